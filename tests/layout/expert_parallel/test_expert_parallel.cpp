// Layout equivalence for expert parallelism, as an SPMD program under mpirun: every rank trains
// the tiny diffusion MoE (8 experts, top-2, 2 layers, aux and z losses) for 20 iterations under
// the layout and, on its own, the single-process reference; per-iteration losses, gradient
// norms, load-balancing and z losses must agree to 1e-5 (relative). Differences come only from
// fp32 summation order: the expert-dp and EP reductions, the expert-TP partial sums, the SP
// shards of the router statistics.
// Cases: EP = world with each dispatcher, expert TP, EP x TP with SP, PP with a stage without
// MoE layers, the distributed optimizer, capacity dropping, context parallelism (with padded
// sequences; alone, with EP, with TP + SP), an expert bias that leaves experts without tokens,
// and benchmark routing by random logits (--moe-router-force-load-balancing). Run at 2 and 4 ranks; a case that does not fit the world skips.
#include <gtest/gtest.h>
#include <cmath>
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

struct Layout {
  int ep = 1, etp = 1, tp = 1, pp = 1, cp = 1;  // ep 0: the whole world
  bool sp = false, dist_opt = false;
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
  std::optional<float> capacity;
  bool expert_bias = false;
  bool force_balance = false;  // --moe-router-force-load-balancing
  bool grouped = false;
  std::vector<bool> moe_layers;  // empty: every layer
  MoeDropPolicy drop = MoeDropPolicy::Position;
  int iters = 20;
};

RunConfig tiny_run(const Layout& l, int world) {
  // 2 x 15 = 30 rows per micro-batch: uneven SP shards over TP 2 and 4.
  RunConfig r = test::tiny_run({.seq = 15}, l.iters);
  r.model.max_position_embeddings = 16;
  test::make_moe(r, 8, 2, l.moe_layers);
  MoeConfig& m = r.model.moe;
  m.dispatcher = l.dispatcher;
  m.capacity_factor = l.capacity;
  m.drop_policy = l.drop;
  m.grouped_gemm = l.grouped;
  m.force_load_balancing = l.force_balance;
  if (l.expert_bias) {
    m.expert_bias = true;
    m.score = MoeScoreFunction::Sigmoid;
    m.bias_update_rate = 10.0f;  // after one step the favoured experts take every token
  }
  r.diffusion.varilen_prob = 0.3f;  // micro-batches of different lengths
  r.training.global_batch_size = 8;
  r.training.micro_batch_size = 1;
  ParallelConfig& p = r.parallel;
  p.world_size = world;
  p.tensor_model_parallel_size = l.tp;
  p.pipeline_model_parallel_size = l.pp;
  p.sequence_parallel = l.sp && l.tp > 1;
  p.context_parallel_size = l.cp;
  p.data_parallel_size = world / (l.tp * l.pp * l.cp);
  p.expert_model_parallel_size = l.ep;
  p.expert_tensor_parallel_size = l.etp;
  p.expert_data_parallel_size = world / (l.ep * l.etp * l.pp);
  p.use_distributed_optimizer = l.dist_opt;
  return r;
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  auto data = std::make_shared<MockGptDataset>(128, 15, 127);
  std::ostringstream log;
  Trainer t(cfg, data, log, groups);
  return t.train();
}

void expect_close(double got, double want, const char* what, size_t iter, const Layout& l) {
  EXPECT_NEAR(got, want, 1e-5 * std::fabs(want) + 1e-12)
      << what << ", rank " << runtime().world().rank() << ", iteration " << iter + 1 << ", ep " << l.ep
      << " etp " << l.etp << " tp " << l.tp << " pp " << l.pp << " cp " << l.cp;
}

void expect_same_as_single_process(Layout l) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  if (l.ep == 0) l.ep = world;
  const int expert_ranks = l.ep * l.etp * l.pp, dense_ranks = l.tp * l.pp * l.cp;
  if (world % expert_ranks != 0 || world % dense_ranks != 0)
    GTEST_SKIP() << "ep " << l.ep << " x etp " << l.etp << " x pp " << l.pp << " and tp " << l.tp
                 << " x pp " << l.pp << " x cp " << l.cp << " must divide the world " << world;
  const RunConfig cfg = tiny_run(l, world);
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  const auto split = train(cfg, &groups);
  Layout one;
  one.capacity = l.capacity;
  one.expert_bias = l.expert_bias;
  one.force_balance = l.force_balance;
  one.moe_layers = l.moe_layers;
  one.drop = l.drop;
  one.iters = l.iters;
  const auto ref = train(tiny_run(one, 1), nullptr);
  ASSERT_EQ(split.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    expect_close(split[i].lm_loss, ref[i].lm_loss, "lm loss", i, l);
    expect_close(split[i].grad_norm, ref[i].grad_norm, "grad norm", i, l);
    expect_close(split[i].moe.aux_loss, ref[i].moe.aux_loss, "load-balancing loss", i, l);
    expect_close(split[i].moe.z_loss, ref[i].moe.z_loss, "z loss", i, l);
    expect_close(split[i].moe.load_max_over_mean, ref[i].moe.load_max_over_mean, "load max/mean", i, l);
    expect_close(split[i].moe.dropped_fraction, ref[i].moe.dropped_fraction, "dropped", i, l);
  }
  EXPECT_GT(ref.back().moe.aux_loss, 0.0);
  if (l.expert_bias) {
    // The bias moves by 10 per step: from iteration 2 on, the tokens go to the experts it
    // favours and the others get none (an expert load of at least twice the mean).
    double most = 0;
    for (size_t i = 1; i < ref.size(); ++i) most = std::max(most, ref[i].moe.load_max_over_mean);
    EXPECT_GE(most, 2.0);
  }
  if (l.force_balance) {
    // Random logits spread the 60 slots of a micro-batch over the 8 experts: far from the
    // collapsed routing (max/mean up to 4 with top-2 of 8) every iteration.
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_LT(ref[i].moe.load_max_over_mean, 2.0) << "iteration " << i + 1;
  }
}

}  // namespace

