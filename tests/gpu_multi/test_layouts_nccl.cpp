// Whole training steps under every parallel layout on CUDA tensors over NCCL (part of the gpu_nccl
// SPMD suite: 2, 4 or 8 ranks, one GPU each or all on one GPU through scripts/shared_gpu_rank.sh).
// The CPU layout suites (tests/layout/*) prove each layout equivalent to one process in fp32 with
// MPI; this trains the same kind of tiny model in bf16 on the GPU, where the paths differ: the
// data-parallel buckets reduced on the communication stream while the backward runs, the
// distributed optimizer's parameter all-gather on that stream, FSDP's prefetched all-gathers and
// reduce-scatters on its own streams, the pipeline's activations and gradients sent and received
// between stages (1F1B and interleaved), MoE tokens dispatched over NCCL (all-to-all, all-gather,
// with expert TP), tensor and sequence parallelism with the vocabulary-parallel embedding and
// cross-entropy (and --tp-comm-overlap's rings), and context parallelism inside the model.
// Each layout is picked per world size so that every case runs at 2, 4 and 8 ranks. Also: the
// overlapped data-parallel paths bit for bit against their blocking selves.
//
// Reference: the same configuration trained by one process on this rank's GPU (the trainer's
// single-process path, no groups), with the same global batch, data and noise (all keyed by
// global sample index and coordinates). Per-iteration lm loss and gradient norm over 2
// iterations: the first compares the forward and the reduced gradients on identical weights, the
// second the optimizer step and, under the distributed optimizer and FSDP, the gathered weights.
// (More iterations add run time, not coverage of the communication: sockets are slow.)
// Tolerances, measured with 2, 4 and 8 ranks on one H200 (every value is printed,
// "[layout nccl]"; docs/benchmarks.md, "Many ranks on one GPU") and set at ~10x the worst:
//   * layouts that may change where bf16 rounds (TP/SP/CP split the GEMMs and the attention,
//     EP/expert TP regroup the expert GEMMs; PP runs the same kernels, measured within 1.2e-7,
//     but is held to this bound): worst loss 2.0e-4 (TP 4 tied), grad norm 1.6e-3 (MoE at 4
//     ranks, iteration 2): bounds 2e-3 and 1.6e-2.
//   * data-only layouts (DDP, distributed optimizer, FSDP: the same kernels on the same
//     micro-batches; only the fp32 order of the gradient sums over ranks differs): worst 1.2e-7
//     over both iterations: bound 1e-6.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/trainer.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

constexpr int64_t kIters = 2;
constexpr int64_t kSeq = 64, kVocab = 500, kPaddedVocab = 512;

struct Layout {
  std::string name;
  int tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, etp = 1;
  bool sp = false, tp_overlap = false, tied = false;
  bool dist_opt = false, overlap_grad = false, overlap_param = false;
  int64_t bucket = 100000;  ///< --ddp-bucket-size: several buckets of the tiny model
  bool fsdp = false;
  ShardingStrategy strategy = ShardingStrategy::OptimGradsParams;
  bool moe = false;
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
  std::string cp_comm = "p2p";
  bool deterministic = false;  ///< --deterministic-mode: attention's dQ summed in a fixed order
  /// Only the order of fp32 gradient sums differs from one process (see the header).
  bool data_only() const { return tp == 1 && pp == 1 && cp == 1 && ep == 1 && etp == 1 && !moe; }
};

