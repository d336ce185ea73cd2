// pretrain_difflm: Megatron-style flags -> validated configs -> masked-diffusion training.
// Thin by design: everything it does is a library call (training/arguments, training/trainer).
//
//   pretrain_difflm @configs/tiny_dlm.args --train-iters 100
//   pretrain_difflm @configs/megadlms_1.7b.args --mock-data --train-iters 10 (continued:)
//       --dry-run --world-size 1024 --tensor-model-parallel-size 8
// Exit codes: 0 success; 2 invalid configuration or a reported error; 3 unexpected failure.
#include <iostream>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/arguments.h"
#include "megadlm/training/flags.h"
#include "megadlm/training/trainer.h"

using namespace megadlm;

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    training::LaunchInfo launch;
    launch.visible_gpus = cuda_device_count();
    const training::ParsedArguments parsed = training::parse_arguments(args, launch);
    if (parsed.help) {
      std::cout << training::format_help();
      return 0;
    }
    if (parsed.help_markdown) {
      std::cout << training::format_flags_markdown();
      return 0;
    }
    if (parsed.dry_run) {
      // Validation passed (parse_arguments throws otherwise): report and touch no GPU.
      std::cout << training::format_dry_run_report(parsed);
      std::cout << (parsed.not_supported.empty()
                        ? "dry run: the configuration is valid and runnable by this build\n"
                        : "dry run: the configuration is valid; the items above marked not "
                          "supported yet keep this build from running it\n");
      return 0;
    }
    for (const std::string& w : parsed.warnings) std::cerr << "WARNING: " << w << "\n";
    std::cout << training::format_arguments(parsed);
    const RunConfig& cfg = parsed.config;
    MDLM_CHECK(cfg.data.mock_data, "only --mock-data is supported by this build; Megatron indexed "
               "datasets (--data-path) arrive with the data issue in docs/roadmap.md");
    auto data = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length,
                                                 cfg.diffusion.mask_token);
    Trainer trainer(cfg, data, std::cout);
    trainer.train();
    return 0;
  } catch (const ConfigError& e) {
    std::cerr << "error: invalid configuration:\n" << e.what() << "\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: unexpected failure: " << e.what() << "\n";
    return 3;
  }
}
