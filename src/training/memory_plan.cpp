#include "megadlm/training/memory_plan.h"
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include "megadlm/model/gpt_model.h"
#include "megadlm/parallel/data_parallel/data_parallel.h"
#include "megadlm/parallel/data_parallel/fsdp.h"
#include "megadlm/training/parallelize.h"
#include "megadlm/parallel/pipeline_parallel/layer_partition.h"
#include "megadlm/parallel/pipeline_parallel/schedule.h"

namespace megadlm {

namespace {

constexpr int64_t kCublasWorkspace = int64_t{32} << 20;  // per stream (core/cuda/runtime.cpp)
// Outside the pool on a GPU: the CUDA context (~0.5 GB on an H200), cuBLASLt handles and NCCL's
// internal buffers; a fixed allowance, not a measurement of this configuration.
constexpr int64_t kCudaRuntimeReserve = 1'000'000'000;

/// Bytes per element of what a stage holds, by device.
struct Bytes {
  int64_t act;     ///< activations and model weights: bf16 on CUDA, f32 on CPU
  int64_t weight;
  int64_t stat = 4;  ///< norm statistics, log-sum-exp, losses
};

Bytes bytes_of(PlanDevice d) { return d == PlanDevice::Cuda ? Bytes{2, 2} : Bytes{4, 4}; }

/// What one micro-batch's records of one layer hold (model/transformer_layer.h LayerRecord with
/// model/attention.h and model/mlp.h Saved), and the temporaries of its backward.
struct LayerBytes {
  int64_t saved = 0;
  int64_t forward_temporaries = 0;
  int64_t backward_temporaries = 0;
};

/// Whether attention takes the fused QK-norm + RoPE path on the packed QKV rows
/// (SelfAttention::fused_qk): it keeps the raw QKV rows, not q, k, v and their pre-norm copies.
bool fused_qk(const TransformerConfig& m, PlanDevice device) {
  if (m.qk_layernorm && m.normalization != NormType::RMSNorm) return false;
  return device == PlanDevice::Cpu || (m.kv_channels % 32 == 0 && m.kv_channels <= 256);
}

/// A layer whose linears run in FP8 with FP8 weight gradients: on CUDA the QKV and fc1 inputs
/// are kept as their column-wise codes (tp::LinearInput), one byte an element (blockwise: token
/// rows padded to 128 and one f32 scale per 128 tokens of a feature), and fc1's quantized output
/// gradient (both orientations) lives through its backward. On the CPU the codes are decoded f32,
/// the size of the activations they replace.
struct LayerFp8 {
  bool codes = false;
  bool blockwise = false;
};

LayerBytes layer_bytes(const TransformerConfig& m, int tp, bool sp, int64_t tokens, const Bytes& b,
                       PlanDevice device, LayerFp8 fp8 = {}) {
  const int64_t T = tokens;                  // all rows of the micro-batch (per CP rank)
  const int64_t rows = sp ? T / tp : T;      // this rank's rows between TP regions
  const int64_t H = m.hidden_size;
  const int64_t hq = m.query_projection_size() / tp, hkv = m.kv_projection_size() / tp;
  const int64_t nh = m.num_attention_heads / tp, ng = m.num_query_groups / tp;
  const int64_t F = m.ffn_hidden_size / tp;
  const int64_t fc1 = m.activation == MlpActivation::SwiGLU ? 2 * F : F;
  const int64_t norm_stats = (m.normalization == NormType::LayerNorm ? 2 : 1) * b.stat;
  const bool fused = fused_qk(m, device);
  LayerBytes l;
  l.saved = b.act * (rows * H            // x_in (norm1 saves the same tensor)
                     + T * (hq + 2 * hkv)  // the QKV rows (fused) or q, k, v after norm and RoPE
                     + T * hq            // core attention output
                     + rows * H          // x_mid (norm2 saves the same tensor)
                     + T * fc1)          // fc1 output (pre-activation; the activation is recomputed)
            + b.stat * T * nh            // log-sum-exp
            + norm_stats * 2 * rows;     // norm1, norm2 statistics
  // The norm outputs (QKV and fc1 inputs; under SP the all-rows gathers) are kept, except with
  // --recompute-modules layernorm (without SP), which recomputes them from x_in / x_mid.
  const bool recomputed_norms = m.recompute_norms && !sp;
  const bool fp8_codes = fp8.codes && device == PlanDevice::Cuda;
  const int64_t padded = fp8.blockwise ? (T + 127) / 128 * 128 : T;  // blockwise: token rows to 128
  const int64_t one_input = fp8_codes ? padded * H + (fp8.blockwise ? b.stat * H * (padded / 128) : 0)
                                      : b.act * T * H;
  if (!recomputed_norms) l.saved += 2 * one_input;
  if (m.qk_layernorm) {
    if (fused) l.saved += b.stat * T * (nh + ng);  // q/k norm statistics
    else l.saved += b.act * (T * hq + T * hkv) + norm_stats * (T * nh + T * ng);  // pre-norm q, k
  }
  // Forward: the fused QKV output lives next to its rotated (or split) copies.
  l.forward_temporaries = b.act * T * (hq + 2 * hkv);
  // Backward, MLP: the recomputed norm output (if), the gradient of the full rows, the recomputed
  // activation and its gradient, then fc1's output gradient.
  const int64_t mlp = b.act * ((recomputed_norms ? T * H : 0) + T * H + 2 * T * F + T * fc1) +
                      (fp8_codes ? 2 * T * fc1 : 0);
  // Backward, attention: the recomputed norm output (if), d(out), the recomputed rows, d(qkv), the
  // flash kernel's fp32 row sums and dq accumulator (CUDA).
  int64_t attn = b.act * ((recomputed_norms ? T * H : 0) + T * hq + 2 * T * (hq + 2 * hkv));
  if (device == PlanDevice::Cuda) attn += b.stat * (T * nh + T * hq);
  l.backward_temporaries = std::max(mlp, attn);
  return l;
}

/// One model chunk of a stage: its layers grouped as GptModel groups recomputation units.
struct ChunkBytes {
  int64_t records = 0;    ///< one micro-batch's saved records (layers, recomputed units' inputs)
  int64_t head = 0;       ///< with the head: final norm input and output, logits, losses
  int64_t rebuilt = 0;    ///< the largest recomputed unit's records, rebuilt in backward
  int64_t temporaries = 0;
};

/// `fp8`: the FP8 linears' state (null without FP8): which layers run in FP8.
ChunkBytes chunk_bytes(const TransformerConfig& m, const pp::LayerRange& range, bool head, int tp,
                       bool sp, int64_t tokens, const Bytes& b, PlanDevice device, const Fp8State* fp8 = nullptr) {
  ChunkBytes c;
  const LayerBytes high = layer_bytes(m, tp, sp, tokens, b, device);
  const LayerBytes low = fp8 == nullptr ? high
                                        : layer_bytes(m, tp, sp, tokens, b, device,
                                                      {.codes = fp8->settings().wgrad, .blockwise = fp8->blockwise()});
  auto layer = [&](int global) -> const LayerBytes& { return fp8 != nullptr && fp8->fp8_layer(global) ? low : high; };
  const int64_t rows = sp ? tokens / tp : tokens;
  const bool full = m.recompute_granularity == RecomputeGranularity::Full;
  const bool uniform = m.recompute_method == RecomputeMethod::Uniform;
  const int unit = full && uniform ? std::max(1, m.recompute_num_layers) : 1;
  int index = 0;
  for (int i = 0; i < range.count; i += unit, ++index) {
    const int n = std::min(unit, range.count - i);
    const bool recomputed = full && (uniform || index < m.recompute_num_layers);
    int64_t saved = 0;
    for (int k = i; k < i + n; ++k) {
      const LayerBytes& l = layer(range.first + k);
      saved += l.saved;
      c.temporaries = std::max({c.temporaries, l.forward_temporaries, l.backward_temporaries});
    }
    if (recomputed) {
      c.records += b.act * rows * m.hidden_size;  // the unit's input only
      c.rebuilt = std::max(c.rebuilt, saved);
    } else {
      c.records += saved;
    }
  }
  if (head) {
    const int64_t H = m.hidden_size;
    const int64_t norm_stats = (m.normalization == NormType::LayerNorm ? 2 : 1) * b.stat;
    const int64_t V = m.padded_vocab_size / tp;
    c.head = b.act * rows * H + norm_stats * rows     // final norm: input and statistics
             + b.stat * tokens;                       // per-token losses
    if (tp == 1) {
      // The fused head (ops::linear_cross_entropy): no [T, V] logits; d(final norm output)
      // kept from the forward; the logits of one chunk of rows (and their gradient) meanwhile.
      c.head += b.act * tokens * H;
      const int64_t chunk = std::min<int64_t>(tokens, 2048);
      c.temporaries = std::max(c.temporaries, 2 * b.act * chunk * V + b.act * tokens * H);
    } else {
      c.head += b.act * tokens * H                    // output layer input (all rows)
                + b.act * tokens * V;                 // logits, then their gradient
      c.temporaries = std::max(c.temporaries, b.act * tokens * H);  // head backward's dh
    }
  }
  return c;
}

int64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

std::string gb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / 1e9);
  return buf;
}

