// Row normalisations: RMSNorm and LayerNorm over the last dimension, statistics in fp32.
// Also used for QK-layernorm by viewing q as [tokens*heads, head_dim].
//
// Shapes: x, y, dy, dx are [R, C] (R rows, C normalised columns); weight, bias are [C];
// mean, rstd are f32 [R]. Dtypes: CPU f32/f64 everywhere; CUDA bf16 activations and
// weights, f32 statistics. Accumulation: dx is written; dweight/dbias (f32 main grads) are
// accumulated (+=).
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

/// y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
void rms_norm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                      const Stream& stream);
/// dx = d/dx; dweight += sum_rows(dy * x * rstd).
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       Tensor& dx, Tensor& dweight, const Stream& stream);

/// The residual add fused with the next RMSNorm (pre-norm blocks): sum = x + residual, rounded
/// to the activation dtype exactly as ops::add rounds it (written: the new residual stream),
/// then y and rstd as rms_norm_forward(sum). One pass over the rows instead of two.
void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          Tensor& sum, Tensor& y, Tensor& rstd, float eps, const Stream& stream);
/// rms_norm_backward with the residual stream's gradient added: dx = d/dx + dresidual (written;
/// on CUDA added in fp32 before the one rounding, so dx may be the dresidual tensor itself);
/// dweight += as rms_norm_backward.
void rms_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& weight,
                           const Tensor& rstd, const Tensor& dresidual, Tensor& dx,
                           Tensor& dweight, const Stream& stream);

/// y = (x - mean) * rstd * weight + bias (bias may be undefined).
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                        Tensor& mean, Tensor& rstd, float eps, const Stream& stream);
/// dx written; dweight += ...; dbias += sum_rows(dy) when dbias is defined.
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                         Tensor& dbias, const Stream& stream);

}  // namespace megadlm::ops
