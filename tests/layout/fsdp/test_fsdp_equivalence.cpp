// Layout equivalence for FSDP (docs/architecture.md, promise 1; docs/parallelism/fsdp.md), as
// an SPMD program under mpirun (np 2 and 4): every rank trains the tiny diffusion LM with
// Megatron-FSDP over the layout and, on its own, the single-process reference without FSDP
// (plain DP = 1) on the same global batch; per-iteration losses and pre-clip gradient norms must
// agree to 1e-5 relative for 20 iterations. Dropout and varilen are on (keyed by global
// coordinates, so identical under every layout). Where the layouts differ is only the order of
// fp32 sums across ranks (reduce-scatter vs the single process's accumulation), which moves the
// 5th-6th digit at most; the tolerance is the data-parallel suites' for that reason.
// Covered: each strategy at DP = world with M = 1 or 2 and M = 4 micro-batches, TP 2 + SP,
// PP 2 (and two virtual stages), full recomputation (uniform and block), tied embeddings on one
// stage and across two stages, CP 2 (every strategy) and MoE layers with EP 2 (every strategy).
// Cases that need more ranks than the world skip.
#include <gtest/gtest.h>
#include <map>
#include <sstream>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/trainer.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

constexpr ShardingStrategy kStrategies[] = {ShardingStrategy::NoShard, ShardingStrategy::Optim,
                                            ShardingStrategy::OptimGrads,
                                            ShardingStrategy::OptimGradsParams};

struct Layout {
  ShardingStrategy strategy = ShardingStrategy::OptimGradsParams;
  int tp = 1, pp = 1, vpp = 1;
  bool sp = false, untied = true;
  int micro_batches = 0;  ///< per rank; 0: the global batch of 8 split over the ranks
  RecomputeGranularity recompute = RecomputeGranularity::None;
  RecomputeMethod method = RecomputeMethod::Uniform;
  int recompute_layers = 1;
  int layers = 2;
  int cp = 1;
  int ep = 0;  ///< > 0: MoE layers (4 experts, top-2) with their experts over EP ranks
};

RunConfig tiny_run(const Layout& l, int world, bool fsdp) {
  const bool small = l.pp > 1 || l.layers > 2;
  RunConfig r = test::tiny_run(small ? test::TinyShape::small(l.layers) : test::TinyShape{}, 20);
  r.model.untie_embeddings_and_output_weights = l.untied;
  r.model.hidden_dropout = 0.1f;
  r.model.recompute_granularity = l.recompute;
  r.model.recompute_method = l.method;
  r.model.recompute_num_layers = l.recompute_layers;
  r.diffusion.varilen_prob = 0.2f;
  if (l.ep > 0) test::make_moe(r, 4, 2);
  const int dp = world / (l.tp * l.pp * l.cp);
  r.training.micro_batch_size = small || l.micro_batches > 0 ? 1 : 2;
  if (l.micro_batches > 0) r.training.global_batch_size = l.micro_batches * r.training.micro_batch_size * dp;
  else if (small) r.training.global_batch_size = 4 * dp;  // M = 4: 1F1B and VPP need M >= pp
  r.parallel.world_size = world;
  r.parallel.data_parallel_size = dp;
  r.parallel.tensor_model_parallel_size = l.tp;
  r.parallel.sequence_parallel = l.sp && l.tp > 1;
  r.parallel.pipeline_model_parallel_size = l.pp;
  r.parallel.virtual_pipeline_model_parallel_size = l.vpp > 1 ? l.vpp : 0;
  r.parallel.context_parallel_size = l.cp;
  if (l.ep > 0) {
    r.parallel.expert_model_parallel_size = l.ep;
    r.parallel.expert_tensor_parallel_size = 1;
    r.parallel.expert_data_parallel_size = world / (l.ep * l.pp);
  }
  r.parallel.use_custom_fsdp = fsdp;
  r.parallel.data_parallel_sharding_strategy = l.strategy;
  r.parallel.use_distributed_optimizer = fsdp && l.strategy != ShardingStrategy::NoShard;
  return r;
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  const bool small = cfg.model.hidden_size == 32;
  auto data = small ? std::make_shared<MockGptDataset>(64, 16, 63) : std::make_shared<MockGptDataset>(128, 32, 127);
  std::ostringstream log;
  Trainer t(cfg, data, log, groups);
  return t.train();
}

// The single-process reference (no FSDP, DP 1) for a global batch and micro-batch size (varilen
// is keyed by the global micro-batch, so the micro-batch size is part of the data), computed
// once per process.
const std::vector<IterationMetrics>& reference(const Layout& l, int micro_batch, int64_t global_batch) {
  static std::map<std::string, std::vector<IterationMetrics>> cache;
  Layout one;  // same shape, no parallelism, no recomputation (it changes no number)
  one.untied = l.untied;
  one.layers = l.layers;
  one.ep = l.ep > 0 ? 1 : 0;
  RunConfig cfg = tiny_run(one, 1, false);
  cfg.training.micro_batch_size = micro_batch;
  cfg.training.global_batch_size = global_batch;
  const std::string key = std::to_string(cfg.model.hidden_size) + "/" + std::to_string(l.layers) + "/" +
                          std::to_string(l.untied) + "/" + std::to_string(micro_batch) + "/" +
                          std::to_string(global_batch) + "/" + std::to_string(one.ep);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, train(cfg, nullptr)).first;
  return it->second;
}

