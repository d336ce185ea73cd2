#!/usr/bin/env python3
"""The comparison point of scripts/bench_generate.sh: transformers + LLaDA's sampler in PyTorch.

Loads an exported megadlm model (convert_checkpoint --to-hf) with transformers, switches its
attention to bidirectional (the causal flag cleared, an additive 4-D mask that hides only the
left padding, positions counted from each row's first prompt token), and runs LLaDA's generate
as LLaDA's generate.py does it (low_confidence or random remasking, temperature with
float64 Gumbel noise from torch.rand, semi-autoregressive blocks), a batch of prompts at a time.
Writes the completions as JSONL (index, token_ids) and prints one JSON line with the timing.
Benchmark code, not a test: the exact agreement with megadlm is tested on the CPU by
tests/golden/llada_reference.py.

usage: bench_generate_reference.py --model HF_DIR --prompts-jsonl F --mask-id M --gen-length 256
       --steps 256 --block-length 32 --batch-size 16 [--output F] [--dtype bf16|fp32] [--warmup 1]
       [--max-prompts N]
"""
import argparse
import json
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM
except ImportError as e:
    sys.exit(f"bench_generate_reference.py: needs torch and transformers ({e})")


def bidirectional(model):
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False


def num_transfer_tokens(masked, steps):
    base, rem = divmod(masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


@torch.no_grad()
def generate(model, prompts, a, dtype):
    dev = next(model.parameters()).device
    b = len(prompts)
    p_len = max(len(p) for p in prompts)
    seq = p_len + a.gen_length
    x = torch.full((b, seq), a.mask_id, dtype=torch.long, device=dev)
    valid = torch.zeros((b, seq), dtype=torch.bool, device=dev)
    for r, p in enumerate(prompts):
        x[r, p_len - len(p):p_len] = torch.tensor(p, device=dev)
        valid[r, p_len - len(p):] = True
    x[~valid] = 0
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    # Additive mask [b, 1, seq, seq]: keys outside the row's tokens hidden; pad queries see only
    # themselves (their outputs are never used, but a row of -inf would give NaN).
    neg = torch.finfo(dtype).min
    keep = valid[:, None, None, :] | torch.eye(seq, dtype=torch.bool, device=dev)[None, None]
    mask = torch.zeros((b, 1, seq, seq), dtype=dtype, device=dev).masked_fill(~keep, neg)
    blocks = a.gen_length // a.block_length
    steps = a.steps // blocks
    forwards = 0
    for q in range(blocks):
        end = p_len + (q + 1) * a.block_length
        schedule = num_transfer_tokens(a.block_length, steps)
        for i in range(steps):
            if schedule[i] == 0:
                continue
            logits = model(input_ids=x, attention_mask=mask, position_ids=positions).logits
            forwards += 1
            is_mask = x == a.mask_id
            if a.temperature > 0:
                l64 = logits.to(torch.float64)
                g = (-torch.log(torch.rand_like(l64))) ** a.temperature
                x0 = torch.argmax(l64.exp() / g, dim=-1)
            else:
                x0 = torch.argmax(logits, dim=-1)
            if a.remasking == "low_confidence":
                p = F.softmax(logits.to(torch.float64), dim=-1)
                conf = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
            else:
                conf = torch.rand(x0.shape, device=dev, dtype=torch.float64)
            conf[:, end:] = -float("inf")
            conf = torch.where(is_mask, conf, torch.full_like(conf, -float("inf")))
            x0 = torch.where(is_mask, x0, x)
            sel = torch.topk(conf, k=schedule[i], dim=-1).indices
            x.scatter_(1, sel, torch.gather(x0, 1, sel))
    return x[:, p_len:].tolist(), forwards


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts-jsonl", required=True)
    ap.add_argument("--mask-id", type=int, required=True)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"])
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--warmup", type=int, default=1, help="untimed batches first")
    ap.add_argument("--max-prompts", type=int, default=0, help="only the first N prompts (0: all)")
    ap.add_argument("--output")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    try:  # transformers >= 4.56 names it dtype; older ones torch_dtype
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype, attn_implementation="sdpa")
    model = model.cuda().eval()
    bidirectional(model)
    prompts = [json.loads(l)["prompt_ids"] for l in open(a.prompts_jsonl) if l.strip()]
    if a.max_prompts:
        prompts = prompts[:a.max_prompts]
    batches = [prompts[i:i + a.batch_size] for i in range(0, len(prompts), a.batch_size)]
    warm = argparse.Namespace(**vars(a))  # two steps a block: every shape once, a fraction of the time
    warm.steps = min(a.steps, 2 * (a.gen_length // a.block_length))
    for w in range(min(a.warmup, len(batches))):
        generate(model, batches[w], warm, dtype)
    torch.cuda.synchronize()
    out, forwards, t0 = [], 0, time.perf_counter()
    for batch in batches:
        toks, f = generate(model, batch, a, dtype)
        out += toks
        forwards += f
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if a.output:
        with open(a.output, "w") as f:
            for i, t in enumerate(out):
                f.write(json.dumps({"index": i, "token_ids": t}) + "\n")
    tokens = len(out) * a.gen_length
    print(json.dumps({"impl": "transformers+reference", "batch_size": a.batch_size, "prompts": len(out),
                      "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "forwards": forwards,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
