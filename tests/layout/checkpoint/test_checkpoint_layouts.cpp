// Checkpoints across data-parallel layouts, as an SPMD program under mpirun (np 2 and 4):
//   * same layout (DP = world, plain DDP or the distributed optimizer, one or two instances,
//     sync or async save):
//     N steps straight == k steps, save, load in a new trainer, N - k steps, bit for bit;
//   * another layout: DP = world and DP = world / 2 (each half of the ranks is its own job), one
//     with the distributed optimizer and one without, saving under either and loading under the
//     other. The state the loading layout holds is checked bitwise by saving it again at once
//     and comparing every tensor with the original checkpoint; the continued run matches the
//     uninterrupted one to the data-parallel tolerance (1e-5 relative: fp32 reduction order
//     differs between layouts, as in tests/layout/trainer).
#include <gtest/gtest.h>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/trainer.h"
#include "support/checkpoint_checks.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

RunConfig tiny_run(int dp, bool dist_opt, int64_t iters) {
  RunConfig r = test::tiny_run({}, iters);
  r.model.hidden_dropout = 0.1f;
  r.diffusion.varilen_prob = 0.2f;
  r.parallel.world_size = dp;
  r.parallel.data_parallel_size = dp;
  r.parallel.use_distributed_optimizer = dist_opt;
  // Several buckets under the distributed optimizer: shards cut through parameters.
  r.parallel.overlap_grad_reduce = dist_opt;
  r.parallel.ddp_bucket_size = dist_opt ? 20000 : 0;
  return r;
}

// A job on `world` (all ranks, or a half) with its own process groups.
struct Job {
  std::shared_ptr<comm::Communicator> world;
  std::unique_ptr<parallel::ProcessGroups> groups;
  Job(std::shared_ptr<comm::Communicator> w, const ParallelConfig& p)
      : world(std::move(w)), groups(std::make_unique<parallel::ProcessGroups>(parallel::ProcessGroups::build(world, p))) {}
};

std::unique_ptr<Trainer> make_trainer(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  return test::quiet_trainer(cfg, groups);
}

std::vector<IterationMetrics> train(const RunConfig& cfg, const parallel::ProcessGroups* groups) {
  return make_trainer(cfg, groups)->train();
}

}  // namespace

TEST(CheckpointLayouts, ResumeUnderTheSameLayoutIsBitIdentical) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  constexpr int64_t kIters = 6, kStop = 3;
  // Plain DDP; the distributed optimizer (saved asynchronously); two distributed-optimizer
  // instances, where only the first instance's ranks write.
  for (const int variant : {0, 1, 2}) {
    const bool dist_opt = variant > 0;
    test::SharedTempDir dir(rt.world(), "megadlm_layout_ckpt_");
    RunConfig base = tiny_run(world, dist_opt, kIters);
    if (variant == 2) base.parallel.num_distributed_optimizer_instances = 2;
    Job job(rt.world_shared(), base.parallel);
    const auto straight = train(base, job.groups.get());
    RunConfig first = base;
    first.checkpoint.save = dir / "ckpt";
    first.checkpoint.save_interval = 2;
    first.checkpoint.async_save = variant == 1;  // the asynchronous path under several ranks too
    first.training.exit_interval = kStop;
    train(first, job.groups.get());
    RunConfig second = base;
    second.checkpoint.load = dir / "ckpt";
    test::expect_identical_resume(train(second, job.groups.get()), straight, kStop,
                                  "DP " + std::to_string(world) + ", variant " + std::to_string(variant));
  }
}

// Layout A: every rank. Layout B: each half of the ranks as its own job. One of the two uses
// the distributed optimizer (several buckets, shards cutting through parameters), the other
// plain DDP; both directions for both assignments, which includes the DP 2 + distributed
// optimizer -> DP 4 without it, and the reverse, on 4 ranks.
void save_and_load_across(bool whole_world_dist_opt) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size(), half = world / 2, rank = rt.world().rank();
  constexpr int64_t kIters = 6, kStop = 3;
  test::SharedTempDir dir(rt.world(), "megadlm_layout_ckpt_");
  const RunConfig a = tiny_run(world, whole_world_dist_opt, kIters);
  const RunConfig b = tiny_run(half, !whole_world_dist_opt, kIters);
  Job job_a(rt.world_shared(), a.parallel);
  std::shared_ptr<comm::Communicator> half_world(rt.world().split(rank / half, rank, "half"));
  Job job_b(half_world, b.parallel);
  const std::string mine = "half" + std::to_string(rank / half);
  auto name = [](const RunConfig& c) {
    return "DP " + std::to_string(c.parallel.data_parallel_size) +
           (c.parallel.use_distributed_optimizer ? " + distributed optimizer" : "");
  };

  // A -> B: the state B holds right after loading is A's, bit for bit; B continues as A would.
  const auto straight_a = train(a, job_a.groups.get());
  RunConfig save_a = a;
  save_a.checkpoint.save = dir / "a";
  save_a.training.exit_interval = kStop;
  train(save_a, job_a.groups.get());
  {
    RunConfig load_b = b;
    load_b.checkpoint.load = dir / "a";
    load_b.checkpoint.save = dir / ("a_as_b_" + mine);
    auto t = make_trainer(load_b, job_b.groups.get());
    t->save_checkpoint();  // what layout B now holds, without a step in between
  }
  rt.world().barrier(Stream::cpu());
  test::expect_same_tensors(dir / "a", dir / ("a_as_b_" + mine));
  RunConfig load_b = b;
  load_b.checkpoint.load = dir / "a";
  test::expect_close_resume(train(load_b, job_b.groups.get()), straight_a, kStop,
                            "saved under " + name(a) + ", continued under " + name(b));

  // B -> A (each half saved its own copy; everyone loads half 0's).
  const auto straight_b = train(b, job_b.groups.get());
  RunConfig save_b = b;
  save_b.checkpoint.save = dir / ("b_" + mine);
  save_b.training.exit_interval = kStop;
  train(save_b, job_b.groups.get());
  rt.world().barrier(Stream::cpu());
  {
    RunConfig load_a = a;
    load_a.checkpoint.load = dir / "b_half0";
    load_a.checkpoint.save = dir / "b_as_a";
    auto t = make_trainer(load_a, job_a.groups.get());
    t->save_checkpoint();
  }
  test::expect_same_tensors(dir / "b_half0", dir / "b_as_a");
  RunConfig load_a = a;
  load_a.checkpoint.load = dir / "b_half0";
  test::expect_close_resume(train(load_a, job_a.groups.get()), straight_b, kStop,
                            "saved under " + name(b) + ", continued under " + name(a));
}