void expect_same_as_single_process(const Layout& l, const std::string& what) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  if (world % (l.tp * l.pp * l.cp) != 0 || (l.ep > 0 && world % (l.ep * l.pp) != 0))
    GTEST_SKIP() << "needs a world size multiple of tp " << l.tp << " x pp " << l.pp << " x cp " << l.cp
                 << " (and of ep " << l.ep << " x pp)";
  const RunConfig cfg = tiny_run(l, world, true);
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  const auto got = train(cfg, &groups);
  const auto& ref = reference(l, cfg.training.micro_batch_size, cfg.training.global_batch_size);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(got[i].lm_loss, ref[i].lm_loss, 1e-5 * ref[i].lm_loss)
        << what << ": rank " << rt.world().rank() << ", iteration " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, ref[i].grad_norm, 1e-5 * ref[i].grad_norm)
        << what << ": rank " << rt.world().rank() << ", iteration " << i + 1;
  }
}

std::string name(ShardingStrategy s) { return sharding_strategy_name(s); }

}  // namespace

TEST(FsdpEquivalence, EachStrategyMatchesOneProcess) {
  for (ShardingStrategy s : kStrategies) expect_same_as_single_process({.strategy = s}, name(s));
}

TEST(FsdpEquivalence, EachStrategyWithFourMicroBatchesMatchesOneProcess) {
  // Accumulation over micro-batches: the full buffer (no_shard, optim) or reduce-scatter after
  // every micro-batch added into the shard (optim_grads*).
  for (ShardingStrategy s : kStrategies) expect_same_as_single_process({.strategy = s, .micro_batches = 4}, name(s));
}

TEST(FsdpEquivalence, TensorParallelWithSequenceParallelMatchesOneProcess) {
  // FSDP shards the TP-local tensors; SP norms' partial gradients sum over TP on the shards.
  for (ShardingStrategy s : {ShardingStrategy::Optim, ShardingStrategy::OptimGradsParams})
    expect_same_as_single_process({.strategy = s, .tp = 2, .sp = true}, name(s));
}

TEST(FsdpEquivalence, PipelineParallelMatchesOneProcess) {
  // Per stage over that stage's group; 1F1B re-gathers every layer for each micro-batch.
  for (ShardingStrategy s : {ShardingStrategy::OptimGrads, ShardingStrategy::OptimGradsParams})
    expect_same_as_single_process({.strategy = s, .pp = 2, .layers = 4}, name(s));
  expect_same_as_single_process({.pp = 2, .vpp = 2, .layers = 4}, "optim_grads_params, 2 virtual stages");
}

TEST(FsdpEquivalence, RecomputationMatchesOneProcess) {
  // One gather serves the re-run forward and the backward of a recomputed unit.
  expect_same_as_single_process({.recompute = RecomputeGranularity::Full, .layers = 4},
                                "uniform, 1 layer per unit");
  expect_same_as_single_process({.recompute = RecomputeGranularity::Full, .recompute_layers = 2, .layers = 4},
                                "uniform, 2 layers per unit");
  expect_same_as_single_process({.recompute = RecomputeGranularity::Full, .method = RecomputeMethod::Block,
                                 .layers = 4},
                                "block, first layer");
  expect_same_as_single_process({.strategy = ShardingStrategy::OptimGrads,
                                 .recompute = RecomputeGranularity::Full, .layers = 4},
                                "optim_grads, uniform");
}

TEST(FsdpEquivalence, TiedEmbeddingsMatchOneProcess) {
  // One stage: the head borrows the embedding's unit (gathered again, its gradient
  // reduce-scattered after the head and after the embedding). Two stages: each holds a copy in
  // a bucket of its own whose shards line up, summed over the embedding group.
  for (ShardingStrategy s : {ShardingStrategy::Optim, ShardingStrategy::OptimGradsParams}) {
    expect_same_as_single_process({.strategy = s, .untied = false}, name(s) + ", one stage");
    expect_same_as_single_process({.strategy = s, .pp = 2, .untied = false, .layers = 4}, name(s) + ", two stages");
  }
}

TEST(FsdpEquivalence, ContextParallelMatchesOneProcess) {
  // CP 2: FSDP shards over dp×cp (the gradient group), every strategy.
  for (ShardingStrategy s : kStrategies) expect_same_as_single_process({.strategy = s, .cp = 2}, name(s) + ", cp 2");
}

TEST(FsdpEquivalence, ExpertParallelMatchesOneProcess) {
  // MoE layers with EP 2: a layer's unit holds a dense bucket over dp×cp and an expert bucket
  // over expert-dp (the ranks holding the same experts); the norm sums the expert shards over
  // expert-dp and EP. EP = the world (expert-dp 1: the expert bucket is whole on each rank,
  // Megatron-LM#6660's case) and, at 4 ranks, EP 2 × expert-dp 2.
  for (ShardingStrategy s : kStrategies) expect_same_as_single_process({.strategy = s, .ep = 2}, name(s) + ", ep 2");
  expect_same_as_single_process({.micro_batches = 4, .ep = 2}, "optim_grads_params, ep 2, 4 micro-batches");
}
