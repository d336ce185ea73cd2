// --tp-comm-overlap: the sequence-parallel all-gather and reduce-scatter of mappings.h cut into
// one chunk per TP rank's row shard and run as a ring of point-to-point transfers, so that the
// GEMM of the chunk in hand overlaps the transfer of the next one (Transformer Engine's "ring
// exchange" overlap, written with our communicator). Same results as gather_rows/scatter_rows:
// the gather moves the same bytes; the reduce-scatter sums the same partials in ring order
// (bitwise equal for two ranks, reassociated for more). docs/parallelism/tensor_parallel.md has
// the schedule with a worked example.
//
// Streams: with a side stream (CUDA) the transfers run on it, ordered after the compute stream's
// work queued so far, and the compute stream waits for each chunk's arrival (events) before its
// GEMM; when a function returns, the compute stream has waited for every transfer it started,
// so later work on either stream (and other collectives on the TP group) is ordered after it.
// Without one (CPU, MPI) each transfer blocks and the same chunked code runs in the same order.
// Both functions are collective over `group` (every member calls them for the same region).
#pragma once
#include <cstdint>
#include <functional>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::tp {

/// Work on one arrived chunk: `rows` are the real rows [n, H] (n >= 1) of the gathered tensor
/// starting at row `first_row`. Queued on the compute stream.
using GatheredChunkFn = std::function<void(int64_t first_row, const Tensor& rows)>;

/// All-gather along rows as gather_rows does (shard [shard_rows(rows, tp), H] on every rank ->
/// [rows, H]), calling `on_chunk` for every shard's real rows as soon as it is here: this rank's
/// own shard first, then the shards of ranks r-1, r-2, ... (ring order). tp = group.size() >= 2.
Tensor gather_rows_overlapped(const Tensor& shard, int64_t rows, comm::Communicator& group,
                              const Stream& compute, const Stream* side, const GatheredChunkFn& on_chunk);

/// This rank's partial sums of rows [first_row, first_row + out.rows()) of the region's output,
/// written into `out` [n, cols] (n >= 1). Queued on the compute stream.
using PartialChunkFn = std::function<void(int64_t first_row, Tensor& out)>;

/// Reduce-scatter along rows as scatter_rows does: the sum over the group of every rank's
/// partial [rows, cols] output, this rank's shard [shard_rows(rows, tp), cols] returned (rows
/// past `rows` zero), with the partial output never materialised whole: rank r computes the
/// chunk of shard r+1 first and passes the running sum to rank r-1, which adds its own partial
/// of that chunk, and so on around the ring; the last chunk each rank computes is its own
/// shard, to which it adds the sum of all the others'. `between` (optional) is queued on the
/// compute stream once the first transfer is under way, to overlap it (a weight-gradient GEMM).
Tensor scatter_rows_overlapped(int64_t rows, int64_t cols, DType dtype, comm::Communicator& group,
                               const Stream& compute, const Stream* side, const PartialChunkFn& partial,
                               const std::function<void()>& between = {});

}  // namespace megadlm::tp
