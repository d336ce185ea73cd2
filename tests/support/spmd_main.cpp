// main() of the SPMD suites (spmd.h): rank-aware reporting, per-test agreement on failures, and
// an exit code that is non-zero on every rank when any rank failed.
#include <gtest/gtest.h>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/core/device.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "support/spmd.h"

namespace megadlm::test::spmd {

namespace {

std::unique_ptr<comm::DistributedRuntime> g_runtime;  // test harness state, see spmd.h
std::unique_ptr<Stream> g_stream;                       // the harness's own stream on its device
int g_rank = 0;
constexpr int kExitAllSkipped = 77;  // ctest's SKIP_RETURN_CODE for the SPMD suites

/// all_gather of one int per rank over the world (a barrier as well).
std::vector<int32_t> gather_flags(int32_t mine) {
  comm::Communicator& world = g_runtime->world();
  if (!g_stream) g_stream = std::make_unique<Stream>(Stream::for_device(g_runtime->device()));
  const Stream& s = *g_stream;
  Tensor in = Tensor::from_ints({mine}, {1}).to(g_runtime->device(), s);
  Tensor out = Tensor::empty({world.size()}, DType::I32, s);
  world.all_gather(in, out, s);
  world.synchronize(s);
  return out.to_ints(s);
}

std::string rank_list(const std::vector<int32_t>& flags) {
  std::ostringstream os;
  bool first = true;
  for (size_t r = 0; r < flags.size(); ++r) {
    if (!flags[r]) continue;
    os << (first ? "" : ", ") << r;
    first = false;
  }
  return os.str();
}

class RankReporter : public testing::EmptyTestEventListener {
 public:
  void OnTestStart(const testing::TestInfo&) override { failed_ = false; }

  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    failed_ = true;
    const std::string msg = r.message();
    if (msg.find("CommTimeoutError") != std::string::npos) timed_out_ = true;
    // Rank 0's failures are printed by gtest's own printer; the others only here.
    if (g_rank != 0)
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", g_rank,
                   r.file_name() ? r.file_name() : "?", r.line_number(), msg.c_str());
  }

  void OnTestEnd(const testing::TestInfo& info) override {
    const std::string name = std::string(info.test_suite_name()) + "." + info.name();
    if (timed_out_) {
      std::fprintf(stderr, "[rank %d] %s: a collective timed out; its group is unusable, so the "
                   "job ends here (exit 1)\n", g_rank, name.c_str());
      if (g_runtime) g_runtime->abort_job(1);
      std::_Exit(1);
    }
    if (failed_) {
      any_failed_ = true;
      if (g_rank != 0) std::fprintf(stderr, "[rank %d] FAILED %s\n", g_rank, name.c_str());
    }
    if (!g_runtime) return;
    const std::vector<int32_t> flags = gather_flags(failed_ ? 1 : 0);
    const std::string ranks = rank_list(flags);
    if (!ranks.empty()) {
      failed_tests_.push_back(name + " (ranks " + ranks + ")");
      if (g_rank == 0) std::fprintf(stderr, "[spmd] %s FAILED on ranks %s\n", name.c_str(), ranks.c_str());
    }
  }

  bool any_failed() const { return any_failed_; }
  const std::vector<std::string>& failed_tests() const { return failed_tests_; }

 private:
  bool failed_ = false;
  bool timed_out_ = false;
  bool any_failed_ = false;
  std::vector<std::string> failed_tests_;
};

}  // namespace

int launch_rank() { return g_rank; }

bool shared_gpu() {
  // The variable scripts/shared_gpu_rank.sh sets; the runtime reads the same one
  // (comm/bootstrap.cpp) to bind GPU local rank % count.
  const char* v = std::getenv("MEGADLM_SHARED_GPU");
  return v != nullptr && std::string(v) == "1";
}

Device expected_device(const comm::LaunchEnvironment& env) {
  const int gpus = cuda_device_count();
  if (shared_gpu()) return Device::cuda(env.local_rank % gpus);
  return Device::cuda(gpus == 1 ? 0 : env.local_rank);
}

