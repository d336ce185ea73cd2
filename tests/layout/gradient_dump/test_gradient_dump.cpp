// --save-gradients across layouts (training/gradient_dump.h), as an SPMD program under mpirun
// (np 2 and 4): every rank trains the tiny diffusion LM under a layout with --save-gradients and,
// on its own, the single-process reference on the same global batch with its own dump; the two
// gradients.safetensors files must hold the same tensors (global names and shapes) and every
// tensor must agree to 1e-5 relative L2 (the layout suites' tolerance: the layouts differ only in
// the order of fp32 sums across ranks). The dump's own norm must be the run's logged gradient
// norm (pre-clip, each element exactly once: a piece written twice or missing would move it).
// Covered: DP (plain; the distributed optimizer with buckets cutting through parameters), TP 2 +
// SP, PP 2 with the tied embedding across stages, Megatron-FSDP (every strategy), CP 2, EP 2 on
// MoE layers, TP 2 x PP 2 (4 ranks), and a later iteration. Dropout and varilen are on (keyed by
// global coordinates: the same under every layout). Cases that need more ranks skip.
#include <gtest/gtest.h>
#include <cmath>
#include <map>
#include <sstream>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/checkpoint/safetensors.h"
#include "megadlm/training/gradient_dump.h"
#include "megadlm/training/trainer.h"
#include "support/checkpoint_checks.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

// The layout suites' fp32 tolerance (tests/layout/fsdp, tests/layout/trainer): reduction order only.
constexpr double kRelTol = 1e-5;

struct Layout {
  int tp = 1, pp = 1, cp = 1, ep = 0;  ///< ep > 0: MoE layers (4 experts, top-2) over EP ranks
  bool sp = false, untied = true, dist_opt = false, fsdp = false;
  ShardingStrategy strategy = ShardingStrategy::OptimGradsParams;
  int layers = 2;
  int64_t iteration = 1;  ///< the iteration dumped (the run trains this many)
};

RunConfig tiny_run(const Layout& l, int world) {
  const bool small = l.pp > 1 || l.layers > 2;
  RunConfig r = test::tiny_run(small ? test::TinyShape::small(l.layers) : test::TinyShape{}, l.iteration);
  r.model.untie_embeddings_and_output_weights = l.untied;
  r.model.hidden_dropout = 0.1f;
  r.diffusion.varilen_prob = 0.2f;
  if (l.ep > 0) test::make_moe(r, 4, 2);
  r.training.micro_batch_size = 1;
  r.training.global_batch_size = 8;
  r.training.save_gradients_iteration = l.iteration;
  const int dp = world / (l.tp * l.pp * l.cp);
  r.parallel.world_size = world;
  r.parallel.data_parallel_size = dp;
  r.parallel.tensor_model_parallel_size = l.tp;
  r.parallel.sequence_parallel = l.sp && l.tp > 1;
  r.parallel.pipeline_model_parallel_size = l.pp;
  r.parallel.context_parallel_size = l.cp;
  if (l.ep > 0) {
    r.parallel.expert_model_parallel_size = l.ep;
    r.parallel.expert_tensor_parallel_size = 1;
    r.parallel.expert_data_parallel_size = world / (l.ep * l.pp);
  }
  r.parallel.use_custom_fsdp = l.fsdp;
  r.parallel.data_parallel_sharding_strategy = l.strategy;
  r.parallel.use_distributed_optimizer = l.dist_opt || (l.fsdp && l.strategy != ShardingStrategy::NoShard);
  if (l.dist_opt) {  // several buckets: the shards cut through parameters
    r.parallel.overlap_grad_reduce = true;
    r.parallel.ddp_bucket_size = 3000;
  }
  return r;
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  const bool small = cfg.model.hidden_size == 32;
  auto data = small ? std::make_shared<MockGptDataset>(64, 16, 63) : std::make_shared<MockGptDataset>(128, 32, 127);
  std::ostringstream log;
  Trainer t(cfg, data, log, groups);
  return t.train();
}

std::map<std::string, Tensor> read_dump(const std::string& dir, std::map<std::string, std::string>* meta = nullptr) {
  const checkpoint::SafetensorsFile f(dir + "/" + kGradientsFileName);
  std::map<std::string, Tensor> out;
  for (const auto& [key, e] : f.entries()) out.emplace(key, f.read(key));
  if (meta) *meta = f.metadata();
  return out;
}

double sum_sq(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(t.data<float>()[i]) * t.data<float>()[i];
  return s;
}

