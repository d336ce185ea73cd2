// pretrain_difflm: Megatron-style flags -> validated configs -> masked-diffusion training.
// Thin by design: everything it does is a library call (training/arguments, training/trainer).
//
//   pretrain_difflm @configs/tiny_dlm.args --train-iters 100
//   pretrain_difflm --dry-run --world-size 1024 --tensor-model-parallel-size 8 ...
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/parallel/rank_layout.h"
#include "megadlm/training/arguments.h"
#include "megadlm/training/trainer.h"

using namespace megadlm;

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    LaunchInfo launch;
    launch.visible_gpus = cuda_device_count();
    ParsedArguments parsed = parse_arguments(args, launch);
    if (parsed.help) {
      std::cout << parsed.help_text;
      return 0;
    }
    for (const std::string& w : parsed.warnings) std::cerr << "WARNING: " << w << "\n";
    std::cout << format_arguments(parsed);
    if (parsed.dry_run) {
      std::cout << format_layout(parsed.config.parallel, 0);
      if (!parsed.not_supported.empty()) {
        std::cerr << "error: this layout is valid but cannot run on this build of megadlm yet:\n";
        for (const std::string& e : parsed.not_supported) std::cerr << "  - " << e << "\n";
        return 2;
      }
      std::cout << "dry run: configuration is valid\n";
      return 0;
    }
    const RunConfig& cfg = parsed.config;
    MDLM_CHECK(cfg.data.mock_data, "only --mock-data is supported by this build (indexed datasets "
               "arrive with docs/roadmap.md's data issue)");
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
