#!/usr/bin/env python3
"""Trains the PyTorch peer's block-diffusion model from megadlm's initial weights on megadlm's rows.

The peer (a single-file PyTorch trainer, outside this repository, passed as PEER) runs its
argument parsing and training when imported, and has no weight or data loading. This script does
not edit it: it parses the peer's source, executes only its definitions (imports, RMSNorm, rope,
Block, DLM, forward_process_bd, the block mask predicate bd_mask_mod, MASK_ID / BD / GMM) in a
namespace holding a prepared args object `a` (the globals those definitions read), and drives them:

  model      the peer's DLM (objective bd), its weights loaded from the Hugging Face folder
             convert_checkpoint --to-hf wrote from megadlm's iteration-0 checkpoint
  attention  as the peer does it on CUDA: FlexAttention (torch.compile) with
             create_block_mask(bd_mask_mod); on CPU: SDPA with the dense mask of the same
             predicate (a CPU smoke test of the pipeline, not a timing)
  data       iteration k trains on megadlm's rows of iteration k (scripts/megatron_samples.py
             from the run's --data-cache-path; x_0 = w_1..w_L), GBS rows in GBS/MBS micro-batches
  noise      the peer's forward_process_bd (t ~ U(1e-3, 1) per block, masked w.p. t, weight
             1/t), MASK_ID set to megadlm's --mask-token, torch.manual_seed(--noise-seed)
  optimizer  the peer's --params amp recipe (fp32 parameters, bf16 autocast) with megadlm's
             rules: AdamW (betas, eps), weight decay on matrices only (norm weights: none, as
             megadlm/Megatron), global-norm clipping, and the learning rate of each step from
             megadlm's schedule (step k uses learning_rate(k - 1), src/training/lr_schedule.cpp;
             checked against the lr megadlm logged when --megadlm-metrics is given)

Writes one JSON line per iteration ("iteration", "lm_loss", "lr", "grad_norm"): the format of
pretrain_difflm's --metrics-jsonl, for scripts/bd_curve_report.py and scripts/plot_metrics.py.

  python3 scripts/bd_curve_vs_peer.py PEER --hf OUT/hf0 --cache OUT/cache --data PREFIX \\
      --iters 150 --gbs 8 --mbs 8 --lr 6e-4 --min-lr 6e-5 --warmup 10 --noise-seed 1 --out peer.jsonl
"""
import argparse
import ast
import json
import math
import os
import struct
import sys
import time
import types

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_samples import CachedGptSamples  # noqa: E402

# The peer's top-level names this script needs; its argparse, train() and benchmarks are left out.
PEER_DEFS = {"RMSNorm", "rope", "Block", "DLM", "MoE", "gmm", "forward_process_bd", "bd_mask_mod"}
PEER_ASSIGNS = {"MASK_ID", "BD", "GMM", "BACKEND"}


def load_peer(path, a, dev):
    """The peer's definitions, executed in a namespace whose `a` is ours."""
    tree = ast.parse(open(path).read(), path)
    keep, seen = [], set()

    def take(node):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            keep.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in PEER_DEFS:
            keep.append(node)
            seen.add(node.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in PEER_ASSIGNS for t in node.targets):
            keep.append(node)
            seen.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.If):  # `if a.objective == "bd":` defines bd_mask_mod; imports inside are skipped
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and sub.name in PEER_DEFS:
                    keep.append(sub)
                    seen.add(sub.name)

    for node in tree.body:
        take(node)
    missing = {"RMSNorm", "rope", "Block", "DLM", "forward_process_bd", "bd_mask_mod", "MASK_ID", "BD"} - seen
    if missing:
        sys.exit(f"bd_curve_vs_peer.py: {path} does not define {sorted(missing)} at top level: not the peer expected")
    # A registered module, not a bare dict: torch.compile looks functions' globals up by module
    # name in sys.modules.
    mod = types.ModuleType("peer_definitions")
    mod.__file__, mod.a, mod.dev = path, a, dev
    sys.modules["peer_definitions"] = mod
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), mod.__dict__)
    return mod.__dict__


def read_safetensors(path, torch):
    raw = open(path, "rb").read()
    n = struct.unpack_from("<Q", raw, 0)[0]
    header = json.loads(raw[8:8 + n])
    dt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = bytearray(raw[8 + n + b:8 + n + e])
        out[name] = torch.frombuffer(buf, dtype=dt[t["dtype"]]).reshape(t["shape"]).float().clone()
    return out


