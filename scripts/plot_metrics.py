#!/usr/bin/env python3
"""Draws a training run's curves from pretrain_difflm's --metrics-jsonl into one PNG.

Four panels against the iteration: lm loss (per logged interval) with the validation loss,
learning rate, throughput (tokens/s), and TFLOP/s per GPU. Several files overlay several runs.

usage: plot_metrics.py METRICS.jsonl [MORE.jsonl ...] --output curves.png [--title TEXT]
Needs matplotlib (Debian: apt-get install python3-matplotlib); without it, exits 2 saying so.
"""
import argparse
import json
import os
import sys


def load(path):
    train, valid = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                j = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics.py: {path} line {n} is not JSON ({e})")
            if "lm_loss" in j:
                train.append(j)
            if "validation_lm_loss" in j:
                valid.append(j)
    if not train and not valid:
        sys.exit(f"plot_metrics.py: {path} has no iteration or validation lines (is it a --metrics-jsonl file?)")
    return train, valid


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--output", required=True)
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    runs = [(os.path.basename(p), *load(p)) for p in a.metrics]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_metrics.py: matplotlib is not installed ({e}); install it "
              "(apt-get install python3-matplotlib, or pip install matplotlib) to draw curves", file=sys.stderr)
        sys.exit(2)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    panels = [(ax[0][0], "lm_loss", "lm loss"), (ax[0][1], "lr", "learning rate"),
              (ax[1][0], "tokens_per_s", "throughput (tokens/s)"), (ax[1][1], "tflops_per_gpu", "TFLOP/s per GPU")]
    for name, train, valid in runs:
        for axis, key, _ in panels:
            pts = [(j["iteration"], j[key]) for j in train if key in j and j[key] is not None]
            if pts:
                axis.plot(*zip(*pts), label=name if key != "lm_loss" else f"{name} train")
        vpts = [(j["iteration"], j["validation_lm_loss"]) for j in valid]
        if vpts:
            ax[0][0].plot(*zip(*vpts), "o-", label=f"{name} validation")
    for axis, key, label in panels:
        axis.set_xlabel("iteration")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        if axis.get_lines():
            axis.legend(fontsize=8)
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.output, dpi=100)
    print(f"plot_metrics.py: wrote {a.output} ({sum(len(t) for _, t, _ in runs)} iteration lines, "
          f"{sum(len(v) for _, _, v in runs)} validation lines)")


if __name__ == "__main__":
    main()