StageMemory plan_stage(const RunConfig& cfg, PlanDevice device, int pp_rank) {
  const ParallelConfig& pc = cfg.parallel;
  const TransformerConfig& m = cfg.model;
  const Bytes b = bytes_of(device);
  const int tp = pc.tensor_model_parallel_size, pp = pc.pipeline_model_parallel_size;
  const int cp = pc.context_parallel_size;
  const bool sp = pc.sequence_parallel && tp > 1;
  const int d = std::max(1, pc.data_parallel_size * cp);  // the gradient group
  const int vpp = std::max(1, pc.virtual_pipeline_model_parallel_size);
  StageMemory st;
  st.pp_rank = pp_rank;

  // This stage's parameters, registered by the real model code (TP-local slices, tied copies).
  ParameterStore store;
  ModelParallel mp;
  mp.tp = ParallelGroup{nullptr, 0, tp};
  mp.sequence_parallel = sp;
  // MoE layers register this EP rank's experts, split over expert TP.
  mp.ep = ParallelGroup{nullptr, 0, std::max(1, pc.expert_model_parallel_size)};
  mp.expert_tp = ParallelGroup{nullptr, 0, std::max(1, pc.expert_tensor_parallel_size)};
  const int ed = std::max(1, pc.expert_data_parallel_size);  // expert buckets' group
  // FP8: the linears register the weights they cast each step (and, with --fp8-param-gather,
  // those whose codes the gather moves).
  const Fp8Config& f8 = cfg.fp8;
  const bool fp8_param_gather = f8.enabled() && f8.param_gather && pc.use_distributed_optimizer &&
                                !pc.use_custom_fsdp &&
                                (f8.recipe == Fp8Recipe::Delayed || f8.recipe == Fp8Recipe::Tensorwise);
  if (f8.enabled()) {
    Fp8Settings settings = fp8_settings(cfg);
    settings.param_gather = fp8_param_gather;
    mp.fp8 = std::make_shared<Fp8State>(settings);
  }
  const auto ranges = pp::stage_layers(m.num_layers, pp, vpp, pp_rank, pc.decoder_first_pipeline_num_layers,
                                       pc.decoder_last_pipeline_num_layers);
  std::vector<std::unique_ptr<GptModel>> chunks;
  for (int c = 0; c < static_cast<int>(ranges.size()); ++c) {
    ModelChunkSpec spec;
    spec.embedding = pp_rank == 0 && c == 0;
    spec.head = pp_rank == pp - 1 && c == static_cast<int>(ranges.size()) - 1;
    spec.first_layer = ranges[static_cast<size_t>(c)].first;
    spec.num_layers = ranges[static_cast<size_t>(c)].count;
    chunks.push_back(std::make_unique<GptModel>(m, store, mp, spec));
  }
  st.parameters = store.num_parameters();

  // The flat buffers as the data-parallel wrapper lays them out, and what it keeps of them.
  const bool fsdp = pc.use_custom_fsdp;
  const ShardingStrategy strategy = pc.data_parallel_sharding_strategy;
  int64_t largest_unit = 0;
  if (fsdp) {
    std::vector<FsdpUnit> units;
    for (int c = 0; c < static_cast<int>(chunks.size()); ++c)
      for (std::vector<int>& h : chunks[static_cast<size_t>(c)]->param_units()) units.push_back({c, std::move(h)});
    store.lay_out(FullyShardedDataParallel::buffer_layout(strategy, d, units,
                                                          static_cast<int>(store.descs().size()), ed));
    // The wrapper's own shard computation. S: the padded buffer; Sd: what this rank keeps of it
    // (dense buckets over d, expert ones over ed; all of it under no_shard).
    const FsdpShardLayout shards = FullyShardedDataParallel::shard_layout(store, strategy, d, units, ed);
    largest_unit = shards.largest_unit();
    const int64_t S = shards.flat_size, Sd = shards.shard_elements;
    const bool wsh = strategy == ShardingStrategy::OptimGradsParams;
    const bool gsh = wsh || strategy == ShardingStrategy::OptimGrads;
    const int64_t opt = Sd;
    st.weights = b.weight * (wsh ? Sd : S);
    st.grads = 4 * (gsh ? Sd : S);
    st.masters = device == PlanDevice::Cpu ? 0 : 4 * opt;  // CPU: the masters are the weights
    st.moments = 8 * opt;
    // Two gathered units (the one in use and the prefetched one). Gradient slots: on CUDA with
    // more than one rank a reduce-scatter runs on its own stream, so two slots (and their
    // reduce-scatter outputs) are live; otherwise each is reduced before the next is taken.
    const bool overlap = device == PlanDevice::Cuda && d > 1;
    if (wsh) st.comm_buffers += 2 * b.weight * largest_unit;
    if (gsh) st.comm_buffers += (overlap ? 2 : 1) * 4 * (largest_unit + (d > 1 ? largest_unit / d : 0));
  } else {
    DataParallelOptions dpo;
    dpo.overlap_grad_reduce = pc.overlap_grad_reduce;
    dpo.distributed_optimizer = pc.use_distributed_optimizer;
    dpo.overlap_param_gather = pc.overlap_param_gather;
    dpo.bucket_size = pc.ddp_bucket_size;
    // The wrapper's group: dp×cp, or the distributed optimizer's intra-instance slice of it.
    const int shard = dpo.distributed_optimizer ? std::max(1, d / std::max(1, pc.num_distributed_optimizer_instances)) : d;
    store.lay_out(DataParallel::buffer_layout(dpo, shard, ed));
    const int64_t S = store.flat_size();
    int64_t Sd = 0;
    for (const GradBucket& bk : store.buckets()) Sd += (bk.end - bk.begin) / (bk.expert ? ed : shard);
    const int64_t opt = dpo.distributed_optimizer ? Sd : S;
    st.weights = b.weight * S;
    st.grads = 4 * S + (dpo.distributed_optimizer ? 4 * opt : 0);  // + the reduced shard
    st.masters = 4 * opt;
    st.moments = 8 * opt;
    if (fp8_param_gather && shard > 1) {
      // One bucket's staging buffer (the owned parameters and codes as they travel, in the
      // parameter dtype); the gathered codes take the place of the casts counted below.
      int64_t staging = 0;
      for (const Fp8State::GatheredWeight& g : mp.fp8->gathered_weights()) {
        const GradBucket& bk = store.buckets()[static_cast<size_t>(store.bucket_of(g.first))];
        staging = std::max(staging, bk.end - bk.begin);
      }
      st.comm_buffers += b.weight * staging;
    }
  }
  if (mp.fp8) {
    // The FP8 weight codes kept through a step: each linear's (and local expert's) row-wise
    // cast at its first use, or the gathered codes in its place: a byte an element on CUDA
    // (blockwise's 128x128 scale grids are 1/4096 of that: left out), decoded f32 on the CPU.
    // The transposed codes live while a data-gradient GEMM runs: a temporary (below).
    st.fp8_codes = (device == PlanDevice::Cuda ? 1 : 4) * mp.fp8->cast_weight_elements();
  }

  // Activations: the schedule's worst point, replayed from this stage's action list.
  // Block diffusion runs the layers on [x_t | x_0]: twice the tokens (the logits stay the
  // noisy half's masked rows, which the output layer's estimate bounds by all rows anyway).
  const int64_t doubled = cfg.diffusion.block_diffusion() ? 2 : 1;
  const int64_t tokens = static_cast<int64_t>(cfg.training.micro_batch_size) * m.seq_length * doubled / cp;
  std::vector<ChunkBytes> cb;
  for (size_t c = 0; c < ranges.size(); ++c)
    cb.push_back(chunk_bytes(m, ranges[c], pp_rank == pp - 1 && c + 1 == ranges.size(), tp, sp, tokens, b, device,
                             mp.fp8.get()));
  const int dp = std::max(1, pc.data_parallel_size);
  const int M = std::max(1, cfg.training.num_micro_batches(dp));
  pp::ScheduleConfig sc;
  sc.pp_rank = pp_rank;
  sc.pp_size = pp;
  sc.virtual_stages = vpp;
  sc.num_micro_batches = M;
  sc.microbatch_group_size = pc.microbatch_group_size_per_vp_stage;
  std::vector<pp::Action> actions;
  try {
    actions = pp::build_schedule(sc);
  } catch (const std::exception&) {
    // Not a valid schedule (the rules reject it): one micro-batch in flight per chunk.
    for (int c = 0; c < static_cast<int>(ranges.size()); ++c) actions.push_back({pp::ActionType::Forward, 0, c, {}});
  }
  std::vector<int> live(ranges.size(), 0);
  for (const pp::Action& a : actions) {
    if (a.type == pp::ActionType::Backward) --live[static_cast<size_t>(a.chunk)];
    if (a.type != pp::ActionType::Forward) continue;
    ++live[static_cast<size_t>(a.chunk)];
    int64_t records = 0, head = 0;
    for (size_t c = 0; c < cb.size(); ++c) {
      records += live[c] * cb[c].records;
      head += live[c] * cb[c].head;
    }
    if (records + head > st.activations + st.logits_and_loss) {
      st.activations = records;
      st.logits_and_loss = head;
    }
  }
  for (const ChunkBytes& c : cb) st.activations_per_micro_batch += c.records;
  st.micro_batches_in_flight = st.activations_per_micro_batch > 0
                                   ? static_cast<double>(st.activations) / static_cast<double>(st.activations_per_micro_batch)
                                   : 0;
  // Workspaces: one backward's temporaries (a layer, or the head), a recomputed unit rebuilt,
  // and cuBLASLt's workspace on every stream the wrapper creates.
  int64_t temporaries = 0, rebuilt = 0;
  for (const ChunkBytes& c : cb) {
    temporaries = std::max(temporaries, c.temporaries);
    rebuilt = std::max(rebuilt, c.rebuilt);
  }
  st.workspaces = temporaries + rebuilt;
  // FP8: a data-gradient GEMM's transposed weight codes (CUDA bytes; the CPU's blockwise decoded
  // f32; its per-tensor values serve both orientations).
  if (mp.fp8 && (device == PlanDevice::Cuda || mp.fp8->blockwise()))
    st.workspaces += (device == PlanDevice::Cuda ? 1 : 4) * mp.fp8->largest_transposed_weight();
  if (device == PlanDevice::Cuda) {
    int streams = 1;
    if (d > 1 && fsdp) streams += 2;
    else if (d > 1 && (pc.overlap_grad_reduce || pc.overlap_param_gather)) streams += 1;
    st.workspaces += streams * kCublasWorkspace;
  }
  if (pp > 1) st.comm_buffers += 2 * b.act * (sp ? tokens / tp : tokens) * m.hidden_size;
  return st;
}

}  // namespace

