// The model-parallel groups as a layer sees them: one value that carries the tensor-, context-,
// expert- and expert-tensor-parallel groups with this rank's place in each, and the
// sequence-parallel switch. Layers receive it when they are built and keep it; nothing reads a
// global. Data-parallel groups are not here: layers never talk over them (the gradient hooks of
// parallel/param_hooks.h do).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/side_stream.h"
#include "megadlm/parallel/context_parallel/comm_type.h"
#include "megadlm/parallel/fp8_state.h"
#include "megadlm/parallel/parallel_config.h"
#include "megadlm/parallel/process_groups.h"

namespace megadlm {

/// One parallel dimension: its group (null: a group of one) and this rank's place in it.
struct ParallelGroup {
  std::shared_ptr<comm::Communicator> comm;
  int rank = 0;
  int size = 1;

  /// The group's communicator, or null for a group of one (what tp/ mappings take).
  comm::Communicator* get() const { return size > 1 ? comm.get() : nullptr; }
  bool enabled() const { return size > 1; }
  /// Rank and size read from the communicator (null: rank 0 of 1).
  static ParallelGroup of(std::shared_ptr<comm::Communicator> c);
};

/// Rows of one sequence-parallel shard for `rows` rows over `tp` ranks: ceil(rows / tp); TP rank
/// t holds rows [t · shard, (t + 1) · shard), the last shard padded with zero rows
/// (tensor_parallel/mappings.h).
inline int64_t shard_rows(int64_t rows, int tp) { return (rows + tp - 1) / tp; }

struct ModelParallel {
  ParallelGroup tp;         ///< tensor parallel (dense layers)
  ParallelGroup cp;         ///< context parallel: the sequence is split over it
  ParallelGroup ep;         ///< expert model parallel: experts are split over it
  ParallelGroup expert_tp;  ///< tensor parallel inside each expert
  /// --hierarchical-context-parallel-sizes: one group per level (empty: not hierarchical).
  std::vector<ParallelGroup> hierarchical_cp;
  /// --cp-comm-type: how each layer's attention talks over the CP group (one value: every
  /// layer; see cp::comm_type_of_layer).
  std::vector<cp::CommType> cp_comm_types;
  /// The stream the CP ring's transfers overlap compute on (CUDA), shared by every layer; null
  /// without CP.
  std::shared_ptr<SideStream> cp_side_stream;
  /// Sequence parallelism: activations between TP regions are sharded along the rows. Resolved:
  /// true only with tp.size > 1.
  bool sequence_parallel = false;
  /// --tp-comm-overlap: the SP all-gathers and reduce-scatters of the TP linears run as rings
  /// overlapped with their GEMMs (tensor_parallel/comm_overlap.h). Resolved: true only with SP.
  bool tp_comm_overlap = false;
  /// The stream those rings' transfers run on (CUDA), shared by every layer; null without it.
  std::shared_ptr<SideStream> tp_side_stream;
  /// FP8 linears (--fp8-format): the rank's shared scaling state; null: the linears run in the
  /// activation dtype. A transformer layer kept in bf16 hands its linears a copy without it.
  std::shared_ptr<Fp8State> fp8;

  /// Rows of activations this rank holds between TP regions for `rows` rows of the full
  /// (per-CP-rank) micro-batch: its SP shard, or all of them.
  int64_t local_rows(int64_t rows) const;
  /// First of this rank's rows among the `rows` rows (0 without SP).
  int64_t local_row_offset(int64_t rows) const;

  /// The groups of `groups` for a run of `config` (sizes checked against the config).
  static ModelParallel from(const parallel::ProcessGroups& groups, const ParallelConfig& config);
  /// Every group a group of one: a single-rank model.
  static ModelParallel single() { return {}; }
};

}  // namespace megadlm
