#!/usr/bin/env python3
"""Tiny Hugging Face folders of the block-diffusion families, and their forward pass in NumPy.

Independent of megadlm (NumPy only; safetensors written and read by hand: an 8-byte little-endian
header length, the JSON header, the raw tensor bytes). Written from the families' public formats
(docs/checkpoints.md, "Block-diffusion formats"):
  sdar          model_type "sdar": Qwen3 names (model.layers.N.self_attn.{q,k,v,o}_proj, q_norm/k_norm,
                mlp.{gate,up,down}_proj, input/post_attention_layernorm, model.embed_tokens, model.norm,
                lm_head), block_size and mask_token_id at the top
  fast_dllm_v2  model_type "Fast_dLLM_Qwen": Qwen2 names with q/k/v biases, bd_size; the mask id in
                added_tokens.json as "|<MASK>|"
  llada         model_type "llada": model.transformer.wte, blocks.N.{attn_norm, q_proj, k_proj, v_proj,
                attn_out, ff_norm, ff_proj (SiLU: the gate), up_proj, ff_out}, ln_f, ff_out (the head);
                d_model / n_layers / n_heads / n_kv_heads / mlp_hidden_size keys
BFR_SWAP_GATE_UP=1 swaps the gate and up projections (a mistake the test expects --verify to catch).
The forward is bidirectional (no mask), float64: RMSNorm x / sqrt(mean(x^2) + eps) * w, rotate-half
RoPE with inv_freq = theta^(-2i/head_dim), grouped-query heads, SiLU(gate) * up.

Usage: block_formats_reference.py make FAMILY DIR [--seed N]
       block_formats_reference.py --model DIR --input ids.safetensors --output logits.safetensors
                                  [--dtype fp32] [--device cpu] [--causal]      (convert_checkpoint --verify)
       block_formats_reference.py --probe
"""
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # --probe says why
    np = None

L, D, NH, NKV, F, V, MASK = 2, 32, 4, 2, 48, 64, 63
HD = D // NH


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = np.ascontiguousarray(t, dtype=np.float32)
        b = t.tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "I64": np.int64, "I32": np.int32}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        if e["dtype"] == "BF16":
            raw = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
            out[name] = raw.view(np.float32).reshape(e["shape"])
        else:
            out[name] = np.frombuffer(data[a:b], dtype=kinds[e["dtype"]]).reshape(e["shape"])
    return out


def names(family, i):
    """Layer i's tensor names in `family`: q k v o attn_norm mlp_norm gate up down (+ q_norm k_norm)."""
    if family == "llada":
        p = f"model.transformer.blocks.{i}."
        return dict(q=p + "q_proj", k=p + "k_proj", v=p + "v_proj", o=p + "attn_out", attn_norm=p + "attn_norm",
                    mlp_norm=p + "ff_norm", gate=p + "ff_proj", up=p + "up_proj", down=p + "ff_out")
    p = f"model.layers.{i}."
    return dict(q=p + "self_attn.q_proj", k=p + "self_attn.k_proj", v=p + "self_attn.v_proj",
                o=p + "self_attn.o_proj", attn_norm=p + "input_layernorm", mlp_norm=p + "post_attention_layernorm",
                gate=p + "mlp.gate_proj", up=p + "mlp.up_proj", down=p + "mlp.down_proj",
                q_norm=p + "self_attn.q_norm", k_norm=p + "self_attn.k_norm")


def globals_(family):
    if family == "llada":
        return "model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"
    return "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"


