// Who am I in the job, and the world communicator. The environment is read here and only here
// (launcher facts only; nothing else in the library reads it):
//   mpirun (OpenMPI): OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
//   Slurm srun:       SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NTASKS_PER_NODE
//   torchrun-style:   RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT
//   rendezvous token: MEGADLM_RENDEZVOUS_TOKEN, else TORCHELASTIC_RUN_ID or SLURM_JOB_ID (+ step)
//   none of these:    a single process (world size 1)
// CPU runs use MPI (they need mpirun or an MPI-enabled srun). CUDA runs use NCCL; its unique id
// travels over MPI when MPI is initialised, otherwise over a TCP rendezvous at
// MASTER_ADDR:MASTER_PORT (rank 0 listens). Each process binds the GPU of its local rank.
// A world of one process needs neither: it gets a SelfCommunicator (local copies, no MPI, no NCCL).
// docs/launching.md has the launch recipes, how the NCCL id travels and the timeout behaviour.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
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
  /// What a process must present to rank 0's TCP rendezvous: MEGADLM_RENDEZVOUS_TOKEN, else
  /// the launcher's job id (torchrun's TORCHELASTIC_RUN_ID, Slurm's SLURM_JOB_ID.SLURM_STEP_ID),
  /// else "" (every process of the launch then presents the same empty token).
  std::string job_token;
  std::string job_token_source;  ///< the variable(s) it came from, for messages ("" = none)
};

/// Value of an environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

/// Reads the launcher variables above (through getenv); throws with the offending variable on
/// inconsistency.
LaunchEnvironment detect_launch_environment();
/// The same from any variable source (tests pass a fake environment).
/// Precedence, most specific first: OpenMPI's OMPI_COMM_WORLD_* (set per process by mpirun, even
/// inside a Slurm allocation); torchrun's RANK / WORLD_SIZE (set per worker, even when torchrun
/// itself runs under srun); a Slurm task (SLURM_PROCID inside an srun step, i.e. with
/// SLURM_STEP_ID; a batch script alone is not a launch); otherwise a single process.
/// Slurm's tasks on this node come from SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE or
/// SLURM_TASKS_PER_NODE (first set wins; "2(x3),1" lists are read at SLURM_NODEID).
LaunchEnvironment detect_launch_environment(const EnvLookup& lookup);

/// What gather_startup_errors learnt.
struct StartupErrors {
  int failed_ranks = 0;  ///< how many ranks passed an error (known on every rank)
  /// (world rank, error) of every failing rank; filled on rank 0 only, and on every rank of a
  /// launch that cannot communicate before the runtime exists (then: this rank's own error).
  std::vector<std::pair<int, std::string>> errors;
  bool gathered = false;  ///< true when the ranks did exchange their errors
};

/// Collective before any communicator exists, for errors every rank finds on its own (its
/// command line, say): each rank passes its error ("" = none). Under mpirun or srun with an
/// MPI build the ranks exchange them over MPI (started here when needed; the runtime reuses
/// it), so that rank 0 can report a failure that happened only on rank 1 of an MPMD launch.
/// Other launches (torchrun-style, a single process) exchange nothing: the result holds this
/// rank's own error, and each rank must report it itself.
StartupErrors gather_startup_errors(const LaunchEnvironment& env, const std::string& error,
                                    std::chrono::milliseconds timeout);

/// True when this libmegadlm carries the MPI communicator (MEGADLM_WITH_MPI).
bool mpi_compiled();
/// True when this libmegadlm carries the NCCL communicator (MEGADLM_WITH_NCCL).
bool nccl_compiled();
/// Version of the NCCL library loaded at run time ("2.28.3"), "none" without NCCL.
std::string nccl_version();

enum class Transport { Mpi, Nccl };

namespace detail {
class CommRegistry;  // the communicators a runtime created, for abort_job (src/comm/comm_common.h)
}

/// The process's view of the job: environment, bound device and the world communicator.
/// Owns MPI initialisation/finalisation when it started MPI. One per process; not a global:
/// programs create it in main and pass it down.
class DistributedRuntime {
 public:
  /// CUDA device = local rank when transport is Nccl (device 0 when the launcher made exactly
  /// one GPU visible to each process). `timeout` bounds every collective and the bootstrap.
  /// World size 1 → a SelfCommunicator on the device, whatever the transport.
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

  /// Where a timeout or abort_job writes this rank's last collectives (comm/collective_record.h):
  /// DIR/collectives_rank<R>.txt; "" (the default) = the system's temporary directory, as
  /// megadlm_collectives_rank<R>_pid<P>.txt. pretrain_difflm passes --collective-log-dir.
  void set_collective_log_dir(const std::string& dir);
  /// Writes that file now (with `reason` in its header); returns its path ("" if it failed).
  std::string write_collective_log(const std::string& reason);

  /// After a fatal error: abort every communicator and the MPI job so no rank hangs.
  /// (The one place a distributed program ends other processes; called by apps, not the library.)
  /// Writes this rank's last collectives first (again after a timeout: the same file), then aborts every
  /// communicator created from this runtime's world (splits included), then MPI_Abort when MPI
  /// is up, else std::_Exit(exit_code).
  [[noreturn]] void abort_job(int exit_code) noexcept;

 private:
  LaunchEnvironment env_;
  Transport transport_;
  Device device_;
  bool mpi_started_here_ = false;
  std::shared_ptr<detail::CommRegistry> registry_;
  std::shared_ptr<Communicator> world_;
};

}  // namespace megadlm::comm
