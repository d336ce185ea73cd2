#!/usr/bin/env python3
"""The estimators of evaluate_difflm (docs/evaluation.md) in PyTorch on transformers, for
scripts/device_block_evaluation.sh: the same work per example, to time against megadlm. Written
from the rule, not from megadlm's C++; its random numbers are torch's and Python's, not megadlm's
Philox streams, so the values agree in distribution, not draw for draw (the means are printed so
that a reader can see they are of the same magnitude).

The model is a megadlm checkpoint exported with `convert_checkpoint --to-hf` (a Qwen2/Qwen3
folder). Its config.json says what transformers cannot: `megadlm.attention` (`block_causal` for
a block-diffusion model), `block_size`, `megadlm.bd_clean_attention`, `megadlm.vocab_size` (the
unpadded vocabulary: every cross entropy is over those rows of the output layer, as
evaluate_difflm's) and `megadlm.mask_token_id`. The model runs in bf16 on CUDA (fp32 on the CPU),
attention "sdpa", every forward with explicit position_ids and a 4D additive attention mask
(0 visible, the dtype's lowest value hidden; transformers passes a 4D mask through unchanged).
Logits are computed only at the scored positions (the decoder's hidden states gathered, then the
output layer), as evaluate_difflm does.

Block-diffusion model (block B): each forward runs the doubled row [x_t | x_0] (2n tokens, both
halves at positions 0..n-1) under the block-diffusion mask, blocks at multiples of B from the
row's first token (p = position, bs/be its block's start/end):
  noisy query: noisy keys of its own block (bs <= kp < be) and clean keys of earlier blocks (kp < bs);
  clean query: clean keys of its own and earlier blocks (kp < be; kp <= p for a causal clean half).
Full-sequence model: the row x_t alone, bidirectional (an all-zero mask).

* ELBO (--task elbo): --text-jsonl read as NullTokenizer does (whitespace-separated ids, the
  document's EOD = vocab_size - 1 appended), concatenated; sample i = tokens [i*S, i*S + S], the
  clean row x_0 = tokens 1..S of it; --micro-batch-size samples per forward, one noise draw. Each
  block (block model; the whole row for the full-sequence one, or with --t-granularity sequence)
  draws t ~ U[0, 1) and masks each token with probability p(t), at least --min-masked tokens a row;
  a masked token's cross entropy weighs --loss-weight of its block: exact_ratio (the block's length
  over its masked count), inv_t (1/t, t + 2^-24) or inv_t_eps (1/p, p = (1 - 1e-3) t + 1e-3).
  elbo_per_token = sum / (samples x S). Examples: samples.
* Multiple choice (--task multiple-choice): --task-jsonl with "context_ids", "choices_ids",
  "gold"; each choice is the request [context ; answer] (Ly answer tokens) scored by LLaDA's
  Monte-Carlo estimator of log p(answer | context): --mc-num / --mc-batch-size forwards of
  --mc-batch-size rows each. Per forward and per answer block j (the block model: each block
  holding answer positions, Ly_j of them; the full-sequence model: one group of all Ly), k_j ~
  U{1..Ly_j}, row m masks n_{j,m} = ((round_half_even(k_j + m Ly_j / M) - 1) mod Ly_j) + 1
  uniformly chosen answer positions of the group, the context stays clean; estimate = (1/M)
  sum_m sum_j sum_masked CE x Ly_j / n_{j,m}; log p = -mean over the forwards. acc: the highest
  log p is the gold choice. Examples: documents.

Timing: after one untimed warm-up forward (the first micro-batch or the first request's first
mini-batch), from the first timed forward to the last, with the host work in between (the same
span evaluate_difflm's examples_per_second covers). Prints, per task, one line
`reference task=T model=NAME ... examples_per_s=X ...` (also as JSON with --summary-json).

A self-check first (one short row, two blocks): changing a token that a position must not see
leaves its hidden state unchanged, and changing one it must see changes it; it fails loudly when
the installed transformers ignores the mask (the timing would then be of another computation).

usage: bench_block_evaluation_reference.py --model HF_DIR --name NAME [--task elbo|multiple-choice|both]
           [--text-jsonl F --seq-length S --micro-batch-size 4 --max-samples N]
           [--task-jsonl F --mc-num 128 --mc-batch-size 16 --max-documents N]
           [--loss-weight exact_ratio|inv_t|inv_t_eps] [--min-masked 1] [--t-granularity block|sequence]
           [--mask-id M] [--vocab-size V] [--seed S] [--summary-json F]
"""
import argparse
import json
import os
import random
import sys
import time