def make(family, out, seed):
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.normal(0, 0.3, s)
    t = {}
    emb, norm, head = globals_(family)
    t[emb], t[norm], t[head] = w(V, D), 1 + 0.1 * w(D), w(V, D)
    for i in range(L):
        n = names(family, i)
        t[n["q"] + ".weight"], t[n["k"] + ".weight"], t[n["v"] + ".weight"] = w(D, D), w(NKV * HD, D), w(NKV * HD, D)
        t[n["o"] + ".weight"] = w(D, D)
        t[n["attn_norm"] + ".weight"], t[n["mlp_norm"] + ".weight"] = 1 + 0.1 * w(D), 1 + 0.1 * w(D)
        t[n["gate"] + ".weight"], t[n["up"] + ".weight"], t[n["down"] + ".weight"] = w(F, D), w(F, D), w(D, F)
        if family == "sdar":
            t[n["q_norm"] + ".weight"], t[n["k_norm"] + ".weight"] = 1 + 0.1 * w(HD), 1 + 0.1 * w(HD)
        if family == "fast_dllm_v2":
            t[n["q"] + ".bias"], t[n["k"] + ".bias"], t[n["v"] + ".bias"] = w(D), w(NKV * HD), w(NKV * HD)
    if family == "llada":
        cfg = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": D, "n_layers": L, "n_heads": NH,
               "n_kv_heads": NKV, "mlp_hidden_size": F, "mlp_ratio": 4, "vocab_size": V, "embedding_size": V,
               "max_sequence_length": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope": True, "alibi": False,
               "weight_tying": False, "include_bias": False, "include_qkv_bias": False, "block_type": "llama",
               "activation_type": "silu", "layer_norm_type": "rms", "attention_layer_norm": False,
               "mask_token_id": MASK, "eos_token_id": 1, "pad_token_id": 1}
    else:
        cfg = {"hidden_size": D, "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH,
               "num_key_value_heads": NKV, "vocab_size": V, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
               "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu", "rope_scaling": None}
        if family == "sdar":
            cfg.update({"architectures": ["SDARForCausalLM"], "model_type": "sdar", "head_dim": HD,
                        "attention_bias": False, "block_size": 4, "mask_token_id": MASK})
        else:
            cfg.update({"architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen", "bd_size": 8,
                        "conplemenrary_mask": True})
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    if family == "fast_dllm_v2":
        json.dump({"|<MASK>|": MASK}, open(os.path.join(out, "added_tokens.json"), "w"))
    write_safetensors(os.path.join(out, "model.safetensors"), t)


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, theta):  # x [T, heads, hd], positions 0..T-1, rotate-half
    T, _, hd = x.shape
    inv = theta ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None, :], np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rot * sin


def forward(model_dir, ids):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = {k: v.astype(np.float64) for k, v in read_safetensors(os.path.join(model_dir, "model.safetensors")).items()}
    family = {"llada": "llada", "sdar": "sdar", "Fast_dLLM_Qwen": "fast_dllm_v2"}[cfg["model_type"]]
    if family == "llada":
        d, nl, nh, nkv = cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg.get("n_kv_heads") or cfg["n_heads"]
        hd, eps = d // nh, cfg.get("rms_norm_eps", 1e-5)
    else:
        d, nl, nh = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
        nkv, hd, eps = cfg.get("num_key_value_heads", nh), cfg.get("head_dim") or d // nh, cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    emb, norm, head = globals_(family)
    out = []
    for row in ids:
        x = w[emb + ".weight"][row] if emb.endswith("wte") else w[emb][row]
        T = len(row)
        for i in range(nl):
            n = names(family, i)
            lin = lambda name, h: h @ w[name + ".weight"].T + (w[name + ".bias"] if name + ".bias" in w else 0)
            h = rms(x, w[n["attn_norm"] + ".weight"], eps)
            q = lin(n["q"], h).reshape(T, nh, hd)
            k = lin(n["k"], h).reshape(T, nkv, hd)
            v = lin(n["v"], h).reshape(T, nkv, hd)
            if family == "sdar":
                q, k = rms(q, w[n["q_norm"] + ".weight"], eps), rms(k, w[n["k_norm"] + ".weight"], eps)
            q, k = rope(q, theta), rope(k, theta)
            att = np.zeros((T, nh, hd))
            for hh in range(nh):
                g = hh // (nh // nkv)
                s = q[:, hh] @ k[:, g].T / np.sqrt(hd)
                p = np.exp(s - s.max(-1, keepdims=True))
                att[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, g]
            x = x + lin(n["o"], att.reshape(T, nh * hd))
            h = rms(x, w[n["mlp_norm"] + ".weight"], eps)
            gate = lin(n["gate"], h)
            if os.environ.get("BFR_SWAP_GATE_UP"):  # a deliberate mistake, for the test that --verify can fail
                gate = lin(n["up"], h)
                x = x + lin(n["down"], gate / (1 + np.exp(-gate)) * lin(n["gate"], h))
                continue
            x = x + lin(n["down"], gate / (1 + np.exp(-gate)) * lin(n["up"], h))
        out.append(rms(x, w[norm], eps) @ w[head].T)
    return np.stack(out)


def main():
    a = sys.argv[1:]
    if "--probe" in a:
        if np is None:
            print("NumPy is not installed")
            sys.exit(1)
        sys.exit(0)
    if a and a[0] == "make":
        make(a[1], a[2], int(a[a.index("--seed") + 1]) if "--seed" in a else 7)
        return
    opt = lambda k: a[a.index(k) + 1]
    if "--causal" in a:
        sys.exit("block_formats_reference.py: bidirectional only")
    ids = read_safetensors(opt("--input"))["input_ids"]
    logits = forward(opt("--model"), ids).astype(np.float32)
    write_safetensors(opt("--output"), {"logits": logits.reshape(-1, logits.shape[-1])})
    print(f"block_formats_reference.py: {logits.shape} logits (float64 NumPy, bidirectional)")


if __name__ == "__main__":
    main()
