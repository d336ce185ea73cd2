#!/usr/bin/env python3
"""Compares megadlm's block-diffusion loss curve with the PyTorch peer's (scripts/bd_loss_curve.sh).

Inputs: per-iteration losses as JSON lines with "iteration" and "lm_loss" (pretrain_difflm's
--metrics-jsonl with --log-interval 1, and scripts/bd_curve_vs_peer.py's output): megadlm's run
and S >= 2 peer runs from the same initial weights on the same rows that differ only in the
masking noise (its seed). megadlm's masks and the peer's cannot be the same (different random
number generators), so the curves are compared statistically. If megadlm computes the peer's
function, its run is one more draw of the peer's runs, and it must sit among them as they sit
among each other:

  MA_x(i)    trailing moving average of run x's loss over the last W iterations (W = --window)
  D(i)       (MA_megadlm(i) - mean_s MA_peer_s(i)) / mean_s MA_peer_s(i): megadlm's relative
             distance from the peers' mean curve
  D_s(i)     the same for peer s against the mean of the other S - 1 peers (leave one out): the
             distances an implementation shows against itself under other masks, including the
             slow drift of trajectories that saw different masks
  spread     root mean square of D_s(i) over every peer s and row i, scaled by
             sqrt((1 + 1/S) / (1 + 1/(S - 1))) (D compares with S runs, D_s with S - 1)
  row i      |D(i)| <= K * spread   (K = --k, 3.5 by default: 15 rows at 3.5 standard
             deviations leave about 1 % chance of a false alarm; every --every iterations, from W on)
  offset     mean over iterations W..N of megadlm's relative distance from the peers' mean, within
             K * the same leave-one-out statistic of the peers (RMS over s, scaled likewise), and
             at least K * sigma / sqrt(n), sigma = the per-iteration spread (n iterations)

Verdict "same curve" when every row and the offset are within their bounds, else "different"
(exit 1). The two implementations' bf16 rounding differences are far below the masking noise, so
this bound is what "within noise" means here. Without peer runs (no torch) the table holds
megadlm's curve and the verdict is "n/a".

usage: bd_curve_report.py MEGADLM.jsonl [PEER_1.jsonl PEER_2.jsonl ...] --out DIR [--window 10] [--k 3]
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


def rms(xs):
    return math.sqrt(sum(x * x for x in xs) / len(xs))


def fmt(v, d=4):
    return "" if v is None else f"{v:.{d}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("megadlm")
    ap.add_argument("peers", nargs="*", help="the peer's runs, one per masking-noise seed (at least 2)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--k", type=float, default=3.5)
    a = ap.parse_args()
    if len(a.peers) == 1:
        sys.exit("bd_curve_report.py: give at least two peer runs (noise seeds), or none")
    m = load(a.megadlm)
    runs = [load(p) for p in a.peers]
    its = sorted(set(m).intersection(*[set(r) for r in runs]))
    if not its or its != list(range(its[0], its[0] + len(its))) or len(its) < 2 * a.window:
        sys.exit(f"bd_curve_report.py: need consecutive common iterations, at least {2 * a.window}; have {len(its)}")
    w, k, S = a.window, a.k, len(runs)
    mm = moving(m, its, w)
    tail = [i for i in its if i >= its[0] + w - 1]
    n = len(tail)
    shown = [i for i in its if (i - its[0] + 1) % a.every == 0 or i == its[-1]]
    checked = [i for i in shown if i in tail]
    res = dict(method=("megadlm as one more draw of the peer's runs (S masking-noise seeds): D(i) = relative "
                       "distance of megadlm's W-iteration moving average from the peers' mean; spread = RMS of "
                       "each peer's leave-one-out distance from the other peers' mean over the rows, scaled by "
                       "sqrt((1+1/S)/(1+1/(S-1))); a row passes when |D(i)| <= K * spread; the mean relative "
                       "offset over iterations W..N is bounded likewise by the peers' leave-one-out offsets"),
               window=w, k=k, peer_runs=S, iterations=len(its), files=[a.megadlm] + a.peers)
    rows = []
    if runs:
        mp = [moving(r, its, w) for r in runs]
        mean_ma = {i: sum(x[i] for x in mp) / S for i in its}
        mean_raw = {i: sum(r[i] for r in runs) / S for i in its}
        scale = math.sqrt((1 + 1 / S) / (1 + 1 / (S - 1)))

        def loo(s, series, i):  # peer s against the mean of the others
            others = sum(series[t][i] for t in range(S) if t != s) / (S - 1)
            return (series[s][i] - others) / others
        spread = scale * rms([loo(s, mp, i) for s in range(S) for i in checked])
        sigma = rms([loo(s, runs, i) for s in range(S) for i in tail]) / math.sqrt(1 + 1 / (S - 1))
        offset = sum((m[i] - mean_raw[i]) / mean_raw[i] for i in tail) / n
        peer_offsets = [sum(loo(s, runs, i) for i in tail) / n for s in range(S)]
        offset_bound = k * max(scale * rms(peer_offsets), sigma * math.sqrt(1 + 1 / S) / math.sqrt(n))
        res.update(spread=spread, sigma=sigma, offset=offset, offset_bound=offset_bound, peer_offsets=peer_offsets)
    for i in shown:
        r = dict(iteration=i, megadlm=m[i], ma_megadlm=mm[i])
        if runs:
            r.update(peer=runs[0][i], ma_peers=mean_ma[i], rel_diff=(mm[i] - mean_ma[i]) / mean_ma[i],
                     peers_rel=[loo(s, mp, i) for s in range(S)], bound=k * spread)
            if i in tail:
                r["within"] = abs(r["rel_diff"]) <= r["bound"]
        rows.append(r)
    res["rows"] = rows
    if runs:
        ok = all(r["within"] for r in rows if "within" in r) and abs(res["offset"]) <= res["offset_bound"]
        res["verdict"] = "same curve" if ok else "different"
        res["rows_within"] = sum(bool(r.get("within")) for r in rows)
        res["rows_checked"] = sum("within" in r for r in rows)
    else:
        res["verdict"] = "n/a (no peer runs)"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bd_loss_curve.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    lines = ["# Block diffusion: megadlm against the PyTorch peer, loss per iteration", "",
             f"Method: {res['method']}. W = {w}, K = {k:g}, S = {S}.", ""]
    if runs:
        lines += [f"Peers against each other (leave one out): spread {spread:.4f} of the loss after averaging, "
                  f"sigma {sigma:.4f} per iteration; bound per row K x spread = {k * spread:.4f} (relative). "
                  f"megadlm's mean relative offset from the peers over iterations {tail[0]}..{tail[-1]}: "
                  f"{offset:+.4f} (bound {offset_bound:.4f}; each peer's: "
                  + ", ".join(f"{x:+.4f}" for x in peer_offsets) + ").", "",
                  "| iteration | megadlm | peer (seed 1) | MA megadlm | MA peers | (MA megadlm - MA peers) / MA peers | "
                  "each peer against the others | bound | within |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['iteration']} | {fmt(r['megadlm'])} | {fmt(r['peer'])} | {fmt(r['ma_megadlm'])} | "
                         f"{fmt(r['ma_peers'])} | {r['rel_diff']:+.4f} | "
                         + " ".join(f"{x:+.4f}" for x in r["peers_rel"])
                         + f" | {fmt(r['bound'])} | {'' if 'within' not in r else ('yes' if r['within'] else 'NO')} |")
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
