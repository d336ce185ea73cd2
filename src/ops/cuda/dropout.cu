// Dropout keyed by global coordinates on CUDA (bias-dropout-add forward and its backward).
// Entry -> launch_dropout -> dropout_kernel. The mask is regenerated, never stored.
//
// Element (r, c) is kept iff uniform(philox(key(seed, HiddenDropout),
//   {col / 4, position, sample, site})[col % 4]) >= p, with col = column_offset + c,
//   sample = sample_offset + r / seq_len, position = position_offset + r % seq_len  (dropout.h).
// One Philox call yields the four words of the four global columns 4g..4g+3, so a thread owns one
// such group of one row: with column_offset % 4 == 0 the group is one aligned 4-element access,
// otherwise the thread handles the (up to four) elements of its group that fall in the tensor.
#include "megadlm/core/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kThreads = 256;

/// kForward: out = residual + mask * x * scale; otherwise out = mask * x * scale (x is dout).
/// out may alias residual (no __restrict__ on either).
template <typename T, bool kAligned, bool kForward>
__global__ void __launch_bounds__(kThreads)
dropout_kernel(const T* __restrict__ x, const T* residual, T* out, int64_t rows, int64_t cols,
               int64_t groups_per_row, PhiloxKey key, float p, float scale, uint32_t site,
               int64_t seq_len, int64_t sample_offset, int64_t position_offset,
               int64_t column_offset) {
  const int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= groups_per_row) return;
  const int64_t group = column_offset / 4 + q;  // global group of columns 4*group .. 4*group+3
  const int64_t first = 4 * group - column_offset;  // local column of the group's first word
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t sample = sample_offset + r / seq_len;
    const int64_t position = position_offset + r % seq_len;
    const PhiloxWords w = philox(key, static_cast<uint32_t>(group), static_cast<uint32_t>(position),
                                 static_cast<uint32_t>(sample), site);
    const int64_t base = r * cols + first;
    if constexpr (kAligned) {
      float v[4], res[4];
      load_vec<4>(x + base, v);
      if constexpr (kForward) load_vec<4>(residual + base, res);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float kept = uniform_from_u32(w.w[k]) >= p ? v[k] * scale : 0.0f;
        v[k] = kForward ? res[k] + kept : kept;
      }
      store_vec<4>(out + base, v);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = first + k;
        if (c < 0 || c >= cols) continue;
        const float kept = uniform_from_u32(w.w[k]) >= p ? to_float(x[base + k]) * scale : 0.0f;
        out[base + k] = from_float<T>(kForward ? to_float(residual[base + k]) + kept : kept);
      }
    }
  }
}

template <bool kForward>
void launch_dropout(const Tensor& x, const Tensor* residual, Tensor& out, const DropoutArgs& args,
                    const char* op, const Stream& stream) {
  const int64_t rows = x.rows(), cols = x.cols();
  if (rows == 0 || cols == 0) return;
  MDLM_CHECK(args.column_offset >= 0 && args.sample_offset >= 0 && args.position_offset >= 0, op,
             ": offsets must be non-negative");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const PhiloxKey key = PhiloxKey::make(args.seed, RngPurpose::HiddenDropout);
  const float scale = 1.0f / (1.0f - args.p);
  const int64_t first_group = args.column_offset / 4;
  const int64_t last_group = (args.column_offset + cols - 1) / 4;
  const int64_t groups_per_row = last_group - first_group + 1;
  const dim3 grid(static_cast<unsigned>(ceil_div(groups_per_row, kThreads)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  dispatch_activation_dtype(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pr = residual ? static_cast<const T*>(residual->data_ptr()) : nullptr;
    T* po = static_cast<T*>(out.data_ptr());
    const size_t access = 4 * sizeof(T);
    const bool aligned = args.column_offset % 4 == 0 && cols % 4 == 0 && is_aligned(px, access) &&
                         (pr == nullptr || is_aligned(pr, access)) && is_aligned(po, access);
    auto run = [&](auto aligned_tag) {
      constexpr bool kAligned = decltype(aligned_tag)::value;
      dropout_kernel<T, kAligned, kForward><<<grid, kThreads, 0, s>>>(
          px, pr, po, rows, cols, groups_per_row, key, args.p, scale, args.site, args.seq_len,
          args.sample_offset, args.position_offset, args.column_offset);
    };
    if (aligned) run(std::true_type{});
    else run(std::false_type{});
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void dropout_add_forward(const Tensor& x, const Tensor& residual, Tensor& out,
                         const DropoutArgs& args, const Stream& stream) {
  NvtxRange range("dropout_add_forward");
  launch_dropout<true>(x, &residual, out, args, "dropout_add_forward", stream);
}

void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutArgs& args, const Stream& stream) {
  NvtxRange range("dropout_backward");
  launch_dropout<false>(dout, nullptr, dx, args, "dropout_backward", stream);
}

}  // namespace megadlm::ops::cuda
