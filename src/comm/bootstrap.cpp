// comm/bootstrap.h: reading the launcher's variables, and building the world communicator for
// the chosen transport (MPI, NCCL with its id over MPI or TCP, or the self communicator for a
// world of one). docs/launching.md describes the same flow for users.
#include "megadlm/comm/bootstrap.h"
#include "megadlm/core/logging.h"
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include "comm/backends.h"
#include "comm/self_communicator.h"
#include "comm/tcp_rendezvous.h"
#include "core/cuda_bridge.h"

namespace megadlm::comm {

using ::megadlm::detail::concat;

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::Single: return "single process";
    case Launcher::MpiRun: return "mpirun";
    case Launcher::Slurm: return "srun";
    case Launcher::TorchRun: return "torchrun";
  }
  return "?";
}

bool mpi_compiled() { return detail::mpi_compiled_impl(); }
bool nccl_compiled() { return detail::nccl_compiled_impl(); }
std::string nccl_version() { return detail::nccl_runtime_version(); }

namespace {

/// Strict integer parse of a launcher variable: the whole value, in int range.
int parse_int(const char* var, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end == value.c_str() || *end != '\0' || errno == ERANGE || v < INT_MIN ||
      v > INT_MAX)
    MDLM_FAIL("launcher variable ", var, "='", value, "' is not an integer");
  return static_cast<int>(v);
}

struct Reader {
  const EnvLookup& lookup;
  bool has(const char* var) const { return lookup(var).has_value(); }
  std::optional<int> optional_int(const char* var) const {
    const auto v = lookup(var);
    if (!v) return std::nullopt;
    return parse_int(var, *v);
  }
  int required_int(const char* var, const char* launcher, const char* because) const {
    const auto v = lookup(var);
    if (!v) MDLM_FAIL(launcher, " launch detected (", because, ") but ", var, " is not set");
    return parse_int(var, *v);
  }
};

/// Slurm's per-node task lists: "4", "2(x3),1" (2 tasks on each of 3 nodes, then 1).
std::optional<int> tasks_on_node(const char* var, const std::string& list, int node) {
  int index = 0;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = list.find(',', pos);
    const std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int tasks = 0, repeat = 1;
    const size_t paren = item.find("(x");
    if (paren == std::string::npos) {
      tasks = parse_int(var, item);
    } else {
      if (item.back() != ')') MDLM_FAIL("launcher variable ", var, "='", list, "' is not a Slurm task list");
      tasks = parse_int(var, item.substr(0, paren));
      repeat = parse_int(var, item.substr(paren + 2, item.size() - paren - 3));
    }
    if (node < index + repeat) return tasks;
    index += repeat;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return std::nullopt;
}

void check_consistency(const LaunchEnvironment& e, const char* v_world, const char* v_rank,
                       const char* v_local_rank, const char* v_local_size) {
  const char* who = launcher_name(e.launcher);
  if (e.world_size < 1)
    MDLM_FAIL(v_world, "=", e.world_size, " (", who, "): the world needs at least 1 process");
  if (e.rank < 0 || e.rank >= e.world_size)
    MDLM_FAIL(v_rank, "=", e.rank, " is not below ", v_world, "=", e.world_size, " (", who,
              "): valid ranks are 0..", e.world_size - 1);
  if (e.local_world_size < 1 || e.local_world_size > e.world_size)
    MDLM_FAIL(v_local_size, "=", e.local_world_size, " (", who, ") must be between 1 and ", v_world,
              "=", e.world_size);
  if (e.local_rank < 0 || e.local_rank >= e.local_world_size)
    MDLM_FAIL(v_local_rank, "=", e.local_rank, " is not below ", v_local_size, "=",
              e.local_world_size, " (", who, "): valid local ranks are 0..",
              e.local_world_size - 1);
  if (e.master_port < 0 || e.master_port > 65535)
    MDLM_FAIL("MASTER_PORT=", e.master_port, " is not a TCP port (valid: 1..65535)");
}

