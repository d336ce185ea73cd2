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
// reported error; 3 unexpected failure. Only rank 0 prints the configuration and the iteration lines.
#include <csignal>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"
#include "megadlm/training/arguments.h"
#include "megadlm/training/config_agreement.h"
#include "megadlm/training/data_setup.h"
#include "megadlm/training/flags.h"
#include "megadlm/training/layout_plan.h"
#include "megadlm/training/memory_plan.h"
#include "megadlm/training/trainer.h"

using namespace megadlm;

namespace {

// A sink for the ranks that do not log.
class NullBuffer : public std::streambuf {
  int overflow(int c) override { return c; }
};

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

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  std::optional<comm::DistributedRuntime> runtime;
  int rank = 0;
  auto fail = [&](const std::string& what, int code) {
    if (rank == 0 || !runtime || runtime->environment().world_size == 1) {
      std::cerr << what << "\n";
    } else {
      std::cerr << "[rank " << rank << "] " << what << "\n";
    }
    // One rank failing must not leave the others blocked in a collective.
    if (runtime && runtime->environment().world_size > 1) runtime->abort_job(code);
    return code;
  };
  try {
    const comm::LaunchEnvironment env = comm::detect_launch_environment();
    rank = env.rank;
    training::LaunchInfo launch;
    launch.world_size = env.world_size;
    launch.rank = env.rank;
    launch.visible_gpus = cuda_device_count();
    const training::ParsedArguments parsed = training::parse_arguments(args, launch);
    if (parsed.help || parsed.help_markdown) {
      if (rank == 0)
        std::cout << (parsed.help ? training::format_help() : training::format_flags_markdown());
      return 0;
    }
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
    {
      // Before any data or device work: a layout that cannot fit the GPU (or the host, for the
      // CPU backend, shared by this host's ranks) stops here instead of in an allocation.
      const MemoryPlan memory = plan_memory(cfg, cfg.training.device == DeviceKind::Cuda ? PlanDevice::Cuda : PlanDevice::Cpu,
                                            env.local_world_size);
      if (!memory.fits()) {
        if (rank == 0) std::cerr << "error: " << memory_advice(cfg, memory) << "\n";
        return 2;
      }
    }
    NullBuffer null_buffer;
    std::ostream null_stream(&null_buffer);
    std::ostream& log = rank == 0 ? std::cout : null_stream;
    for (const std::string& w : parsed.warnings) if (rank == 0) std::cerr << "WARNING: " << w << "\n";
    log << training::format_arguments(parsed);
    // Data first: a missing or corrupted dataset stops the run before any device is touched.
    const training::TrainingData data = training::build_training_data(cfg, rank, log);

    const bool cuda = cfg.training.device == DeviceKind::Cuda;
    runtime.emplace(env, cuda ? comm::Transport::Nccl : comm::Transport::Mpi,
                    std::chrono::minutes(cfg.parallel.distributed_timeout_minutes));
    // Before the process groups are split: ranks disagreeing on the layout would hang there.
    training::check_same_configuration(runtime->world(), training::configuration_text(parsed.values),
                                       Stream::for_device(runtime->device()));
    const parallel::ProcessGroups groups = parallel::ProcessGroups::build(runtime->world_shared(), cfg.parallel);
    const bool handle_signals = !cfg.checkpoint.save.empty() || cfg.training.exit_signal_handler;
    if (handle_signals) install_stop_handler();
    Trainer trainer(cfg, data.train, log, &groups);
    trainer.set_evaluation_data(data.valid, data.test);
    if (handle_signals) trainer.set_stop_request([] { return g_stop_signal != 0; });
    trainer.train();
    return 0;
  } catch (const ConfigError& e) {
    // Every rank sees the same configuration: only rank 0 explains it.
    if (rank == 0) std::cerr << "error: invalid configuration:\n" << e.what() << "\n";
    return 2;
  } catch (const comm::CommTimeoutError& e) {
    return fail(std::string("error: ") + e.what(), 2);
  } catch (const Error& e) {
    return fail(std::string("error: ") + e.what(), 2);
  } catch (const std::exception& e) {
    return fail(std::string("error: unexpected failure: ") + e.what(), 3);
  }
}
