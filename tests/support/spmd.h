// Multi-rank test support (multi-rank tests as SPMD programs, docs/conventions.md): one GoogleTest
// binary started on every rank by mpirun. Every rank runs every test in the same order; the
// runtime (and with it the world communicator) is created by the first test that asks for it.
// spmd_main.cpp is the main(): rank 0 prints gtest's report, other ranks print only their
// failures prefixed "[rank r]", each test ends with the ranks agreeing on who failed (rank 0
// prints "[spmd] <test> FAILED on ranks ..."), and every process exits non-zero when any rank
// failed. A communication timeout inside a test ends the job at once (the groups are unusable).
// A run in which every test skipped (the NCCL suite without GPUs) exits 77, which ctest reports
// as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
//
// Test code only: the runtime lives in a static of spmd_main.cpp, like gtest's own registry.
#pragma once
#include <chrono>
#include <string>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"

namespace megadlm::test::spmd {

/// Bounds every collective of the suites: generous for 4 ranks sharing 2 CI cores, short
/// enough that a desynchronised test ends the job in about a minute instead of hanging CI.
inline constexpr std::chrono::milliseconds kTimeout{60'000};

/// This process's runtime for `transport`, created on first use with kTimeout. Returns nullptr
/// and sets `why_not` when it cannot exist here (the NCCL suite without a GPU, or with fewer GPUs
/// than ranks outside scripts/shared_gpu_rank.sh, ...); every rank reaches the same answer. One
/// transport per process.
comm::DistributedRuntime* runtime(comm::Transport transport, std::string* why_not);

/// The launcher's rank of this process (0 without a launcher), usable before any runtime exists.
int launch_rank();

/// True when the ranks share GPUs on purpose (MEGADLM_SHARED_GPU=1, set by
/// scripts/shared_gpu_rank.sh): several ranks per GPU, NCCL over loopback sockets.
bool shared_gpu();

/// The GPU the NCCL runtime must bind for `env`: local rank % GPU count when shared_gpu(), the
/// only GPU when one is visible, else the local rank.
Device expected_device(const comm::LaunchEnvironment& env);

/// The MPI runtime of the CPU layout suites; fails the calling test when it cannot exist.
inline comm::DistributedRuntime& mpi_runtime() {
  std::string why_not;
  comm::DistributedRuntime* rt = runtime(comm::Transport::Mpi, &why_not);
  if (rt == nullptr) throw Error("no MPI runtime for the layout suite: " + why_not);
  return *rt;
}

}  // namespace megadlm::test::spmd
