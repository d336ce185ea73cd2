// pretrain_difflm: Megatron-style flags -> validated configs -> masked-diffusion training.
// Thin by design: everything it does is a library call (comm/bootstrap, training/arguments,
// training/trainer). Launch it like Megatron's pretrain scripts:
//
//   pretrain_difflm @configs/tiny_dlm.args --train-iters 100            (one process)
//   mpirun -np 8 pretrain_difflm @configs/megadlms_1.7b.args --mock-data --use-distributed-optimizer
//   scripts/launch.sh ...                                               (Slurm, several nodes)
//   pretrain_difflm ... --dry-run --world-size 1024 ...                 (check a layout, no GPU)
//   pretrain_difflm ... --plan --world-size 64 ...                      (rank the layouts that fit)
// Exit codes: 0 success (also after a SIGTERM/SIGUSR1 stop); 2 invalid configuration or a
// reported error; 3 unexpected failure; 16 stopped on a reproducible fault (--rerun-mode
// validate_results; a checkpoint of the last good state is saved with --save). Only rank 0 prints the configuration and the iteration lines
// (stdout, Megatron's format); diagnostics go through core/logging (stderr, rank 0 unless
// --log-all-ranks, errors from every rank, "[rank r] " before each line of rank r > 0).
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"
#include "megadlm/core/logging.h"
#include "megadlm/training/arguments/arguments.h"
#include "megadlm/training/arguments/config_agreement.h"
#include "megadlm/training/data_setup.h"
#include "megadlm/training/arguments/flags.h"
#include "megadlm/training/layout_plan.h"
#include "megadlm/training/memory_plan.h"
#include "megadlm/training/memory_estimate.h"
#include "megadlm/training/trainer.h"

using namespace megadlm;

namespace {

// A sink for the ranks that do not log.
class NullBuffer : public std::streambuf {
  int overflow(int c) override { return c; }
};

// Megatron's record on rank 0's stdout, written a line at a time (so that a diagnostic on stderr
// never lands inside it in `> log 2>&1`) with the first write error kept: a full disk does not
// stop training, but the run must not end with exit 0 and a log cut short (main says why).
class RecordBuffer : public std::streambuf {
 public:
  ~RecordBuffer() override { write_out(); }
  int error() const { return error_; }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    pending_.push_back(static_cast<char>(c));
    if (c == '\n') write_out();
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    pending_.append(s, static_cast<size_t>(n));
    if (std::memchr(s, '\n', static_cast<size_t>(n)) != nullptr) write_out();
    return n;
  }
  int sync() override {
    write_out();
    return 0;  // the stream stays usable: the error is reported at the end
  }

 private:
  void write_out() {
    std::fflush(stdout);  // anything printed through stdio first keeps its place
    size_t done = 0;
    while (done < pending_.size()) {
      const ssize_t n = ::write(STDOUT_FILENO, pending_.data() + done, pending_.size() - done);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        if (error_ == 0) error_ = n < 0 ? errno : EIO;
        break;
      }
    }
    pending_.clear();
  }
  std::string pending_;
  int error_ = 0;
};
RecordBuffer* g_record_buffer = nullptr;  // rank 0's, for main's final check

// Cluster preemption (Slurm sends SIGTERM, or SIGUSR1 with --signal): the handler only records
// it; the trainer notices at the next iteration boundary, saves (with --save) and returns.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int signal) { g_stop_signal = signal; }

void install_stop_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

// "rank 3", "ranks 1, 4-6", "every rank": who shares one configuration error.
std::string ranks_text(const std::vector<int>& ranks, int world) {
  if (static_cast<int>(ranks.size()) == world && world > 1) return "every rank";
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out.append(1, '-').append(std::to_string(ranks[j]));
    i = j + 1;
  }
  return out;
}