TEST(CheckpointLayouts, AllRanksWithTheDistributedOptimizerAndHalvesWithoutExchangeCheckpoints) {
  save_and_load_across(true);
}

TEST(CheckpointLayouts, HalvesWithTheDistributedOptimizerAndAllRanksWithoutExchangeCheckpoints) {
  save_and_load_across(false);
}

// Experts are stored by their global index: a checkpoint saved with EP = world (every rank
// writing its own experts, and the expert biases) loads with EP = 1 (one process) and EP = 2
// (each half of the ranks, on 4), holds the same tensors bit for bit, and continues as the
// uninterrupted run.
TEST(CheckpointLayouts, ExpertParallelCheckpointsLoadUnderOtherExpertLayouts) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size(), rank = rt.world().rank();
  constexpr int64_t kIters = 6, kStop = 3;
  test::SharedTempDir dir(rt.world(), "megadlm_layout_ckpt_");
  auto moe_run = [&](int ranks, int ep) {
    RunConfig r = tiny_run(ranks, false, kIters);
    test::make_moe(r, 8, 2);
    r.model.moe.dispatcher = MoeDispatcher::AllToAll;
    r.model.moe.expert_bias = true;
    r.model.moe.score = MoeScoreFunction::Sigmoid;
    r.model.moe.bias_update_rate = 0.01f;
    r.parallel.expert_model_parallel_size = ep;
    r.parallel.expert_data_parallel_size = ranks / ep;
    return r;
  };
  const RunConfig a = moe_run(world, world);
  Job job_a(rt.world_shared(), a.parallel);
  const auto straight = train(a, job_a.groups.get());
  RunConfig save_a = a;
  save_a.checkpoint.save = dir / "ep";
  save_a.training.exit_interval = kStop;
  train(save_a, job_a.groups.get());
  rt.world().barrier(Stream::cpu());
  {
    checkpoint::CheckpointReader reader(*checkpoint::find_checkpoint(dir / "ep", std::nullopt));
    EXPECT_TRUE(reader.has_tensor("model/decoder.layers.1.mlp.experts.7.linear_fc2.weight"));
    EXPECT_TRUE(reader.has_tensor("moe_state/expert_bias/decoder.layers.0"));
  }
  std::vector<std::pair<int, std::shared_ptr<comm::Communicator>>> targets = {{1, nullptr}};
  std::shared_ptr<comm::Communicator> half;
  if (world == 4) {
    half = std::shared_ptr<comm::Communicator>(rt.world().split(rank / 2, rank, "half"));
    targets.push_back({2, half});
  }
  for (const auto& [ep, comm] : targets) {
    const int ranks = comm ? comm->size() : 1;
    const RunConfig b = moe_run(ranks, ep);
    std::unique_ptr<Job> job_b;
    if (comm) job_b = std::make_unique<Job>(comm, b.parallel);
    const parallel::ProcessGroups* groups = job_b ? job_b->groups.get() : nullptr;
    // One copy per job: per rank for the single processes, per half for the 2-rank jobs.
    const std::string copy = "ep_as_ep" + std::to_string(ep) + (comm ? "_half" + std::to_string(rank / 2)
                                                                      : "_rank" + std::to_string(rank));
    {
      RunConfig load_b = b;
      load_b.checkpoint.load = dir / "ep";
      load_b.checkpoint.save = dir / copy;
      auto t = make_trainer(load_b, groups);
      t->save_checkpoint();
    }
    if (!comm || comm->rank() == 0) test::expect_same_tensors(dir / "ep", dir / copy);
    RunConfig load_b = b;
    load_b.checkpoint.load = dir / "ep";
    test::expect_close_resume(train(load_b, groups), straight, kStop,
                              "saved under EP " + std::to_string(world) + ", continued under EP " + std::to_string(ep));
    rt.world().barrier(Stream::cpu());
  }
}
