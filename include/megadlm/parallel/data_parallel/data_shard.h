// Which samples a rank reads (docs/parallelism/data_parallel.md): the global batch is sharded
// over the
// data-parallel group dp — not over the gradient group dp×cp. Every rank of one TP, CP or PP
// group has the same data rank and reads the same samples (CP ranks then keep their chunks of
// the sequence); gradients and loss sums are reduced over dp×cp.
//
// Of every block of B·D consecutive samples (B micro-batch size, D data-parallel size), data rank
// r reads [r·B, (r+1)·B): micro-batch m of the batch starting at sample F is the B samples from
//     F + m·B·D + r·B.
// Worked example: B = 2, D = 2, global batch 8 from F = 0: rank 0 reads {0,1} then {4,5}, rank 1
// reads {2,3} then {6,7}.
#pragma once
#include <cstdint>
#include "megadlm/parallel/rank_layout.h"

namespace megadlm {

struct DataShard {
  int rank = 0;  ///< data-parallel rank (position in the dp group)
  int size = 1;  ///< data-parallel size

  /// The data shard of global rank `global_rank` in `layout` (its dp group).
  static DataShard of(const parallel::RankLayout& layout, int global_rank);
  /// First sample of micro-batch `m` of the global batch that starts at sample `batch_first`.
  int64_t first_sample(int64_t batch_first, int64_t m, int64_t micro_batch_size) const {
    return batch_first + m * micro_batch_size * size + rank * micro_batch_size;
  }
  bool operator==(const DataShard&) const = default;
};

}  // namespace megadlm
