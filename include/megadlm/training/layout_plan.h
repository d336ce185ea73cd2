// `--plan --world-size N`: the layouts of N GPUs for a model and batch, ranked by an estimated
// step time, keeping those whose predicted memory (training/memory_plan.h) fits --gpu-memory-gb.
// Every candidate is a real command line: the user's flags with the layout flags replaced, parsed
// and validated by parse_arguments, so a listed layout is one pretrain_difflm accepts.
//
// Candidates: TP (1, 2, 4, 8, with SP), PP (divisors of N up to the layer count), VPP (1, 2, 4),
// CP (1, 2, 4, 8), DP flavour (DDP, the distributed optimizer, FSDP optim_grads and
// optim_grads_params), full recomputation on or off, and for a model with MoE layers EP (1, 2,
// 4, 8; the cost model prices MoE layers as dense MLPs and leaves the token all-to-all out, so
// EP candidates differ by their memory). The micro-batch and global batch stay the user's.
//
// Cost model (per GPU, one step; docs/planner.md derives it, docs/benchmarks.md has the rates):
//   compute per micro-batch and stage = GEMM FLOPs / 811 TFLOP/s (cuBLASLt bf16)
//     + attention FLOPs at 300 TFLOP/s forward, 200 backward (unmasked; causal takes 0.73 / 0.62
//       of that time) + memory-bound ops at 0.35 × the GEMM time (the 1.7B step's measured share;
//       without SP, half of them are replicated over TP)
//     + recomputation: one more forward of the recomputed layers;
//   communication at nccl-tests bus bandwidths (all-reduce 329 GB/s, all-gather and
//   reduce-scatter 265 GB/s inside an 8-GPU node, measured on H200 NVLink; 50 GB/s across nodes,
//   an assumption: 400 Gb/s InfiniBand, not measured here) plus 40 µs per collective:
//     TP and CP exposed; pipeline transfers exposed; data-parallel reductions and FSDP gathers
//     overlapped with the compute they can hide behind (DDP / distributed optimizer: the last
//     micro-batch's backward and the next forward; FSDP: every micro-batch), the rest exposed;
//   pipeline: (M + (pp − 1) / vpp) × the slowest stage's micro-batch time;
//   optimizer: AdamW over the owned elements at 0.444 ms per 61 M (measured).
#pragma once
#include <string>
#include <vector>
#include "megadlm/training/arguments/arguments.h"
#include "megadlm/training/memory_plan.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

/// The estimated time of one step, in milliseconds, by component.
struct StepTime {
  double compute_ms = 0;    ///< M micro-batches of the slowest stage: GEMMs, attention, other ops
  double tp_cp_ms = 0;      ///< tensor- and context-parallel communication (exposed)
  double pipeline_ms = 0;   ///< bubble and stage-to-stage transfers
  double data_parallel_ms = 0;  ///< exposed gradient reductions and parameter gathers
  double optimizer_ms = 0;
  double total_ms() const { return compute_ms + tp_cp_ms + pipeline_ms + data_parallel_ms + optimizer_ms; }
};

/// The cost model of this header for a validated configuration.
StepTime estimate_step_time(const RunConfig& config);

struct LayoutCandidate {
  std::vector<std::string> flags;    ///< the layout's launch flags (added to the user's)
  std::string description;           ///< "tp 2 + SP, pp 1, cp 1, dp 8 (FSDP optim_grads_params)"
  RunConfig config;
  MemoryPlan memory;
  StepTime time;
  std::vector<std::string> not_supported;  ///< valid, but this build cannot run it yet
};

struct LayoutPlan {
  int world_size = 0;
  int considered = 0, valid = 0, fitting = 0;
  std::vector<LayoutCandidate> best;  ///< fastest first, at most `top`
};

/// Ranks the layouts of `world` GPUs for the command line `args` (the user's flags; their layout
/// flags are replaced). Collective over nothing; CPU only.
LayoutPlan plan_layouts(const std::vector<std::string>& args, int world, int top = 5);

std::string format_layout_plan(const LayoutPlan& plan, const RunConfig& config);

}  // namespace megadlm
