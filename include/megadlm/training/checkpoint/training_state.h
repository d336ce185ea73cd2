// The bridge between a training process's state (ParameterStore flat buffers, the optimizer's
// compact fp32 masters and Adam moments for its owned flat ranges) and checkpoint pieces.
//
// Saved per parameter: "model/<name>" = the fp32 master weights (the model dtype copy is a
// rounding of them, recomputed on load), "optimizer/exp_avg/<name>" and
// "optimizer/exp_avg_sq/<name>". A rank writes the elements of its owned ranges (its
// distributed-optimizer shard, or everything) when it is the writer for them; each owned range
// of a parameter becomes a piece whose region is the parameter's box in the global tensor plus
// the flat range inside it.
//
// Parallel layouts enter through each parameter's ParamDesc: its global shape, the offsets of
// its tensor-parallel box (row_offset, col_offset) and whether this copy is the one written
// (tensor-parallel replicas other than TP rank 0 and the last pipeline stage's copy of a tied
// embedding are not). A pipeline stage simply has fewer parameters, under global names.
#pragma once
#include <memory>
#include <optional>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/optimizer.h"

namespace megadlm::checkpoint {

/// Where a rank's parameter sits in its global tensor.
struct ParamPlacement {
  Shape global_shape;  ///< shape of the unsplit tensor
  Shape offset;        ///< where this rank's (local) tensor starts in it, per dimension
  bool primary = true; ///< false for a replica whose twin on another rank is written instead
};

/// The placement ParameterStore recorded for `desc` (tensor-parallel box, replicas, pipeline copies).
ParamPlacement placement_of(const ParamDesc& desc);

/// Host copies of the state this rank saves, as pieces (empty when `writer` is false).
struct StateSnapshot {
  std::vector<OutgoingPiece> pieces;
  std::shared_ptr<const void> keep_alive;  ///< the host buffers the pieces point into
};

/// Copies the owned masters (and with `moments` the Adam moments) to host memory on `stream`
/// and describes them as pieces. `writer`: this rank writes its owned ranges (false on
/// data-parallel replicas); `expert_writer`: the same for expert parameters, whose replicas are
/// the expert-data-parallel group (unset: `writer`).
StateSnapshot snapshot_state(const ParameterStore& store, const AdamWOptimizer& optimizer,
                             bool writer, bool moments, const Stream& stream,
                             std::optional<bool> expert_writer = std::nullopt);

/// Reads the owned ranges' weights (and with `moments` the Adam moments, else zeros) from
/// `reader` into the optimizer, one piece at a time through a host buffer of that piece's size
/// (memory stays bounded by the largest parameter, not the model), and sets the owned ranges of
/// the model weights to the masters rounded to the model dtype, as the optimizer step does.
/// Under the distributed optimizer the caller then all-gathers the model weights. Call it after
/// CheckpointReader::verify_files: what remains to fail is I/O, and the caller must not train
/// on a state whose load threw.
void load_state(const CheckpointReader& reader, ParameterStore& store, AdamWOptimizer& optimizer,
                bool moments, const Stream& stream);

}  // namespace megadlm::checkpoint
