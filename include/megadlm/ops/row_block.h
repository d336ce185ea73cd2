// Writing a block of rows into every batch row of a larger tensor, in one call: what the
// approximate key/value cache of the samplers (model/kv_cache.h) needs to put the keys and
// values of the recomputed columns into the cached ones.
//
//   dst [batch * dst_rows, W], src [batch * src_rows, W] (same dtype, contiguous):
//   dst[b * dst_rows + row0 + i, :] = src[b * src_rows + i, :]   for b < batch, i < src_rows
// with row0 + src_rows <= dst_rows. Raw bytes: any dtype. CUDA: one strided cudaMemcpy2DAsync.
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

void copy_row_block(const Tensor& src, Tensor& dst, int64_t batch, int64_t row0, const Stream& stream);

/// The inverse: a block of rows out of every batch row (block diffusion's composed attention
/// reads its pieces' rows and lse columns with it):
///   dst[b * dst_rows + i, :] = src[b * src_rows + row0 + i, :]   for b < batch, i < dst_rows
/// with row0 + dst_rows <= src_rows. Raw bytes; CUDA: one strided cudaMemcpy2DAsync.
void read_row_block(const Tensor& src, Tensor& dst, int64_t batch, int64_t row0, const Stream& stream);

/// Adding a block of rows into every batch row (block diffusion's composed attention sums its
/// pieces' gradient partials into the whole rows with it, ops/attention_block_diffusion_bulk.h):
///   dst[b * dst_rows + row0 + i, :] += src[b * src_rows + i, :]   for b < batch, i < src_rows
/// with row0 + src_rows <= dst_rows, src and dst of one dtype: f32 or bf16 (CUDA and CPU), f64
/// (CPU). Each element is summed in f32 (f64 for f64) and rounded once to dst's dtype (round to
/// nearest even), so the CPU and CUDA results are equal bit for bit. CUDA: one fused kernel (a
/// read of both, a write of dst), no scratch.
void add_row_block(const Tensor& src, Tensor& dst, int64_t batch, int64_t row0, const Stream& stream);

}  // namespace megadlm::ops