PlanDevice plan_device(const RunConfig& config, bool dry_run, bool device_given) {
  if (config.training.device == DeviceKind::Cuda) return PlanDevice::Cuda;
  return dry_run && !device_given ? PlanDevice::Cuda : PlanDevice::Cpu;
}

MemoryPlan plan_memory(const RunConfig& config, PlanDevice device, int host_ranks) {
  MemoryPlan plan;
  plan.device = device;
  if (device == PlanDevice::Cuda) {
    plan.capacity = static_cast<int64_t>(std::llround(config.training.gpu_memory_gb * 1e9));
    plan.runtime_reserve = kCudaRuntimeReserve;
  } else {
    plan.capacity = host_memory_bytes() / std::max(1, host_ranks);
  }
  const int pp = std::max(1, config.parallel.pipeline_model_parallel_size);
  for (int r = 0; r < pp; ++r) {
    plan.stages.push_back(plan_stage(config, device, r));
    if (plan.stages.back().peak() > plan.stages[static_cast<size_t>(plan.busiest)].peak()) plan.busiest = r;
  }
  if (config.parallel.context_parallel_size > 1)
    plan.notes.push_back("context parallelism: the tokens per rank are divided by cp; its attention "
                         "communication buffers are not counted");
  if (config.model.moe.enabled())
    plan.notes.push_back("MoE layers: their parameters and optimizer state (this EP rank's experts) are "
                         "counted exactly; their activations as a dense MLP's (routing buffers and "
                         "token imbalance are not modelled)");
  return plan;
}

