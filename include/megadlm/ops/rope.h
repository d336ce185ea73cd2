// Rotary position embedding (Megatron/GPT-NeoX "rotate half" convention, not interleaved).
//
// For each head vector x of length head_dim and its position p, the first rotary_dim
// elements are rotated, the rest pass through:
//   inv_freq[i] = base^(-2i / rotary_dim),  i in [0, rotary_dim/2)
//   theta[i]    = p * inv_freq[i]   (computed in fp32 as Megatron does, angle in double on CPU f64)
//   x1 = x[i], x2 = x[i + rotary_dim/2]
//   y[i] = x1*cos(theta[i]) - x2*sin(theta[i]);  y[i + rotary_dim/2] = x2*cos(theta[i]) + x1*sin(theta[i])
// rotary_dim = int(head_dim * --rotary-percent), even.
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

struct RopeArgs {
  int64_t heads = 0;       ///< heads per token in x
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  ///< <= head_dim, even
  float base = 10000.0f;   ///< --rotary-base
};

/// In place: x [T, heads, head_dim] rotated by the angles of positions [T] (i32).
void rope_forward(Tensor& x, const Tensor& positions, const RopeArgs& args, const Stream& stream);
/// In place: the gradient of rope_forward, i.e. rotation by -theta, applied to dx.
void rope_backward(Tensor& dx, const Tensor& positions, const RopeArgs& args, const Stream& stream);

}  // namespace megadlm::ops
