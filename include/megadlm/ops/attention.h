// Scaled dot-product attention with grouped-query heads, bidirectional or causal, returning the
// per-row log-sum-exp so that partial results over key blocks can be merged exactly (context
// parallelism). CUDA: flash-attention style kernels (bf16 in/out, fp32 softmax and
// accumulation, never materialising the [S,S] matrix). CPU: direct loops, the reference.
//
// Shapes (contiguous): q [B, S, Hq, D]; k, v [B, S, Hkv, D]; out [B, S, Hq, D];
// lse f32 [B, Hq, S] (natural log of sum_j exp(scale * q.k_j)). Query head h uses key/value
// head h / (Hq / Hkv). CUDA: D <= 256 (tensor-core flash kernels for D = 64 and 128, a simple
// fp32 kernel otherwise); CPU: any D.
// Accumulation: every output (out, lse, dq, dk, dv) is written.
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

enum class AttentionMask : uint8_t {
  None,    ///< bidirectional (--attention-mask-type no_mask)
  Causal,  ///< query i sees keys j <= i (causal / causal_bottom_right with Sq == Skv)
};

struct AttentionArgs {
  int64_t batch = 0, seq = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  AttentionMask mask = AttentionMask::None;
  float softmax_scale = 0.0f;  ///< usually 1/sqrt(head_dim)
};

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionArgs& args, const Stream& stream);

/// dq, dk, dv written (dk/dv summed over the query heads of each group).
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionArgs& args, const Stream& stream);

}  // namespace megadlm::ops
