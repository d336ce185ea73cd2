#!/usr/bin/env python3
"""The MoE benchmark report: reads what scripts/bench_moe.sh and megadlm_bench wrote into a
results folder and writes RESULTS/bench_moe.json and RESULTS/bench_moe.md; with --update FILE it
also puts the Markdown into FILE (docs/benchmarks.md) between the markers
`<!-- bench_moe:begin -->` and `<!-- bench_moe:end -->`, appended as a new section when FILE has
none. Nothing is typed by hand: every number comes from these files.

  RESULTS/moe_metrics.jsonl  pretrain_difflm --metrics-jsonl of the fine-grained MoE (required)
  RESULTS/peer.json, peer.log  peer_torch_dlm.py --json and its output (optional)
  RESULTS/moe_ops.jsonl      megadlm_bench ops rows (grouped_gemm_*, moe_*; optional)
  RESULTS/machine.txt        nvidia-smi line (optional)

The goal, under balanced routing on both sides (scripts/bench_moe.sh forces it by default):
megadlm's tokens/s at least 4x the peer's in the same run, at least 250 TFLOP/s counting
active-parameter FLOPs (the peer's own count, flops_per_token in the peer script), and peak memory
at most the peer's (reserved by the allocators: megadlm's pool against
torch.cuda.max_memory_reserved). Each side's expert load (max/mean tokens an expert, 1 = even,
top-k of E at most E/k) is written beside its speed; a row above 2 is marked unbalanced: its
grouped GEMMs did not do the same work as a balanced run's.

  moe_bench_report.py RESULTS [--skip N] [--update docs/benchmarks.md]
"""
import argparse, json, os, statistics, sys

GIB = 2 ** 30
GOAL_RATIO, GOAL_TFLOPS = 4.0, 250.0
UNBALANCED = 2.0  # expert load max/mean above which a row is marked
BEGIN, END = "<!-- bench_moe:begin -->", "<!-- bench_moe:end -->"


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip()]


def megadlm_summary(path, skip):
    rows = read_jsonl(path)
    train = [r for r in rows if r.get("kind", "train") == "train" and "elapsed_ms" in r]
    if len(train) <= skip:
        return None
    steady = train[skip:]
    med = lambda k: statistics.median(r[k] for r in steady)
    s = {"iterations_measured": len(steady), "tokens_per_s": med("tokens_per_s"), "ms_per_iteration": med("elapsed_ms"),
         "tflops_megatron_count": med("tflops_per_gpu"), "mfu_811": med("mfu"),
         "peak_in_use_gib": max(r["peak_mem_gb"] for r in train) * 1e9 / GIB,
         "peak_reserved_gib": max(r.get("peak_reserved_gb", 0.0) for r in train) * 1e9 / GIB,
         "first_lm_loss": train[0]["lm_loss"], "last_lm_loss": train[-1]["lm_loss"],
         "global_batch_size": train[0].get("global_batch_size"),
         "ms_every_iteration": [round(r["elapsed_ms"], 1) for r in train]}  # the warm-up's trend
    for k in ("moe_load_balancing_loss", "moe_load_max_over_mean"):
        if k in train[-1]:
            s["last_" + k] = train[-1][k]
    return s


def peer_summary(json_path, log_path):
    rows = read_jsonl(json_path)
    if not rows:
        return None
    r = rows[-1]
    tflops = r["mfu"] * r["cfg"]["peak"]  # the peer's active-parameter FLOPs / s, in TFLOP/s
    p = {"tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms"], "tflops": tflops,
         "flops_per_token": tflops * 1e12 / r["tokens_per_s"], "peak_in_use_gib": r["max_mem_gb"],
         "peak_reserved_gib": r["max_reserved_gb"], "loss": r["loss"], "params": r["params"],
         "steps": r["cfg"].get("steps")}
    p["load"] = r.get("moe_load_max_over_mean")
    p["forced_balance"] = bool(r["cfg"].get("force_balance"))
    if os.path.exists(log_path):
        for line in open(log_path):
            if "grouped GEMM:" in line:
                p["grouped_gemm"] = line.rsplit("grouped GEMM:", 1)[1].split(",", 1)[0].strip()
    return p