TEST(ExpertParallel, AllToAllOverTheWholeWorldMatchesOneProcess) {
  expect_same_as_single_process({.ep = 0});
}

TEST(ExpertParallel, AllGatherDispatcherMatchesOneProcess) {
  expect_same_as_single_process({.ep = 0, .dispatcher = MoeDispatcher::AllGather});
}

TEST(ExpertParallel, EpTwoWithGroupedGemmMatchesOneProcess) {
  expect_same_as_single_process({.ep = 2, .grouped = true});
}

TEST(ExpertParallel, ExpertTensorParallelMatchesOneProcess) {
  // 2 ranks: expert TP 2 over two data-parallel ranks; 4 ranks: ETP 2 x EP 2.
  const int world = runtime().world().size();
  expect_same_as_single_process({.ep = world / 2, .etp = 2});
  expect_same_as_single_process({.ep = world / 2, .etp = 2, .dispatcher = MoeDispatcher::AllGather});
}

TEST(ExpertParallel, EpTimesTpWithSequenceParallelMatchesOneProcess) {
  expect_same_as_single_process({.ep = 2, .tp = 2, .sp = true});
  expect_same_as_single_process({.ep = 2, .tp = 2, .sp = true, .dispatcher = MoeDispatcher::AllGather});
}

TEST(ExpertParallel, PipelineWithAStageWithoutMoeLayersMatchesOneProcess) {
  // Layer 0 (stage 0) is an MoE layer, layer 1 (stage 1) dense: stage 1 has no expert
  // parameters and still joins the statistics' reduction.
  const int world = runtime().world().size();
  expect_same_as_single_process({.ep = world / 2, .pp = 2, .moe_layers = {true, false}});
}

TEST(ExpertParallel, DistributedOptimizerShardsDenseAndExpertParameters) {
  expect_same_as_single_process({.ep = 2, .dist_opt = true});
  expect_same_as_single_process({.ep = 0, .dist_opt = true});
}

TEST(ExpertParallel, CapacityDroppingMatchesOneProcess) {
  expect_same_as_single_process({.ep = 0, .capacity = 0.75f});
  expect_same_as_single_process({.ep = 2, .tp = 2, .sp = true, .capacity = 0.75f});
  // Dropping by probability ranks near-equal probs (post-softmax top-2 starts at 0.5 ± tiny):
  // after a few steps fp32 reassociation can swap two candidates, a discrete change; the first
  // iterations, where the weights still agree to rounding, must match. (Since the fused
  // add+RMSNorm the third step already swaps one such pair: 7e-4 in the grad norm.)
  expect_same_as_single_process({.ep = 0, .capacity = 0.75f, .drop = MoeDropPolicy::Probs, .iters = 2});
}

TEST(ExpertParallel, ContextParallelMatchesOneProcess) {
  // Sequences of 15 (and shorter, varilen) tokens split over CP 2 and 4 are padded to 2·cp
  // chunks: the padding rows fall inside the shards and must be neither routed nor counted.
  // CP ranks hold the same experts (expert-dp spans them) or, with EP over them, split them.
  const int world = runtime().world().size();
  expect_same_as_single_process({.ep = 1, .cp = 2});
  expect_same_as_single_process({.ep = 0, .cp = 2});
  expect_same_as_single_process({.ep = 0, .cp = 2, .dispatcher = MoeDispatcher::AllGather});
  if (world >= 4) {
    expect_same_as_single_process({.ep = 2, .cp = 4});
    expect_same_as_single_process({.ep = 2, .tp = 2, .cp = 2, .sp = true});
  }
}

TEST(ExpertParallel, ExpertBiasThatStarvesExpertsMatchesOneProcess) {
  // Bias steps of 10 make the selection a near-tie between the favoured experts; under EP 4 the
  // fp32 reassociation of the fused ops swaps one pair at step 9, a discrete change. The steps
  // before it (which include the starving) must match.
  expect_same_as_single_process({.ep = 0, .expert_bias = true, .iters = 8});
}

TEST(ExpertParallel, ForcedLoadBalancingRoutesEveryLayoutAlike) {
  // The random logits are keyed by (sample, position, layer, expert): SP shards, CP chunks
  // (with their padding rows) and pipeline stages draw the values the single process draws.
  const int world = runtime().world().size();
  expect_same_as_single_process({.ep = 0, .force_balance = true});
  expect_same_as_single_process({.ep = 2, .tp = 2, .sp = true, .force_balance = true});
  expect_same_as_single_process({.ep = 1, .cp = 2, .force_balance = true});
  expect_same_as_single_process({.ep = world / 2, .pp = 2, .force_balance = true});
}
