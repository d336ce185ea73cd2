// Fault replay across ranks (docs/faults.md): the verdict depends only on global values and the
// injection draw on (seed, iteration), so every rank replays the same steps and reaches the same
// verdict without communicating — were one rank to replay alone, its extra collectives would hang
// the job. Under mpirun, on a data-parallel layout with the distributed optimizer and on a
// pipeline-parallel one: an injected transient fault is replayed away (every rank's numbers
// bitwise those of the same layout without injection), an injected persistent one stops every
// rank at the same iteration with exit code 16 and a checkpoint of the last good state.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <filesystem>
#include <sstream>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/fault_detection.h"
#include "megadlm/training/trainer.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

// Rank 0's folder name, on every rank (the ranks of a job share a file system, not a name).
std::string shared_temp_dir(comm::Communicator& world) {
  std::string p;
  if (world.rank() == 0) {
    char tmpl[] = "/tmp/megadlm_layout_fault_stop_XXXXXX";
    p = ::mkdtemp(tmpl);
  }
  Tensor t = Tensor::zeros({512}, DType::I32, Stream::cpu());
  for (size_t i = 0; i < p.size() && i < 511; ++i) t.data<int32_t>()[i] = p[i];
  world.broadcast(t, 0, Stream::cpu());
  std::string out;
  for (int i = 0; i < 512 && t.data<int32_t>()[i] != 0; ++i) out += static_cast<char>(t.data<int32_t>()[i]);
  return out;
}

RunConfig layout(int world, int pp) {
  RunConfig r = test::tiny_run(test::TinyShape::small(4), 8);
  r.model.hidden_dropout = 0.1f;  // the replay must see the same dropout masks too
  r.training.micro_batch_size = 1;
  const int dp = world / pp;
  r.training.global_batch_size = 4 * dp;
  r.parallel.world_size = world;
  r.parallel.pipeline_model_parallel_size = pp;
  r.parallel.data_parallel_size = dp;
  r.parallel.use_distributed_optimizer = dp > 1;
  return r;
}

struct Run {
  std::vector<IterationMetrics> metrics;
  int transient = 0;
};

Run train(const RunConfig& cfg) {
  comm::DistributedRuntime& rt = runtime();
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  auto data = std::make_shared<MockGptDataset>(64, 16, 63);
  std::ostringstream log;
  Trainer t(cfg, data, log, &groups);
  Run r;
  r.metrics = t.train();
  for (const IterationMetrics& m : r.metrics) r.transient += m.fault_report.find("a TRANSIENT fault") != std::string::npos;
  return r;
}

void expect_transient_faults_replayed_away(int pp) {
  const int world = runtime().world().size();
  if (world % pp != 0) GTEST_SKIP() << "needs a world size multiple of pp " << pp;
  RunConfig cfg = layout(world, pp);
  const Run clean = train(cfg);
  cfg.fault_detection.rerun_mode = RerunMode::ValidateResults;
  cfg.fault_detection.error_injection_rate = 3;
  cfg.fault_detection.error_injection_type = ErrorInjectionType::TransientError;
  const Run faulty = train(cfg);
  const int rank = runtime().world().rank();
  EXPECT_GE(faulty.transient, 1) << "rank " << rank << ": nothing was injected";
  ASSERT_EQ(faulty.metrics.size(), clean.metrics.size());
  for (size_t i = 0; i < clean.metrics.size(); ++i) {
    EXPECT_EQ(faulty.metrics[i].lm_loss, clean.metrics[i].lm_loss) << "rank " << rank << ", iteration " << i + 1;
    EXPECT_EQ(faulty.metrics[i].grad_norm, clean.metrics[i].grad_norm) << "rank " << rank << ", iteration " << i + 1;
  }
}

void expect_persistent_fault_stops_every_rank(int pp) {
  comm::DistributedRuntime& rt = runtime();
  const int world = rt.world().size();
  if (world % pp != 0) GTEST_SKIP() << "needs a world size multiple of pp " << pp;
  const std::string dir = shared_temp_dir(rt.world());
  RunConfig cfg = layout(world, pp);
  cfg.checkpoint.save = dir;
  cfg.checkpoint.save_interval = 100;
  cfg.fault_detection.rerun_mode = RerunMode::ValidateResults;
  cfg.fault_detection.error_injection_rate = 1;  // every step from the second on
  cfg.fault_detection.error_injection_type = ErrorInjectionType::PersistentError;
  parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
  auto data = std::make_shared<MockGptDataset>(64, 16, 63);
  std::ostringstream log;
  Trainer t(cfg, data, log, &groups);
  int code = 0;
  std::string what;
  try {
    t.train();
  } catch (const FaultStop& e) {
    code = e.exit_code();
    what = e.what();
  }
  const int rank = rt.world().rank();
  EXPECT_EQ(code, kExitReproducibleFault) << "rank " << rank;
  EXPECT_NE(what.find("iteration 2: found a non-finite value"), std::string::npos) << "rank " << rank << ": " << what;
  EXPECT_EQ(t.iteration(), 1) << "rank " << rank;
  rt.world().barrier(Stream::cpu());
  if (rank == 0) {
    const checkpoint::CheckpointReader saved(checkpoint::checkpoint_dir(dir, "1"));
    EXPECT_EQ(saved.index().state.iteration, 1);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace

TEST(FaultReplayAcrossRanks, DataParallelTransientFaultsAreReplayedAwayBitwise) { expect_transient_faults_replayed_away(1); }
TEST(FaultReplayAcrossRanks, PipelineParallelTransientFaultsAreReplayedAwayBitwise) { expect_transient_faults_replayed_away(2); }
TEST(FaultReplayAcrossRanks, DataParallelPersistentFaultStopsEveryRankWithACheckpoint) { expect_persistent_fault_stops_every_rank(1); }
TEST(FaultReplayAcrossRanks, PipelineParallelPersistentFaultStopsEveryRankWithACheckpoint) { expect_persistent_fault_stops_every_rank(2); }