PlannedRecordBytes planned_record_bytes(const RunConfig& config, PlanDevice device) {
  const ParallelConfig& pc = config.parallel;
  const TransformerConfig& m = config.model;
  const int tp = pc.tensor_model_parallel_size;
  const bool sp = pc.sequence_parallel && tp > 1;
  const int64_t doubled = config.diffusion.block_diffusion() ? 2 : 1;  // [x_t | x_0]
  const int64_t tokens = static_cast<int64_t>(config.training.micro_batch_size) * m.seq_length * doubled /
                         pc.context_parallel_size;
  const Bytes b = bytes_of(device);
  PlannedRecordBytes r;
  r.per_layer = layer_bytes(m, tp, sp, tokens, b, device).saved;
  r.head = chunk_bytes(m, pp::LayerRange{0, 0}, true, tp, sp, tokens, b, device).head;
  return r;
}

std::string format_memory_plan(const MemoryPlan& plan, const RunConfig& config) {
  std::ostringstream os;
  const bool cuda = plan.device == PlanDevice::Cuda;
  const size_t n = plan.stages.size();
  os << "memory plan (GB = 1e9 bytes; " << (cuda ? "per GPU, bf16 weights and activations" : "host, fp32 backend")
     << (n > 1 ? "; one column per pipeline stage" : "") << "):\n";
  auto row = [&](const std::string& label, auto field) {
    os << "  " << label << std::string(label.size() < 46 ? 46 - label.size() : 1, ' ');
    for (const StageMemory& s : plan.stages) {
      char buf[24];
      std::snprintf(buf, sizeof buf, "%10s", gb(field(s)).c_str());
      os << buf;
    }
    os << "\n";
  };
  const ParallelConfig& pc = config.parallel;
  const std::string keeps =
      pc.use_custom_fsdp ? std::string("FSDP ") + sharding_strategy_name(pc.data_parallel_sharding_strategy)
      : pc.use_distributed_optimizer ? "distributed optimizer" : "DDP";
  os << "  (" << keeps << " over dp×cp = " << pc.data_parallel_size * pc.context_parallel_size << ", tp "
     << pc.tensor_model_parallel_size << (pc.sequence_parallel ? " + SP" : "") << ", pp "
     << pc.pipeline_model_parallel_size << ", micro-batch " << config.training.micro_batch_size << " x seq "
     << config.model.seq_length << ")\n";
  row(std::string("weights (") + (cuda ? "bf16" : "fp32") + ")", [](const StageMemory& s) { return s.weights; });
  row("gradients (fp32)", [](const StageMemory& s) { return s.grads; });
  row("master weights (fp32)", [](const StageMemory& s) { return s.masters; });
  row("Adam moments (fp32 m, v)", [](const StageMemory& s) { return s.moments; });
  bool fp8_codes = false;
  for (const StageMemory& s : plan.stages) fp8_codes |= s.fp8_codes > 0;
  if (fp8_codes) row("FP8 weight codes (one step's casts)", [](const StageMemory& s) { return s.fp8_codes; });
  row("activations per micro-batch", [](const StageMemory& s) { return s.activations_per_micro_batch; });
  os << "  x micro-batches in flight (pipeline schedule)" << std::string(1, ' ');
  for (const StageMemory& s : plan.stages) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%10.2f", s.micro_batches_in_flight);
    os << buf;
  }
  os << "\n";
  row("= activations", [](const StageMemory& s) { return s.activations; });
  row("logits and loss", [](const StageMemory& s) { return s.logits_and_loss; });
  row("communication buffers", [](const StageMemory& s) { return s.comm_buffers; });
  row("workspaces and temporaries", [](const StageMemory& s) { return s.workspaces; });
  row("predicted peak", [](const StageMemory& s) { return s.peak(); });
  const StageMemory& busy = plan.peak_stage();
  if (cuda)
    os << "  + CUDA context, cuBLASLt and NCCL outside the pool: " << gb(plan.runtime_reserve) << " GB\n";
  os << "  busiest rank: " << (n > 1 ? "pipeline stage " + std::to_string(busy.pp_rank) + ", " : std::string())
     << gb(plan.needed()) << " GB of " << gb(plan.capacity) << " GB "
     << (cuda ? "(--gpu-memory-gb)" : "(host memory)") << ": " << (plan.fits() ? "fits" : "DOES NOT FIT") << "\n";
  for (const std::string& note : plan.notes) os << "  not modelled: " << note << "\n";
  return os.str();
}