def load_hf(folder, torch):
    """config.json and every tensor of a Hugging Face folder (model.safetensors or shards)."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        sys.exit(f"bd_curve_vs_peer.py: no .safetensors in {folder}")
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(folder, f), torch))
    return cfg, tensors


def peer_state_dict(cfg, t, layers, torch):
    """Qwen3 names (convert_checkpoint --to-hf) -> the peer's DLM parameter names."""
    sd = {"emb.weight": t.pop("model.embed_tokens.weight"), "nf.w": t.pop("model.norm.weight"),
          "head.weight": t.pop("lm_head.weight")}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd[f"blocks.{i}.n1.w"] = t.pop(p + "input_layernorm.weight")
        sd[f"blocks.{i}.n2.w"] = t.pop(p + "post_attention_layernorm.weight")
        sd[f"blocks.{i}.qkv.weight"] = torch.cat([t.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"], 0)
        sd[f"blocks.{i}.o.weight"] = t.pop(p + "self_attn.o_proj.weight")
        sd[f"blocks.{i}.qn.w"] = t.pop(p + "self_attn.q_norm.weight")
        sd[f"blocks.{i}.kn.w"] = t.pop(p + "self_attn.k_norm.weight")
        sd[f"blocks.{i}.gu.weight"] = torch.cat([t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")], 0)
        sd[f"blocks.{i}.down.weight"] = t.pop(p + "mlp.down_proj.weight")
    if t:
        sys.exit(f"bd_curve_vs_peer.py: tensors the peer has no place for: {sorted(t)[:8]}")
    return sd


def check_architecture(cfg):
    """The peer hard-codes RMSNorm eps 1e-6, RoPE base 10000 (rotate-half), no bias, untied head."""
    bad = []
    if abs(float(cfg.get("rms_norm_eps", 0)) - 1e-6) > 1e-12:
        bad.append(f"rms_norm_eps {cfg.get('rms_norm_eps')} (the peer: 1e-6; --norm-epsilon 1e-6)")
    if float(cfg.get("rope_theta", 0)) != 10000.0:
        bad.append(f"rope_theta {cfg.get('rope_theta')} (the peer: 10000; --rotary-base 10000)")
    if cfg.get("tie_word_embeddings", False):
        bad.append("tied embeddings (the peer: untied; --untie-embeddings-and-output-weights)")
    if cfg.get("attention_bias", False):
        bad.append("attention bias (the peer: none; --disable-bias-linear)")
    if cfg.get("hidden_act", "silu") != "silu":
        bad.append(f"hidden_act {cfg.get('hidden_act')} (the peer: SwiGLU; --swiglu)")
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if hd * cfg["num_attention_heads"] != cfg["hidden_size"]:
        bad.append("head_dim * heads != hidden (the peer: hidden // heads)")
    if bad:
        sys.exit("bd_curve_vs_peer.py: the exported model is not the peer's architecture: " + "; ".join(bad))


def learning_rate(step, lr, min_lr, warmup, decay_iters, style):
    """src/training/lr_schedule.cpp (constant, linear, cosine; warm-up from 0)."""
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    if style == "constant":
        return lr
    if step > decay_iters:
        return min_lr
    ratio = (step - warmup) / (decay_iters - warmup)
    coeff = 1.0 - ratio if style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return min_lr + coeff * (lr - min_lr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peer", help="the PyTorch peer's script (not in this repository)")
    ap.add_argument("--hf", required=True, help="convert_checkpoint --to-hf folder of megadlm's initial weights")
    ap.add_argument("--cache", required=True, help="the megadlm run's --data-cache-path")
    ap.add_argument("--data", required=True, help="the megadlm run's --data-path prefix")
    ap.add_argument("--iters", type=int, required=True)
    ap.add_argument("--gbs", type=int, required=True)
    ap.add_argument("--mbs", type=int, required=True)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--mask-token", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--decay-iters", type=int, default=0, help="default: --iters")
    ap.add_argument("--decay-style", default="cosine", choices=["constant", "linear", "cosine"])
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--noise-seed", type=int, nargs="+", default=[1], help="one run per seed (same weights, same rows)")
    ap.add_argument("--out", nargs="+", required=True, help="one JSON-lines file per --noise-seed")
    ap.add_argument("--megadlm-metrics", default="", help="megadlm's --metrics-jsonl: its logged lr is checked")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--compile", type=int, default=1, help="torch.compile the model (CUDA), as the peer does")
    a = ap.parse_args()
    if len(a.out) != len(a.noise_seed):
        sys.exit("bd_curve_vs_peer.py: give one --out per --noise-seed")
    if a.gbs % a.mbs:
        sys.exit("bd_curve_vs_peer.py: --gbs must be a multiple of --mbs")
    import torch
    import torch.nn.functional as F
    decay_iters = a.decay_iters or a.iters
    lrs = {k: learning_rate(k - 1, a.lr, a.min_lr, a.warmup, decay_iters, a.decay_style) for k in range(1, a.iters + 2)}
    if a.megadlm_metrics:
        logged = {}
        for line in open(a.megadlm_metrics):
            if line.strip():
                j = json.loads(line)
                if "lr" in j and "iteration" in j:
                    logged[int(j["iteration"])] = float(j["lr"])
        for k, v in logged.items():  # megadlm logs (in fp32), at iteration k, the lr of the next step
            if k + 1 in lrs and abs(v - lrs[k + 1]) > 1e-6 * abs(lrs[k + 1]) + 1e-12:
                sys.exit(f"bd_curve_vs_peer.py: megadlm logged lr {v} at iteration {k}, this schedule gives {lrs[k + 1]}")
        print(f"learning rates: the schedule matches megadlm's {len(logged)} logged values")

    cfg, tensors = load_hf(a.hf, torch)
    check_architecture(cfg)
    samples = CachedGptSamples(a.cache, a.data)
    seq = samples.seq_length
    if len(samples) < a.iters * a.gbs:
        sys.exit(f"bd_curve_vs_peer.py: the cache holds {len(samples)} samples, {a.iters * a.gbs} needed")
    pa = types.SimpleNamespace(
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
        kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]), ffn=cfg["intermediate_size"],
        vocab=cfg["vocab_size"], seq=seq, mbs=a.mbs, objective="bd", block_size=a.block_size, params="amp",
        experts=0, topk=8, expert_ffn=768, aux_coeff=0.0, force_balance=0, compile=a.compile, sdpa="cudnn")
    if pa.kv_heads == pa.heads:
        pa.kv_heads = 0  # the peer's spelling of "no grouped-query attention"
    dev = a.device
    peer = load_peer(a.peer, pa, dev)
    peer["MASK_ID"] = a.mask_token
    if dev == "cuda":  # as the peer's own `if a.objective == "bd":` block
        from torch.nn.attention.flex_attention import flex_attention, create_block_mask
        peer["flex_attention"] = torch.compile(flex_attention)
        peer["BD"]["mask"] = create_block_mask(peer["bd_mask_mod"], None, None, 2 * seq, 2 * seq, device=dev)
    else:  # the same predicate as a dense boolean mask through SDPA
        idx = torch.arange(2 * seq)
        peer["BD"]["mask"] = peer["bd_mask_mod"](None, None, idx[:, None], idx[None, :])

        def dense_attention(q, k, v, block_mask=None, enable_gqa=False):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=block_mask, enable_gqa=enable_gqa)
        peer["flex_attention"] = dense_attention
    sd = peer_state_dict(cfg, dict(tensors), pa.layers, torch)
    rows = {k: torch.tensor(samples.iteration_rows(k, a.gbs), dtype=torch.long) for k in range(1, a.iters + 1)}
    for seed, out in zip(a.noise_seed, a.out):
        torch.manual_seed(seed)
        model = peer["DLM"]().to(dev)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        if missing or unexpected:
            sys.exit(f"bd_curve_vs_peer.py: weights do not fit the peer's model: missing {missing}, unexpected {unexpected}")
        params = list(model.parameters())
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": a.weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=lrs[1], betas=(a.beta1, a.beta2), eps=a.eps, fused=dev == "cuda")
        step_model = torch.compile(model) if a.compile and dev == "cuda" else model
        nmb = a.gbs // a.mbs
        t0 = time.time()
        with open(out, "w") as f:
            for k in range(1, a.iters + 1):
                for g in opt.param_groups:
                    g["lr"] = lrs[k]
                x_all = rows[k].to(dev)
                total = 0.0
                for mb in range(nmb):
                    x = x_all[mb * a.mbs:(mb + 1) * a.mbs]
                    noisy, m, pm = peer["forward_process_bd"](x)
                    with torch.autocast(device_type=dev, dtype=torch.bfloat16):
                        loss = step_model(noisy, x, m, pm) / nmb
                    loss.backward()
                    total += float(loss)
                gn = torch.nn.utils.clip_grad_norm_(params, a.clip_grad) if a.clip_grad > 0 else torch.zeros(())
                opt.step()
                opt.zero_grad(set_to_none=True)
                f.write(json.dumps({"iteration": k, "lm_loss": total, "lr": lrs[k + 1], "grad_norm": float(gn),
                                    "noise_seed": seed}) + "\n")
                if k == 1 or k % 10 == 0 or k == a.iters:
                    print(f"peer (noise seed {seed}) iteration {k}: loss {total:.4f} grad norm {float(gn):.3f} "
                          f"lr {lrs[k]:.3e} ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
