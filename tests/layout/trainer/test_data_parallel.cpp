// Layout equivalence for data parallelism (docs/architecture.md promise 1), as an SPMD program under
// mpirun: every rank trains the tiny diffusion LM with DP = world size and, on its own, the
// single-process reference (DP = 1) with the same global batch; the per-iteration losses and
// gradient norms must agree to 1e-5 (relative) for plain DDP, overlapped bucket reduction and
// the distributed optimizer. The only differences are fp32 summation orders across ranks.
#include <gtest/gtest.h>
#include <cmath>
#include <sstream>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/trainer.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

RunConfig tiny_run(int dp, bool dist_opt, bool overlap, int64_t bucket, int instances = 1) {
  RunConfig r = test::tiny_run({}, 20);
  r.model.hidden_dropout = 0.1f;    // keyed by global coordinates: identical under every layout
  r.diffusion.varilen_prob = 0.2f;  // keyed by the global micro-batch: identical too
  r.parallel.world_size = dp;
  r.parallel.data_parallel_size = dp;
  r.parallel.use_distributed_optimizer = dist_opt;
  r.parallel.overlap_grad_reduce = overlap;
  r.parallel.ddp_bucket_size = bucket;
  r.parallel.num_distributed_optimizer_instances = instances;
  return r;
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  auto data = std::make_shared<MockGptDataset>(128, 32, 127);
  std::ostringstream log;
  Trainer t(cfg, data, log, groups);
  return t.train();
}

void expect_same_as_single_process(bool dist_opt, bool overlap, int64_t bucket, int instances = 1) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  if (world % instances != 0) GTEST_SKIP() << instances << " instances need a world size multiple";
  RunConfig cfg = tiny_run(world, dist_opt, overlap, bucket, instances);
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  const auto dp = train(cfg, &groups);
  const auto ref = train(tiny_run(1, false, false, 0), nullptr);
  ASSERT_EQ(dp.size(), ref.size());
  const int rank = rt.world().rank();
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(dp[i].lm_loss, ref[i].lm_loss, 1e-5 * ref[i].lm_loss)
        << "rank " << rank << ", iteration " << i + 1 << ", DP " << world;
    EXPECT_NEAR(dp[i].grad_norm, ref[i].grad_norm, 1e-5 * ref[i].grad_norm)
        << "rank " << rank << ", iteration " << i + 1 << ", DP " << world;
  }
}

}  // namespace

TEST(DataParallel, MatchesOneProcess) { expect_same_as_single_process(false, false, 0); }

TEST(DataParallel, OverlappedBucketsMatchOneProcess) {
  expect_same_as_single_process(false, true, 20000);  // several buckets, reduced during backward
}

TEST(DataParallel, DistributedOptimizerMatchesOneProcess) {
  expect_same_as_single_process(true, false, 0);
}

TEST(DataParallel, DistributedOptimizerWithOverlapAndBucketsMatchesOneProcess) {
  expect_same_as_single_process(true, true, 20000);
}

TEST(DataParallel, TwoDistributedOptimizerInstancesMatchOneProcess) {
  // Shards reduce-scattered inside each half of the ranks, then all-reduced across the halves.
  expect_same_as_single_process(true, true, 20000, 2);
}
