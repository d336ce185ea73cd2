// Communicators for every process group of the validated layout (Megatron's
// initialize_model_parallel), built
// once at start by cutting the world communicator (comm::split_by_members: ncclCommSplit /
// MPI_Comm_split) with the member lists of parallel/rank_layout. A value, not a global: tests
// hold several.
#pragma once
#include <memory>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/parallel/parallel_config.h"

namespace megadlm::parallel {

/// A field is null on a rank that belongs to no group of its kind (embedding on middle pipeline
/// stages; dist_opt_inter with one instance; hierarchical_cp without
/// --hierarchical-context-parallel-sizes). Groups whose member lists coincide across the whole
/// layout share one communicator, named after all of them ("dp=dp-cp"); one-rank groups are local
/// (no MPI/NCCL communicator behind them). Rank order in every group is the member order of
/// parallel/rank_layout.
struct ProcessGroups {
  std::shared_ptr<comm::Communicator> world;
  // Dense groups. dp is the data group (which samples a rank reads); dp_cp is the gradient group
  // (weight gradients and loss sums are reduced over it).
  std::shared_ptr<comm::Communicator> tp, cp, dp, dp_cp, pp, model_parallel, tp_cp, embedding;
  /// Hierarchical context parallelism: one group per level of
  /// --hierarchical-context-parallel-sizes (empty without it).
  std::vector<std::shared_ptr<comm::Communicator>> hierarchical_cp;
  // Expert groups: ep = expert model parallel, expert_tp = tensor parallel inside the
  // experts, expert_dp = the gradient group of expert parameters.
  std::shared_ptr<comm::Communicator> ep, expert_tp, expert_dp;
  /// Distributed-optimizer groups: intra = the reduce-scatter/all-gather group (dp-cp, or its
  /// slice with --num-distributed-optimizer-instances > 1), inter = across instances (or null).
  std::shared_ptr<comm::Communicator> dist_opt_intra, dist_opt_inter;

  /// Collective over `world`: every rank must call it with the same config.
  static ProcessGroups build(std::shared_ptr<comm::Communicator> world, const ParallelConfig& config);
};

}  // namespace megadlm::parallel
