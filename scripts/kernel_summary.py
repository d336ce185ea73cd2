#!/usr/bin/env python3
"""Per-kernel time of one profiled range, from Nsight Compute's CSV (scripts/profile_kernels.sh).

    python3 scripts/kernel_summary.py NCU_CSV [--wall-ms MS] [--top N] [--json OUT.json]

Reads the rows `ncu --csv --page raw --metrics gpu__time_duration.sum` printed, groups the kernels
by name and by a coarse family (GEMM, attention, MoE, norm, optimizer, ...), and prints a markdown
table: calls, total ms, share of the summed GPU time. With --wall-ms (the iteration's time without
the profiler, from the metrics JSONL) it also states how much of the wall time no kernel ran:
launch gaps and host synchronisations, which ncu's serialised replay itself cannot show.
"""
import argparse
import collections
import csv
import json
import re
import sys

FAMILIES = [  # first match wins
    ("attention (cuDNN)", r"cudnn|sdpa|fprop|bprop|dot_do_o|convert_dq"),
    ("attention (own)", r"flash|attention"),
    ("GEMM", r"nvjet|gemm|cutlass|xmma|sm90_|s16816|tensorop"),
    ("MoE routing/permute", r"moe|permute|route|topk|expert|dispatch|gather_rows|scatter"),
    ("norm", r"norm"),
    ("optimizer", r"adam|optimizer|multi_tensor"),
    ("cross-entropy / head", r"cross_entropy|linear_cross|logits|softmax"),
    ("rope / qk", r"rope|qk_"),
    ("activation", r"swiglu|gelu|silu|activation"),
    ("reduction", r"reduce|norm_sq|sum"),
    ("copy / fill / convert", r"copy|fill|memset|convert|cast|zero"),
]


def family(name):
    low = name.lower()
    for label, pattern in FAMILIES:
        if re.search(pattern, low):
            return label
    return "other"


def read_rows(path):
    text = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(text) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"kernel_summary.py: no ncu CSV header in {path}")
    reader = csv.DictReader(text[start:])
    for row in reader:
        value = row.get("gpu__time_duration.sum", "")
        try:
            ns = float(value.replace(",", ""))
        except ValueError:
            continue  # the units row
        yield row.get("Kernel Name", "?"), ns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--wall-ms", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    by_name = collections.defaultdict(lambda: [0, 0.0])
    by_family = collections.defaultdict(lambda: [0, 0.0])
    for name, ns in read_rows(a.csv):
        short = re.sub(r"\(.*", "", name)[:90]
        by_name[short][0] += 1
        by_name[short][1] += ns / 1e6
        f = by_family[family(name)]
        f[0] += 1
        f[1] += ns / 1e6
    total = sum(v[1] for v in by_family.values())
    calls = sum(v[0] for v in by_family.values())
    if a.title:
        print(f"### {a.title}\n")
    print(f"{calls} kernels, {total:.2f} ms of GPU time summed", end="")
    if a.wall_ms > 0:
        print(f"; wall time {a.wall_ms:.2f} ms without the profiler: "
              f"{max(0.0, a.wall_ms - total):.2f} ms ({max(0.0, 1 - total / a.wall_ms) * 100:.1f} %) with no kernel running", end="")
    print("\n\n| family | calls | ms | share |\n|---|---|---|---|")
    for label, (n, ms) in sorted(by_family.items(), key=lambda kv: -kv[1][1]):
        print(f"| {label} | {n} | {ms:.2f} | {ms / total * 100:.1f} % |")
    print(f"\n| kernel (top {a.top}) | calls | ms | µs per call | share |\n|---|---|---|---|---|")
    for name, (n, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"| `{name}` | {n} | {ms:.2f} | {ms / n * 1e3:.1f} | {ms / total * 100:.1f} % |")
    if a.json:
        json.dump({"total_ms": total, "calls": calls, "wall_ms": a.wall_ms,
                   "families": {k: {"calls": v[0], "ms": v[1]} for k, v in by_family.items()},
                   "kernels": {k: {"calls": v[0], "ms": v[1]} for k, v in by_name.items()}},
                  open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
