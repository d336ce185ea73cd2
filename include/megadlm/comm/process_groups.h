// Communicators for every process group of the validated layout (megatron-compat.md §1.3),
// built once at start by splitting the world communicator (ncclCommSplit / MPI_Comm_split) with
// the member lists of parallel/rank_layout. A value, not a global: tests hold several.
#pragma once
#include <memory>
#include "megadlm/comm/communicator.h"
#include "megadlm/parallel/parallel_config.h"

namespace megadlm::comm {

/// A field is null on a rank that belongs to no group of its kind (embedding on middle pipeline
/// stages; dist_opt_inter with one instance). Groups whose member lists coincide across the whole
/// layout share one communicator, named after all of them ("dp=dp-cp"); one-rank groups are
/// local (no MPI/NCCL communicator behind them). Rank order in every group is the member order
/// of parallel/rank_layout.
struct ProcessGroups {
  std::shared_ptr<Communicator> world;
  std::shared_ptr<Communicator> tp, cp, dp, dp_cp, pp, model_parallel, tp_cp, embedding;
  /// Distributed-optimizer groups: intra = the reduce-scatter/all-gather group (dp-cp, or its
  /// slice with --num-distributed-optimizer-instances > 1), inter = across instances (or null).
  std::shared_ptr<Communicator> dist_opt_intra, dist_opt_inter;

  /// Collective over `world`: every rank must call it with the same config.
  static ProcessGroups build(std::shared_ptr<Communicator> world, const ParallelConfig& config);
};

}  // namespace megadlm::comm
