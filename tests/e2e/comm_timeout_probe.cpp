// The program tests/e2e/comm_timeout.sh runs under mpirun -np 2: after one all_reduce that every
// rank joins, rank 1 skips the next one and idles as a stuck rank would. The other ranks must
// raise CommTimeoutError within the timeout (seconds, argv[1]) and end the whole job through
// DistributedRuntime::abort_job, as a program does on any fatal error.
//   comm_timeout_probe SECONDS [DIR]  the probe; with DIR, the ranks' last collectives go there
//   comm_timeout_probe SECONDS DIR split   the same in a group 'dp' split from the world, which
//                                          is destroyed (as a trainer's groups are while the
//                                          error unwinds) before abort_job writes the file again
//   comm_timeout_probe --mpi-compiled   exit 0 when this build has MPI, 77 otherwise
// Exit codes: 3 the timeout fired and the job was aborted (expected), 4 the skipped all_reduce
// completed, 5 rank 1 outlived the abort, 2 bad usage.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include "megadlm/comm/bootstrap.h"

using namespace megadlm;

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4 || (argc == 4 && std::strcmp(argv[3], "split") != 0)) {
    std::fprintf(stderr, "usage: %s SECONDS [DIR [split]] | --mpi-compiled\n", argv[0]);
    return 2;
  }
  if (std::strcmp(argv[1], "--mpi-compiled") == 0) return comm::mpi_compiled() ? 0 : 77;
  const auto timeout = std::chrono::milliseconds(static_cast<long>(std::atof(argv[1]) * 1000));
  int rank = -1;
  std::unique_ptr<comm::DistributedRuntime> runtime;
  try {
    const comm::LaunchEnvironment env = comm::detect_launch_environment();
    rank = env.rank;
    runtime = std::make_unique<comm::DistributedRuntime>(env, comm::Transport::Mpi, timeout);
    if (argc >= 3) runtime->set_collective_log_dir(argv[2]);
    comm::Communicator& world = runtime->world();
    const Stream cpu = Stream::cpu();
    Tensor t = Tensor::from_floats({1.0f, 2.0f, 3.0f}, {3});
    const bool split = argc == 4;
    std::unique_ptr<comm::Communicator> dp;
    if (split) dp = world.split(0, world.rank(), "dp");  // every rank: one group of all
    comm::Communicator& group = split ? *dp : world;
    group.all_reduce(t, comm::ReduceOp::Sum, cpu);  // everyone: the group works
    if (world.rank() == 1) {
      std::fprintf(stderr, "comm_timeout_probe: rank 1 skips the second all_reduce\n");
      std::this_thread::sleep_for(std::chrono::seconds(60));
      std::fprintf(stderr, "comm_timeout_probe: rank 1 is still alive after 60 s: the job was "
                           "not aborted\n");
      return 5;
    }
    // The timeout leaves this block: `dp` is destroyed before the handler below calls abort_job,
    // as a trainer's groups are while the error unwinds.
    group.all_reduce(t, comm::ReduceOp::Sum, cpu);
    std::fprintf(stderr, "comm_timeout_probe: rank %d: the all_reduce completed although rank 1 "
                         "skipped it\n", rank);
    return 4;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_timeout_probe: rank %d: %s\n", rank, e.what());
    if (runtime) runtime->abort_job(3);
    return 3;
  }
}
