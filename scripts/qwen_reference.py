#!/usr/bin/env python3
"""A dependency-free reference of the Qwen2 / Qwen3 forward pass, as transformers defines it.

Stand-in for scripts/hf_verify.py where transformers is not installed (CI): same command line,
same output, computed in Python floats (double precision) straight from the Hugging Face folder
(config.json + model.safetensors or its shards). It checks megadlm's export mapping on the CPU: names, q/k/v
and gate/up order, grouped-query heads (query head h uses key/value head h // (heads / groups)),
q_norm/k_norm before RoPE, rotate-half RoPE with inv_freq = 1 / theta^(2i / head_dim), RMSNorm
(x / sqrt(mean(x^2) + eps) * w), SiLU(gate) * up, tied or separate lm_head. Attention is
bidirectional unless --causal. Written from the architecture's definition, not from megadlm's code.
Slow (pure Python): for tiny models only.

Usage: qwen_reference.py --model DIR --input ids.safetensors --output logits.safetensors
                         [--dtype fp32] [--device cpu] [--causal] | --probe
"""
import argparse
import array
import json
import math
import os
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        if e["dtype"] == "F32":
            values = array.array("f", raw).tolist()
        elif e["dtype"] == "BF16":
            halves = array.array("H", raw)
            values = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
        elif e["dtype"] == "I64":
            values = array.array("q", raw).tolist()
        else:
            sys.exit(f"qwen_reference.py: {path}: tensor {name} has dtype {e['dtype']}, not F32/BF16/I64")
        out[name] = (e["shape"], values)
    return out


def write_logits(path, logits, shape):
    header = json.dumps({"logits": {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 * len(logits)]}})
    header += " " * ((8 - (8 + len(header)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header.encode())
        f.write(array.array("f", logits).tobytes())


def rows(t):
    shape, v = t
    cols = shape[-1]
    return [v[i * cols:(i + 1) * cols] for i in range(len(v) // cols)]


def linear(x, w, bias=None):  # x [in], w rows [out][in]
    y = [math.fsum(map(float.__mul__, r, x)) for r in w]
    return [a + b for a, b in zip(y, bias)] if bias is not None else y


def rms_norm(x, w, eps):
    s = 1.0 / math.sqrt(math.fsum(v * v for v in x) / len(x) + eps)
    return [v * s * g for v, g in zip(x, w)]


def rope(x, pos, inv_freq):  # rotate-half on one head
    half = len(x) // 2
    out = []
    for i in range(len(x)):
        ang = pos * inv_freq[i % half]
        other = -x[i + half] if i < half else x[i - half]
        out.append(x[i] * math.cos(ang) + other * math.sin(ang))
    return out


def main():
    if "--probe" in sys.argv:
        sys.exit(0)
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--causal", action="store_true")
    a = p.parse_args()
    if a.device != "cpu" or a.dtype != "fp32":
        sys.exit("qwen_reference.py computes in double precision on the CPU: use --verify-device cpu")
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    index = os.path.join(a.model, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(a.model, f)))
    qwen3 = cfg["model_type"] == "qwen3"
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    ng = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    inv_freq = [1.0 / cfg.get("rope_theta", 10000.0) ** (2 * i / hd) for i in range(hd // 2)]
    bias = cfg.get("attention_bias", False) if qwen3 else True

    def get(name):
        return w[name]

    def vec(name):
        return get(name)[1]

    (b_, s_), ids = read_safetensors(a.input)["input_ids"]
    embed = rows(get("model.embed_tokens.weight"))
    head = embed if cfg.get("tie_word_embeddings", False) else rows(get("lm_head.weight"))
    logits = []
    for b in range(b_):
        x = [list(embed[ids[b * s_ + s]]) for s in range(s_)]
        for l in range(L):
            pre = f"model.layers.{l}."
            h = [rms_norm(t, vec(pre + "input_layernorm.weight"), eps) for t in x]
            proj = {}
            for n in ("q", "k", "v"):
                wb = vec(pre + f"self_attn.{n}_proj.bias") if bias else None
                proj[n] = [linear(t, rows(get(pre + f"self_attn.{n}_proj.weight")), wb) for t in h]
            heads = {"q": nh, "k": ng, "v": ng}
            split = {n: [[proj[n][s][j * hd:(j + 1) * hd] for j in range(heads[n])] for s in range(s_)] for n in proj}
            if qwen3:
                for n in ("q", "k"):
                    g = vec(pre + f"self_attn.{n}_norm.weight")
                    split[n] = [[rms_norm(v, g, eps) for v in t] for t in split[n]]
            for n in ("q", "k"):
                split[n] = [[rope(v, s, inv_freq) for v in split[n][s]] for s in range(s_)]
            attn = [[0.0] * (nh * hd) for _ in range(s_)]
            for j in range(nh):
                kv = j // (nh // ng)
                for s in range(s_):
                    keys = range(s + 1) if a.causal else range(s_)
                    sc = [math.fsum(map(float.__mul__, split["q"][s][j], split["k"][t][kv])) / math.sqrt(hd) for t in keys]
                    m = max(sc)
                    e = [math.exp(v - m) for v in sc]
                    z = math.fsum(e)
                    for d in range(hd):
                        attn[s][j * hd + d] = math.fsum(e[i] * split["v"][t][kv][d] for i, t in enumerate(keys)) / z
            wo = rows(get(pre + "self_attn.o_proj.weight"))
            ob = vec(pre + "self_attn.o_proj.bias") if qwen3 and bias else None
            x = [[u + v for u, v in zip(x[s], linear(attn[s], wo, ob))] for s in range(s_)]
            h = [rms_norm(t, vec(pre + "post_attention_layernorm.weight"), eps) for t in x]
            wg, wu, wd = (rows(get(pre + f"mlp.{n}_proj.weight")) for n in ("gate", "up", "down"))
            for s in range(s_):
                g, u = linear(h[s], wg), linear(h[s], wu)
                act = [gi / (1.0 + math.exp(-gi)) * ui for gi, ui in zip(g, u)]
                x[s] = [p_ + q_ for p_, q_ in zip(x[s], linear(act, wd))]
        for s in range(s_):
            logits.extend(linear(rms_norm(x[s], vec("model.norm.weight"), eps), head))
    write_logits(a.output, logits, [b_, s_, len(head)])
    print(f"qwen_reference.py: {cfg['model_type']} ({'causal' if a.causal else 'bidirectional'}, double "
          f"precision): logits [{b_}, {s_}, {len(head)}] written to {a.output}")


if __name__ == "__main__":
    main()
