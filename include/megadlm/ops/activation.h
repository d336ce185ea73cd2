// MLP activations. SwiGLU follows Megatron: the fc1 output row is [gate | up] (two halves of
// width F), y = silu(gate) * up. GELU is the exact erf form (Megatron's default F.gelu).
// Dtypes: CPU f32/f64; CUDA bf16 with fp32 math. Accumulation: outputs and dx are written.
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

/// x [R, 2F] -> y [R, F].
void swiglu_forward(const Tensor& x, Tensor& y, const Stream& stream);
/// dy [R, F], x [R, 2F] -> dx [R, 2F].
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream);
/// swiglu_backward, and in the same pass over x also y = swiglu_forward(x) [R, F] (bitwise the
/// forward's values): the MLP's backward recomputes the activation output that fc2's weight
/// gradient needs from the saved pre-activation instead of keeping it from the forward.
void swiglu_backward_recompute(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& y,
                               const Stream& stream);

/// y = x * Phi(x), elementwise, any shape.
void gelu_forward(const Tensor& x, Tensor& y, const Stream& stream);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream);

}  // namespace megadlm::ops