void read_master(const Reader& r, LaunchEnvironment& e) {
  if (auto a = r.lookup("MASTER_ADDR")) e.master_addr = *a;
  if (auto p = r.optional_int("MASTER_PORT")) e.master_port = *p;
  // torchrun's agent serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), so
  // megadlm's NCCL id rendezvous takes the next port there; MEGADLM_RENDEZVOUS_PORT names another.
  if (auto p = r.optional_int("MEGADLM_RENDEZVOUS_PORT")) {
    e.master_port = *p;
  } else if (r.lookup("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True" && e.master_port > 0) {
    e.master_port += 1;
  }
  // The rendezvous token: explicit (scripts/launch.sh makes a random one), else an id every
  // process of this launch shares and other launches do not: torchrun's run id (a fresh uuid
  // with --standalone), Slurm's job and step.
  if (auto t = r.lookup("MEGADLM_RENDEZVOUS_TOKEN")) {
    e.job_token = *t;
    e.job_token_source = "MEGADLM_RENDEZVOUS_TOKEN";
  } else if (auto t = r.lookup("TORCHELASTIC_RUN_ID")) {
    e.job_token = "torchrun:" + *t;
    e.job_token_source = "TORCHELASTIC_RUN_ID";
  } else if (auto t = r.lookup("SLURM_JOB_ID")) {
    const auto step = r.lookup("SLURM_STEP_ID") ? r.lookup("SLURM_STEP_ID") : r.lookup("SLURM_STEPID");
    e.job_token = "slurm:" + *t + "." + step.value_or("");
    e.job_token_source = "SLURM_JOB_ID and SLURM_STEP_ID";
  }
  if (e.job_token.size() > 256)
    MDLM_FAIL(e.job_token_source, " is ", e.job_token.size(), " bytes long; the rendezvous token "
              "takes at most 256");
}

}  // namespace