// Every rank's configuration error reaches the user: rank 0 prints each distinct message once
// with the ranks that have it (an MPMD launch may be wrong on rank 1 only); a launch that cannot
// gather them before the runtime exists has each failing rank print its own (logging adds the
// "[rank r] " prefix).
void report_configuration_errors(const comm::StartupErrors& errors, int rank, int world) {
  if (!errors.gathered) {
    for (const auto& [r, text] : errors.errors) logging::error("invalid configuration:\n", text);
    return;
  }
  if (rank != 0) return;
  std::map<std::string, std::vector<int>> by_message;
  for (const auto& [r, text] : errors.errors) by_message[text].push_back(r);
  for (const auto& [text, ranks] : by_message)
    logging::error("invalid configuration", world > 1 ? " on " + ranks_text(ranks, world) : std::string(), ":\n",
                   text);
}

// A model larger than the memory it gets is a configuration error too, found before anything
// is allocated: host memory shared by this node's ranks, or the rank's GPU (rule M-31).
void check_memory(const RunConfig& c, const comm::LaunchEnvironment& env, int visible_gpus) {
  if (c.training.device == DeviceKind::Cuda) {
    const int gpus = std::max(1, visible_gpus);
    const int gpu = gpus == 1 ? 0 : env.local_rank % gpus;
    const size_t total = cuda_total_memory_bytes(Device::cuda(gpu));
    training::check_parameter_memory(c, static_cast<double>(total),
                                     "the " + std::to_string(total >> 30) + " GiB of GPU " + std::to_string(gpu));
  } else {
    const double host = training::host_memory_bytes() / std::max(1, env.local_world_size);
    training::check_parameter_memory(c, host, "this host's memory per rank (" +
                                                  std::to_string(static_cast<int64_t>(host / (1 << 30))) +
                                                  " GiB for each of its " + std::to_string(env.local_world_size) +
                                                  " rank(s))");
  }
  // Then the memory planner's whole peak (weights, gradients, optimizer state, activations
  // under the pipeline schedule, buffers; training/memory_plan.h) against --gpu-memory-gb, or
  // the host's memory shared by this host's ranks: a launch that cannot fit stops here, with
  // the predicted bytes and the changes that would fit, instead of in an allocation.
  const MemoryPlan memory = plan_memory(c, c.training.device == DeviceKind::Cuda ? PlanDevice::Cuda : PlanDevice::Cpu,
                                        env.local_world_size);
  if (!memory.fits()) throw ConfigError({memory_advice(c, memory)}, {});
}

