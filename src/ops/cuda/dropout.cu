// Dropout keyed by global coordinates on CUDA (bias-dropout-add forward and its backward).
// Entry -> launch_dropout -> dropout_kernel. The mask is regenerated, never stored.
//
// The element -> Philox counter mapping is ops/dropout_mask.h, shared with the CPU reference, so
// both backends drop exactly the same elements. One Philox call yields the words of the four
// global columns 4g..4g+3, so a thread owns one such group of one row: with column_offset % 4 == 0
// the group is one aligned 4-element access, otherwise the thread handles the (up to four)
// elements of its group that fall inside the tensor.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"
#include "ops/dropout_mask.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kThreads = 256;

/// kForward: out = residual + mask * x * scale; otherwise out = mask * x * scale (x is dout).
/// out may alias residual (no __restrict__ on either).
template <typename T, bool kAligned, bool kForward>
__global__ void __launch_bounds__(kThreads)
dropout_kernel(const T* __restrict__ x, const T* residual, T* out, int64_t rows, int64_t cols,
               int64_t groups_per_row, ops::detail::DropoutMask mask) {
  const int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= groups_per_row) return;
  const int64_t group = mask.column_offset / 4 + q;  // global columns 4*group .. 4*group+3
  const int64_t first = 4 * group - mask.column_offset;  // local column of the group's first word
  const float scale = mask.scale;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const PhiloxWords w = mask.words(r, 4 * group);
    const int64_t base = r * cols + first;
    if constexpr (kAligned) {
      float v[4], res[4];
      load_vec<4>(x + base, v);
      if constexpr (kForward) load_vec<4>(residual + base, res);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float kept = mask.keeps(w.w[k]) ? v[k] * scale : 0.0f;
        v[k] = kForward ? res[k] + kept : kept;
      }
      store_vec<4>(out + base, v);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = first + k;
        if (c < 0 || c >= cols) continue;
        const float kept = mask.keeps(w.w[k]) ? to_float(x[base + k]) * scale : 0.0f;
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
  const auto mask = ops::detail::DropoutMask::from_args(args);
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
          px, pr, po, rows, cols, groups_per_row, mask);
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
