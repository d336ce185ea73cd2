#!/usr/bin/env python3
"""Independent NumPy reference of megadlm's block-diffusion log-likelihood estimator.

Written from the estimator's definition (include/megadlm/diffusion/likelihood.h,
docs/evaluation.md "Block-diffusion models"), not from megadlm's C++. It reuses the float64
Qwen forward, Philox and LLaDA's stratified masks of llada_reference.py, and evaluates each block
term without the doubled [x_t | x_0] row megadlm runs: for answer block j (absolute block b) and
mini-batch row m, one sequence [clean tokens of blocks < b ; block b with its masks] at positions
0..end, attention block-causal (a query of block p sees the keys of blocks <= p: clean prefix
block-causal, the noisy block bidirectional over itself and the prefix) or, for the causal clean
variant, causal inside the prefix. That is the inference-time form of the same conditional.

  log p(y | c) = sum_j log p(y_j | c, y_<j); block j holds Ly_j answer positions (answer-relative
  a0..a1-1); repeat r draws k_j from philox(key(seed, LikelihoodMC), (j, 0, g, r)), row m masks
  n_{j,m} of them ranked by philox((a, 1 + m, g, r)); estimate_r = (1/B) sum_m sum_j sum_masked
  CE * Ly_j / n_{j,m};  log p = -mean_r estimate_r.

The block ELBO (evaluate_difflm --task elbo on a block-diffusion checkpoint) from the documented
evaluation noise (include/megadlm/core/philox.h, docs/evaluation.md): sample g of the text cut
into S+1-token samples scores its tokens 1..S (L = S); block k draws t_k = uniform_from_u32 of word
0 of philox(key(seed + d, EvalNoise), (k, 1, g lo, g hi)), p_k = (1 - 1e-3) t_k + 1e-3
(inv_t_eps), token i is masked iff uniform_from_u32(philox((i, 2, g lo, g hi)).w0) < p_{blk(i)},
at least one token masked (fallback counters (k, 3, g lo, g hi)); ELBO per token =
sum over masked i of CE_i / p_{blk(i)} over all tokens, each block's CE from the inference-time
form above ([clean blocks < k ; noisy block k]). With --clean causal also the clean stream's
exact next-token NLL per token (a plain causal forward of the sample).

Block greedy decoding (for is_greedy): from the context, block by block at absolute multiples of
B, each block's answer positions start masked and every step commits the single most confident
masked position (probability of its argmax; lower position on ties) from the forward of
[decoded prefix ; the block], until the block is full; then the next block.

usage:
  block_likelihood_reference.py greedy --model HF_DIR --prompts-jsonl F --gen-length G --mask-id M
      --block-size B [--clean causal|block_causal]     (prints {"index", "token_ids"} per prompt)
  block_likelihood_reference.py elbo --model HF_DIR --text-jsonl F --eod E --seq-length S
      --mask-id M --block-size B [--seed S] [--draws D] [--clean causal|block_causal]
  block_likelihood_reference.py loglik --model HF_DIR --requests-jsonl F --output F --mask-id M
      --block-size B --mc-num N --mc-batch B [--seed S] [--clean causal|block_causal]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llada_reference import (PURPOSE_LIKELIHOOD, QwenModel, log_softmax64, philox,  # noqa: E402
                             selftest, uniform53)


def block_masks(seed, g, r, j, a0, ly, batch):
    """Masks [batch, ly] of answer block j (positions a0..a0+ly-1) and counts n_m."""
    w = philox(seed, PURPOSE_LIKELIHOOD, j, 0, g, r)
    k = 1 + min(int(uniform53(w[0], w[1]) * ly), ly - 1)
    n = np.round(k + np.arange(batch) * (ly / batch)).astype(np.int64)  # half to even
    n = ((n - 1) % ly) + 1
    masks = np.zeros((batch, ly), dtype=bool)
    for m in range(batch):
        w = philox(seed, PURPOSE_LIKELIHOOD, a0 + np.arange(ly), 1 + m, g, r)
        order = np.lexsort((np.arange(ly), uniform53(w[0], w[1])))
        masks[m, order[:n[m]]] = True
    return masks, n


def prefix_mask(length, block, start, causal_clean):
    """Attention of [clean prefix of `start` tokens ; one noisy block]: allow[q, k]."""
    q = np.arange(length)[:, None]
    k = np.arange(length)[None, :]
    allow = (q // block) >= (k // block)
    if causal_clean:
        allow = np.where(q < start, k <= q, allow)
    return allow


def loglikelihood(model, context, answer, a, g):
    seq = np.array(list(context) + list(answer), dtype=np.int64)
    lc, ly, bs = len(context), len(answer), a.block_size
    blocks = []
    s = 0
    while s < ly:
        e = min(ly, ((lc + s) // bs + 1) * bs - lc)
        blocks.append((s, e))
        s = e
    estimates = []
    for r in range(a.mc_num // a.mc_batch):
        total = 0.0
        for j, (a0, a1) in enumerate(blocks):
            masks, n = block_masks(a.seed, g, r, j, a0, a1 - a0, a.mc_batch)
            start = (lc + a0) // bs * bs      # the block's first column
            end = lc + a1                     # its last answer position + 1 (= block end or n)
            for m in range(a.mc_batch):
                x = seq[:end].copy()
                pos = lc + a0 + np.nonzero(masks[m])[0]
                x[pos] = a.mask_id
                allow = prefix_mask(end, bs, start, a.clean == "causal")
                lp = log_softmax64(model.logits(x, allow=allow))
                total += float(np.sum(-lp[pos, seq[pos]])) * (a1 - a0) / n[m]
        estimates.append(total / a.mc_batch)
    return -float(np.mean(estimates)), estimates


PURPOSE_EVAL_NOISE = 0x2005


def uniform_from_u32(x):
    return np.float32((int(x) >> 8)) * np.float32(1.0 / 16777216.0)


def elbo(model, stream, a):
    seq, bs = a.seq_length, a.block_size
    samples = (len(stream) - 1) // seq
    per_draw = []
    for d in range(a.draws):
        seed = a.seed + d
        total, tokens = 0.0, 0
        for g in range(samples):
            clean = np.array(stream[g * seq + 1:g * seq + seq + 1], dtype=np.int64)
            lo, hi = g & 0xFFFFFFFF, g >> 32
            blocks = (seq + bs - 1) // bs
            p = []
            for k in range(blocks):
                t = float(uniform_from_u32(philox(seed, PURPOSE_EVAL_NOISE, k, 1, lo, hi)[0]))
                p.append((1.0 - 1e-3) * t + 1e-3)
            mask = np.array([float(uniform_from_u32(philox(seed, PURPOSE_EVAL_NOISE, i, 2, lo, hi)[0])) < p[i // bs]
                             for i in range(seq)])
            k = 0
            while mask.sum() < 1:
                u = float(uniform_from_u32(philox(seed, PURPOSE_EVAL_NOISE, k, 3, lo, hi)[0]))
                mask[min(int(u * seq), seq - 1)] = True
                k += 1
            noisy = np.where(mask, a.mask_id, clean)
            for b in range(blocks):
                start, end = b * bs, min(seq, (b + 1) * bs)
                pos = start + np.nonzero(mask[start:end])[0]
                if len(pos) == 0:
                    continue
                x = np.concatenate([clean[:start], noisy[start:end]])
                lp = log_softmax64(model.logits(x, allow=prefix_mask(end, bs, start, a.clean == "causal")))
                total += float(np.sum(-lp[pos, clean[pos]])) / p[b]
            tokens += seq
        per_draw.append(total / tokens)
    out = {"elbo_per_token": float(np.mean(per_draw)), "per_draw": per_draw, "samples": samples}
    if a.clean == "causal":  # the causal clean stream's exact next-token NLL (tokens 2..S given the rest)
        nll, count = 0.0, 0
        for g in range(samples):
            clean = np.array(stream[g * seq + 1:g * seq + seq + 1], dtype=np.int64)
            causal = np.tril(np.ones((seq, seq), dtype=bool))
            lp = log_softmax64(model.logits(clean, allow=causal))
            nll += float(-np.sum(lp[np.arange(seq - 1), clean[1:]]))
            count += seq - 1
        out["ar_nll_per_token"] = nll / count
    return out


def greedy(model, prompt, a):
    bs, lc = a.block_size, len(prompt)
    x = list(prompt) + [a.mask_id] * a.gen_length
    n = len(x)
    s = lc
    while s < n:
        start = s // bs * bs
        end = min(n, start + bs)
        while any(t == a.mask_id for t in x[s:end]):
            seq = np.array(x[:end], dtype=np.int64)
            logits = model.logits(seq, allow=prefix_mask(end, bs, start, a.clean == "causal")).astype(np.float64)
            best, best_conf, best_tok = -1, -1.0, 0
            for i in range(s, end):
                if x[i] != a.mask_id:
                    continue
                l = logits[i]
                e = np.exp(l - l.max())
                conf = 1.0 / e.sum()  # probability of the argmax
                if conf > best_conf:
                    best, best_conf, best_tok = i, conf, int(np.argmax(l))
            x[best] = best_tok
        s = end
    return x[lc:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["loglik", "elbo", "greedy"])
    ap.add_argument("--prompts-jsonl")
    ap.add_argument("--gen-length", type=int)
    ap.add_argument("--text-jsonl")
    ap.add_argument("--eod", type=int, default=-1)
    ap.add_argument("--seq-length", type=int)
    ap.add_argument("--draws", type=int, default=1)
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests-jsonl")
    ap.add_argument("--output")
    ap.add_argument("--mask-id", type=int, required=True)
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--mc-num", type=int, default=128)
    ap.add_argument("--mc-batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--clean", default="block_causal", choices=["block_causal", "causal"])
    a = ap.parse_args()
    assert a.mc_num % a.mc_batch == 0
    selftest()
    model = QwenModel(a.model)
    out = open(a.output, "w") if a.output else sys.stdout
    if a.mode == "greedy":
        with open(a.prompts_jsonl) as f:
            prompts = [json.loads(line)["prompt_ids"] for line in f if line.strip()]
        for i, p in enumerate(prompts):
            out.write(json.dumps({"index": i, "token_ids": greedy(model, p, a)}) + "\n")
        return
    if a.mode == "elbo":  # NullTokenizer text: whitespace-separated ids, the EOD after each line
        stream = []
        with open(a.text_jsonl) as f:
            for line in f:
                if line.strip():
                    stream += [int(v) for v in json.loads(line)["text"].split()] + ([a.eod] if a.eod >= 0 else [])
        out.write(json.dumps(elbo(model, stream, a)) + "\n")
        return
    with open(a.requests_jsonl) as f:
        reqs = [json.loads(line) for line in f if line.strip()]
    for i, q in enumerate(reqs):
        ll, est = loglikelihood(model, q["context_ids"], q["continuation_ids"], a, i)
        out.write(json.dumps({"index": i, "loglikelihood": ll, "estimates": est}) + "\n")


if __name__ == "__main__":
    main()
