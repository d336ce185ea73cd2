// Internal: attention on row windows of larger tensors, what block diffusion's composed path
// (ops/attention_block_diffusion_bulk.h) runs its causal bulks on. A piece's arguments are an
// ordinary call of args.seq rows; its inputs are rows of the whole doubled rows:
//   q, dout, out: rows [q_row0, q_row0 + seq) of each batch row of [B, rows, Hq, D] tensors;
//   k, v:         rows [kv_row0, kv_row0 + seq) of [B, rows, Hkv, D];
//   lse (a backward input): columns [q_row0, q_row0 + seq) of [B, Hq, rows].
// The piece's outputs (out, lse forward; dq, dk, dv backward) are its own contiguous tensors.
// On CUDA cuDNN reads the windows in place (a batch stride of `rows` tokens); elsewhere, and
// where cuDNN does not take the call, the rows are copied into contiguous scratch first.
#pragma once
#include <cstdint>

namespace megadlm::ops {

struct AttentionRowWindow {
  int64_t rows = 0;    ///< rows per batch row of the whole tensors
  int64_t q_row0 = 0;  ///< first query row (also of dout, out and the lse columns)
  int64_t kv_row0 = 0; ///< first key / value row
};

}  // namespace megadlm::ops

#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/attention.h"

namespace megadlm::ops {

/// attention_forward of a piece on its row windows: q, k, v the whole [B, w.rows, H, D] tensors,
/// out [B, seq, Hq, D] and lse [B, Hq, seq] the piece's (args: the piece's call).
void attention_forward_rows(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                            const AttentionArgs& args, const AttentionRowWindow& window, const Stream& stream);
/// attention_backward of a piece: dout, q, k, v, out, lse the whole tensors; dq, dk, dv the
/// piece's [B, seq, H, D].
void attention_backward_rows(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionArgs& args, const AttentionRowWindow& window,
                             const Stream& stream);

}  // namespace megadlm::ops
