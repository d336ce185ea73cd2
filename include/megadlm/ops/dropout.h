// Dropout keyed by global coordinates (counter-based Philox, see core/philox.h), so that the
// same element is dropped whichever rank holds it and backward regenerates the mask instead of
// storing it. Used as Megatron's bias-dropout-add on the residual path.
//
// Element (r, c) of x [R, C] is row g = row_offset + r of its micro-batch and belongs to global
// sample sample_offset + g / seq_len, position position_offset + chunks.global(g % seq_len),
// hidden column column_offset + c. `chunks` (ops/chunk_map.h) places a context-parallel shard's
// rows in the full sequence (identity without CP), so every layout drops the same elements.
// It is kept iff uniform(philox(key(seed, HiddenDropout), {col/4, position, sample, site})[col%4]) >= p,
// and kept values are scaled by 1/(1-p).
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/chunk_map.h"

namespace megadlm::ops {

struct DropoutArgs {
  float p = 0.0f;
  uint64_t seed = 0;
  uint32_t site = 0;             ///< which dropout of the model (e.g. layer*2 + {0: attention, 1: mlp})
  int64_t seq_len = 1;           ///< rows per sample in x
  int64_t sample_offset = 0;     ///< global index of the sample of row 0
  int64_t position_offset = 0;   ///< global position of row 0 within its sample
  int64_t row_offset = 0;        ///< x's row 0 is row `row_offset` of the micro-batch (SP shards)
  int64_t column_offset = 0;     ///< global column of column 0
  ChunkMap chunks = {};          ///< global position of each of the seq_len local positions
};

/// out = residual + dropout(x) (written; out may alias residual).
void dropout_add_forward(const Tensor& x, const Tensor& residual, Tensor& out,
                         const DropoutArgs& args, const Stream& stream);
/// dx = dropout mask * dout / (1-p) (written). The residual's gradient is dout itself.
void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutArgs& args, const Stream& stream);

}  // namespace megadlm::ops