/// The tiny model on the GPU: 2 layers per (virtual) stage, head dim 64 (the attention kernels'
/// tested shape), 4 query groups (TP up to 4), vocabulary 500 padded to 512 (TP up to 8).
RunConfig tiny_cuda_run(const Layout& l, int world) {
  RunConfig r = test::tiny_run({.layers = 2 * l.pp * l.vpp, .hidden = 256, .heads = 4, .query_groups = 4,
                                .kv_channels = 64, .ffn = 512, .seq = kSeq, .vocab = kPaddedVocab},
                               kIters);
  r.model.vocab_size = kVocab;
  r.diffusion.mask_token = kVocab - 1;
  r.model.untie_embeddings_and_output_weights = !l.tied;
  r.model.hidden_dropout = 0.1f;  // keyed by global coordinates: the same under every layout
  if (l.moe) test::make_moe(r, 8, 2);
  r.training.device = DeviceKind::Cuda;
  r.training.bf16 = true;
  r.training.micro_batch_size = 2;
  const int dp = world / (l.tp * l.pp * l.cp);
  // 2 micro-batches per data rank (and at least pp: 1F1B fills the pipeline, interleaving needs
  // a multiple of pp).
  r.training.global_batch_size = 2 * dp * std::max(2, l.pp);
  ParallelConfig& p = r.parallel;
  p.world_size = world;
  p.tensor_model_parallel_size = l.tp;
  p.pipeline_model_parallel_size = l.pp;
  p.virtual_pipeline_model_parallel_size = l.vpp > 1 ? l.vpp : 0;
  p.context_parallel_size = l.cp;
  p.cp_comm_type = {cp::comm_type_from_name(l.cp_comm)};
  p.sequence_parallel = l.sp && l.tp > 1;
  p.tp_comm_overlap = l.tp_overlap && p.sequence_parallel;
  p.data_parallel_size = dp;
  p.expert_model_parallel_size = l.ep;
  p.expert_tensor_parallel_size = l.moe ? l.etp : l.tp;
  p.expert_data_parallel_size = world / (l.ep * p.expert_tensor_parallel_size * l.pp);
  p.use_distributed_optimizer = l.dist_opt || (l.fsdp && l.strategy != ShardingStrategy::NoShard);
  p.overlap_grad_reduce = l.overlap_grad;
  p.overlap_param_gather = l.overlap_param;
  p.ddp_bucket_size = l.bucket;  // the same buckets with and without overlap
  r.model.deterministic_mode = l.deterministic;
  p.use_custom_fsdp = l.fsdp;
  p.data_parallel_sharding_strategy = l.strategy;
  return r;
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  auto data = std::make_shared<MockGptDataset>(kVocab, kSeq, kVocab - 1);
  std::ostringstream log;
  Trainer t(cfg, data, log, groups);
  return t.train();
}

/// One process on this rank's GPU, same model and global batch (cached per model variant).
const std::vector<IterationMetrics>& reference(const RunConfig& split) {
  static std::map<std::string, std::vector<IterationMetrics>> cache;
  RunConfig one = tiny_cuda_run({.name = "one process",
                                 .tied = !split.model.untie_embeddings_and_output_weights,
                                 .moe = split.model.moe.num_experts > 0},
                                1);
  one.model.num_layers = split.model.num_layers;
  one.training.global_batch_size = split.training.global_batch_size;
  const std::string key = std::to_string(one.model.num_layers) + (one.model.moe.num_experts > 0 ? "/moe" : "") +
                          (one.model.untie_embeddings_and_output_weights ? "/untied/" : "/tied/") +
                          std::to_string(one.training.global_batch_size);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, train(one, nullptr)).first;
  return it->second;
}

class LayoutsNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    runtime_ = test::spmd::runtime(comm::Transport::Nccl, &why);
    if (runtime_ == nullptr) GTEST_SKIP() << why;
  }

  int world() const { return runtime_->world().size(); }

  /// The process groups of `p`, built once per shape (creating NCCL communicators over sockets
  /// is the slow part of a case on a shared GPU).
  const parallel::ProcessGroups& groups(const ParallelConfig& p) {
    std::map<std::string, parallel::ProcessGroups>& cache = groups_;
    std::string key;
    for (int v : {p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
                  p.data_parallel_size, p.expert_model_parallel_size, p.expert_tensor_parallel_size,
                  p.expert_data_parallel_size, p.num_distributed_optimizer_instances})
      key += std::to_string(v) + "/";
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, parallel::ProcessGroups::build(runtime_->world_shared(), p)).first;
    return it->second;
  }

  std::vector<IterationMetrics> train_layout(const Layout& l) {
    const int n = world();
    EXPECT_EQ(n % (l.tp * l.pp * l.cp), 0) << l.name << " does not fit " << n << " ranks";
    const RunConfig cfg = tiny_cuda_run(l, n);
    return train(cfg, &groups(cfg.parallel));
  }

  /// `a` and `b` give the same losses and gradient norms bit for bit.
  void expect_bitwise_equal(const Layout& a, const Layout& b) {
    SCOPED_TRACE(a.name + " vs " + b.name);
    const std::vector<IterationMetrics> x = train_layout(a), y = train_layout(b);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      if (runtime_->world().rank() == 0)
        std::printf("[layout nccl] %d ranks %s vs %s it %zu: loss %.9g / %.9g, grad norm %.9g / %.9g\n", world(),
                    a.name.c_str(), b.name.c_str(), i + 1, x[i].lm_loss, y[i].lm_loss, x[i].grad_norm, y[i].grad_norm);
      EXPECT_EQ(x[i].lm_loss, y[i].lm_loss) << "iteration " << i + 1;
      EXPECT_EQ(x[i].grad_norm, y[i].grad_norm) << "iteration " << i + 1;
    }
  }

  void expect_same_as_one_process(const Layout& l) {
    SCOPED_TRACE(l.name);
    const int n = world();
    const RunConfig cfg = tiny_cuda_run(l, n);
    const std::vector<IterationMetrics> got = train_layout(l);
    const std::vector<IterationMetrics>& want = reference(cfg);
    ASSERT_EQ(got.size(), want.size());
    const int rank = runtime_->world().rank();
    for (size_t i = 0; i < want.size(); ++i) {
      const double dl = std::fabs(got[i].lm_loss - want[i].lm_loss) / want[i].lm_loss;
      const double dg = std::fabs(got[i].grad_norm - want[i].grad_norm) / want[i].grad_norm;
      if (rank == 0)
        std::printf("[layout nccl] %d ranks %-44s it %zu: loss %.6f / %.6f (rel %.1e), grad norm %.5f / "
                    "%.5f (rel %.1e)\n",
                    n, l.name.c_str(), i + 1, got[i].lm_loss, want[i].lm_loss, dl, got[i].grad_norm,
                    want[i].grad_norm, dg);
      const double loss_bound = l.data_only() ? 1e-6 : 2e-3;
      const double norm_bound = l.data_only() ? 1e-6 : 1.6e-2;
      EXPECT_LT(dl, loss_bound) << "lm loss, rank " << rank << ", iteration " << i + 1;
      EXPECT_LT(dg, norm_bound) << "grad norm, rank " << rank << ", iteration " << i + 1;
    }
  }

  // Every rank frees the suite's communicators together, before main() returns.
  static void TearDownTestSuite() { groups_.clear(); }

  comm::DistributedRuntime* runtime_ = nullptr;
  static inline std::map<std::string, parallel::ProcessGroups> groups_;  // per shape of the layout
};

}  // namespace

// ---- data parallel ------------------------------------------------------------------------------

TEST_F(LayoutsNccl, DdpReducesItsBucketsOnTheCommStreamDuringBackward) {
  expect_same_as_one_process({.name = "ddp overlapped buckets", .overlap_grad = true});
}

TEST_F(LayoutsNccl, DistributedOptimizerGathersParametersOnTheCommStream) {
  expect_same_as_one_process({.name = "dist-opt", .dist_opt = true});
  expect_same_as_one_process(
      {.name = "dist-opt overlapped grads + param gather", .dist_opt = true, .overlap_grad = true, .overlap_param = true});
}