LaunchEnvironment detect_launch_environment(const EnvLookup& lookup) {
  const Reader r{lookup};
  LaunchEnvironment e;
  if (r.has("OMPI_COMM_WORLD_SIZE") || r.has("OMPI_COMM_WORLD_RANK")) {
    const char* why = "OMPI_COMM_WORLD_* is set";
    e.launcher = Launcher::MpiRun;
    e.world_size = r.required_int("OMPI_COMM_WORLD_SIZE", "mpirun", why);
    e.rank = r.required_int("OMPI_COMM_WORLD_RANK", "mpirun", why);
    e.local_rank = r.required_int("OMPI_COMM_WORLD_LOCAL_RANK", "mpirun", why);
    e.local_world_size = r.required_int("OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun", why);
    read_master(r, e);
    check_consistency(e, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
    return e;
  }
  if (r.has("RANK") || r.has("WORLD_SIZE")) {
    const char* why = "RANK or WORLD_SIZE is set";
    e.launcher = Launcher::TorchRun;
    e.world_size = r.required_int("WORLD_SIZE", "torchrun-style", why);
    e.rank = r.required_int("RANK", "torchrun-style", why);
    if (e.world_size > 1) {
      // Without them every process would pick GPU 0; torchrun always sets both.
      e.local_rank = r.required_int("LOCAL_RANK", "torchrun-style", why);
      e.local_world_size = r.required_int("LOCAL_WORLD_SIZE", "torchrun-style", why);
    } else {
      e.local_rank = r.optional_int("LOCAL_RANK").value_or(0);
      e.local_world_size = r.optional_int("LOCAL_WORLD_SIZE").value_or(1);
    }
    read_master(r, e);
    check_consistency(e, "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    return e;
  }
  if (r.has("SLURM_PROCID") && (r.has("SLURM_STEP_ID") || r.has("SLURM_STEPID"))) {
    const char* why = "SLURM_PROCID is set inside an srun step";
    e.launcher = Launcher::Slurm;
    e.world_size = r.required_int("SLURM_NTASKS", "Slurm", why);
    e.rank = r.required_int("SLURM_PROCID", "Slurm", why);
    e.local_rank = r.required_int("SLURM_LOCALID", "Slurm", why);
    const char* local_var = nullptr;
    for (const char* var : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
      const auto v = lookup(var);
      if (!v) continue;
      local_var = var;
      const bool is_list = v->find_first_of(",(") != std::string::npos;
      const int node = is_list ? r.required_int("SLURM_NODEID", "Slurm", concat(var, " lists several nodes").c_str()) : 0;
      const auto n = tasks_on_node(var, *v, node);
      if (!n) MDLM_FAIL(var, "='", *v, "' has no entry for SLURM_NODEID=", node);
      e.local_world_size = *n;
      break;
    }
    if (!local_var)
      MDLM_FAIL("Slurm launch detected (", why, ") but none of SLURM_STEP_TASKS_PER_NODE, "
                "SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE is set");
    read_master(r, e);
    check_consistency(e, "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", local_var);
    return e;
  }
  return e;  // a single process
}

LaunchEnvironment detect_launch_environment() {
  return detect_launch_environment([](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

StartupErrors gather_startup_errors(const LaunchEnvironment& env, const std::string& error,
                                    std::chrono::milliseconds timeout) {
  StartupErrors out;
  const bool launched_by_mpi = env.launcher == Launcher::MpiRun || env.launcher == Launcher::Slurm;
  if (env.world_size > 1 && launched_by_mpi && mpi_compiled()) {
    detail::mpi_start();
    // Messages are a few lines; a bound keeps a runaway one from flooding rank 0.
    constexpr size_t kMaxError = 16384;
    const std::string mine = error.size() > kMaxError ? error.substr(0, kMaxError) + "..." : error;
    out.errors = detail::mpi_gather_strings(mine, timeout, &out.failed_ranks);
    out.gathered = true;
    return out;
  }
  if (!error.empty()) {
    out.failed_ranks = 1;
    out.errors.emplace_back(env.rank, error);
  }
  return out;
}

// ---- DistributedRuntime --------------------------------------------------------------------------

namespace {

/// Testing mode: several ranks on one GPU (scripts/shared_gpu_rank.sh sets MEGADLM_SHARED_GPU=1
/// and a unique NCCL_HOSTID per rank, which is what lets NCCL connect two ranks of one GPU
/// through its socket transport). docs/launching.md, "Many ranks on one GPU".
bool shared_gpu_requested() {
  const char* v = std::getenv("MEGADLM_SHARED_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

/// The GPU of this process: its local rank, or the only visible GPU when the launcher already
/// restricted each process to one (Slurm --gpus-per-task, per-rank CUDA_VISIBLE_DEVICES), or
/// local rank modulo the GPU count when ranks share GPUs on purpose (shared_gpu_requested).
int choose_device(const LaunchEnvironment& env) {
  const int count = cuda_device_count();
  if (count == 0)
    MDLM_FAIL("rank ", env.rank, ": the NCCL transport needs a GPU but none is visible",
              cuda_compiled() ? " (check CUDA_VISIBLE_DEVICES and the driver)"
                              : " (this libmegadlm was built without CUDA)");
  if (shared_gpu_requested()) {
    const char* host_id = std::getenv("NCCL_HOSTID");
    if (env.local_world_size > count && (host_id == nullptr || *host_id == '\0'))
      MDLM_FAIL("rank ", env.rank, ": MEGADLM_SHARED_GPU=1 puts ", env.local_world_size,
                " ranks on ", count, " GPU(s), which NCCL accepts only when every rank has its own "
                "NCCL_HOSTID (with NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "
                "NCCL_IB_DISABLE=1); launch each rank through scripts/shared_gpu_rank.sh");
    return env.local_rank % count;
  }
  if (count == 1) return 0;
  if (env.local_rank >= count)
    MDLM_FAIL("rank ", env.rank, " has local rank ", env.local_rank, " and would bind GPU ",
              env.local_rank, ", but ", count, " GPUs are visible on this node; launch at most ",
              count, " ranks per node (one per GPU), or, for testing, several ranks per GPU "
              "through scripts/shared_gpu_rank.sh");
  return env.local_rank;
}

}  // namespace

DistributedRuntime::DistributedRuntime(const LaunchEnvironment& env, Transport transport,
                                       std::chrono::milliseconds timeout)
    : env_(env), transport_(transport), device_(Device::cpu()),
      registry_(std::make_shared<detail::CommRegistry>()) {
  MDLM_CHECK(timeout.count() > 0, "the communication timeout must be positive, got ",
             timeout.count(), " ms (--distributed-timeout-minutes)");
  check_consistency(env_, "world_size", "rank", "local_rank", "local_world_size");
  const bool nccl = transport == Transport::Nccl;
  if (nccl) {
    device_ = Device::cuda(choose_device(env_));
    ::megadlm::detail::cuda_set_device(device_.index);
    const int gpus = cuda_device_count();
    if (env_.local_world_size > gpus && env_.local_rank == 0)
      logging::warn("shared GPU: ", env_.local_world_size, " ranks of this node run on ", gpus,
                " GPU(s), NCCL over loopback sockets; results are exact, speeds mean nothing");
  }

  // One process: neither MPI nor NCCL is needed, whatever launched it.
  if (env_.world_size == 1) {
    world_ = std::make_shared<detail::SelfCommunicator>("world", device_, 0, timeout, registry_);
    return;
  }

  const bool launched_by_mpi = env_.launcher == Launcher::MpiRun || env_.launcher == Launcher::Slurm;
  if (!nccl) {
    if (!mpi_compiled())
      MDLM_FAIL("a CPU (MPI) run of ", env_.world_size, " processes (", launcher_name(env_.launcher),
                ") needs MPI, but this libmegadlm was built without it (configure with "
                "-DMEGADLM_WITH_MPI=ON); a single process needs no MPI");
    if (!launched_by_mpi)
      MDLM_FAIL("a CPU (MPI) run of ", env_.world_size, " processes must be launched by mpirun or "
                "srun, not ", launcher_name(env_.launcher), " (torchrun-style launches carry only "
                "the NCCL transport: use CUDA devices, or launch with mpirun)");
  }
  const bool use_mpi = launched_by_mpi && mpi_compiled();
  if (use_mpi) {
    mpi_started_here_ = detail::mpi_start();
    const int mpi_rank = detail::mpi_world_rank(), mpi_size = detail::mpi_world_size();
    if (mpi_rank != env_.rank || mpi_size != env_.world_size)
      MDLM_FAIL("the launcher (", launcher_name(env_.launcher), ") says rank ", env_.rank, " of ",
                env_.world_size, " but MPI says rank ", mpi_rank, " of ", mpi_size,
                env_.launcher == Launcher::Slurm
                    ? "; srun must start MPI processes through PMI/PMIx (srun --mpi=pmix), or use "
                      "mpirun inside the allocation"
                    : "; the processes were not started by one mpirun");
  }

  if (!nccl) {
    world_ = detail::mpi_world_communicator("world", timeout, registry_);
    return;
  }

  if (!nccl_compiled())
    MDLM_FAIL("a CUDA run of ", env_.world_size, " processes needs NCCL, but this libmegadlm was "
              "built without it (configure with -DMEGADLM_WITH_NCCL=ON; libnccl must be next to the "
              "CUDA toolkit or under NCCL_ROOT)");
  // NVLink SHARP (multicast) stays off unless the user explicitly asked for it: the GPU machines
  // this project targets must not create multicast objects. NCCL reads this at communicator init.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  detail::NcclId id{};
  if (env_.rank == 0) id = detail::nccl_new_unique_id();
  if (use_mpi) {
    detail::mpi_broadcast_bytes(id.data(), id.size(), 0, timeout, "handing out the NCCL unique id");
  } else {
    if (env_.master_addr.empty() || env_.master_port <= 0)
      MDLM_FAIL("rank ", env_.rank, " of ", env_.world_size, " (", launcher_name(env_.launcher),
                "): without MPI the NCCL id travels over TCP from rank 0, which needs MASTER_ADDR "
                "(rank 0's host) and MASTER_PORT (a free port) in every rank's environment; got "
                "MASTER_ADDR='", env_.master_addr, "' MASTER_PORT=", env_.master_port);
    if (env_.rank == 0) {
      detail::TcpRendezvousServer server(env_.master_port);
      server.serve(env_.world_size, std::vector<uint8_t>(id.begin(), id.end()), env_.job_token, timeout);
    } else {
      const std::vector<uint8_t> got = detail::tcp_rendezvous_fetch(
          env_.master_addr, env_.master_port, env_.rank, env_.world_size, env_.job_token, timeout);
      MDLM_CHECK(got.size() == id.size(), "rank 0 sent an NCCL id of ", got.size(),
                 " bytes; expected ", id.size());
      std::copy(got.begin(), got.end(), id.begin());
    }
  }
  world_ = detail::nccl_world_communicator(id, env_.rank, env_.world_size, device_.index, timeout,
                                           registry_);
}

DistributedRuntime::~DistributedRuntime() {
  world_.reset();  // groups still held elsewhere are freed with their last reference
  if (mpi_started_here_) detail::mpi_stop();
}

void DistributedRuntime::set_collective_log_dir(const std::string& dir) { registry_->set_log_dir(dir); }

std::string DistributedRuntime::write_collective_log(const std::string& reason) {
  return registry_->write_collective_log(reason);
}

void DistributedRuntime::abort_job(int exit_code) noexcept {
  std::fflush(stdout);
  std::fflush(stderr);
  if (registry_ && env_.world_size > 1) {
    const std::string file = registry_->write_collective_log(concat("abort_job(", exit_code, ")"));
    if (!file.empty()) std::fprintf(stderr, "rank %d: last collectives written to %s\n", env_.rank, file.c_str());
    std::fflush(stderr);
  }
  if (registry_) registry_->abort_all();
  if (detail::mpi_is_up()) detail::mpi_abort(exit_code);
  std::_Exit(exit_code);
}

}  // namespace megadlm::comm
