// Checkpoints stay layout-independent under context parallelism (CP splits activations, never
// parameters): a checkpoint saved at CP = 2 (x DP on 4 ranks, with the distributed optimizer)
// loads in one process (CP = 1) and, on 4 ranks, at CP = 4. The loading layout's state is
// checked bitwise by saving it again at once and comparing every tensor with the original; the
// continued run matches the uninterrupted single-process run to 1e-5 (relative: the layouts
// differ in fp32 reduction order only).
#include <gtest/gtest.h>
#include <memory>
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

RunConfig tiny_run(int cp, int world, bool dist_opt) {
  RunConfig r = test::tiny_run(test::TinyShape::small(2), kIters);
  r.model.num_query_groups = 4;
  r.model.hidden_dropout = r.model.attention_dropout = 0.1f;
  r.diffusion.varilen_prob = 0.3f;
  r.training.micro_batch_size = 1;
  r.training.global_batch_size = 4;
  r.training.eval_iters = 0;
  r.parallel.world_size = world;
  r.parallel.context_parallel_size = cp;
  r.parallel.data_parallel_size = world / cp;
  r.parallel.use_distributed_optimizer = dist_opt;
  r.parallel.cp_comm_type = {cp::CommType::P2P};
  return r;
}

struct Job {
  RunConfig cfg;
  std::unique_ptr<parallel::ProcessGroups> groups;
  Job(int cp, int world, bool dist_opt) : cfg(tiny_run(cp, world, dist_opt)) {
    if (world > 1)
      groups = std::make_unique<parallel::ProcessGroups>(
          parallel::ProcessGroups::build(runtime().world_shared(), cfg.parallel));
  }
  std::unique_ptr<Trainer> trainer(const RunConfig& c) const { return test::quiet_trainer(c, groups.get(), 64, 16); }
};

}  // namespace

TEST(ContextParallelCheckpoint, SavedAtCp2LoadsAtCp1AndCp4AndContinuesWithTheSameLosses) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  if (world != 2 && world != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  const Job reference(1, 1, false);
  const auto straight = reference.trainer(reference.cfg)->train();
  ASSERT_EQ(straight.size(), static_cast<size_t>(kIters));

  test::SharedTempDir dir(rt.world(), "megadlm_cp_ckpt_");
  const Job src(2, world, /*dist_opt=*/world == 4);  // CP 2 (x DP 2 with the distributed optimizer)
  RunConfig save = src.cfg;
  save.checkpoint.save = dir / "cp2";
  save.training.exit_interval = kStop;
  src.trainer(save)->train();

  struct Target {
    int cp, world;
    std::string name;
  };
  std::vector<Target> targets = {{1, 1, "one process (CP 1)"}};
  if (world == 4) targets.push_back({4, 4, "CP 4"});
  for (const Target& t : targets) {
    const Job dst(t.cp, t.world, false);
    const std::string again = t.world == 1 ? "again_rank" + std::to_string(rt.world().rank()) : "again_cp" + std::to_string(t.cp);
    {
      RunConfig load = dst.cfg;
      load.checkpoint.load = dir / "cp2";
      load.checkpoint.save = dir / again;
      dst.trainer(load)->save_checkpoint();  // the state the new layout holds, before any step
    }
    rt.world().barrier(Stream::cpu());
    test::expect_same_tensors(dir / "cp2", dir / again, "saved at CP 2, loaded as " + t.name);
    RunConfig load = dst.cfg;
    load.checkpoint.load = dir / "cp2";
    test::expect_close_resume(dst.trainer(load)->train(), straight, kStop, t.name);
  }
}
