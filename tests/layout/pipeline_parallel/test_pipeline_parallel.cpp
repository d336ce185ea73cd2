// Layout equivalence for pipeline parallelism (with virtual stages, uneven splits, tied
// embeddings across stages, and combined with TP and DP), as an SPMD program under mpirun:
// every rank trains the tiny diffusion LM under the layout and, on its own, the single-process
// reference; per-iteration losses and gradient norms must agree to 1e-5 (relative).
// Run at 2, 4 and 8 ranks (tests/CMakeLists.txt): cases that need more ranks than the world skip.
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

struct Layout {
  int pp = 2, vpp = 1, tp = 1;
  bool sp = false, dist_opt = false, overlap = false, untied = true;
  int first = 0, last = 0;  // uneven split (0: even)
  RecomputeGranularity recompute = RecomputeGranularity::None;
};

RunConfig tiny_run(const Layout& l, int world) {
  RunConfig r = test::tiny_run(test::TinyShape::small(8), 10);
  TransformerConfig& m = r.model;
  m.untie_embeddings_and_output_weights = l.untied;
  m.hidden_dropout = m.attention_dropout = 0.1f;
  m.recompute_granularity = l.recompute;
  m.recompute_num_layers = 1;
  r.diffusion.varilen_prob = 0.3f;  // micro-batches of different lengths cross the stages
  r.training.micro_batch_size = 1;
  const int dp = world / (l.pp * l.tp);
  r.training.global_batch_size = 4 * dp;  // 4 micro-batches per rank: M % pp == 0 for VPP
  r.parallel.world_size = world;
  r.parallel.pipeline_model_parallel_size = l.pp;
  r.parallel.virtual_pipeline_model_parallel_size = l.vpp > 1 ? l.vpp : 0;
  r.parallel.tensor_model_parallel_size = l.tp;
  r.parallel.sequence_parallel = l.sp && l.tp > 1;
  r.parallel.data_parallel_size = dp;
  r.parallel.use_distributed_optimizer = l.dist_opt;
  r.parallel.overlap_grad_reduce = l.overlap;
  if (l.overlap) r.parallel.ddp_bucket_size = 5000;
  if (l.first) r.parallel.decoder_first_pipeline_num_layers = l.first;
  if (l.last) r.parallel.decoder_last_pipeline_num_layers = l.last;
  return r;
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  auto data = std::make_shared<MockGptDataset>(64, 16, 63);
  std::ostringstream log;
  Trainer t(cfg, data, log, groups);
  return t.train();
}

void expect_same_as_single_process(const Layout& l) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  if (world % (l.pp * l.tp) != 0 || world < l.pp * l.tp)
    GTEST_SKIP() << "needs a world size multiple of pp " << l.pp << " x tp " << l.tp;
  const RunConfig cfg = tiny_run(l, world);
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  const auto split = train(cfg, &groups);
  Layout one;
  one.pp = 1;
  one.untied = l.untied;
  RunConfig ref_cfg = tiny_run(one, 1);
  ref_cfg.training.global_batch_size = cfg.training.global_batch_size;
  const auto ref = train(ref_cfg, nullptr);
  ASSERT_EQ(split.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NEAR(split[i].lm_loss, ref[i].lm_loss, 1e-5 * ref[i].lm_loss)
        << "rank " << rt.world().rank() << ", iteration " << i + 1;
    EXPECT_NEAR(split[i].grad_norm, ref[i].grad_norm, 1e-5 * ref[i].grad_norm)
        << "rank " << rt.world().rank() << ", iteration " << i + 1;
  }
}

}  // namespace

TEST(PipelineParallel, TwoStagesMatchOneProcess) { expect_same_as_single_process({.pp = 2}); }

TEST(PipelineParallel, FourStagesMatchOneProcess) { expect_same_as_single_process({.pp = 4}); }

TEST(PipelineParallel, TwoStagesWithTwoVirtualStagesMatchOneProcess) {
  expect_same_as_single_process({.pp = 2, .vpp = 2});
}

TEST(PipelineParallel, FourStagesWithTwoVirtualStagesMatchOneProcess) {
  expect_same_as_single_process({.pp = 4, .vpp = 2});
}

TEST(PipelineParallel, UnevenSplitMatchesOneProcess) {
  expect_same_as_single_process({.pp = 2, .first = 3, .last = 5});
}

TEST(PipelineParallel, TiedEmbeddingsAcrossStagesMatchOneProcess) {
  expect_same_as_single_process({.pp = 2, .untied = false});
  expect_same_as_single_process({.pp = 2, .dist_opt = true, .overlap = true, .untied = false});
}

TEST(PipelineParallel, RecomputationMatchesOneProcess) {
  expect_same_as_single_process({.pp = 2, .recompute = RecomputeGranularity::Full});
}

TEST(PipelineParallel, TensorPipelineAndDataParallelTogetherMatchOneProcess) {
  // 8 ranks: TP 2 x PP 2 x DP 2 with SP, the distributed optimizer and overlapped reduction.
  expect_same_as_single_process({.pp = 2, .tp = 2, .sp = true, .dist_opt = true, .overlap = true});
}
