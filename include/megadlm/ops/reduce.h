// Reductions. Results are f32 and *accumulated* into their output (so that partial results
// over parameters or ranks add up); zero the output first for a fresh result.
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

/// out[0] += sum(x^2) over all elements of x (x of any float dtype; out f32 [1]).
void sum_squares(const Tensor& x, Tensor& out, const Stream& stream);
/// out[c] += sum_r x[r, c] (x [R, C]; out f32 [C]); bias gradients.
void sum_rows(const Tensor& x, Tensor& out, const Stream& stream);
/// out[0] += sum_i a[i] * b[i] (f32 a, b of equal size; out f32 [1]); weighted loss sums.
void dot(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream);

}  // namespace megadlm::ops
