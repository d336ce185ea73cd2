// Token embedding lookup. `vocab_start` lets a vocab-parallel shard hold rows
// [vocab_start, vocab_start + V): ids outside the shard produce zero rows and no gradient.
// Dtypes: weight/out CPU f32/f64, CUDA bf16; ids i32; dweight f32 (main grad).
// Accumulation: out written; dweight accumulated (+=).
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

/// out[t, :] = weight[ids[t] - vocab_start, :].  weight [V, H], ids [T], out [T, H].
void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out, int64_t vocab_start,
                       const Stream& stream);
/// dweight[ids[t] - vocab_start, :] += dout[t, :].
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                        int64_t vocab_start, const Stream& stream);

}  // namespace megadlm::ops
