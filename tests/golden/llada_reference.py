#!/usr/bin/env python3
"""Independent NumPy reference of LLaDA's sampler and log-likelihood estimator, for megadlm's tests.

Written from LLaDA's published algorithms (`generate`, the conditional log-likelihood with
classifier-free guidance), not from megadlm's C++: a Qwen2/Qwen3 forward pass in
float64 read from a Hugging Face folder (config.json + model.safetensors or shards), bidirectional
attention, then LLaDA's loop. The random numbers are the ones megadlm documents, reimplemented
here: Philox-4x32-10 keyed by (seed, purpose) with counters of global coordinates
(include/megadlm/core/philox.h, include/megadlm/ops/sampling.h, include/megadlm/diffusion/likelihood.h):

  Gumbel noise of token v at generated position j, sample g, step t:
      uniform53 of words (2(v%2), 2(v%2)+1) of philox(key(seed, 0x5001), (v//2, j, g, t))
  random-remasking confidence: uniform53 of words (0, 1) of philox(key(seed, 0x5002), (j, 0, g, t))
  likelihood Monte Carlo, repeat r of request g: k = 1 + floor(U * Ly) with U = uniform53 of
      philox(key(seed, 0x5003), (0, 0, g, r)) words (0, 1); answer position a of row m of the
      mini-batch ranks by uniform53 of philox(key(seed, 0x5003), (a, 1 + m, g, r)) words (0, 1)

Each prompt is generated alone (batch 1), as LLaDA's generate.py does; the logits are rounded to
float32 (a float32 model's output) before guidance, which is combined in float32 as PyTorch would.

usage:
  llada_reference.py generate --model HF_DIR --prompts-jsonl F --output F --gen-length G --steps S
                     --block-length K --mask-id M [--remasking low_confidence|random]
                     [--temperature T] [--cfg-scale W] [--seed N] [--eos-id E --logits-eos-inf]
                     [--kv-cache none|prefix|dual]
  llada_reference.py loglik --model HF_DIR --requests-jsonl F --output F --mask-id M --mc-num N
                     --mc-batch B [--seed N] [--cfg-scale W] [--fixed-masks F]
  llada_reference.py selftest
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

MASK32 = np.uint64(0xFFFFFFFF)
PURPOSE_GUMBEL, PURPOSE_REMASK, PURPOSE_LIKELIHOOD = 0x5001, 0x5002, 0x5003


# ------------------------------------------------------------------------------ Philox-4x32-10

def philox(seed, purpose, c0, c1, c2, c3):
    """Philox-4x32-10 (Salmon et al. 2011) on broadcastable arrays of 32-bit counters."""
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64(((seed >> 32) ^ purpose) & 0xFFFFFFFF)
    c = [np.asarray(x).astype(np.uint64) & MASK32 for x in np.broadcast_arrays(c0, c1, c2, c3)]
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    w0, w1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
    for _ in range(10):
        p0 = m0 * c[0]
        p1 = m1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & MASK32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & MASK32]
        k0 = (k0 + w0) & MASK32
        k1 = (k1 + w1) & MASK32
    return c


def uniform53(a, b):
    v = ((a >> np.uint64(5)) << np.uint64(26)) | (b >> np.uint64(6))
    return v.astype(np.float64) * (1.0 / 9007199254740992.0)


def selftest():
    # Known-answer vectors of Philox-4x32-10 (Random123's kat_vectors).
    w = philox(0, 0, 0, 0, 0, 0)
    assert [int(x) for x in w] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8], [hex(int(x)) for x in w]
    # key (0xa4093822, 0x299f31d0) = seed 0x299f31d0a4093822 with purpose 0.
    w = philox(0x299F31D0A4093822, 0, 0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
    assert [int(x) for x in w] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1], [hex(int(x)) for x in w]
    print("selftest: Philox-4x32-10 known-answer vectors pass")


# ------------------------------------------------------------------------------ the model

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
        raw = np.frombuffer(data[b:end], dtype={"F32": np.float32, "BF16": np.uint16, "F64": np.float64}[e["dtype"]])
        if e["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
        out[name] = raw.astype(np.float64).reshape(e["shape"])
    return out


class QwenModel:
    """Qwen2/Qwen3 decoder as transformers defines it, bidirectional, float64."""

    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        index = os.path.join(folder, "model.safetensors.index.json")
        self.w = {}
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for name in files:
            self.w.update(read_safetensors(os.path.join(folder, name)))
        c = self.cfg
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.groups = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.theta = c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        self.qwen3 = c["model_type"] == "qwen3"
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        self.vocab = self.lm_head.shape[0]

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x [S, H, D], rotate-half
        d = self.head_dim
        inv = 1.0 / (self.theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :]
        half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
        return x * cos + half * sin

    def logits(self, tokens, cache=None, cols=None, allow=None):
        """float32 logits [S, V] of one sequence, positions 0..S-1.

        `allow` (booleans [S, S], query by key): the attention mask; None = bidirectional.

        Fast-dLLM's approximate key/value cache: with `cache` (a list) and no `cols`, every layer's
        keys and values (after norm and RoPE) are stored in it; with cols = (c0, c1) only those
        columns are computed (logits [c1 - c0, V]): their keys and values replace the cached ones
        and the other columns' come from the cache."""
        tokens = np.asarray(tokens)
        c0, c1 = cols if cols is not None else (0, len(tokens))
        s = c1 - c0
        pos = np.arange(c0, c1)
        x = self.w["model.embed_tokens.weight"][tokens[c0:c1]]
        if cache is not None and cols is None:
            cache.clear()
        hd, hq, hk = self.head_dim, self.heads, self.groups
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = self.rms(x, self.w[p + "input_layernorm.weight"])

            def proj(name):
                y = h @ self.w[p + f"self_attn.{name}.weight"].T
                b = self.w.get(p + f"self_attn.{name}.bias")
                return y if b is None else y + b

            q = proj("q_proj").reshape(s, hq, hd)
            k = proj("k_proj").reshape(s, hk, hd)
            v = proj("v_proj").reshape(s, hk, hd)
            if self.qwen3:
                q = self.rms(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, self.w[p + "self_attn.k_norm.weight"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            if cache is not None:
                if cols is None:
                    cache.append((k.copy(), v.copy()))
                else:
                    cache[i][0][c0:c1], cache[i][1][c0:c1] = k, v
                    k, v = cache[i]
            rep = hq // hk
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
            if allow is not None:
                scores = np.where(allow[None], scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            prob = np.exp(scores)
            prob /= prob.sum(axis=-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", prob, v).reshape(s, hq * hd)
            o = att @ self.w[p + "self_attn.o_proj.weight"].T
            if p + "self_attn.o_proj.bias" in self.w:
                o = o + self.w[p + "self_attn.o_proj.bias"]
            x = x + o
            h2 = self.rms(x, self.w[p + "post_attention_layernorm.weight"])
            g = h2 @ self.w[p + "mlp.gate_proj.weight"].T
            u = h2 @ self.w[p + "mlp.up_proj.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ self.w[p + "mlp.down_proj.weight"].T
        x = self.rms(x, self.w["model.norm.weight"])
        return (x @ self.lm_head.T).astype(np.float32)


# ------------------------------------------------------------------------------ LLaDA's generate

def guided(model, x, prompt_index, mask_id, cfg_scale, caches=None, cols=None):
    """Logits of canvas x, with classifier-free guidance when cfg_scale > 0 (float32); with
    `caches` (two lists: the canvas's and the unconditional canvas's) through the key/value cache."""
    caches = caches or (None, None)
    logits = model.logits(x, caches[0], cols)
    if cfg_scale > 0:
        un_x = np.where(prompt_index, mask_id, x)
        un = model.logits(un_x, caches[1], cols)
        w1 = np.float32(cfg_scale + 1.0)
        logits = un + w1 * (logits - un)  # float32 arithmetic, one rounding per operation
    return logits


def num_transfer_tokens(masked, steps):
    base, rem = divmod(masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def generate(model, prompt, a, sample_index):
    g_len, k_len = a.gen_length, a.block_length
    assert g_len % k_len == 0 and a.steps % (g_len // k_len) == 0
    p_len = len(prompt)
    x = np.array(list(prompt) + [a.mask_id] * g_len, dtype=np.int64)
    prompt_index = x != a.mask_id
    prompt_index[p_len:] = False
    blocks = g_len // k_len
    steps = a.steps // blocks
    caches = ([], [])
    for q in range(blocks):
        block_start, block_end = p_len + q * k_len, p_len + (q + 1) * k_len
        schedule = num_transfer_tokens(int(np.sum(x[block_start:block_end] == a.mask_id)), steps)
        refreshed = False
        for i in range(steps):
            t = q * steps + i
            if schedule[i] == 0:
                continue  # top-0 transfers nothing: the forward pass would change nothing
            mask_index = x == a.mask_id
            cand_index = mask_index & (np.arange(len(x)) < block_end)
            if a.kv_cache == "none":
                logits = guided(model, x, prompt_index, a.mask_id, a.cfg_scale).astype(np.float64)
            elif not refreshed:  # Fast-dLLM: the block's first step runs everything and fills the cache
                logits = guided(model, x, prompt_index, a.mask_id, a.cfg_scale, caches).astype(np.float64)
                refreshed = True
            else:  # later steps: the block (dual) or the block and what follows (prefix)
                cols = (block_start, block_end if a.kv_cache == "dual" else len(x))
                logits = np.zeros((len(x), model.vocab))
                logits[cols[0]:cols[1]] = guided(model, x, prompt_index, a.mask_id, a.cfg_scale, caches, cols)
                cand_index &= np.arange(len(x)) >= block_start
            if a.logits_eos_inf:
                logits[:, a.eos_id] = -np.inf
            cand = np.nonzero(cand_index)[0]
            lc = logits[cand]
            j = (cand - p_len).astype(np.int64) & 0xFFFFFFFF  # generated position (mod 2^32)
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
                conf = (e / e.sum(axis=-1, keepdims=True))[np.arange(len(cand)), x0]
            else:
                w = philox(a.seed, PURPOSE_REMASK, j, 0, sample_index, t)
                conf = uniform53(w[0], w[1])
            order = np.lexsort((cand, -conf))  # most confident first, lower position on ties
            chosen = order[:schedule[i]]
            x[cand[chosen]] = x0[chosen]
    return [int(v) for v in x[p_len:]]


# ------------------------------------------------------------------------------ log-likelihood

def mc_masks(seed, g, r, ly, batch):
    """The masks of repeat r of request g: [batch, ly] booleans and the counts n_j."""
    w = philox(seed, PURPOSE_LIKELIHOOD, 0, 0, g, r)
    k = 1 + min(int(uniform53(w[0], w[1]) * ly), ly - 1)
    n = np.round(k + np.arange(batch) * (ly / batch)).astype(np.int64)  # half to even, as torch.round
    n = ((n - 1) % ly) + 1
    masks = np.zeros((batch, ly), dtype=bool)
    for m in range(batch):
        w = philox(seed, PURPOSE_LIKELIHOOD, np.arange(ly), 1 + m, g, r)
        keys = uniform53(w[0], w[1])
        order = np.lexsort((np.arange(ly), keys))  # ascending key, lower position on ties
        masks[m, order[:n[m]]] = True
    return masks, n


def log_softmax64(logits):
    l = logits.astype(np.float64)
    m = l.max(axis=-1, keepdims=True)
    return l - m - np.log(np.exp(l - m).sum(axis=-1, keepdims=True))


def loglikelihood(model, context, answer, a, g):
    seq = np.array(list(context) + list(answer), dtype=np.int64)
    c_len, ly = len(context), len(answer)
    prompt_index = np.arange(len(seq)) < c_len
    estimates = []
    for r in range(a.mc_num // a.mc_batch):
        masks, n = mc_masks(a.seed, g, r, ly, a.mc_batch)
        total = 0.0
        for m in range(a.mc_batch):
            x = seq.copy()
            x[c_len:][masks[m]] = a.mask_id
            lp = log_softmax64(guided(model, x, prompt_index, a.mask_id, a.cfg_scale))
            pos = c_len + np.nonzero(masks[m])[0]
            total += float(np.sum(-lp[pos, seq[pos]])) * ly / n[m]
        estimates.append(total / a.mc_batch)
    return -float(np.mean(estimates)), estimates


# ------------------------------------------------------------------------------ command line

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["generate", "loglik", "selftest"])
    ap.add_argument("--model")
    ap.add_argument("--prompts-jsonl")
    ap.add_argument("--requests-jsonl")
    ap.add_argument("--output")
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--block-length", type=int, default=None)
    ap.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"])
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--cfg-scale", type=float, default=0.0)
    ap.add_argument("--mask-id", type=int)
    ap.add_argument("--eos-id", type=int, default=-1)
    ap.add_argument("--logits-eos-inf", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--kv-cache", default="none", choices=["none", "prefix", "dual"])
    ap.add_argument("--mc-num", type=int, default=128)
    ap.add_argument("--mc-batch", type=int, default=16)
    a = ap.parse_args()
    if a.mode == "selftest":
        selftest()
        return
    selftest()
    model = QwenModel(a.model)
    out = open(a.output, "w") if a.output else sys.stdout
    if a.mode == "generate":
        a.block_length = a.block_length or a.gen_length
        with open(a.prompts_jsonl) as f:
            prompts = [json.loads(line)["prompt_ids"] for line in f if line.strip()]
        for i, p in enumerate(prompts):
            out.write(json.dumps({"index": i, "token_ids": generate(model, p, a, i)}) + "\n")
    else:
        assert a.mc_num % a.mc_batch == 0
        with open(a.requests_jsonl) as f:
            reqs = [json.loads(line) for line in f if line.strip()]
        for i, q in enumerate(reqs):
            ll, est = loglik_of(model, q, a, i)
            out.write(json.dumps({"index": i, "loglikelihood": ll, "estimates": est}) + "\n")


def loglik_of(model, q, a, i):
    return loglikelihood(model, q["context_ids"], q["continuation_ids"], a, i)


if __name__ == "__main__":
    main()
