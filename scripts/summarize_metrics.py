#!/usr/bin/env python3
"""Summarise a pretrain_difflm --metrics-jsonl file (one object per logged iteration):
median step time, tokens/s, TFLOP/s per GPU, MFU and peak memory over the iterations after a
warm-up, plus the first and last loss. Writes JSON and a Markdown table."""
import argparse, json, statistics, sys

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("--skip", type=int, default=2, help="warm-up iterations left out")
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.metrics) if l.strip()]
    if len(rows) <= a.skip:
        sys.exit(f"{a.metrics}: {len(rows)} logged iterations, need more than --skip {a.skip}")
    steady = rows[a.skip:]
    med = lambda k: statistics.median(r[k] for r in steady)
    s = {
        "label": a.label,
        "iterations_measured": len(steady),
        "elapsed_ms_median": med("elapsed_ms"),
        "tokens_per_s_median": med("tokens_per_s"),
        "tflops_per_gpu_median": med("tflops_per_gpu"),
        "mfu_median": med("mfu"),
        "peak_mem_gb": max(r["peak_mem_gb"] for r in rows),
        "first_lm_loss": rows[0]["lm_loss"],
        "last_lm_loss": rows[-1]["lm_loss"],
        "global_batch_size": rows[0].get("global_batch_size"),
        "device": rows[0].get("device"),
    }
    if a.json:
        json.dump(s, open(a.json, "w"), indent=2)
    md = ("| run | ms/iter | tokens/s | TFLOP/s/GPU | MFU | peak mem (GB) | loss first -> last |\n"
          "|---|---|---|---|---|---|---|\n"
          f"| {s['label']} | {s['elapsed_ms_median']:.0f} | {s['tokens_per_s_median']:.0f} | "
          f"{s['tflops_per_gpu_median']:.1f} | {100*s['mfu_median']:.1f}% | {s['peak_mem_gb']:.1f} | "
          f"{s['first_lm_loss']:.3f} -> {s['last_lm_loss']:.3f} |\n")
    if a.markdown:
        open(a.markdown, "w").write(md)
    print(md)

if __name__ == "__main__":
    main()