std::string memory_advice(const RunConfig& config, const MemoryPlan& plan) {
  if (plan.fits()) return "";
  const bool cuda = plan.device == PlanDevice::Cuda;
  std::ostringstream os;
  const StageMemory& busy = plan.peak_stage();
  os << "the layout does not fit: the busiest rank needs " << gb(plan.needed()) << " GB (weights "
     << gb(busy.weights) << ", gradients " << gb(busy.grads) << ", optimizer " << gb(busy.masters + busy.moments)
     << ", activations " << gb(busy.activations + busy.logits_and_loss) << ", buffers and workspaces "
     << gb(busy.comm_buffers + busy.workspaces + plan.runtime_reserve) << ") of "
     << (cuda ? "the GPU's " : "the host's ") << gb(plan.capacity) << " GB"
     << (cuda ? " (--gpu-memory-gb)" : "");
  // Changes that keep the GPUs and the global batch, each re-planned.
  struct Change {
    std::string flags;
    RunConfig cfg;
  };
  std::vector<Change> changes;
  const ParallelConfig& pc = config.parallel;
  const int d = pc.data_parallel_size * pc.context_parallel_size;
  auto recompute = [](RunConfig c) {
    c.model.recompute_granularity = RecomputeGranularity::Full;
    c.model.recompute_method = RecomputeMethod::Uniform;
    c.model.recompute_num_layers = 1;
    return c;
  };
  auto fsdp = [](RunConfig c) {
    c.parallel.use_custom_fsdp = true;
    c.parallel.data_parallel_sharding_strategy = ShardingStrategy::OptimGradsParams;
    c.parallel.use_distributed_optimizer = true;
    return c;
  };
  const bool has_recompute = config.model.recompute_granularity == RecomputeGranularity::Full;
  const bool has_zero3 = pc.use_custom_fsdp && pc.data_parallel_sharding_strategy == ShardingStrategy::OptimGradsParams;
  const std::string recompute_flags = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
  if (!has_recompute) changes.push_back({recompute_flags, recompute(config)});
  if (d > 1 && !has_zero3) changes.push_back({"--use-megatron-fsdp (optim_grads_params)", fsdp(config)});
  if (d > 1 && !has_zero3 && !has_recompute)
    changes.push_back({"--use-megatron-fsdp and " + recompute_flags, fsdp(recompute(config))});
  if (config.training.micro_batch_size > 1) {
    RunConfig c = config;
    c.training.micro_batch_size = 1;
    changes.push_back({"--micro-batch-size 1", c});
    if (!has_recompute) changes.push_back({"--micro-batch-size 1 and " + recompute_flags, recompute(c)});
  }
  std::vector<std::string> fitting;
  for (const Change& ch : changes) {
    try {
      const MemoryPlan p = plan_memory(ch.cfg, plan.device);
      if (p.fits()) fitting.push_back("`" + ch.flags + "` (" + gb(p.needed()) + " GB)");
    } catch (const std::exception&) {
    }
  }
  const char* units = cuda ? "GPUs" : "processes";
  if (!fitting.empty()) {
    os << ". With the same " << units << " it would fit with ";
    for (size_t i = 0; i < fitting.size(); ++i) os << (i ? "; or " : "") << fitting[i];
  } else {
    // The model state over more devices: fully sharded (FSDP), it costs 18 bytes per parameter
    // on CUDA (16 on the CPU backend) wherever it lives; TP x PP divide it too.
    const int64_t state = busy.parameters * (cuda ? 18 : 16);
    const int64_t room = plan.capacity - plan.runtime_reserve -
                         (busy.activations + busy.logits_and_loss + busy.workspaces);
    os << ". No change of recomputation, FSDP or micro-batch size makes it fit on these " << units
       << ": the model state of a stage (weights, fp32 gradients, masters and Adam moments) is "
       << gb(state) << " GB";
    if (room > 0) {
      const int64_t n = (state + room - 1) / room * std::max(1, pc.pipeline_model_parallel_size) *
                        pc.tensor_model_parallel_size;
      os << ", so it needs at least " << n << " " << units
         << " (FSDP over the data-parallel ranks, or more --tensor-model-parallel-size / "
            "--pipeline-model-parallel-size)";
    } else {
      os << ", and one micro-batch's activations alone exceed the memory: use a smaller "
            "--micro-batch-size or --seq-length, or split the model with --tensor-model-parallel-size "
            "and --pipeline-model-parallel-size";
    }
  }
  os << " (`--dry-run` prints the breakdown; `--plan --world-size N` ranks the layouts that fit)";
  return os.str();
}

}  // namespace megadlm
