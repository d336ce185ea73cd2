#!/usr/bin/env python3
"""The block sampler of generate_difflm (docs/generation.md, "Block decoding") in PyTorch on
transformers, for scripts/bench_block_decoding.sh: the same rule with an exact cache of committed
blocks, to time against megadlm. Written from the rule, not from megadlm's C++.

Prompts left padded so that blocks sit at multiples of B of each row's positions (pad columns a
multiple of B, masked out of attention); the prompt's complete blocks are prefilled into a
DynamicCache block by block; each block then takes S / (G / B) greedy low-confidence steps
(LLaDA's transfer counts over the block's masks) in which the block attends the cache and itself
bidirectionally (a 4D additive mask; the cache is cropped back after each step), and one forward of
the finished block appends its keys and values. bf16 on CUDA. Prints tokens_per_s=X.

usage: bench_block_decoding_reference.py --model HF_DIR --prompts-jsonl F --gen-length G --steps S
           --block-length B --mask-id M --batch-size N [--output F]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def transfer_counts(masked, steps):
    base, rem = divmod(masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


@torch.no_grad()
def decode(model, prompts, a, dev):
    b_len, g_len = a.block_length, a.gen_length
    s = a.steps // (g_len // b_len)
    pmax = max(len(p) for p in prompts)
    first = pmax // b_len
    pads = [b_len * (first - len(p) // b_len) for p in prompts]
    ends = [pad + len(p) + g_len for pad, p in zip(pads, prompts)]
    seq = (max(ends) + b_len - 1) // b_len * b_len
    n = len(prompts)
    x = torch.zeros((n, seq), dtype=torch.long, device=dev)
    live = torch.zeros((n, seq), dtype=torch.bool, device=dev)
    pos = torch.zeros((n, seq), dtype=torch.long, device=dev)
    for r, (p, pad, end) in enumerate(zip(prompts, pads, ends)):
        x[r, pad:pad + len(p)] = torch.tensor(p, device=dev)
        x[r, pad + len(p):end] = a.mask_id
        live[r, pad:end] = True
        pos[r, pad:end] = torch.arange(end - pad, device=dev)
    neg = torch.finfo(model.dtype).min

    def forward(cache, c0, c1):
        # Keys [0, c1): a query sees the live columns of its row (pads hidden; a pad query sees itself).
        keys = live[:, :c1].clone()
        keys[:, c0:c1] |= ~live[:, c0:c1]
        mask = torch.where(keys, 0.0, neg).to(model.dtype)[:, None, None, :].expand(n, 1, c1 - c0, c1)
        out = model(input_ids=x[:, c0:c1], position_ids=pos[:, c0:c1], attention_mask=mask.contiguous(),
                     past_key_values=cache, use_cache=True)
        return out.logits

    from transformers import DynamicCache

    def drop_after(cache, keep):
        # The step's keys and values go; the committed blocks stay. A negative crop removes that
        # many tokens; crop(0) is a no-op in recent transformers (a prompt shorter than one block
        # starts at block 0), so an empty prefix gets a fresh cache.
        if keep == 0:
            return DynamicCache()
        extra = cache.get_seq_length() - keep
        if extra > 0:
            cache.crop(-extra)
        return cache

    cache = DynamicCache()
    for j in range(first):
        forward(cache, j * b_len, (j + 1) * b_len)
    for j in range(first, seq // b_len):
        b0, b1 = j * b_len, (j + 1) * b_len
        blk = (x[:, b0:b1] == a.mask_id)
        sched = [transfer_counts(int(blk[r].sum()), s) for r in range(n)]
        for i in range(s):
            if all(c[i] == 0 for c in sched):
                continue
            logits = forward(cache, b0, b1).float()
            cache = drop_after(cache, b0)
            prob = torch.softmax(logits, dim=-1)
            conf, tok = prob.max(dim=-1)
            masked = x[:, b0:b1] == a.mask_id
            conf = torch.where(masked, conf, torch.tensor(-1.0, device=dev))
            for r in range(n):
                k = sched[r][i]
                if k == 0:
                    continue
                idx = torch.topk(conf[r], k).indices
                x[r, b0 + idx] = tok[r, idx]
        if b1 < seq:
            forward(cache, b0, b1)  # the finished block's clean keys and values, kept
    return [x[r, pad + len(p):end].tolist() for r, (p, pad, end) in enumerate(zip(prompts, pads, ends))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts-jsonl", required=True)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--mask-id", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--output")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16 if dev == "cuda" else torch.float32,
                                                 attn_implementation="sdpa").to(dev).eval()
    prompts = [json.loads(l)["prompt_ids"] for l in open(a.prompts_jsonl) if l.strip()]
    decode(model, prompts[:1], a, dev)  # warm-up
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(prompts), a.batch_size):
        outs += decode(model, prompts[i:i + a.batch_size], a, dev)
    if dev == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    tokens = sum(len(o) for o in outs)
    if a.output:
        with open(a.output, "w") as f:
            for o in outs:
                f.write(json.dumps({"token_ids": o}) + "\n")
    print(f"tokens={tokens} seconds={secs:.3f} tokens_per_s={tokens / secs:.2f}")


if __name__ == "__main__":
    main()
