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

usage:
  block_likelihood_reference.py --model HF_DIR --requests-jsonl F --output F --mask-id M
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests-jsonl", required=True)
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
    with open(a.requests_jsonl) as f:
        reqs = [json.loads(line) for line in f if line.strip()]
    for i, q in enumerate(reqs):
        ll, est = loglikelihood(model, q["context_ids"], q["continuation_ids"], a, i)
        out.write(json.dumps({"index": i, "loglikelihood": ll, "estimates": est}) + "\n")


if __name__ == "__main__":
    main()
