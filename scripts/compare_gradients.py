#!/usr/bin/env python3
"""Compares two gradient dumps of pretrain_difflm --save-gradients tensor by tensor.

  scripts/compare_gradients.py A B [--noise C D] [--factor K] [--floor F] [--json OUT]

A, B: DIR/gradients.safetensors files (or their DIRs) of the same step of the same model (B is
the reference, e.g. the one-GPU run; A a parallel layout). Per tensor it prints the relative L2
difference ||a - b|| / ||b|| and the largest absolute difference, and, with --noise, a bound.

How the bound is derived. A layout computes the same function as the one-GPU run, but with other
GEMM shapes, other summation orders (partial sums reduced over TP / CP / DP ranks) and, in bf16,
other rounding points. The noise pair C / D is two one-GPU dumps of the same step that differ only
in --micro-batch-size (4 vs 2 at the same global batch): the same function with other GEMM shapes
and another accumulation order, i.e. rounding differences alone, measured per tensor:
noise_t = ||c_t - d_t|| / ||d_t||. A correct layout's difference is rounding of the same kind and
size, so tensor t passes when

    rel_diff_t <= bound_t = max(K * noise_t, F)

with K = --factor (default 3: two independent rounding differences of the same size differ by
less than 3x in practice; a bug, e.g. a missing or doubled partial sum, a wrong shard or a
mis-scaled gradient, gives a relative difference of order 1e-2..1 on the tensors it touches) and
F = --floor (default 1e-5, the CPU layout suites' fp32 tolerance: below it fp32 rounding alone
explains any difference, and a noise pair that happens to agree exactly gives no bound of zero).
Without --noise the bound is F alone (fp32 runs, where layouts agree to rounding). Gradients are
one step's: unlike loss curves after many steps, they cannot amplify a rounding difference through
chaotic training dynamics, so the comparison separates rounding from a bug.

Exit status: 0 when every tensor is within its bound and both dumps hold the same tensors with the
same shapes; 1 otherwise (each offending tensor is marked in the table); 2 on unreadable input.
Needs python3 and numpy only.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

def die(message):
    """Unreadable input or a bad option: exit 2 (1 means "beyond the bound")."""
    print("compare_gradients.py: " + message, file=sys.stderr)
    sys.exit(2)


_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "I64": np.int64}


def load(path):
    """{name: float64 array} of a safetensors file (BF16 widened to fp32 exactly)."""
    if os.path.isdir(path):
        path = os.path.join(path, "gradients.safetensors")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die("cannot read %s: %s" % (path, e.strerror))
    if len(raw) < 8:
        die("%s is not a safetensors file (%d bytes)" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        die("%s: header of %d bytes runs past the file's end" % (path, n))
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        die("%s: the safetensors header is not JSON (%s)" % (path, e))
    data = raw[8 + n:]
    out = {}
    for key, e in header.items():
        if key == "__metadata__":
            continue
        b, end = e["data_offsets"]
        shape = tuple(e["shape"])
        if not 0 <= b <= end <= len(data):
            die("%s: tensor %s's data [%d, %d) lies outside the file's %d data bytes (truncated?)" % (path, key, b, end, len(data)))
        if e["dtype"] == "BF16":
            u = np.frombuffer(data[b:end], dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif e["dtype"] in _DTYPES:
            arr = np.frombuffer(data[b:end], dtype=np.dtype(_DTYPES[e["dtype"]]).newbyteorder("<"))
        else:
            die("%s: tensor %s has dtype %s (F32, F64, F16, BF16 expected)"
                     % (path, key, e["dtype"]))
        out[key] = arr.astype(np.float64).reshape(shape)
    return out, header.get("__metadata__", {})


def rel_diff(a, b):
    """||a - b|| / ||b|| (0 when both are zero, inf when only b is)."""
    d = float(np.linalg.norm((a - b).ravel()))
    nb = float(np.linalg.norm(b.ravel()))
    if nb == 0:
        return 0.0 if d == 0 else math.inf
    return d / nb


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if math.isinf(v):
        return "inf"
    return "%.3e" % v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="gradients.safetensors (or its directory) of the run under test")
    ap.add_argument("b", help="... of the reference run (the one-GPU run)")
    ap.add_argument("--noise", nargs=2, metavar=("C", "D"),
                    help="two one-GPU dumps of the same step with other GEMM shapes (--micro-batch-size 4 vs 2)")
    ap.add_argument("--factor", type=float, default=3.0, help="K: the bound is K x the noise pair's difference (3)")
    ap.add_argument("--floor", type=float, default=1e-5, help="F: the smallest bound (1e-5, fp32 rounding)")
    ap.add_argument("--json", metavar="OUT", help="also write the rows and the verdict as JSON")
    ap.add_argument("--quiet", action="store_true", help="print only the summary line")
    args = ap.parse_args()
    if args.factor <= 0 or not math.isfinite(args.factor):
        die("--factor %s: must be a positive number" % args.factor)
    if args.floor < 0 or not math.isfinite(args.floor):
        die("--floor %s: must be a number >= 0" % args.floor)

    a, meta_a = load(args.a)
    b, meta_b = load(args.b)
    c = d = None
    if args.noise:
        c, _ = load(args.noise[0])
        d, _ = load(args.noise[1])

    rows, problems = [], []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            problems.append("%s: only in %s" % (name, "A" if name in a else "B"))
            rows.append({"tensor": name, "ok": False, "note": "only in " + ("A" if name in a else "B")})
            continue
        if a[name].shape != b[name].shape:
            problems.append("%s: shape %s vs %s" % (name, a[name].shape, b[name].shape))
            rows.append({"tensor": name, "ok": False, "note": "shape %s vs %s" % (a[name].shape, b[name].shape)})
            continue
        r = {"tensor": name, "numel": int(a[name].size), "rel_diff": rel_diff(a[name], b[name]),
             "max_abs": float(np.max(np.abs(a[name] - b[name]))) if a[name].size else 0.0,
             "norm_b": float(np.linalg.norm(b[name].ravel()))}
        r["noise"] = None
        if c is not None:
            if name not in c or name not in d or c[name].shape != b[name].shape or d[name].shape != b[name].shape:
                problems.append("%s: missing or of another shape in the noise pair" % name)
                r["note"] = "no noise measure"
            else:
                r["noise"] = rel_diff(c[name], d[name])
        r["bound"] = max(args.factor * r["noise"], args.floor) if r["noise"] is not None else args.floor
        r["ok"] = bool(np.all(np.isfinite(a[name]))) and r["rel_diff"] <= r["bound"]
        if not np.all(np.isfinite(a[name])):
            r["note"] = "non-finite values"
        rows.append(r)

    bad = [r for r in rows if not r["ok"]]
    compared = [r for r in rows if "rel_diff" in r]
    worst = max(compared, key=lambda r: r["rel_diff"] / r["bound"] if r["bound"] > 0 else math.inf, default=None)
    total = None
    if compared:
        num = sum(float(np.sum((a[r["tensor"]] - b[r["tensor"]]) ** 2)) for r in compared)
        den = sum(r["norm_b"] ** 2 for r in compared)
        total = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)

    if not args.quiet:
        print("| tensor | numel | rel diff | max abs | noise | bound | ok |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            if "rel_diff" not in r:
                print("| %s | - | - | - | - | - | **no** (%s) |" % (r["tensor"], r["note"]))
                continue
            print("| %s | %d | %s | %s | %s | %s | %s%s |" % (
                r["tensor"], r["numel"], fmt(r["rel_diff"]), fmt(r["max_abs"]), fmt(r["noise"]),
                fmt(r["bound"]), fmt(r["ok"]), " (%s)" % r["note"] if r.get("note") else ""))
    summary = "compare_gradients: %d tensor(s), %d beyond their bound (bound = max(%g x noise, %g)%s); " % (
        len(rows), len(bad), args.factor, args.floor, "" if args.noise else ", no noise pair: the floor alone")
    if worst is not None:
        summary += "whole model rel diff %s; closest to its bound: %s rel diff %s vs bound %s (%.2f of it)" % (
            fmt(total), worst["tensor"], fmt(worst["rel_diff"]), fmt(worst["bound"]),
            worst["rel_diff"] / worst["bound"] if worst["bound"] > 0 else math.inf)
    for p in problems:
        summary += "\n  " + p
    print(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"a": args.a, "b": args.b, "noise": args.noise, "factor": args.factor, "floor": args.floor,
                       "equal": not bad, "tensors": len(rows), "beyond": [r["tensor"] for r in bad],
                       "whole_rel_diff": total,
                       "worst": None if worst is None else {k: worst[k] for k in ("tensor", "rel_diff", "bound")},
                       "meta_a": meta_a, "meta_b": meta_b,
                       "rows": [{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in r.items()}
                                for r in rows]}, f, indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