void expect_dump_matches_single_process(const Layout& l, const std::string& what) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size(), rank = rt.world().rank();
  if (world % (l.tp * l.pp * l.cp) != 0 || (l.ep > 0 && world % (l.ep * l.pp) != 0) || world < l.tp * l.pp * l.cp)
    GTEST_SKIP() << what << ": needs a world size multiple of tp " << l.tp << " x pp " << l.pp << " x cp " << l.cp;
  test::SharedTempDir dir(rt.world(), "megadlm_gradient_dump_");
  RunConfig cfg = tiny_run(l, world);
  cfg.training.save_gradients = dir / "layout";
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  const auto got = train(cfg, &groups);
  // The reference: one process (no parallelism, same model and global batch), on every rank.
  Layout one;
  one.untied = l.untied;
  one.layers = l.layers;
  one.ep = l.ep > 0 ? 1 : 0;
  one.iteration = l.iteration;
  RunConfig ref_cfg = tiny_run(one, 1);
  ref_cfg.training.micro_batch_size = cfg.training.micro_batch_size;
  ref_cfg.training.global_batch_size = cfg.training.global_batch_size;
  ref_cfg.training.save_gradients = dir / ("reference_rank" + std::to_string(rank));
  const auto ref = train(ref_cfg, nullptr);
  rt.world().barrier(Stream::cpu());  // rank 0 has written the layout's file

  std::map<std::string, std::string> meta;
  const auto a = read_dump(dir / "layout", &meta);
  const auto b = read_dump(ref_cfg.training.save_gradients);
  EXPECT_EQ(meta["format"], "megadlm-gradients") << what;
  EXPECT_EQ(meta["iteration"], std::to_string(l.iteration)) << what;
  ASSERT_EQ(a.size(), b.size()) << what << ": the layout's dump has " << a.size() << " tensors, one process's "
                                << b.size();
  double whole = 0;
  for (const auto& [name, tb] : b) {
    const auto it = a.find(name);
    ASSERT_NE(it, a.end()) << what << ": " << name << " is missing from the layout's dump";
    const Tensor& ta = it->second;
    ASSERT_EQ(ta.shape(), tb.shape()) << what << ": " << name;
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < tb.numel(); ++i) {
      const double x = ta.data<float>()[i], y = tb.data<float>()[i];
      diff += (x - y) * (x - y);
      norm += y * y;
    }
    EXPECT_GT(norm, 0) << what << ": " << name << " has a zero gradient in one process";
    EXPECT_LE(std::sqrt(diff), kRelTol * std::sqrt(norm))
        << what << ": " << name << " differs by " << std::sqrt(diff / norm) << " relative (rank " << rank << ")";
    whole += sum_sq(ta);
  }
  // Each element once, before clipping: the dump's norm is the norm the run logged.
  const size_t k = static_cast<size_t>(l.iteration - 1);
  ASSERT_EQ(got.size(), ref.size());
  EXPECT_NEAR(std::sqrt(whole), got[k].grad_norm, kRelTol * got[k].grad_norm) << what;
  EXPECT_NEAR(got[k].grad_norm, ref[k].grad_norm, kRelTol * ref[k].grad_norm) << what;
}

}  // namespace

TEST(GradientDump, DataParallelMatchesOneProcess) {
  expect_dump_matches_single_process({}, "DP");
  expect_dump_matches_single_process({.dist_opt = true}, "DP + distributed optimizer");
}

TEST(GradientDump, TensorParallelWithSequenceParallelMatchesOneProcess) {
  expect_dump_matches_single_process({.tp = 2, .sp = true}, "TP 2 + SP");
}

TEST(GradientDump, PipelineParallelWithTiedEmbeddingMatchesOneProcess) {
  // The last stage's copy of the tied embedding is not written; the first stage's holds the sum.
  expect_dump_matches_single_process({.pp = 2, .untied = false, .layers = 4}, "PP 2, tied embedding");
}

TEST(GradientDump, FsdpMatchesOneProcess) {
  for (ShardingStrategy s : {ShardingStrategy::NoShard, ShardingStrategy::Optim, ShardingStrategy::OptimGrads,
                             ShardingStrategy::OptimGradsParams})
    expect_dump_matches_single_process({.fsdp = true, .strategy = s},
                                       std::string("Megatron-FSDP ") + sharding_strategy_name(s));
}

TEST(GradientDump, ContextAndExpertParallelMatchOneProcess) {
  expect_dump_matches_single_process({.cp = 2}, "CP 2");
  expect_dump_matches_single_process({.ep = 2}, "EP 2");
}

TEST(GradientDump, TensorTimesPipelineAndALaterIterationMatchOneProcess) {
  expect_dump_matches_single_process({.tp = 2, .pp = 2, .sp = true, .layers = 4}, "TP 2 x PP 2");
  expect_dump_matches_single_process({.tp = 2, .sp = true, .iteration = 3}, "TP 2 + SP, iteration 3");
}