// The same buckets reduced on the communication stream during the backward (and the parameters
// gathered on it after the step) or on the compute stream at the end: the same NCCL collectives
// on the same buffers, so bit for bit the same run (deterministic attention on both sides). A
// bucket launched before its last gradient landed, or a forward reading a bucket before its
// gather, moves bits.
TEST_F(LayoutsNccl, OverlappedReductionAndParamGatherAreBitwiseTheBlockingOnes) {
  expect_bitwise_equal({.name = "ddp overlapped", .overlap_grad = true, .deterministic = true},
                       {.name = "ddp blocking", .deterministic = true});
  expect_bitwise_equal({.name = "dist-opt overlapped", .dist_opt = true, .overlap_grad = true, .overlap_param = true,
                        .deterministic = true},
                       {.name = "dist-opt blocking", .dist_opt = true, .deterministic = true});
}

TEST_F(LayoutsNccl, FsdpPrefetchesAndReduceScattersOnItsStreams) {
  expect_same_as_one_process({.name = "fsdp optim_grads_params", .fsdp = true});
  expect_same_as_one_process({.name = "fsdp optim_grads", .fsdp = true, .strategy = ShardingStrategy::OptimGrads});
}

// ---- tensor parallel (vocabulary-parallel embedding and cross-entropy included) -----------------

TEST_F(LayoutsNccl, TensorAndSequenceParallelWithVocabParallelEmbeddingAndLoss) {
  expect_same_as_one_process({.name = "tp 2 sp", .tp = 2, .sp = true});
  // TP over up to 4 ranks (the query groups), tied embeddings: the vocabulary-parallel embedding
  // and output layer share one weight.
  const int tp = std::min(world(), 4);
  expect_same_as_one_process({.name = "tp " + std::to_string(tp) + " tied", .tp = tp, .tied = true});
}

TEST_F(LayoutsNccl, TpCommOverlapRingsInsideTheModel) {
  const int tp = std::min(world(), 4);
  expect_same_as_one_process({.name = "tp " + std::to_string(tp) + " sp comm-overlap", .tp = tp, .sp = true,
                              .tp_overlap = true});
}

// ---- pipeline parallel ----------------------------------------------------------------------------

TEST_F(LayoutsNccl, PipelineOneFOneBSendsActivationsAndGradientsBetweenStages) {
  expect_same_as_one_process({.name = "pp 2 (1F1B)", .pp = 2});
  if (world() >= 4) expect_same_as_one_process({.name = "pp 4 (1F1B) tied", .pp = 4, .tied = true});
}

TEST_F(LayoutsNccl, InterleavedPipelineWithVirtualStages) {
  const int pp = std::min(world(), 4);
  expect_same_as_one_process({.name = "pp " + std::to_string(pp) + " vpp 2 (interleaved)", .pp = pp, .vpp = 2});
}

// ---- expert parallel ------------------------------------------------------------------------------

TEST_F(LayoutsNccl, ExpertDispatchAllToAllOverTheWorld) {
  expect_same_as_one_process({.name = "moe ep world all-to-all", .ep = world(), .moe = true});
}

TEST_F(LayoutsNccl, ExpertDispatchAllGatherOverTheWorld) {
  expect_same_as_one_process(
      {.name = "moe ep world all-gather", .ep = world(), .moe = true, .dispatcher = MoeDispatcher::AllGather});
}

TEST_F(LayoutsNccl, ExpertTensorParallelDispatch) {
  // 2 ranks: expert TP 2 alone; 4 and 8: expert TP 2 x EP 2 or 4.
  const int ep = world() / 2;
  expect_same_as_one_process({.name = "moe etp 2 ep " + std::to_string(ep), .ep = ep, .etp = 2, .moe = true});
  expect_same_as_one_process({.name = "moe etp 2 ep " + std::to_string(ep) + " all-gather", .ep = ep, .etp = 2,
                              .moe = true, .dispatcher = MoeDispatcher::AllGather});
}

// ---- context parallel inside the model --------------------------------------------------------------

TEST_F(LayoutsNccl, ContextParallelInsideTheModel) {
  expect_same_as_one_process({.name = "cp 2 p2p", .cp = 2, .cp_comm = "p2p"});
  const int cp = std::min(world(), 4);
  expect_same_as_one_process({.name = "cp " + std::to_string(cp) + " a2a", .cp = cp, .cp_comm = "a2a"});
}
