// How much memory a run's parameters need on one rank, before anything is allocated, so that a
// model too large for the machine is refused with the flags that make it large and the bytes it
// would need, instead of a bad_alloc or an out-of-memory error from deep inside the allocator.
// The estimate is the lower bound that does not depend on the batch: the model weights, their
// fp32 gradients, the fp32 master weights and the two Adam moments (the last three sharded
// over data-parallel ranks by the distributed optimizer). Activations come on top.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "megadlm/training/training_config.h"

namespace megadlm::training {

struct MemoryEstimate {
  double parameters_per_rank = 0;  ///< on the pipeline stage with the most
  double bytes_per_rank = 0;
  /// What the parameters are made of, largest first: ("`--num-layers 28` x `--hidden-size`
  /// 2048 / `--ffn-hidden-size` 6144 (layers)", parameters on this rank).
  std::vector<std::pair<std::string, double>> parts;
};

/// The estimate for `config` (its parallel sizes and device included). Computed in double, so
/// sizes whose products overflow int64 still give a (huge) number.
MemoryEstimate estimate_parameter_memory(const RunConfig& config);

/// Throws ConfigError (rule M-31) when the estimate exceeds `available_bytes` (`where`: "this host's
/// 64.0 GiB of memory", "GPU 0's 80.0 GiB"), naming the largest part and its flags.
void check_parameter_memory(const RunConfig& config, double available_bytes, const std::string& where);

/// Physical memory of this host in bytes (0 when unknown).
double host_memory_bytes();

}  // namespace megadlm::training
