// Checkpoints under FSDP (docs/checkpoints.md, docs/parallelism/fsdp.md), as an SPMD program under
// mpirun (np 2
// and 4). FSDP saves through the same layout-independent format as every other layout: each
// rank writes the pieces of its owned shard of every bucket (flat ranges inside parameters'
// global boxes), so
//   * the same FSDP layout resumes bit for bit (6 iterations straight == 3, save, load, 3);
//   * a checkpoint saved with FSDP over every rank loads in one process without FSDP, and one
//     saved there loads under FSDP: the loaded state is the saved one bit for bit (checked by
//     saving it again at once and comparing every tensor), and training continues with the
//     losses of the uninterrupted run to 1e-5 (fp32 reduction order differs between layouts,
//     as in tests/layout/fsdp);
//   * the same with TP 2 inside the FSDP layout (np 4: TP 2 × FSDP 2), and with MoE layers
//     whose experts are spread over EP = every rank.
#include <gtest/gtest.h>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/trainer.h"
#include "support/checkpoint_checks.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

constexpr int64_t kIters = 6, kStop = 3;

RunConfig tiny_run(int world, int tp, bool fsdp, ShardingStrategy s = ShardingStrategy::OptimGradsParams,
                   bool moe = false) {
  RunConfig r = test::tiny_run({}, kIters);
  if (moe) {
    // MoE layers with their experts over EP = the world (expert-dp 1).
    test::make_moe(r, 4, 2);
    r.parallel.expert_model_parallel_size = world;
    r.parallel.expert_tensor_parallel_size = 1;
    r.parallel.expert_data_parallel_size = 1;
  }
  r.model.hidden_dropout = 0.1f;
  r.diffusion.varilen_prob = 0.2f;
  r.parallel.world_size = world;
  r.parallel.tensor_model_parallel_size = tp;
  r.parallel.sequence_parallel = tp > 1;
  r.parallel.data_parallel_size = world / tp;
  r.parallel.use_custom_fsdp = fsdp;
  r.parallel.data_parallel_sharding_strategy = s;
  r.parallel.use_distributed_optimizer = fsdp && s != ShardingStrategy::NoShard;
  return r;
}

std::unique_ptr<Trainer> make_trainer(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  return test::quiet_trainer(cfg, groups);
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  return make_trainer(cfg, groups)->train();
}

// FSDP over every rank (with `tp`; or with MoE layers over EP = the world) <-> one process
// without FSDP, both directions.
void exchange_with_one_process(int tp, bool moe = false) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size(), rank = rt.world().rank();
  if (world % tp != 0 || world / tp < 2) GTEST_SKIP() << "needs FSDP over at least 2 ranks beside tp " << tp;
  test::SharedTempDir dir(rt.world(), "megadlm_fsdp_ckpt_");
  const RunConfig a = tiny_run(world, tp, true, ShardingStrategy::OptimGradsParams, moe);
  const RunConfig b = tiny_run(1, 1, false, ShardingStrategy::OptimGradsParams, moe);  // every rank alone
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), a.parallel);
  const std::string what_a = "FSDP over " + std::to_string(world / tp) + " ranks" +
                             (tp > 1 ? " x TP " + std::to_string(tp) : "") + (moe ? ", experts over EP" : "");
  const std::string mine = std::to_string(rank);

  // A -> B.
  const auto straight_a = train(a, &groups);
  RunConfig save_a = a;
  save_a.checkpoint.save = dir / "a";
  save_a.training.exit_interval = kStop;
  train(save_a, &groups);
  rt.world().barrier(Stream::cpu());
  {
    RunConfig load_b = b;
    load_b.checkpoint.load = dir / "a";
    load_b.checkpoint.save = dir / ("a_as_b_" + mine);
    make_trainer(load_b, nullptr)->save_checkpoint();  // what one process now holds
  }
  test::expect_same_tensors(dir / "a", dir / ("a_as_b_" + mine));
  RunConfig load_b = b;
  load_b.checkpoint.load = dir / "a";
  test::expect_close_resume(train(load_b, nullptr), straight_a, kStop,
                            "saved under " + what_a + ", continued in one process");

  // B -> A (every rank saved its own copy; all load rank 0's).
  const auto straight_b = train(b, nullptr);
  RunConfig save_b = b;
  save_b.checkpoint.save = dir / ("b_" + mine);
  save_b.training.exit_interval = kStop;
  train(save_b, nullptr);
  rt.world().barrier(Stream::cpu());
  {
    RunConfig load_a = a;
    load_a.checkpoint.load = dir / "b_0";
    load_a.checkpoint.save = dir / "b_as_a";
    make_trainer(load_a, &groups)->save_checkpoint();
  }
  test::expect_same_tensors(dir / "b_0", dir / "b_as_a");
  RunConfig load_a = a;
  load_a.checkpoint.load = dir / "b_0";
  test::expect_close_resume(train(load_a, &groups), straight_b, kStop,
                            "saved in one process, continued under " + what_a);
}

}  // namespace

TEST(CheckpointFsdp, ResumeUnderTheSameFsdpLayoutIsBitIdentical) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  for (ShardingStrategy s : {ShardingStrategy::Optim, ShardingStrategy::OptimGrads, ShardingStrategy::OptimGradsParams}) {
    test::SharedTempDir dir(rt.world(), "megadlm_fsdp_ckpt_");
    const RunConfig base = tiny_run(world, 1, true, s);
    parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), base.parallel);
    const auto straight = train(base, &groups);
    RunConfig first = base;
    first.checkpoint.save = dir / "ckpt";
    first.training.exit_interval = kStop;
    train(first, &groups);
    RunConfig second = base;
    second.checkpoint.load = dir / "ckpt";
    test::expect_identical_resume(train(second, &groups), straight, kStop, sharding_strategy_name(s));
  }
}

TEST(CheckpointFsdp, FsdpOverEveryRankAndOneProcessWithoutFsdpExchangeCheckpoints) {
  exchange_with_one_process(1);
}

TEST(CheckpointFsdp, TensorParallelFsdpAndOneProcessExchangeCheckpoints) { exchange_with_one_process(2); }

TEST(CheckpointFsdp, FsdpWithExpertsOverEpAndOneProcessExchangeCheckpoints) {
  // Expert buckets: every EP rank writes its own experts' shards (by global expert index), and
  // one process reads them all back; then the reverse.
  exchange_with_one_process(1, true);
}
