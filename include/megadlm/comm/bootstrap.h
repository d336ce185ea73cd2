// Who am I in the job, and the world communicator. The environment is read here and only here
// (style.md 9.9: launcher facts only):
//   mpirun (OpenMPI): OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
//   Slurm srun:       SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NTASKS_PER_NODE
//   torchrun-style:   RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT
//   none of these:    a single process (world size 1)
// CPU runs use MPI (they need mpirun or an MPI-enabled srun). CUDA runs use NCCL; its unique id
// travels over MPI when MPI is initialised, otherwise over a TCP rendezvous at
// MASTER_ADDR:MASTER_PORT (rank 0 listens). Each process binds the GPU of its local rank.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include "megadlm/comm/communicator.h"

namespace megadlm::comm {

enum class Launcher { Single, MpiRun, Slurm, TorchRun };
const char* launcher_name(Launcher l);

struct LaunchEnvironment {
  Launcher launcher = Launcher::Single;
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  ///< TorchRun (and Slurm without MPI): rendezvous host
  int master_port = 0;
};

/// Reads the launcher variables above; throws with the offending variable on inconsistency.
LaunchEnvironment detect_launch_environment();

enum class Transport { Mpi, Nccl };

/// The process's view of the job: environment, bound device and the world communicator.
/// Owns MPI initialisation/finalisation when it started MPI. One per process; not a global:
/// programs create it in main and pass it down.
class DistributedRuntime {
 public:
  /// CUDA device = local rank when transport is Nccl. `timeout` bounds every collective.
  DistributedRuntime(const LaunchEnvironment& env, Transport transport,
                     std::chrono::milliseconds timeout);
  ~DistributedRuntime();
  DistributedRuntime(const DistributedRuntime&) = delete;
  DistributedRuntime& operator=(const DistributedRuntime&) = delete;

  const LaunchEnvironment& environment() const { return env_; }
  Transport transport() const { return transport_; }
  Device device() const { return device_; }
  Communicator& world() const { return *world_; }
  std::shared_ptr<Communicator> world_shared() const { return world_; }

  /// After a fatal error: abort every communicator and the MPI job so no rank hangs.
  /// (The one place a distributed program ends other processes; called by apps, not the library.)
  [[noreturn]] void abort_job(int exit_code) noexcept;

 private:
  LaunchEnvironment env_;
  Transport transport_;
  Device device_;
  bool mpi_started_here_ = false;
  std::shared_ptr<Communicator> world_;
};

}  // namespace megadlm::comm
