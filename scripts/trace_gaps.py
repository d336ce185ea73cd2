#!/usr/bin/env python3
"""Where the GPU waits: idle time of a CUPTI trace (tools/cupti_trace) and what the host did then.

    python3 scripts/trace_gaps.py TRACE.jsonl [--min-gap-us 5] [--top 15]

A gap is time between two GPU operations (kernels, copies, memsets; any stream) in which none
runs. For each gap the next operation's launch call (matched by correlation id) says whether
the host issued it late — then the runtime calls the host made between the end of the previous
operation and that launch (synchronisations, copies, allocations) are what it was doing, and the
rest is host computation. Prints a markdown summary: busy and idle time, idle by the host call
that preceded it, the largest gaps with their neighbouring kernels.
"""
import argparse
import bisect
import collections
import json
import re


def short(name, n=60):
    return re.sub(r"\(.*", "", name or "?")[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--min-gap-us", type=float, default=5.0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--title", default="")
    ap.add_argument("--kernels", type=int, default=0, help="also table the N kernels with most time")
    a = ap.parse_args()
    gpu, api = [], []
    for line in open(a.trace):
        r = json.loads(line)
        (api if r["k"] in ("api", "driver") else gpu).append(r)
    gpu.sort(key=lambda r: r["s"])
    api.sort(key=lambda r: r["s"])
    launch = {r["corr"]: r for r in api}
    api_starts = [r["s"] for r in api]
    if not gpu:
        print("no GPU operations in the trace")
        return
    span = gpu[-1]["e"] - gpu[0]["s"]
    busy, gaps, end, prev = 0, [], gpu[0]["s"], None
    for r in gpu:
        if r["s"] > end:
            if (r["s"] - end) / 1e3 >= a.min_gap_us:
                gaps.append((end, r["s"], prev, r))
            busy += r["e"] - r["s"] if r["e"] > r["s"] else 0
        else:
            busy += max(0, r["e"] - end)
        if r["e"] > end:
            end, prev = r["e"], r
    idle = sum(g[1] - g[0] for g in gaps)
    by_cause = collections.defaultdict(lambda: [0, 0.0])
    rows = []
    for g0, g1, before, after in gaps:
        call = launch.get(after["corr"])
        late = call is not None and call["s"] > g0
        calls = collections.Counter()
        if late:
            i = bisect.bisect_left(api_starts, g0 - 1)
            while i < len(api) and api[i]["s"] < call["s"]:
                if api[i]["k"] == "api":
                    calls[api[i]["name"]] += (min(api[i]["e"], call["s"]) - max(api[i]["s"], g0)) / 1e3
                i += 1
        # the host call that the GPU's idle started under (the one running at g0), if any
        j = bisect.bisect_right(api_starts, g0) - 1
        during = None
        while j >= 0 and j > bisect.bisect_right(api_starts, g0) - 50:
            if api[j]["k"] == "api" and api[j]["e"] >= g0:
                during = api[j]["name"]
                break
            j -= 1
        if not late:
            cause = "launched in time (dependency/event wait)"
        elif during:
            cause = f"host returning from {during}"  # the GPU drained while the host waited in it
        else:
            cause = "host busy (" + (max(calls, key=calls.get) if calls else "no CUDA call") + ")"
        by_cause[cause][0] += 1
        by_cause[cause][1] += (g1 - g0) / 1e3
        rows.append(((g1 - g0) / 1e3, short(before.get("name", before["k"])), short(after.get("name", after["k"])),
                     cause, ", ".join(f"{k} {v:.0f}us" for k, v in calls.most_common(3))))
    if a.title:
        print(f"### {a.title}\n")
    print(f"{len(gpu)} GPU operations over {span / 1e6:.2f} ms: busy {busy / 1e6:.2f} ms, "
          f"idle {idle / 1e6:.2f} ms in {len(gaps)} gaps of >= {a.min_gap_us:g} us "
          f"({idle / span * 100:.1f} % of the span)\n")
    print("| idle under / after | gaps | ms |\n|---|---|---|")
    for cause, (n, us) in sorted(by_cause.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"| {cause} | {n} | {us / 1e3:.2f} |")
    print(f"\n| gap us (largest {a.top}) | kernel before | kernel after | under | host calls in it |\n|---|---|---|---|---|")
    for us, b, f, cause, calls in sorted(rows, reverse=True)[: a.top]:
        print(f"| {us:.0f} | `{b}` | `{f}` | {cause} | {calls} |")
    if a.kernels:
        per = collections.defaultdict(lambda: [0, 0.0])
        for r in gpu:
            p = per[short(r.get("name", r["k"]), 80)]
            p[0] += 1
            p[1] += (r["e"] - r["s"]) / 1e3
        print(f"\n| kernel (top {a.kernels}) | calls | ms | us per call |\n|---|---|---|---|")
        for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[: a.kernels]:
            print(f"| `{name}` | {n} | {us / 1e3:.2f} | {us / n:.1f} |")


if __name__ == "__main__":
    main()
