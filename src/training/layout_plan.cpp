#include "megadlm/training/layout_plan.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include "megadlm/parallel/pipeline_parallel/layer_partition.h"
#include "megadlm/training/arguments/flags.h"

namespace megadlm {

namespace {

// Rates measured on H200s (docs/benchmarks.md): cuBLASLt bf16 GEMM, the flash attention kernels
// (unmasked; causal at 0.326 / 0.448 of the forward and 1.030 / 1.658 of the backward time),
// NCCL bus bandwidths on 2 GPUs over NVLink, the latency of a 1 MiB collective, AdamW.
constexpr double kGemmFlops = 811e12;
constexpr double kAttentionForwardFlops = 300e12, kAttentionBackwardFlops = 200e12;
constexpr double kCausalForward = 0.326 / 0.448, kCausalBackward = 1.030 / 1.658;
constexpr double kOtherOverGemm = 35.0 / 100.0;  // norms, RoPE, SwiGLU, adds: 35 ms per 100 ms of GEMMs
constexpr double kAllReduceBusBw = 329e9, kGatherBusBw = 265e9;
constexpr double kInterNodeBusBw = 50e9;  // assumption: 400 Gb/s InfiniBand per GPU (not measured)
constexpr double kCollectiveLatency = 40e-6;
constexpr double kAdamSecondsPerElement = 0.444e-3 / 61e6;
constexpr int kGpusPerNode = 8;

/// Seconds of one collective over n ranks moving `bytes` (nccl-tests' bus-bandwidth definitions).
double all_reduce_s(double bytes, int n, bool intra) {
  if (n <= 1) return 0;
  return kCollectiveLatency + bytes * 2.0 * (n - 1) / n / (intra ? kAllReduceBusBw : kInterNodeBusBw);
}
double gather_s(double bytes, int n, bool intra) {  // all-gather or reduce-scatter; bytes = full buffer
  if (n <= 1) return 0;
  return kCollectiveLatency + bytes * (n - 1.0) / n / (intra ? kGatherBusBw : kInterNodeBusBw);
}

// The flags a layout sets, which the user's command line must not set again.
const std::set<std::string> kLayoutFlags = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--context-parallel-size", "--sequence-parallel",
    "--use-distributed-optimizer", "--use-custom-fsdp", "--use-megatron-fsdp", "--use-torch-fsdp2",
    "--data-parallel-sharding-strategy", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--recompute-activations", "--distribute-saved-activations",
    "--overlap-grad-reduce", "--overlap-param-gather", "--num-distributed-optimizer-instances",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--microbatch-group-size-per-virtual-pipeline-stage", "--hierarchical-context-parallel-sizes",
    "--cp-comm-type", "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--world-size",
    "--dry-run", "--plan"};

std::vector<std::string> without_layout_flags(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  for (size_t i = 0; i < tokens.size();) {
    const std::string& t = tokens[i++];
    const size_t eq = t.find('=');
    const std::string name = t.substr(0, eq);
    if (kLayoutFlags.count(name) == 0) {
      out.push_back(t);
      continue;
    }
    const training::FlagSpec* f = training::find_flag(name);
    if (eq != std::string::npos || f == nullptr || !training::flag_takes_value(*f)) continue;
    const bool list = f->kind == training::FlagKind::IntList || f->kind == training::FlagKind::FloatList ||
                      f->kind == training::FlagKind::StringList;
    // A scalar flag takes one value; a list takes every value up to the next flag.
    if (!list) {
      if (i < tokens.size()) ++i;
    } else {
      while (i < tokens.size() && tokens[i].rfind("--", 0) != 0) ++i;
    }
  }
  return out;
}

struct Dims {
  int tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1;
  enum class Dp { Ddp, DistOpt, FsdpGrads, FsdpParams } dp_kind = Dp::Ddp;
  bool recompute = false;
};

std::vector<std::string> layout_flags(const Dims& d) {
  std::vector<std::string> f;
  if (d.tp > 1) f.insert(f.end(), {"--tensor-model-parallel-size", std::to_string(d.tp), "--sequence-parallel"});
  if (d.pp > 1) f.insert(f.end(), {"--pipeline-model-parallel-size", std::to_string(d.pp)});
  if (d.vpp > 1) f.insert(f.end(), {"--virtual-pipeline-model-parallel-size", std::to_string(d.vpp)});
  if (d.cp > 1) f.insert(f.end(), {"--context-parallel-size", std::to_string(d.cp)});
  if (d.ep > 1) f.insert(f.end(), {"--expert-model-parallel-size", std::to_string(d.ep)});
  switch (d.dp_kind) {
    case Dims::Dp::Ddp: f.push_back("--overlap-grad-reduce"); break;
    case Dims::Dp::DistOpt:
      f.insert(f.end(), {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"});
      break;
    case Dims::Dp::FsdpGrads:
      f.insert(f.end(), {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"});
      break;
    case Dims::Dp::FsdpParams:
      f.insert(f.end(), {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"});
      break;
  }
  if (d.recompute)
    f.insert(f.end(), {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"});
  return f;
}

std::string describe(const RunConfig& c) {
  const ParallelConfig& p = c.parallel;
  std::ostringstream os;
  os << "tp " << p.tensor_model_parallel_size << (p.sequence_parallel ? "+SP" : "") << ", pp "
     << p.pipeline_model_parallel_size;
  if (p.virtual_pipeline_model_parallel_size > 1) os << "x" << p.virtual_pipeline_model_parallel_size;
  os << ", cp " << p.context_parallel_size;
  if (p.expert_model_parallel_size > 1) os << ", ep " << p.expert_model_parallel_size;
  os << ", dp " << p.data_parallel_size << " ";
  if (p.use_custom_fsdp) os << "FSDP " << sharding_strategy_name(p.data_parallel_sharding_strategy);
  else if (p.use_distributed_optimizer) os << "dist-opt";
  else os << "DDP";
  if (c.model.recompute_granularity == RecomputeGranularity::Full) os << ", recompute";
  return os.str();
}

}  // namespace

StepTime estimate_step_time(const RunConfig& cfg) {
  const TransformerConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  const int tp = p.tensor_model_parallel_size, pp = p.pipeline_model_parallel_size, cp = p.context_parallel_size;
  const int vpp = std::max(1, p.virtual_pipeline_model_parallel_size);
  const int dp = std::max(1, p.data_parallel_size), d = dp * cp;
  const bool sp = p.sequence_parallel && tp > 1;
  const int M = std::max(1, cfg.training.num_micro_batches(dp));
  const double mbs = cfg.training.micro_batch_size, S = m.seq_length, H = m.hidden_size;
  const double T = mbs * S / cp;  // tokens per rank per micro-batch
  const double Q = m.query_projection_size(), K = m.kv_projection_size(), F = m.ffn_hidden_size;
  const double fc1 = m.activation == MlpActivation::SwiGLU ? 2 * F : F;
  const double V = static_cast<double>(m.padded_vocab_size);
  const bool causal = m.attention_mask == AttentionMaskType::Causal;
  // Which groups stay inside a node, by Megatron's rank order (tp fastest, then cp, dp, pp).
  const bool tp_intra = tp <= kGpusPerNode, cp_intra = tp * cp <= kGpusPerNode;
  const bool dp_intra = tp * cp * dp <= kGpusPerNode, pp_intra = tp * cp * dp * pp <= kGpusPerNode;

  // One layer, one micro-batch, this rank.
  const double gemm_fwd = 2 * T * (H * (Q + 2 * K) + Q * H + H * fc1 + F * H) / tp / kGemmFlops;
  const double attn_flops = 4 * mbs * (S / cp) * S * Q / tp;  // this rank's queries against all keys
  const double attn_fwd = attn_flops / kAttentionForwardFlops * (causal ? kCausalForward : 1.0);
  const double attn_bwd = 2.5 * attn_flops / kAttentionBackwardFlops * (causal ? kCausalBackward : 1.0);
  // Memory-bound ops scale with the layer's GEMM time; without SP the norms, residual adds and
  // dropout run on every TP rank in full (about half of them).
  const double other = kOtherOverGemm * 3 * gemm_fwd * (sp || tp == 1 ? 1.0 : (1.0 + tp) / 2.0);
  const double act_bytes = 2 * T * H;  // bf16 [T, H]
  const double tp_block = sp ? 2 * gather_s(act_bytes, tp, tp_intra) : all_reduce_s(act_bytes, tp, tp_intra);
  const double tp_fwd = 2 * tp_block, tp_bwd = 2 * tp_block;  // attention and MLP blocks
  // CP ring: cp − 1 steps of this rank's K and V forward, twice that (dK, dV too) backward.
  const double kv_bytes = 2 * T * 2 * K / tp;
  const double cp_fwd = cp > 1 ? (cp - 1) * (kCollectiveLatency + kv_bytes / (cp_intra ? kGatherBusBw : kInterNodeBusBw)) : 0;
  const double cp_bwd = 2 * cp_fwd;
  const bool recompute = m.recompute_granularity == RecomputeGranularity::Full;
  const double layer_compute = 3 * gemm_fwd + attn_fwd + attn_bwd + other +
                               (recompute ? gemm_fwd + attn_fwd + other / 3 : 0);
  const double layer_comm = tp_fwd + tp_bwd + cp_fwd + cp_bwd + (recompute ? tp_fwd + cp_fwd : 0);
  const double head_gemm = 3 * 2 * T * H * V / tp / kGemmFlops;
  const double head_comm = tp > 1 ? 2 * (sp ? gather_s(act_bytes, tp, tp_intra) : all_reduce_s(act_bytes, tp, tp_intra)) : 0;

  // The slowest stage decides the pipeline's pace.
  double stage_compute = 0, stage_comm = 0;
  for (int r = 0; r < pp; ++r) {
    int layers = 0;
    for (const pp::LayerRange& range : pp::stage_layers(m.num_layers, pp, vpp, r, p.decoder_first_pipeline_num_layers,
                                                         p.decoder_last_pipeline_num_layers))
      layers += range.count;
    double c = layers * layer_compute, k = layers * layer_comm;
    if (r == pp - 1) {
      c += head_gemm * (1 + kOtherOverGemm);
      k += head_comm;
    }
    if (c + k > stage_compute + stage_comm) {
      stage_compute = c;
      stage_comm = k;
    }
  }
  const double t_mb = stage_compute + stage_comm;
  StepTime st;
  st.compute_ms = 1e3 * M * stage_compute;
  st.tp_cp_ms = 1e3 * M * stage_comm;
  if (pp > 1) {
    const double p2p = 2 * (kCollectiveLatency + (sp ? act_bytes / tp : act_bytes) / (pp_intra ? kGatherBusBw : kInterNodeBusBw));
    st.pipeline_ms = 1e3 * ((pp - 1.0) / vpp * t_mb + M * p2p);
  }

  // Data parallelism over dp×cp, per stage: the largest stage's parameters.
  double psi = 0;
  try {
    for (const StageMemory& s : plan_memory(cfg, PlanDevice::Cuda).stages) psi = std::max(psi, static_cast<double>(s.parameters));
  } catch (const std::exception&) {
  }
  const double bwd = 2.0 / 3.0 * t_mb, fwd = t_mb / 3.0;  // the share of a micro-batch each can hide behind
  double dp_s = 0;
  const double grads = 4 * psi, weights = 2 * psi;
  if (d > 1) {
    const bool fsdp = p.use_custom_fsdp;
    const ShardingStrategy s = p.data_parallel_sharding_strategy;
    if (fsdp && s == ShardingStrategy::OptimGradsParams) {
      const double per_mb = 2 * gather_s(weights, d, dp_intra) + gather_s(grads, d, dp_intra);
      const double units = std::max(1, m.num_layers / pp) + 2.0;
      dp_s = M * std::max(0.0, per_mb - t_mb) + gather_s(weights, d, dp_intra) / units;
    } else if (fsdp && s == ShardingStrategy::OptimGrads) {
      dp_s = M * std::max(0.0, gather_s(grads, d, dp_intra) - bwd) + std::max(0.0, gather_s(weights, d, dp_intra) - fwd);
    } else if (p.use_distributed_optimizer || (fsdp && s == ShardingStrategy::Optim)) {
      dp_s = std::max(0.0, gather_s(grads, d, dp_intra) - bwd) + std::max(0.0, gather_s(weights, d, dp_intra) - fwd);
    } else {
      dp_s = std::max(0.0, all_reduce_s(grads, d, dp_intra) - bwd);
    }
  }
  st.data_parallel_ms = 1e3 * dp_s;
  const bool sharded_opt = d > 1 && (p.use_distributed_optimizer ||
                                     (p.use_custom_fsdp && p.data_parallel_sharding_strategy != ShardingStrategy::NoShard));
  st.optimizer_ms = 1e3 * kAdamSecondsPerElement * (sharded_opt ? psi / d : psi);
  return st;
}

LayoutPlan plan_layouts(const std::vector<std::string>& args, int world, int top) {
  LayoutPlan plan;
  plan.world_size = world;
  const std::vector<std::string> base = without_layout_flags(training::expand_flag_files(args));
  // EP only for a model with MoE layers (the rules reject EP sizes its experts do not divide).
  const bool moe = std::find(base.begin(), base.end(), "--num-experts") != base.end();
  const std::vector<int> eps = moe ? std::vector<int>{1, 2, 4, 8} : std::vector<int>{1};
  std::vector<LayoutCandidate> fitting;
  for (int tp : {1, 2, 4, 8}) {
    if (world % tp) continue;
    for (int pp = 1; pp <= world / tp; ++pp) {
      if ((world / tp) % pp) continue;
      for (int vpp : {1, 2, 4}) {
        if (vpp > 1 && pp == 1) continue;
        for (int cp : {1, 2, 4, 8}) {
          if ((world / (tp * pp)) % cp) continue;
          const int d = world / (tp * pp);  // dp × cp
          for (int ep : eps) {
          if ((world / pp) % ep) continue;
          for (Dims::Dp kind : {Dims::Dp::Ddp, Dims::Dp::DistOpt, Dims::Dp::FsdpGrads, Dims::Dp::FsdpParams}) {
            if (d == 1 && kind != Dims::Dp::Ddp) continue;
            for (bool recompute : {false, true}) {
              const Dims dims{tp, pp, vpp, cp, ep, kind, recompute};
              std::vector<std::string> argv = base;
              const std::vector<std::string> flags = layout_flags(dims);
              argv.insert(argv.end(), flags.begin(), flags.end());
              argv.insert(argv.end(), {"--dry-run", "--world-size", std::to_string(world)});
              ++plan.considered;
              training::ParsedArguments parsed;
              try {
                parsed = training::parse_arguments(argv, training::LaunchInfo{});
              } catch (const std::exception&) {
                continue;  // a rule rejects this layout for this model and batch
              }
              ++plan.valid;
              LayoutCandidate c;
              c.flags = flags;
              c.config = parsed.config;
              c.not_supported = parsed.not_supported;
              c.description = describe(c.config);
              try {
                c.memory = plan_memory(c.config, plan_device(c.config, true, parsed.given.count("device") > 0));
              } catch (const std::exception&) {
                continue;
              }
              if (!c.memory.fits()) continue;
              ++plan.fitting;
              c.time = estimate_step_time(c.config);
              fitting.push_back(std::move(c));
            }
          }
          }
        }
      }
    }
  }
  std::stable_sort(fitting.begin(), fitting.end(), [](const LayoutCandidate& a, const LayoutCandidate& b) {
    const double ta = a.time.total_ms(), tb = b.time.total_ms();
    if (std::fabs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb;
    return a.memory.needed() < b.memory.needed();
  });
  for (size_t i = 0; i < fitting.size() && static_cast<int>(i) < top; ++i) plan.best.push_back(std::move(fitting[i]));
  return plan;
}

std::string format_layout_plan(const LayoutPlan& plan, const RunConfig& config) {
  std::ostringstream os;
  const double tokens = static_cast<double>(config.training.global_batch_size) * config.model.seq_length;
  os << "layout plan for " << plan.world_size << " GPUs (global batch " << config.training.global_batch_size
     << ", micro-batch " << config.training.micro_batch_size << ", seq " << config.model.seq_length << ", "
     << config.training.gpu_memory_gb << " GB per GPU): " << plan.considered << " layouts considered, "
     << plan.valid << " valid, " << plan.fitting << " fit; "
     << (plan.best.empty() ? std::string("none fits") : "the " + std::to_string(plan.best.size()) + " fastest:") << "\n";
  char buf[256];
  if (!plan.best.empty()) {
    std::snprintf(buf, sizeof buf, "  %-2s %-52s %11s %12s %9s\n", "#", "layout", "step (ms)", "tokens/s/GPU", "peak GB");
    os << buf;
  }
  for (size_t i = 0; i < plan.best.size(); ++i) {
    const LayoutCandidate& c = plan.best[i];
    const double ms = c.time.total_ms();
    std::snprintf(buf, sizeof buf, "  %-2zu %-52s %11.1f %12.0f %9.2f\n", i + 1, c.description.c_str(), ms,
                  tokens / (ms / 1e3) / plan.world_size, static_cast<double>(c.memory.needed()) / 1e9);
    os << buf;
    std::snprintf(buf, sizeof buf,
                  "     compute %.1f + TP/CP %.1f + pipeline %.1f + data-parallel %.1f + optimizer %.1f ms\n",
                  c.time.compute_ms, c.time.tp_cp_ms, c.time.pipeline_ms, c.time.data_parallel_ms, c.time.optimizer_ms);
    os << buf << "     flags:";
    for (const std::string& f : c.flags) os << " " << f;
    os << "\n";
    for (const std::string& n : c.not_supported) os << "     not supported yet by this build: " << n << "\n";
  }
  os << "cost model (docs/planner.md): GEMMs at 811 TFLOP/s, attention at 300/200 TFLOP/s forward/backward, "
        "other ops at 0.35 x the GEMM time; NCCL at 329 GB/s (all-reduce) and 265 GB/s (all-gather, "
        "reduce-scatter) bus bandwidth inside 8-GPU nodes, 50 GB/s across nodes (assumed); TP/CP exposed, "
        "data-parallel traffic overlapped where it can be; pipeline bubble (pp-1)/vpp micro-batches\n";
  return os.str();
}

}  // namespace megadlm
