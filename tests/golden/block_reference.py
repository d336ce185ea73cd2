#!/usr/bin/env python3
"""Independent NumPy reference of block decoding (and the causal variant's autoregressive decoding).

Written from the block-diffusion decoding rule as docs/generation.md ("Block decoding") states it
(blocks at multiples of B from position 0, the partial last prompt block decoded with the first new
tokens, the active block attending the
committed blocks and itself bidirectionally, committed blocks seen through the clean-stream rule),
not from megadlm's C++. No cache at all: every step runs the whole sequence up to the end of the
active block in float64 with an explicit attention mask, one prompt at a time:

  query q in a committed block (blk(q) < j):  block-causal: keys with blk(k) <= blk(q)
                                              causal:       keys k <= q
  query q in the active block j:              every key k < end of block j

The forward pass, the Philox random numbers and LLaDA's transfer counts come from
llada_reference.py (same folder). Per block of m masks and s = S / (G / B) steps: step i commits the
c_i most confident proposals (c = num_transfer_tokens(m, s), ties to the lower position), or with a
threshold every proposal with confidence >= it and at least the most confident one (up to B steps).
Proposal keys: generated position p - P, step t = k * s + i (threshold: k * B + i), k = the block's
index counted from the first decoded block. Stopping at EOS: after a block holding one.
Autoregressive: token at generated position j from the logits of the position before it (causal
forward), keys (g, j), step j.

usage:
  block_reference.py generate --model HF_DIR --prompts-jsonl F --output F --gen-length G --steps S
                     --block-length B --mask-id M [--causal] [--ar] [--remasking low_confidence|random]
                     [--temperature T] [--confidence-threshold P] [--eos-id E] [--seed N]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llada_reference import PURPOSE_GUMBEL, PURPOSE_REMASK, QwenModel, num_transfer_tokens, philox, uniform53  # noqa: E402


def masked_logits(model, tokens, allow):
    """float32 logits [S, V] of tokens at positions 0..S-1 with the boolean attention mask allow[q, k]."""
    tokens = np.asarray(tokens)
    s = len(tokens)
    pos = np.arange(s)
    x = model.w["model.embed_tokens.weight"][tokens]
    hd, hq, hk = model.head_dim, model.heads, model.groups
    for i in range(model.layers):
        p = f"model.layers.{i}."
        h = model.rms(x, model.w[p + "input_layernorm.weight"])

        def proj(name):
            y = h @ model.w[p + f"self_attn.{name}.weight"].T
            b = model.w.get(p + f"self_attn.{name}.bias")
            return y if b is None else y + b

        q = proj("q_proj").reshape(s, hq, hd)
        k = proj("k_proj").reshape(s, hk, hd)
        v = proj("v_proj").reshape(s, hk, hd)
        if model.qwen3:
            q = model.rms(q, model.w[p + "self_attn.q_norm.weight"])
            k = model.rms(k, model.w[p + "self_attn.k_norm.weight"])
        q, k = model.rope(q, pos), model.rope(k, pos)
        rep = hq // hk
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        scores = np.where(allow[None, :, :], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        prob = np.exp(scores)
        prob /= prob.sum(axis=-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", prob, v).reshape(s, hq * hd)
        o = att @ model.w[p + "self_attn.o_proj.weight"].T
        if p + "self_attn.o_proj.bias" in model.w:
            o = o + model.w[p + "self_attn.o_proj.bias"]
        x = x + o
        h2 = model.rms(x, model.w[p + "post_attention_layernorm.weight"])
        g = h2 @ model.w[p + "mlp.gate_proj.weight"].T
        u = h2 @ model.w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ model.w[p + "mlp.down_proj.weight"].T
    x = model.rms(x, model.w["model.norm.weight"])
    return (x @ model.lm_head.T).astype(np.float32)


def proposals(model, logits, j, sample_index, t, a):
    """Proposed tokens and confidences of f32 logits rows at generated positions j (LLaDA's rule)."""
    lc = logits.astype(np.float64)
    if a.eos_id >= 0 and a.logits_eos_inf:
        lc[:, a.eos_id] = -np.inf
    j = np.asarray(j, dtype=np.int64) & 0xFFFFFFFF
    if a.temperature == 0:
        x0 = np.argmax(lc, axis=-1)
    else:
        v = np.arange(model.vocab)
        w = philox(a.seed, PURPOSE_GUMBEL, (v // 2)[None, :], j[:, None], sample_index, t)
        u = np.where((v % 2)[None, :] == 1, uniform53(w[2], w[3]), uniform53(w[0], w[1]))
        with np.errstate(divide="ignore", over="ignore"):
            x0 = np.argmax(np.exp(lc) / (-np.log(u)) ** a.temperature, axis=-1)
    if a.remasking == "low_confidence":
        e = np.exp(lc - lc.max(axis=-1, keepdims=True))
        conf = (e / e.sum(axis=-1, keepdims=True))[np.arange(len(j)), x0]
    else:
        w = philox(a.seed, PURPOSE_REMASK, j, 0, sample_index, t)
        conf = uniform53(w[0], w[1])
    return x0, conf


def block_mask(n, b, j, causal):
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    committed = (q // b) < j
    clean = (k <= q) if causal else ((k // b) <= (q // b))
    return np.where(committed, clean, True)


def decode_blocks(model, prompt, a, g):
    b, p_len, g_len = a.block_length, len(prompt), a.gen_length
    assert g_len % b == 0 and a.steps % (g_len // b) == 0
    s = a.steps // (g_len // b)
    n = p_len + g_len
    x = np.array(list(prompt) + [a.mask_id] * g_len, dtype=np.int64)
    first = p_len // b
    steps = 0
    for j in range(first, (n + b - 1) // b):
        k = j - first
        b0, b1 = j * b, min((j + 1) * b, n)
        schedule = num_transfer_tokens(int(np.sum(x[b0:b1] == a.mask_id)), s)
        for i in range(b if a.confidence_threshold > 0 else s):
            cand = b0 + np.nonzero(x[b0:b1] == a.mask_id)[0]
            if len(cand) == 0:
                break
            if a.confidence_threshold == 0 and schedule[i] == 0:
                continue
            logits = masked_logits(model, x[:b1], block_mask(b1, b, j, a.causal))[cand]
            t = k * (b if a.confidence_threshold > 0 else s) + i
            x0, conf = proposals(model, logits, cand - p_len, g, t, a)
            order = np.lexsort((cand, -conf))
            if a.confidence_threshold > 0:
                take = max(1, int(np.sum(conf >= a.confidence_threshold)))
            else:
                take = schedule[i]
            chosen = order[:take]
            x[cand[chosen]] = x0[chosen]
            steps += 1
        gen = [int(v) for v in x[p_len:b1]]
        if a.eos_id >= 0 and a.eos_id in gen:
            return gen[:gen.index(a.eos_id) + 1], steps
    return [int(v) for v in x[p_len:]], steps


def decode_ar(model, prompt, a, g):
    x = list(prompt)
    for jj in range(a.gen_length):
        n = len(x)
        allow = np.arange(n)[None, :] <= np.arange(n)[:, None]
        logits = masked_logits(model, x, allow)[n - 1:n]
        x0, _ = proposals(model, logits, [jj], g, jj, a)
        x.append(int(x0[0]))
        if a.eos_id >= 0 and x[-1] == a.eos_id:
            break
    return x[len(prompt):], len(x) - len(prompt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["generate"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts-jsonl", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--gen-length", type=int, default=16)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--block-length", type=int, default=4)
    ap.add_argument("--mask-id", type=int, required=True)
    ap.add_argument("--causal", action="store_true", help="the clean stream is causal (sbd)")
    ap.add_argument("--ar", action="store_true", help="autoregressive decoding (causal variant)")
    ap.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"])
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--confidence-threshold", type=float, default=0.0)
    ap.add_argument("--eos-id", type=int, default=-1)
    ap.add_argument("--logits-eos-inf", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    model = QwenModel(a.model)
    with open(a.prompts_jsonl) as f, open(a.output, "w") as out:
        for g, line in enumerate(l for l in f if l.strip()):
            prompt = json.loads(line)["prompt_ids"]
            tokens, steps = decode_ar(model, prompt, a, g) if a.ar else decode_blocks(model, prompt, a, g)
            out.write(json.dumps({"index": g, "token_ids": tokens, "steps": steps}) + "\n")


if __name__ == "__main__":
    main()