def load_cell(load, forced):
    if load is None:
        return "–"
    cell = "%.2f%s" % (load, " (forced)" if forced else "")
    return cell + (" **unbalanced**" if load > UNBALANCED else "")


def ops_summary(path):
    rows = [r for r in read_jsonl(path) if r.get("op", "").startswith(("grouped_gemm", "moe_"))]
    gemm = [r for r in rows if r["op"].startswith("grouped_gemm") and "tflops" in r]
    total = None
    if gemm:
        flops = sum(r["tflops"] * 1e12 * r["median_ms"] * 1e-3 for r in gemm)
        ms = sum(r["median_ms"] for r in gemm)
        total = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "rows": len(gemm)}
    return rows, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--skip", type=int, default=6, help="warm-up iterations of megadlm left out")
    ap.add_argument("--mbs", type=int, default=4, help="micro-batch size both sides ran")
    ap.add_argument("--update", help="Markdown file to write the section into (docs/benchmarks.md)")
    a = ap.parse_args()
    d = a.results
    m = megadlm_summary(os.path.join(d, "moe_metrics.jsonl"), a.skip)
    log = os.path.join(d, "moe_train_log.txt")
    if m:
        m["forced_balance"] = os.path.exists(log) and "--moe-router-force-load-balancing" in open(log).read()
    p = peer_summary(os.path.join(d, "peer.json"), os.path.join(d, "peer.log"))
    ops, gemm_total = ops_summary(os.path.join(d, "moe_ops.jsonl"))
    machine = ""
    if os.path.exists(os.path.join(d, "machine.txt")):
        lines = open(os.path.join(d, "machine.txt")).read().splitlines()
        machine = lines[1] if len(lines) > 1 else ""
    res = {"machine": machine, "megadlm": m, "peer_amp": p, "ops": ops, "grouped_gemm_total": gemm_total}
    if m and p:
        res["ratio_tokens_per_s"] = m["tokens_per_s"] / p["tokens_per_s"]
        res["megadlm_tflops_peer_count"] = m["tokens_per_s"] * p["flops_per_token"] / 1e12
        res["memory_ratio_reserved"] = m["peak_reserved_gib"] / p["peak_reserved_gib"]
        res["both_balanced"] = all(x is not None and x <= UNBALANCED for x in (m.get("last_moe_load_max_over_mean"), p["load"]))
        res["goal_met"] = {"tokens_per_s_4x": res["ratio_tokens_per_s"] >= GOAL_RATIO,
                           "tflops_250": res["megadlm_tflops_peer_count"] >= GOAL_TFLOPS,
                           "memory_at_most_peer": m["peak_reserved_gib"] <= p["peak_reserved_gib"]}
    json.dump(res, open(os.path.join(d, "bench_moe.json"), "w"), indent=2)

    f = lambda v, fmt: (fmt % v) if v is not None else "–"
    md = [BEGIN, "",
          "Fine-grained MoE on one GPU (`scripts/device_moe.sh`, written by `scripts/moe_bench_report.py`):",
          "configs/fine_grained_moe.args — 12 layers, hidden 2048, 16 heads, 64 SwiGLU experts top-8 of",
          "width 768, vocab 50304, seq 2048, micro-batch %d (both sides), one micro-batch per step (the peer's step), bf16" % a.mbs,
          "with fp32 main weights, dropless, grouped GEMMs. Peer: `peer_torch_dlm.py --layers 12 --experts 64",
          "--topk 8 --expert-ffn 768 --compile 0 --params amp` (eager PyTorch, torch._grouped_mm) in the same",
          "call. TFLOP/s count active-parameter FLOPs with the peer's formula. Tokens: megadlm's mock dataset, the",
          "peer's uniform random ids (with forced balance the routing does not depend on them). %s" % (f"Machine: {machine}." if machine else ""),
          "",
          "| run | expert load max/mean | tokens/s | ms / step | TFLOP/s (peer's count) | ratio (goal ≥ 4) | peak memory in use / reserved GiB |",
          "|---|---|---|---|---|---|---|"]
    if m:
        md.append("| megadlm | %s | %.0f | %.1f | %s | %s | %.1f / %.1f |" % (
            load_cell(m.get("last_moe_load_max_over_mean"), m["forced_balance"]),
            m["tokens_per_s"], m["ms_per_iteration"], f(res.get("megadlm_tflops_peer_count"), "%.0f"),
            f(res.get("ratio_tokens_per_s"), "**%.2f×**"), m["peak_in_use_gib"], m["peak_reserved_gib"]))
    if p:
        md.append("| peer amp (%s, %s steps) | %s | %.0f | %.1f | %.0f | 1 | %.1f / %.1f |" % (
            p.get("grouped_gemm", "?"), p.get("steps"), load_cell(p["load"], p["forced_balance"]),
            p["tokens_per_s"], p["step_ms"], p["tflops"], p["peak_in_use_gib"], p["peak_reserved_gib"]))
    if m:
        md += ["", "megadlm: %d iterations measured (median, after %d of warm-up); Megatron's FLOP count %.0f TFLOP/s "
               "(MFU %.1f%% of 811); lm loss %.3f -> %.3f%s." % (
                   m["iterations_measured"], a.skip, m["tflops_megatron_count"], 100 * m["mfu_811"],
                   m["first_lm_loss"], m["last_lm_loss"],
                   ", expert load max/mean %.2f" % m["last_moe_load_max_over_mean"] if "last_moe_load_max_over_mean" in m else ""),
               "ms per iteration, every iteration: " + " ".join("%.0f" % v for v in m["ms_every_iteration"]) + "."]
    if "goal_met" in res:
        g = res["goal_met"]
        md += ["", "Goals (balanced routing on both sides): 4× the peer's tokens/s: %s; ≥ 250 TFLOP/s: %s; "
               "memory ≤ the peer's (reserved): %s.%s" % (
            "met" if g["tokens_per_s_4x"] else "**not met**", "met" if g["tflops_250"] else "**not met**",
            "met" if g["memory_at_most_peer"] else "**not met**",
            "" if res["both_balanced"] else " **A side ran unbalanced: the ratio does not compare equal work.**")]
    if ops:
        md += ["", "The MoE ops alone (`megadlm_bench ops`, median of 25 device-timed launches, inputs evicted from L2; "
               "grouped GEMM = one cuBLASLt matmul per expert, 64 experts, ~1024 rows each):", "",
               "| op | shape | ms | rate | check |", "|---|---|---|---|---|"]
        for r in ops:
            rate = ("%.0f TFLOP/s" % r["tflops"]) if "tflops" in r else ("%.0f GB/s" % r["gbps"]) if "gbps" in r else "–"
            md.append("| %s | %s | %.4f | %s | %s |" % (r["op"], r.get("shape", ""), r["median_ms"], rate, r.get("check", "")))
        if gemm_total:
            md += ["", "The %d grouped GEMMs above together (%s): %.3f ms, **%.0f TFLOP/s**." % (
                gemm_total["rows"], "one MoE layer's forward and backward" if gemm_total["rows"] == 6 else "a partial set",
                gemm_total["ms"], gemm_total["tflops"])]
    md += ["", END]
    text = "\n".join(md) + "\n"
    open(os.path.join(d, "bench_moe.md"), "w").write(text)
    print(text)
    if a.update:
        doc = open(a.update).read() if os.path.exists(a.update) else ""
        if BEGIN in doc and END in doc:
            head, rest = doc.split(BEGIN, 1)
            doc = head + text.rstrip("\n") + rest.split(END, 1)[1]
        else:
            doc = doc.rstrip("\n") + "\n\n## Mixture of experts on one GPU\n\n" + text
        open(a.update, "w").write(doc)
        print(f"updated {a.update}")
    return 0 if m else 1


if __name__ == "__main__":
    sys.exit(main())
