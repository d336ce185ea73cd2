// Communication at the borders of tensor-parallel regions, each paired with its backward
// conjugate (Megatron's f/g operators; picotron's "communications" file of the TP room).
//
// Activations are [rows, hidden] with rows = tokens (batch-major: row = sample * seq + position).
// Without sequence parallelism every TP rank holds all rows; with it, rank t holds the contiguous
// row shard [t * shard, (t + 1) * shard) where shard = shard_rows(rows, tp) = ceil(rows / tp)
// (parallel/model_parallel.h; the last shard is padded with zero rows when tp does not divide
// rows; padding rows are dropped again on gathering).
// A group of size 1 (or null) makes every function an identity.
//
//   forward                         backward (the conjugate)
//   copy_to_region: identity        all-reduce          (input of a column-parallel block, no SP)
//   reduce_from_region: all-reduce  identity            (output of a row-parallel block, no SP)
//   gather_rows: all-gather         reduce-scatter      (input of a column-parallel block, SP)
//   scatter_rows: reduce-scatter    all-gather          (output of a row-parallel block, SP)
// Only the forward halves exist as functions; backward code calls the conjugate explicitly.
#pragma once
#include <cstdint>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::tp {

/// In place: x = sum over the group of x.
void all_reduce(Tensor& x, comm::Communicator* group, const Stream& stream);

/// shard [shard_rows(rows), H] on every rank -> [rows, H] on every rank (all-gather along rows).
Tensor gather_rows(const Tensor& shard, int64_t rows, comm::Communicator* group, const Stream& stream);

/// full [rows, H] partial sums on every rank -> this rank's shard [shard_rows(rows), H] of the sum
/// (reduce-scatter along rows).
Tensor scatter_rows(const Tensor& full, comm::Communicator* group, const Stream& stream);

/// This rank's shard of a replicated full [rows, H] tensor (no communication).
Tensor shard_of(const Tensor& full, comm::Communicator* group, const Stream& stream);

}  // namespace megadlm::tp