import torch
from transformers import AutoModelForCausalLM


class Model:
    """The transformers model and what config.json says about the diffusion model."""

    def __init__(self, path, a, dev):
        cfg = json.load(open(os.path.join(path, "config.json")))
        meg = cfg.get("megadlm", {})
        self.block = int(cfg.get("block_size") or 0) if meg.get("attention") == "block_causal" else 0
        self.causal_clean = meg.get("bd_clean_attention") == "causal"
        self.vocab = a.vocab_size if a.vocab_size is not None else int(meg.get("vocab_size", cfg["vocab_size"]))
        mask = a.mask_id if a.mask_id is not None else meg.get("mask_token_id", cfg.get("mask_token_id"))
        if mask is None:
            sys.exit(f"{path}/config.json names no mask token: give --mask-id")
        self.mask_id = int(mask)
        self.dev = dev
        self.dtype = torch.bfloat16 if dev == "cuda" else torch.float32
        self.hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=self.dtype,
                                                       attn_implementation="sdpa").to(dev).eval()
        for module in self.hf.modules():  # bidirectional where the mask says so
            if hasattr(module, "is_causal"):
                module.is_causal = False
        self.decoder = self.hf.get_decoder() if hasattr(self.hf, "get_decoder") else self.hf.model
        self.head = self.hf.get_output_embeddings()
        self.neg = torch.finfo(self.dtype).min
        self._masks = {}

    def visible(self, n):
        """[T, T] bool, query rows x key columns: the doubled row's block mask, or all of x_t."""
        p = torch.arange(n, device=self.dev)
        if not self.block:
            return torch.ones((n, n), dtype=torch.bool, device=self.dev)
        bs = (p // self.block * self.block)[:, None]
        be = torch.clamp(bs + self.block, max=n)
        k = p[None, :]
        noisy_noisy = (k >= bs) & (k < be)
        noisy_clean = k < bs
        clean_noisy = torch.zeros((n, n), dtype=torch.bool, device=self.dev)
        clean_clean = (k <= p[:, None]) if self.causal_clean else (k < be)
        return torch.cat([torch.cat([noisy_noisy, noisy_clean], 1), torch.cat([clean_noisy, clean_clean], 1)], 0)

    def mask(self, n, rows):
        """The additive 4D mask [rows, 1, T, T] of requests of n tokens (cached)."""
        key = (n, rows)
        if key not in self._masks:
            if len(self._masks) > 64:
                self._masks.clear()
            add = torch.where(self.visible(n), 0.0, self.neg).to(self.dtype)
            self._masks[key] = add[None, None].expand(rows, 1, *add.shape).contiguous()
        return self._masks[key]

    def row(self, noisy, clean):
        """input_ids and position_ids of the forward: [x_t | x_0] for a block model, else x_t."""
        rows, n = noisy.shape
        pos = torch.arange(n, device=self.dev).expand(rows, n)
        if self.block:
            return torch.cat([noisy, clean], 1), torch.cat([pos, pos], 1)
        return noisy, pos

    @torch.no_grad()
    def hidden(self, ids, pos):
        n = pos.shape[1] // 2 if self.block else pos.shape[1]
        out = self.decoder(input_ids=ids, position_ids=pos, attention_mask=self.mask(n, ids.shape[0]), use_cache=False)
        return out.last_hidden_state

    @torch.no_grad()
    def token_ce(self, h, targets):
        """Cross entropy of the gathered hidden states [k, H] over the real vocabulary."""
        logits = self.head(h)[:, :self.vocab].float()
        return torch.nn.functional.cross_entropy(logits, targets, reduction="none")


@torch.no_grad()
def self_check(m):
    """The mask is honoured: rows that must not see a changed token keep their hidden state."""
    g = torch.Generator().manual_seed(0)
    b = m.block or 4
    n = 2 * b
    clean = torch.randint(0, m.mask_id, (1, n), generator=g).to(m.dev)
    clean[clean == m.mask_id] = 0
    noisy = clean.clone()
    noisy[0, 1::2] = m.mask_id

    def h(nz, cl):
        return m.hidden(*m.row(nz, cl))[0].float()

    base = h(noisy, clean)
    cases = []  # (what, changed hidden, rows that must change, rows that must not)
    if m.block:
        nz = noisy.clone()
        nz[0, b] = (int(nz[0, b]) + 1) % m.mask_id  # a noisy token of block 1
        cases.append(("noisy token of block 1", h(nz, clean), list(range(b, n)), list(range(b)) + list(range(n, 2 * n))))
        cl = clean.clone()
        cl[0, 0] = (int(cl[0, 0]) + 1) % m.mask_id  # a clean token of block 0
        cases.append(("clean token of block 0", h(noisy, cl), list(range(b, n)) + list(range(n, 2 * n)), list(range(b))))
        cl = clean.clone()
        cl[0, n - 1] = (int(cl[0, n - 1]) + 1) % m.mask_id  # the last clean token (block 1)
        must_not = list(range(n)) + (list(range(n, 2 * n - 1)) if m.causal_clean else list(range(n, n + b)))
        cases.append(("last clean token", h(noisy, cl), [2 * n - 1], must_not))
    else:
        nz = noisy.clone()
        nz[0, n - 1] = (int(nz[0, n - 1]) + 1) % m.mask_id
        cases.append(("last token (bidirectional)", h(nz, clean), list(range(n)), []))
    for what, changed, must, must_not in cases:
        diff = (changed - base).abs().amax(dim=-1)
        effect = float(diff[must].min())
        leak = float(diff[must_not].max()) if must_not else 0.0
        if not (effect > 0 and leak <= 1e-3 * effect):
            sys.exit(f"self-check failed ({what}): rows that must see it changed by >= {effect:.3g}, rows that must "
                     f"not by up to {leak:.3g}: the installed transformers does not apply the 4D attention mask")
    print(f"reference self-check: the {'block-diffusion' if m.block else 'bidirectional'} mask is honoured "
          f"({len(cases)} cases)", flush=True)


def read_samples(path, seq, vocab, max_samples):
    """NullTokenizer's stream (ids + EOD = vocab - 1 per document) cut into samples of seq + 1."""
    stream = []
    for line in open(path):
        if line.strip():
            stream += [int(w) for w in json.loads(line)["text"].split()] + [vocab - 1]
    n = (len(stream) - 1) // seq if len(stream) > 1 else 0
    if max_samples is not None:
        n = min(n, max_samples)
    return [stream[i * seq:i * seq + seq + 1] for i in range(n)]


def noise(m, clean, a, gen):
    """x_t and the per-token loss weights (0 where not masked) of clean [b, L]."""
    b, L = clean.shape
    group_len = m.block if (m.block and a.t_granularity == "block") else L
    groups = L // group_len
    t = torch.rand((b, groups), device=m.dev, generator=gen, dtype=torch.float64)
    p = t
    if a.loss_weight == "inv_t":
        t = t + 2.0 ** -24
        p = t
    elif a.loss_weight == "inv_t_eps":
        p = (1 - 1e-3) * t + 1e-3
    u = torch.rand((b, L), device=m.dev, generator=gen, dtype=torch.float64)
    masked = u < p.repeat_interleave(group_len, dim=1)
    need = min(a.min_masked, L)
    if need > 0:  # at least min_masked a row (rare at these lengths: a loop over the rows short of it)
        counts = masked.sum(dim=1)
        for r in torch.nonzero(counts < need).flatten().tolist():
            free = torch.nonzero(~masked[r]).flatten()
            pick = free[torch.randperm(free.numel(), device=m.dev, generator=gen)[:need - int(counts[r])]]
            masked[r, pick] = True
    per_group = masked.view(b, groups, group_len)
    if a.loss_weight == "exact_ratio":
        cnt = per_group.sum(dim=2).double()
        w = torch.where(cnt > 0, group_len / cnt.clamp(min=1), torch.zeros_like(cnt))
    elif a.loss_weight == "inv_t":
        w = 1.0 / t
    else:
        w = 1.0 / p
    weight = torch.where(masked, w.repeat_interleave(group_len, dim=1), torch.zeros_like(u))
    return torch.where(masked, torch.full_like(clean, m.mask_id), clean), masked, weight


@torch.no_grad()
def elbo_batch(m, batch, a, gen):
    clean = torch.tensor([s[1:] for s in batch], dtype=torch.long, device=m.dev)
    noisy, masked, weight = noise(m, clean, a, gen)
    h = m.hidden(*m.row(noisy, clean))[:, :clean.shape[1]]  # the noisy half is scored
    ce = m.token_ce(h[masked], clean[masked])
    return (ce.double() * weight[masked]).sum(), clean.numel()


def run_elbo(m, a, gen):
    samples = read_samples(a.text_jsonl, a.seq_length, m.vocab, a.max_samples)
    if not samples:
        sys.exit(f"{a.text_jsonl}: fewer tokens than one sample of {a.seq_length} + 1")
    elbo_batch(m, samples[:a.micro_batch_size], a, gen)  # warm-up, untimed
    sync(m)
    t0 = time.perf_counter()
    total, tokens = 0.0, 0
    for first in range(0, len(samples), a.micro_batch_size):
        s, n = elbo_batch(m, samples[first:first + a.micro_batch_size], a, gen)
        total += s
        tokens += n
    total = float(total)
    sync(m)
    sec = time.perf_counter() - t0
    return {"task": "elbo", "samples": len(samples), "seq_length": a.seq_length, "micro_batch_size": a.micro_batch_size,
            "elbo_per_token": total / tokens, "seconds": sec, "examples_per_s": len(samples) / sec}


def answer_groups(m, lc, ly):
    """[a0, a1) answer-relative ranges drawn separately: each answer block, or the whole answer."""
    if not m.block:
        return [(0, ly)]
    out, a = [], 0
    while a < ly:
        end = min(ly, ((lc + a) // m.block + 1) * m.block - lc)
        out.append((a, end))
        a = end
    return out


@torch.no_grad()
def loglik(m, context, answer, a, gen, rng, repeats=None):
    lc, ly = len(context), len(answer)
    if ly == 0:
        return 0.0
    bsz = a.mc_batch_size
    clean = torch.tensor(context + answer, dtype=torch.long, device=m.dev)[None].expand(bsz, lc + ly).contiguous()
    ans = clean[:, lc:]
    estimates = []
    for _ in range(repeats if repeats is not None else a.mc_num // bsz):
        masked = torch.zeros((bsz, ly), dtype=torch.bool, device=m.dev)
        weight = torch.zeros((bsz, ly), dtype=torch.float64, device=m.dev)
        for a0, a1 in answer_groups(m, lc, ly):
            n = a1 - a0
            k = rng.randint(1, n)  # one k per group and forward, shared by its rows; stratified counts
            counts = [((round(k + r * n / bsz) - 1) % n) + 1 for r in range(bsz)]
            c = torch.tensor(counts, device=m.dev)
            rank = torch.rand((bsz, n), device=m.dev, generator=gen).argsort(dim=1).argsort(dim=1)
            masked[:, a0:a1] = rank < c[:, None]
            weight[:, a0:a1] = (n / c.double())[:, None]
        noisy = clean.clone()
        noisy[:, lc:] = torch.where(masked, torch.full_like(ans, m.mask_id), ans)
        h = m.hidden(*m.row(noisy, clean))[:, lc:lc + ly]
        ce = m.token_ce(h[masked], ans[masked])
        estimates.append((ce.double() * weight[masked]).sum() / bsz)
    return -float(torch.stack(estimates).mean())


def run_multiple_choice(m, a, gen, rng):
    docs = [json.loads(l) for l in open(a.task_jsonl) if l.strip()]
    if a.max_documents is not None:
        docs = docs[:a.max_documents]
    loglik(m, docs[0]["context_ids"], docs[0]["choices_ids"][0], a, gen, rng, repeats=1)  # warm-up, untimed
    sync(m)
    t0 = time.perf_counter()
    correct, lls = 0, []
    for d in docs:
        ll = [loglik(m, d["context_ids"], c, a, gen, rng) for c in d["choices_ids"]]
        correct += max(range(len(ll)), key=lambda i: (ll[i], -i)) == d["gold"]
        lls += ll
    sync(m)
    sec = time.perf_counter() - t0
    return {"task": "multiple-choice", "documents": len(docs), "mc_num": a.mc_num, "mc_batch_size": a.mc_batch_size,
            "acc": correct / len(docs), "mean_loglikelihood": sum(lls) / len(lls), "seconds": sec,
            "examples_per_s": len(docs) / sec}


def sync(m):
    if m.dev == "cuda":
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face folder written by convert_checkpoint --to-hf")
    ap.add_argument("--name", default="model", help="the model's name in the output lines")
    ap.add_argument("--task", choices=["elbo", "multiple-choice", "both"], default="both")
    ap.add_argument("--text-jsonl")
    ap.add_argument("--seq-length", type=int, default=2048)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--max-samples", type=int)
    ap.add_argument("--task-jsonl")
    ap.add_argument("--mc-num", type=int, default=128)
    ap.add_argument("--mc-batch-size", type=int, default=16)
    ap.add_argument("--max-documents", type=int)
    ap.add_argument("--loss-weight", choices=["exact_ratio", "inv_t", "inv_t_eps"], default="exact_ratio")
    ap.add_argument("--min-masked", type=int, default=1)
    ap.add_argument("--t-granularity", choices=["block", "sequence"], default="block")
    ap.add_argument("--mask-id", type=int)
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--summary-json")
    a = ap.parse_args()
    tasks = ["elbo", "multiple-choice"] if a.task == "both" else [a.task]
    if "elbo" in tasks and not a.text_jsonl:
        ap.error("--task elbo needs --text-jsonl")
    if "multiple-choice" in tasks and not a.task_jsonl:
        ap.error("--task multiple-choice needs --task-jsonl")
    if a.mc_batch_size < 1 or a.mc_num % a.mc_batch_size != 0:
        ap.error("--mc-num must be a positive multiple of --mc-batch-size")
    m = Model(a.model, a, a.device)
    kind = f"block diffusion, block {m.block}{', causal clean half' if m.causal_clean else ''}" if m.block else "full sequence"
    print(f"reference model {a.name}: {kind}, vocab {m.vocab}, mask {m.mask_id}, {m.dtype} on {a.device}, "
          f"transformers {__import__('transformers').__version__}, torch {torch.__version__}", flush=True)
    self_check(m)
    gen = torch.Generator(device=a.device).manual_seed(a.seed)
    rng = random.Random(a.seed)
    if a.summary_json:
        open(a.summary_json, "w").close()
    for task in tasks:
        r = run_elbo(m, a, gen) if task == "elbo" else run_multiple_choice(m, a, gen, rng)
        r["model"] = a.name
        print("reference " + " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in r.items()), flush=True)
        if a.summary_json:  # one line per task as it finishes (a time-out keeps the finished ones)
            with open(a.summary_json, "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
