#!/usr/bin/env python3
"""Summarise a pretrain_difflm --metrics-jsonl file (schema: docs/metrics.md): median step time,
tokens/s, TFLOP/s per GPU, MFU (against 811 and 989 TFLOP/s) and peak memory over the training
rows after a warm-up, plus the first and last loss. Validation, test and memory rows are skipped
(files written before rows carried "kind" are read by the fields a row has). Writes JSON and a
Markdown table."""
import argparse, json, statistics, sys


def row_kind(r):
    if "kind" in r:
        return r["kind"]
    return "train" if "elapsed_ms" in r else "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("--skip", type=int, default=2, help="warm-up iterations left out")
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.metrics) if l.strip()]
    train = [r for r in rows if row_kind(r) == "train"]
    if len(train) <= a.skip:
        sys.exit(f"{a.metrics}: {len(train)} logged training iterations, need more than --skip {a.skip}")
    steady = train[a.skip:]
    med = lambda k: statistics.median(r[k] for r in steady)
    s = {
        "label": a.label,
        "iterations_measured": len(steady),
        "elapsed_ms_median": med("elapsed_ms"),
        "tokens_per_s_median": med("tokens_per_s"),
        "tflops_per_gpu_median": med("tflops_per_gpu"),
        "mfu_median": med("mfu"),  # against 811 TFLOP/s (measured cuBLASLt bf16 rate)
        "mfu_989_median": med("mfu_989") if "mfu_989" in steady[0] else med("mfu") * 811.0 / 989.0,
        "peak_mem_gb": max(r["peak_mem_gb"] for r in train),
        "peak_reserved_gb": max((r.get("peak_reserved_gb", 0.0) for r in train), default=0.0),
        "first_lm_loss": train[0]["lm_loss"],
        "last_lm_loss": train[-1]["lm_loss"],
        "global_batch_size": train[0].get("global_batch_size"),
        "device": train[0].get("device"),
    }
    if a.json:
        json.dump(s, open(a.json, "w"), indent=2)
    md = ("| run | ms/iter | tokens/s | TFLOP/s/GPU | MFU (811) | MFU (989) | peak mem in use / reserved (GB) | loss first -> last |\n"
          "|---|---|---|---|---|---|---|---|\n"
          f"| {s['label']} | {s['elapsed_ms_median']:.0f} | {s['tokens_per_s_median']:.0f} | "
          f"{s['tflops_per_gpu_median']:.1f} | {100*s['mfu_median']:.1f}% | {100*s['mfu_989_median']:.1f}% | "
          f"{s['peak_mem_gb']:.1f} / {s['peak_reserved_gb']:.1f} | "
          f"{s['first_lm_loss']:.3f} -> {s['last_lm_loss']:.3f} |\n")
    if a.markdown:
        open(a.markdown, "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