// The program; main() adds the check of standard output.
int run(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  std::optional<comm::DistributedRuntime> runtime;
  int rank = 0;
  auto fail = [&](const std::string& what, int code) {
    logging::error(what);  // every rank's errors reach the console, with its rank prefix
    // One rank failing must not leave the others blocked in a collective.
    if (runtime && runtime->environment().world_size > 1) runtime->abort_job(code);
    return code;
  };
  try {
    const comm::LaunchEnvironment env = comm::detect_launch_environment();
    rank = env.rank;
    logging::Options log_options;  // the rank prefix from here on; the flags add the rest below
    log_options.rank = env.rank;
    logging::configure(log_options);
    training::LaunchInfo launch;
    launch.world_size = env.world_size;
    launch.rank = env.rank;
    launch.visible_gpus = cuda_device_count();
    std::optional<training::ParsedArguments> parsed_or;
    std::string config_error;
    try {
      parsed_or = training::parse_arguments(args, launch);
      if (!parsed_or->help && !parsed_or->help_markdown && !parsed_or->dry_run)
        check_memory(parsed_or->config, env, launch.visible_gpus);
    } catch (const Error& e) {  // ConfigError, or a flag-derived failure of the checks above
      config_error = e.what();
    }
    if (parsed_or && (parsed_or->help || parsed_or->help_markdown)) {
      if (rank == 0)
        std::cout << (parsed_or->help ? training::format_help() : training::format_flags_markdown());
      return 0;
    }
    // Every rank learns whether any rank's configuration failed, before any work.
    const comm::StartupErrors startup = comm::gather_startup_errors(env, config_error, std::chrono::minutes(10));
    if (startup.failed_ranks > 0) {
      report_configuration_errors(startup, rank, env.world_size);
      return 2;
    }
    const training::ParsedArguments& parsed = *parsed_or;
    const RunConfig& cfg = parsed.config;
    if (parsed.dry_run) {
      // Validation passed (parse_arguments throws otherwise): report and touch no GPU.
      if (rank != 0) return 0;
      std::cout << training::format_dry_run_report(parsed);
      if (parsed.plan) {
        std::cout << format_layout_plan(plan_layouts(args, cfg.parallel.world_size), cfg);
        return 0;
      }
      // A layout that cannot fit is refused, with its numbers and what would fit.
      const MemoryPlan memory = plan_memory(cfg, plan_device(cfg, true, parsed.given.count("device") > 0));
      if (!memory.fits()) {
        std::cout << "dry run: refused: " << memory_advice(cfg, memory) << "\n";
        return 2;
      }
      std::cout << (parsed.not_supported.empty()
                        ? "dry run: the configuration is valid and runnable by this build\n"
                        : "dry run: the configuration is valid; the items above marked not "
                          "supported yet keep this build from running it\n");
      return 0;
    }
    log_options.level = cfg.logging.level;
    log_options.all_ranks = cfg.logging.all_ranks;
    log_options.dir = cfg.logging.dir;
    logging::configure(log_options);
    logging::debug("rank ", env.rank, " of ", env.world_size, " (", comm::launcher_name(env.launcher),
                   ", local rank ", env.local_rank, " of ", env.local_world_size, ")");
    NullBuffer null_buffer;
    std::ostream null_stream(&null_buffer);
    static RecordBuffer record_buffer;  // outlives the run: main() checks it after run() returns
    g_record_buffer = &record_buffer;
    std::ostream record_stream(&record_buffer);
    std::ostream& record = rank == 0 ? record_stream : null_stream;  // Megatron's record: rank 0, stdout
    for (const std::string& w : parsed.warnings) logging::warn(w);
    record << training::format_arguments(parsed);
    // Data first: a missing or corrupted dataset stops the run before any device is touched.
    const training::TrainingData data = training::build_training_data(cfg, rank, record);

    const bool cuda = cfg.training.device == DeviceKind::Cuda;
    runtime.emplace(env, cuda ? comm::Transport::Nccl : comm::Transport::Mpi,
                    std::chrono::minutes(cfg.parallel.distributed_timeout_minutes));
    runtime->set_collective_log_dir(cfg.training.collective_log_dir);
    // Before the process groups are split: ranks disagreeing on the layout would hang there.
    training::check_same_configuration(runtime->world(), training::configuration_text(parsed.values),
                                       Stream::for_device(runtime->device()));
    const parallel::ProcessGroups groups = parallel::ProcessGroups::build(runtime->world_shared(), cfg.parallel);
    const bool handle_signals = !cfg.checkpoint.save.empty() || cfg.training.exit_signal_handler;
    if (handle_signals) install_stop_handler();
    logging::debug("world communicator up: ", env.world_size, " rank(s), device ", runtime->device().str());
    Trainer trainer(cfg, data.train, record, &groups);
    trainer.set_evaluation_data(data.valid, data.test);
    if (handle_signals) trainer.set_stop_request([] { return g_stop_signal != 0; });
    trainer.train();
    return 0;
  } catch (const ConfigError& e) {
    // Configuration errors found later than start-up (none today): rank 0 explains them.
    if (rank == 0) logging::error("invalid configuration:\n", e.what());
    return 2;
  } catch (const FaultStop& e) {
    // Every rank reached the same verdict from the same global values, and saved together.
    if (rank == 0) logging::error(e.what());
    return e.exit_code();
  } catch (const Error& e) {
    return fail(e.what(), 2);
  } catch (const std::exception& e) {
    return fail(std::string("unexpected failure: ") + e.what(), 3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int code = run(argc, argv);
  // The record on stdout (`> log`): a write error there — a full disk — must not end in exit 0
  // with a log cut short. Errors were said on stderr when they happened; this one is said last.
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  int err = flushed ? 0 : errno;
  if (g_record_buffer != nullptr && g_record_buffer->error() != 0) err = g_record_buffer->error();
  if (err != 0 || std::ferror(stdout) || !std::cout.good()) {
    logging::error("writing the record (the arguments and iteration lines) to standard output failed (",
                   err != 0 ? std::strerror(err) : "a write failed",
                   "): the log of this run is incomplete; free space where it goes");
    return code == 0 ? 2 : code;
  }
  return code;
}
