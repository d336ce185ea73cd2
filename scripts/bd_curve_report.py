#!/usr/bin/env python3
"""Compares megadlm's block-diffusion loss curve with the PyTorch peer's (scripts/bd_loss_curve.sh).

Inputs: per-iteration losses as JSON lines with "iteration" and "lm_loss" (pretrain_difflm's
--metrics-jsonl with --log-interval 1, and scripts/bd_curve_vs_peer.py's output): megadlm's run
and two peer runs from the same initial weights on the same rows, differing only in the masking
noise (its seed). The masking noise of megadlm and the peer cannot be the same (different random
number generators), so the curves are compared statistically:

  MA_x(i)   trailing moving average of run x's loss over the last W iterations (W = --window)
  sigma     standard deviation, over iterations W..N, of the per-iteration difference of the two
            peer runs: the spread of the loss between two noise draws of one implementation
  bound     K * sigma / sqrt(W) (K = --k): how far two moving averages of independent noise draws
            of the same function stray apart (K standard deviations)
  row i     |MA_megadlm(i) - MA_peer(i)| <= bound  (every --every iterations, from W on)
  offset    the mean of megadlm - peer over iterations W..N, against K * sigma / sqrt(N - W + 1)

Verdict "same curve" when every row and the offset are within their bounds, else "different"
(exit 1). The peers' own pair (peer - peer, 2nd noise) is shown as the control. Without the peer
runs (no torch) the table holds megadlm's curve and the verdict is "n/a".

usage: bd_curve_report.py MEGADLM.jsonl [PEER.jsonl PEER2.jsonl] --out DIR [--window 10] [--k 3]
Writes DIR/bd_loss_curve.md and DIR/bd_loss_curve.json.
"""
import argparse
import json
import math
import os
import sys


def load(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                j = json.loads(line)
                if "lm_loss" in j and "iteration" in j:
                    out[int(j["iteration"])] = float(j["lm_loss"])
    if not out:
        sys.exit(f"bd_curve_report.py: {path} holds no iteration losses")
    return out


def moving(series, its, w):
    return {i: sum(series[j] for j in its if i - w < j <= i) / min(w, i - its[0] + 1) for i in its}


def fmt(v, d=4):
    return "" if v is None else f"{v:.{d}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("megadlm")
    ap.add_argument("peers", nargs="*", help="the peer run, then the same peer run with another noise seed")
    ap.add_argument("--out", required=True)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--k", type=float, default=3.0)
    a = ap.parse_args()
    if len(a.peers) not in (0, 2):
        sys.exit("bd_curve_report.py: give two peer runs (two noise seeds) or none")
    m = load(a.megadlm)
    runs = [load(p) for p in a.peers]
    its = sorted(set(m).intersection(*[set(r) for r in runs]))
    if its != list(range(its[0], its[0] + len(its))) or len(its) < 2 * a.window:
        sys.exit(f"bd_curve_report.py: need consecutive common iterations, at least {2 * a.window}; have {len(its)}")
    w, k = a.window, a.k
    mm = moving(m, its, w)
    res = dict(method=("moving averages over W iterations; bound = K * sigma / sqrt(W), sigma = std of the "
                       "per-iteration loss difference of two peer runs that differ only in the masking noise seed; "
                       "same curve iff every row's |MA_megadlm - MA_peer| <= bound and the mean offset over "
                       "iterations W..N is within K * sigma / sqrt(N - W + 1)"),
               window=w, k=k, iterations=len(its), files=[a.megadlm] + a.peers)
    rows = []
    tail = [i for i in its if i >= its[0] + w - 1]
    if runs:
        p, q = runs
        mp, mq = moving(p, its, w), moving(q, its, w)
        d = [p[i] - q[i] for i in tail]
        mean_d = sum(d) / len(d)
        sigma = math.sqrt(sum((x - mean_d) ** 2 for x in d) / (len(d) - 1))
        bound = k * sigma / math.sqrt(w)
        offset = sum(m[i] - p[i] for i in tail) / len(tail)
        offset_bound = k * sigma / math.sqrt(len(tail))
        control = sum(p[i] - q[i] for i in tail) / len(tail)
        res.update(sigma=sigma, bound=bound, offset=offset, offset_bound=offset_bound, control_offset=control)
    for i in its:
        if (i - its[0] + 1) % a.every and i != its[-1]:
            continue
        r = dict(iteration=i, megadlm=m[i], ma_megadlm=mm[i])
        if runs:
            r.update(peer=p[i], peer2=q[i], ma_peer=mp[i], ma_peer2=mq[i], ma_diff=mm[i] - mp[i],
                     ma_control=mp[i] - mq[i], bound=bound)
            if i in tail:
                r["within"] = abs(mm[i] - mp[i]) <= bound
        rows.append(r)
    res["rows"] = rows
    if runs:
        checked = [r for r in rows if "within" in r]
        ok = all(r["within"] for r in checked) and abs(res["offset"]) <= res["offset_bound"]
        res["verdict"] = "same curve" if ok else "different"
        res["rows_within"] = sum(r["within"] for r in checked)
        res["rows_checked"] = len(checked)
    else:
        res["verdict"] = "n/a (no peer runs)"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bd_loss_curve.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    lines = ["# Block diffusion: megadlm against the PyTorch peer, loss per iteration", "",
             f"Method: {res['method']}. W = {w}, K = {k:g}.", ""]
    if runs:
        lines += [f"sigma (peer - peer with another noise seed, per iteration) = {res['sigma']:.4f}; "
                  f"bound = {res['bound']:.4f}; mean offset megadlm - peer over iterations {tail[0]}..{tail[-1]} = "
                  f"{res['offset']:+.4f} (bound {res['offset_bound']:.4f}; the two peers' offset: {control:+.4f}).", "",
                  "| iteration | megadlm | peer | peer, 2nd noise | MA megadlm | MA peer | MA megadlm - peer | "
                  "MA peer - peer 2nd | bound | within |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['iteration']} | {fmt(r['megadlm'])} | {fmt(r['peer'])} | {fmt(r['peer2'])} | "
                         f"{fmt(r['ma_megadlm'])} | {fmt(r['ma_peer'])} | {r['ma_diff']:+.4f} | {r['ma_control']:+.4f} | "
                         f"{fmt(r['bound'])} | {'' if 'within' not in r else ('yes' if r['within'] else 'NO')} |")
        lines += ["", f"Verdict: **{res['verdict']}** ({res['rows_within']} of {res['rows_checked']} rows within the "
                  f"bound; offset {'within' if abs(res['offset']) <= res['offset_bound'] else 'OUTSIDE'} its bound)."]
    else:
        lines += ["| iteration | megadlm | MA megadlm |", "|---|---|---|"]
        lines += [f"| {r['iteration']} | {fmt(r['megadlm'])} | {fmt(r['ma_megadlm'])} |" for r in rows]
        lines += ["", f"Verdict: {res['verdict']}."]
    with open(os.path.join(a.out, "bd_loss_curve.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if res["verdict"] == "different" else 0


if __name__ == "__main__":
    sys.exit(main())
