// Names of ParallelConfig's enums, as their flags spell them.
#include "megadlm/parallel/parallel_config.h"

namespace megadlm {

const char* sharding_strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::NoShard: return "no_shard";
    case ShardingStrategy::Optim: return "optim";
    case ShardingStrategy::OptimGrads: return "optim_grads";
    case ShardingStrategy::OptimGradsParams: return "optim_grads_params";
  }
  return "?";
}

}  // namespace megadlm
