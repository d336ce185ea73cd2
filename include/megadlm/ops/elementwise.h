// Elementwise and layout ops the model needs between the big kernels.
// All tensors of one call share a device; shapes must match element for element unless noted.
// Accumulation: each op says whether it writes or adds.
#pragma once
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

/// out = a + b (written; out may alias a or b).
void add(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream);
/// x *= s.
void scale_inplace(Tensor& x, float s, const Stream& stream);
/// x = value.
void fill(Tensor& x, float value, const Stream& stream);
/// dst = src with dtype conversion (same device).
void copy(const Tensor& src, Tensor& dst, const Stream& stream);

/// Split the columns of x [R, sum(widths)] into outs[i] [R, widths[i]] (written).
void split_columns(const Tensor& x, const std::vector<Tensor*>& outs, const Stream& stream);
/// Inverse of split_columns: out [R, sum] = concat(parts, along columns) (written).
void concat_columns(const std::vector<const Tensor*>& parts, Tensor& out, const Stream& stream);

/// dst[m, :] = src[index[m], :] (written): src [N, W], index int32 [M] with values in [0, N)
/// (on the tensors' device), dst [M, W], same dtype (any). Context parallelism reorders
/// sequence chunks and head blocks with it; its backward is gather_rows with the inverse
/// permutation.
void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst, const Stream& stream);
/// The same into a new tensor: src's rows at `index`, [M, W].
Tensor gather_rows(const Tensor& src, const Tensor& index, const Stream& stream);

}  // namespace megadlm::ops
