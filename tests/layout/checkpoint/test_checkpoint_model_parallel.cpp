// Checkpoints across tensor- and pipeline-parallel layouts (the CI cases), as an SPMD
// program under mpirun (np 2 and 4; cases needing more ranks skip):
//   * same layout (TP, PP with tied embeddings across stages, TP x PP, sequence parallelism,
//     virtual stages, the distributed optimizer): N steps straight == k steps, save, load, N - k
//     steps, bit for bit;
//   * another layout: save under TP=2 x PP=2 (4 ranks) and load under TP=1 x PP=4, under DP=4
//     with the distributed optimizer and in one process; on 2 ranks TP=2 <-> PP=2 <-> one
//     process. The loading layout's state is checked bitwise by saving it again at once and
//     comparing every tensor (model and optimizer) with the original checkpoint; the continued
//     run matches the uninterrupted single-process run to 1e-5 (relative: layouts differ in fp32
//     reduction order only, as in tests/layout/pipeline_parallel).
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

struct Layout {
  int tp = 1, pp = 1, vpp = 1;
  bool sp = false, dist_opt = false;
  int ranks() const { return tp * pp; }  // per data-parallel replica
  std::string name(int world) const {
    std::string s = "TP=" + std::to_string(tp) + " x PP=" + std::to_string(pp) + " x DP=" + std::to_string(world / ranks());
    if (vpp > 1) s += " (" + std::to_string(vpp) + " virtual stages)";
    if (sp) s += " + SP";
    if (dist_opt) s += " + distributed optimizer";
    return s;
  }
};

constexpr int64_t kIters = 6, kStop = 3;
constexpr int kGlobalBatch = 8;

// The tiny diffusion LM of tests/layout/pipeline_parallel, with tied embeddings (so the last
// stage holds a copy of the word embedding) and every source of randomness on.
RunConfig tiny_run(const Layout& l, int world) {
  RunConfig r = test::tiny_run(test::TinyShape::small(8), kIters);
  r.model.untie_embeddings_and_output_weights = false;
  r.model.hidden_dropout = r.model.attention_dropout = 0.1f;
  r.diffusion.varilen_prob = 0.3f;
  r.training.micro_batch_size = 1;
  r.training.global_batch_size = kGlobalBatch;
  r.training.eval_iters = 0;
  r.parallel.world_size = world;
  r.parallel.tensor_model_parallel_size = l.tp;
  r.parallel.pipeline_model_parallel_size = l.pp;
  r.parallel.virtual_pipeline_model_parallel_size = l.vpp > 1 ? l.vpp : 0;
  r.parallel.sequence_parallel = l.sp && l.tp > 1;
  r.parallel.data_parallel_size = world / l.ranks();
  r.parallel.use_distributed_optimizer = l.dist_opt;
  return r;
}

// A layout's job on the whole world, or (world 1) a single process on every rank.
struct Job {
  RunConfig cfg;
  std::unique_ptr<parallel::ProcessGroups> groups;
  Job(const Layout& l, int world) : cfg(tiny_run(l, world)) {
    if (world > 1) groups = std::make_unique<parallel::ProcessGroups>(parallel::ProcessGroups::build(runtime().world_shared(), cfg.parallel));
  }
  std::unique_ptr<Trainer> trainer(const RunConfig& c) const { return test::quiet_trainer(c, groups.get(), 64, 16); }
  std::vector<IterationMetrics> train(const RunConfig& c) const { return trainer(c)->train(); }
};

bool fits(const Layout& l, int world) { return world >= l.ranks() && world % l.ranks() == 0; }

}  // namespace

TEST(CheckpointModelParallel, ResumeUnderTensorAndPipelineLayoutsIsBitIdentical) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  const std::vector<Layout> layouts = {
      {.tp = 2}, {.pp = 2, .dist_opt = true}, {.tp = 2, .pp = 2}, {.tp = 2, .pp = 2, .vpp = 2, .sp = true, .dist_opt = true}};
  for (const Layout& l : layouts) {
    if (!fits(l, world)) continue;
    test::SharedTempDir dir(rt.world(), "megadlm_layout_mp_ckpt_");
    const Job job(l, world);
    const auto straight = job.train(job.cfg);
    RunConfig first = job.cfg;
    first.checkpoint.save = dir / "ckpt";
    first.training.exit_interval = kStop;
    job.train(first);
    RunConfig second = job.cfg;
    second.checkpoint.load = dir / "ckpt";
    test::expect_identical_resume(job.train(second), straight, kStop, l.name(world));
  }
}

TEST(CheckpointModelParallel, ACheckpointOfOneLayoutLoadsUnderAnother) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  // Sources and targets: on 4 ranks the TP=2 x PP=2 -> TP=1 x PP=4, DP=4, one process;
  // on 2 ranks TP=2 -> PP=2 and one process, PP=2 -> TP=2.
  struct Case {
    Layout from;
    std::vector<Layout> to;  // tp = pp = 0 marks "one process"
  };
  const Layout one{.tp = 0, .pp = 0};
  std::vector<Case> cases;
  if (world == 4) {
    cases.push_back({{.tp = 2, .pp = 2}, {{.pp = 4}, {.dist_opt = true}, one}});
    cases.push_back({{.pp = 4, .dist_opt = true}, {{.tp = 2, .pp = 2, .sp = true}}});
  } else if (world == 2) {
    cases.push_back({{.tp = 2}, {{.pp = 2}, one}});
    cases.push_back({{.pp = 2, .dist_opt = true}, {{.tp = 2, .sp = true}}});
  } else {
    GTEST_SKIP() << "cases are written for 2 and 4 ranks";
  }
  const Job reference(Layout{}, 1);  // the uninterrupted single-process run
  const auto straight = reference.train(reference.cfg);
  for (const Case& c : cases) {
    test::SharedTempDir dir(rt.world(), "megadlm_layout_mp_ckpt_");
    const Job src(c.from, world);
    RunConfig save = src.cfg;
    save.checkpoint.save = dir / "src";
    save.training.exit_interval = kStop;
    src.train(save);
    for (const Layout& to : c.to) {
      const bool alone = to.tp == 0;
      const Job dst(alone ? Layout{} : to, alone ? 1 : world);
      const std::string what = "saved under " + c.from.name(world) + ", loaded under " +
                               (alone ? std::string("one process") : to.name(world));
      const std::string again = alone ? "again_rank" + std::to_string(rt.world().rank()) : "again_" + to.name(world);
      {
        RunConfig load = dst.cfg;
        load.checkpoint.load = dir / "src";
        load.checkpoint.save = dir / again;
        dst.trainer(load)->save_checkpoint();  // the state the new layout holds, no step in between
      }
      rt.world().barrier(Stream::cpu());
      test::expect_same_tensors(dir / "src", dir / again, what);
      RunConfig load = dst.cfg;
      load.checkpoint.load = dir / "src";
      test::expect_close_resume(dst.train(load), straight, kStop, what);
    }
  }
}
