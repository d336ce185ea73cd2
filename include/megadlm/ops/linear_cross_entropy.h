// The output layer fused with the cross-entropy, over only the rows that carry loss and in
// chunks of rows: logits exist for at most `chunk_rows` rows at a time and never for a row
// outside `rows` (in the diffusion objective unmasked tokens have loss weight 0, about half of
// them). Exact: the losses and gradients of the selected rows are those of the unfused
// gemm + cross_entropy_forward_backward + two gemms, and a row of weight 0 has zero gradient
// anyway, so selecting the rows of nonzero weight changes nothing but the work. The AR
// (`vanilla`) mode, where every row counts, passes rows = null.
//
// Shapes: x [T, H] and weight [V, H] (CPU f32/f64, CUDA bf16); targets i32 [T] in [0, V);
// loss_weights f32 [T] (CPU also x's dtype); rows i32 [R] of distinct row indices in [0, T), on
// x's device, or null for every row; losses f32 [T] (CPU also x's dtype); dx [T, H] of x's dtype;
// dweight f32 [V, H] (CPU also f64): the fp32 main grad.
// For each selected row r, with z = weight x[r] (the logits, [V]):
//   losses[r] = logsumexp(z) - z[targets[r]];            rows not selected: losses[r] = 0
// and with grad_scale > 0, g_r = grad_scale * loss_weights[r] * (softmax(z) - onehot(targets[r])):
//   dx[r] = g_r weight  (written; rows not selected: 0),  dweight += sum_r g_r^T x[r]  (added).
// grad_scale == 0 is evaluation: losses only, dx and dweight may be undefined. grad_scale < 0 is
// an error. CUDA: logits and g in bf16 between the products (as the unfused path), softmax and
// losses in fp32. Targets outside [0, V) are an error on CPU and give NaN losses on CUDA.
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

struct LinearCrossEntropyArgs {
  float grad_scale = 0.0f;     ///< > 0: also dx and dweight (see above)
  int64_t chunk_rows = 2048;   ///< selected rows whose logits exist at once (>= 1)
};

void linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor* rows,
                          const Tensor& targets, const Tensor& loss_weights, Tensor& losses,
                          Tensor& dx, Tensor& dweight, const LinearCrossEntropyArgs& args,
                          const Stream& stream);

}  // namespace megadlm::ops