comm::DistributedRuntime* runtime(comm::Transport transport, std::string* why_not) {
  if (g_runtime) {
    if (g_runtime->transport() == transport) return g_runtime.get();
    *why_not = "this process already runs the other transport (one per process)";
    return nullptr;
  }
  const comm::LaunchEnvironment env = comm::detect_launch_environment();
  if (transport == comm::Transport::Nccl) {
    if (env.world_size < 2) {
      *why_not = "the NCCL suite needs 2 or more ranks: run it as mpirun -np N build/bin/gpu_nccl "
                 "(N GPUs) or mpirun -np N scripts/shared_gpu_rank.sh build/bin/gpu_nccl (one GPU)";
      return nullptr;
    }
    if (!comm::nccl_compiled()) {
      *why_not = "this libmegadlm was built without NCCL (-DMEGADLM_WITH_NCCL=ON)";
      return nullptr;
    }
    const int gpus = cuda_device_count();
    if (gpus == 0) {
      *why_not = "the NCCL suite needs a GPU, none is visible";
      return nullptr;
    }
    // One GPU per rank, or several ranks per GPU through scripts/shared_gpu_rank.sh (the
    // runtime then binds GPU local rank % count; NCCL connects the ranks over loopback sockets).
    // One visible GPU per process (per-rank CUDA_VISIBLE_DEVICES) cannot be told apart from one
    // GPU for all: it skips too, as it always did, unless launched through the wrapper.
    if (gpus < env.local_world_size && !shared_gpu()) {
      *why_not = std::to_string(env.local_world_size) + " ranks on this node but " +
                 std::to_string(gpus) + " visible GPU(s): start every rank through the wrapper, "
                 "mpirun -np " + std::to_string(env.world_size) +
                 " scripts/shared_gpu_rank.sh build/bin/gpu_nccl";
      return nullptr;
    }
  }
  g_runtime = std::make_unique<comm::DistributedRuntime>(env, transport, kTimeout);
  return g_runtime.get();
}

}  // namespace megadlm::test::spmd

int main(int argc, char** argv) {
  using namespace megadlm::test::spmd;
  testing::InitGoogleTest(&argc, argv);
  try {
    g_rank = megadlm::comm::detect_launch_environment().rank;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spmd: %s\n", e.what());
    return 2;
  }
  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  if (g_rank != 0) delete listeners.Release(listeners.default_result_printer());
  auto* reporter = new RankReporter;  // owned by gtest
  listeners.Append(reporter);

  const int local = RUN_ALL_TESTS();
  int global = local != 0 || reporter->any_failed() ? 1 : 0;
  // Nothing ran (every test skipped, e.g. the NCCL suite without a GPU): no runtime exists, every
  // rank skipped alike, and 77 tells ctest "skipped" rather than "passed".
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  if (global == 0 && !g_runtime && unit.test_to_run_count() > 0 &&
      unit.skipped_test_count() == unit.test_to_run_count()) {
    if (g_rank == 0)
      std::fprintf(stderr, "[spmd] all %d test(s) skipped: exit 77 (skipped)\n", unit.test_to_run_count());
    return kExitAllSkipped;
  }
  if (g_runtime) {
    // Every rank learns whether any rank failed, so that every process exits alike.
    const std::vector<int32_t> flags = gather_flags(global);
    const std::string ranks = rank_list(flags);
    global = ranks.empty() ? 0 : 1;
    if (g_rank == 0) {
      std::fprintf(stderr, "[spmd] %d rank(s): %s\n", g_runtime->world().size(),
                   ranks.empty() ? "all tests passed on every rank"
                                 : ("failures on ranks " + ranks).c_str());
      for (const std::string& t : reporter->failed_tests())
        std::fprintf(stderr, "[spmd]   FAILED %s\n", t.c_str());
    }
    g_stream.reset();
    g_runtime.reset();  // finalises MPI
  }
  return global;
}
