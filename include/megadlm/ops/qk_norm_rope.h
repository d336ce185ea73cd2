// QK-layernorm (RMSNorm of every query and key head) and rotary position embedding, fused, on
// the fused QKV projection's output: one pass reads each row of qkv once and writes the row the
// attention reads, instead of a split copy, two norms and two in-place rotations. No split or
// concat copies: q, k and v stay interleaved per token as the QKV GEMM wrote them (and as
// attention_forward_packed reads them), and the backward works in place on the packed gradient.
//
// Layout: qkv, out, dqkv [T, (Hq + 2 Hkv) D] (per token: Hq query heads, Hkv key heads, Hkv value
// heads, each D wide; CPU f32/f64, CUDA bf16). For every query head x (key heads alike, with
// k_weight):
//   r = 1 / sqrt(mean(x^2) + eps),  n = x * r * q_weight,  y = rope(n, positions[t])
// with RoPE as in rope.h (rotate half over the first rotary_dim elements; rotary_dim 0: none), and
// value heads copied (unless copy_values is false). `out` may be `qkv` itself (inference: nothing reads the projection again);
// the value heads then stay where they are. Without weights (q_weight undefined) there is no norm (n = x, rstd unused).
// rstd f32 [T, Hq + Hkv] (query heads, then key heads; CPU also the activation dtype). CUDA: fp32
// arithmetic with one rounding at the output (the unfused path rounds after the norm too).
// Accumulation: out written; in the backward dqkv is replaced, dq_weight/dk_weight (f32 main grad)
// are added.
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

struct QkNormRopeArgs {
  int64_t heads = 0;       ///< query heads Hq
  int64_t kv_heads = 0;    ///< key (and value) heads Hkv
  int64_t head_dim = 0;    ///< D
  int64_t rotary_dim = 0;  ///< even, <= head_dim; 0: no rotation
  float base = 10000.0f;   ///< --rotary-base
  float eps = 1e-6f;       ///< --norm-epsilon
  /// Forward: false leaves out's value heads unwritten (training passes qkv itself as the
  /// attention's value source: attention_forward_packed with v_rows, no copy of the values).
  bool copy_values = true;
};

void qk_norm_rope_forward(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                          const Tensor& positions, Tensor& out, Tensor& rstd,
                          const QkNormRopeArgs& args, const Stream& stream);

/// dqkv holds d/d(out) on entry and d/d(qkv) on return (value heads pass through unchanged, so
/// the attention backward can write the value gradient straight into it). qkv and rstd are the
/// forward's input and statistic. With weights: dq_weight += sum over tokens and query heads of
/// dn * x * r (dk_weight alike), dn the gradient of n.
void qk_norm_rope_backward(Tensor& dqkv, const Tensor& qkv, const Tensor& q_weight,
                           const Tensor& k_weight, const Tensor& rstd, const Tensor& positions,
                           Tensor& dq_weight, Tensor& dk_weight, const QkNormRopeArgs& args,
                           const Stream& stream);

}  // namespace megadlm::ops
