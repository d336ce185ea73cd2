// Checkpoints stay layout-independent under context parallelism (CP splits activations, never
// parameters): a checkpoint saved at CP = 2 (x DP on 4 ranks, with the distributed optimizer)
// loads in one process (CP = 1) and, on 4 ranks, at CP = 4. The loading layout's state is
// checked bitwise by saving it again at once and comparing every tensor with the original; the
// continued run matches the uninterrupted single-process run to 1e-5 (relative: the layouts
// differ in fp32 reduction order only).
#include <gtest/gtest.h>
#include <cstring>
#include <memory>
#include <sstream>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/trainer.h"
#include "support/scratch.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

constexpr int64_t kIters = 6, kStop = 3;

/// A scratch directory made by rank 0 and shared by every rank (one machine), removed after all
/// ranks are done with it.
class SharedDir {
 public:
  explicit SharedDir(comm::Communicator& world) : world_(world) {
    if (world.rank() == 0) owned_ = std::make_unique<test::TempDir>("megadlm_cp_ckpt_");
    Tensor t = Tensor::zeros({256}, DType::I32, Stream::cpu());
    if (owned_)
      for (size_t i = 0; i < owned_->str().size() && i < 255; ++i) t.data<int32_t>()[i] = owned_->str()[i];
    world.broadcast(t, 0, Stream::cpu());
    for (int i = 0; i < 256 && t.data<int32_t>()[i] != 0; ++i) path_ += static_cast<char>(t.data<int32_t>()[i]);
  }
  ~SharedDir() { world_.barrier(Stream::cpu()); }  // owned_ goes after every rank arrived
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  comm::Communicator& world_;
  std::unique_ptr<test::TempDir> owned_;
  std::string path_;
};

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
  r.parallel.cp_comm_type = {"p2p"};
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
  std::unique_ptr<Trainer> trainer(const RunConfig& c) const {
    static std::ostringstream log;
    return std::make_unique<Trainer>(c, std::make_shared<MockGptDataset>(64, 16, 63), log, groups.get());
  }
};

void expect_same_tensors(const std::string& a_dir, const std::string& b_dir, const std::string& what) {
  checkpoint::CheckpointReader a(*checkpoint::find_checkpoint(a_dir, std::nullopt));
  checkpoint::CheckpointReader b(*checkpoint::find_checkpoint(b_dir, std::nullopt));
  ASSERT_EQ(a.index().tensors.size(), b.index().tensors.size()) << what;
  for (const auto& [name, info] : a.index().tensors) {
    ASSERT_TRUE(b.has_tensor(name)) << what << ": " << name;
    const Tensor x = a.read_whole(name), y = b.read_whole(name);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << what << ": tensor " << name;
  }
}

}  // namespace

TEST(ContextParallelCheckpoint, SavedAtCp2LoadsAtCp1AndCp4AndContinuesWithTheSameLosses) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  if (world != 2 && world != 4) GTEST_SKIP() << "written for 2 and 4 ranks";
  const Job reference(1, 1, false);
  const auto straight = reference.trainer(reference.cfg)->train();
  ASSERT_EQ(straight.size(), static_cast<size_t>(kIters));

  SharedDir dir(rt.world());
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
    expect_same_tensors(dir / "cp2", dir / again, "saved at CP 2, loaded as " + t.name);
    RunConfig load = dst.cfg;
    load.checkpoint.load = dir / "cp2";
    const auto resumed = dst.trainer(load)->train();
    ASSERT_EQ(resumed.size(), static_cast<size_t>(kIters - kStop)) << t.name;
    for (size_t i = 0; i < resumed.size(); ++i) {
      const IterationMetrics& r = straight[static_cast<size_t>(kStop) + i];
      EXPECT_NEAR(resumed[i].lm_loss, r.lm_loss, 1e-5 * r.lm_loss) << t.name << ", iteration " << r.iteration;
      EXPECT_NEAR(resumed[i].grad_norm, r.grad_norm, 1e-5 * r.grad_norm) << t.name << ", iteration " << r.iteration;
    }
  }
}
