// main() of the SPMD suites (spmd.h): rank-aware reporting, per-test agreement on failures, a
// closing list of the tests that ran and of those that skipped (with their reasons), and one exit
// code for the job: 1 on every rank when any rank failed, 77 on rank 0 when every test skipped
// (CTest's SKIP_RETURN_CODE: reported as skipped, not passed; mpirun passes it on), else 0.
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

/// The exit code of a job in which nothing failed and every test skipped (tests/CMakeLists.txt
/// registers it as the suites' SKIP_RETURN_CODE).
constexpr int kAllSkippedExitCode = 77;

std::string trimmed(const std::string& s) {
  const size_t first = s.find_first_not_of(" \n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \n") - first + 1);
}

class RankReporter : public testing::EmptyTestEventListener {
 public:
  void OnTestStart(const testing::TestInfo&) override {
    failed_ = false;
    skip_reason_.clear();
  }

  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.skipped() && skip_reason_.empty()) skip_reason_ = trimmed(r.message());
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
    if (info.result()->Skipped()) {
      skipped_.push_back(name + ": " + (skip_reason_.empty() ? "(no reason given)" : skip_reason_));
    } else {
      ran_.push_back(name);
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
  const std::vector<std::string>& ran() const { return ran_; }
  const std::vector<std::string>& skipped() const { return skipped_; }

 private:
  std::string skip_reason_;  ///< of the running test: the first GTEST_SKIP's message
  std::vector<std::string> ran_, skipped_;
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
  // What ran and what did not (rank 0 speaks for all: every rank skips alike).
  if (g_rank == 0) {
    std::fprintf(stderr, "[spmd] ran %zu test(s), skipped %zu%s\n", reporter->ran().size(),
                 reporter->skipped().size(), reporter->skipped().empty() ? "" : ":");
    for (const std::string& s : reporter->skipped()) std::fprintf(stderr, "[spmd]   skipped %s\n", s.c_str());
  }
  bool all_skipped = reporter->ran().empty() && !reporter->skipped().empty();
  if (g_runtime) {
    // Skipped everywhere only if no rank ran a test.
    const std::vector<int32_t> ran = gather_flags(all_skipped ? 0 : 1);
    all_skipped = rank_list(ran).empty();
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
  if (global == 0 && all_skipped) {
    // Rank 0 alone says it: Open MPI's mpirun returns the first non-zero exit code and kills the
    // ranks still running, which would lose rank 0's report were another rank first.
    if (g_rank != 0) return 0;
    std::fprintf(stderr, "[spmd] every test skipped: exit %d (reported as skipped)\n", kAllSkippedExitCode);
    return kAllSkippedExitCode;
  }
  return global;
}
