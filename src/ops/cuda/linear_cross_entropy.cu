// Fused output layer + cross-entropy on CUDA (linear_cross_entropy.h): the selected rows of x,
// their targets and weights are gathered into contiguous buffers, then per chunk of chunk_rows
// rows one cuBLASLt product makes the bf16 logits, the cross-entropy kernel replaces them in
// place by the bf16 gradient g (cross_entropy.cu, as the unfused head), and two products give
// dx_chunk = g W and dW += g^T x_chunk; the chunk's logit buffer is reused by the next chunk.
// Last, losses and dx are scattered back to their rows (zeros elsewhere). Only
// chunk_rows x V logits ever exist (the unfused head holds T x V), and rows outside `rows` cost
// nothing. The gather/scatter kernels move whole rows with 16-byte accesses where aligned.
#include <algorithm>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

/// dst[i, :] = src[rows[i], :] (gather) or dst[rows[i], :] = src[i, :] (scatter), rows of
/// `units` elements of U (a 16-, 4- or 1-byte unit chosen by the launcher).
template <typename U, bool kGather>
__global__ void move_rows_kernel(const U* __restrict__ src, U* __restrict__ dst,
                                 const int32_t* __restrict__ rows, int64_t n_rows, int64_t units) {
  for (int64_t i = blockIdx.x; i < n_rows; i += gridDim.x) {
    const int64_t r = rows[i];
    const U* s = src + (kGather ? r : i) * units;
    U* d = dst + (kGather ? i : r) * units;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) d[u] = s[u];
  }
}

template <bool kGather>
void move_rows(const void* src, void* dst, const int32_t* rows, int64_t n_rows, int64_t row_bytes,
               cudaStream_t stream) {
  if (n_rows == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n_rows, 65535));
  const bool v16 = row_bytes % 16 == 0 && is_aligned(src, 16) && is_aligned(dst, 16);
  const bool v4 = row_bytes % 4 == 0 && is_aligned(src, 4) && is_aligned(dst, 4);
  if (v16) {
    move_rows_kernel<uint4, kGather><<<blocks, 256, 0, stream>>>(
        static_cast<const uint4*>(src), static_cast<uint4*>(dst), rows, n_rows, row_bytes / 16);
  } else if (v4) {
    move_rows_kernel<uint32_t, kGather><<<blocks, 128, 0, stream>>>(
        static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), rows, n_rows, row_bytes / 4);
  } else {
    move_rows_kernel<uint8_t, kGather><<<blocks, 128, 0, stream>>>(
        static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), rows, n_rows, row_bytes);
  }
  MDLM_CUDA_CHECK_LAUNCH();
}

/// The selected rows of t ([T, ...] contiguous) as a new contiguous tensor.
Tensor gather(const Tensor& t, const Tensor& rows, const Stream& stream) {
  Shape shape = t.shape();
  shape[0] = rows.numel();
  Tensor out = Tensor::empty(shape, t.dtype(), stream);
  const int64_t row_bytes = static_cast<int64_t>(t.nbytes()) / std::max<int64_t>(t.size(0), 1);
  move_rows<true>(t.data_ptr(), out.data_ptr(), static_cast<const int32_t*>(rows.data_ptr()),
                  rows.numel(), row_bytes, megadlm::detail::native_stream(stream));
  return out;
}

/// dst = 0, then dst[rows[i]] = src[i].
void scatter_zero_filled(const Tensor& src, Tensor& dst, const Tensor& rows, const Stream& stream) {
  cuda::fill(dst, 0.0f, stream);
  const int64_t row_bytes = static_cast<int64_t>(dst.nbytes()) / std::max<int64_t>(dst.size(0), 1);
  move_rows<false>(src.data_ptr(), dst.data_ptr(), static_cast<const int32_t*>(rows.data_ptr()),
                   rows.numel(), row_bytes, megadlm::detail::native_stream(stream));
}

}  // namespace

void linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor* rows,
                          const Tensor& targets, const Tensor& loss_weights, Tensor& losses,
                          Tensor& dx, Tensor& dweight, const LinearCrossEntropyArgs& args,
                          const Stream& stream) {
  NvtxRange range("linear_cross_entropy");
  const bool grad = args.grad_scale > 0.0f;
  const int64_t t = x.rows(), h = x.cols(), v = weight.rows();
  const int64_t r = rows != nullptr ? rows->numel() : t;
  // The selected rows, contiguous (all rows: the inputs themselves, no copy).
  const Tensor xs = rows != nullptr ? gather(x.view({t, h}), *rows, stream) : x.view({t, h});
  const Tensor ts = rows != nullptr ? gather(targets.view({t}), *rows, stream) : targets.view({t});
  const Tensor ws = rows != nullptr ? gather(loss_weights.view({t}), *rows, stream) : loss_weights.view({t});
  Tensor ls = rows != nullptr ? Tensor::empty({r}, DType::F32, stream) : losses.view({t});
  Tensor dxs;
  if (grad) dxs = rows != nullptr ? Tensor::empty({r, h}, x.dtype(), stream) : dx.view({t, h});
  const int64_t chunk = std::min(args.chunk_rows, std::max<int64_t>(r, 1));
  Tensor logits_buffer = Tensor::empty({chunk, v}, x.dtype(), stream);
  Tensor w = weight.view({v, h});
  GemmArgs forward_args, dgrad_args, wgrad_args;
  forward_args.trans_b = true;
  wgrad_args.trans_a = true;
  wgrad_args.beta = 1.0f;
  Tensor dw = grad ? dweight.view({v, h}) : Tensor();
  for (int64_t c0 = 0; c0 < r; c0 += chunk) {
    const int64_t n = std::min(chunk, r - c0);
    const Tensor xc = xs.narrow(c0, n), tc = ts.narrow(c0, n);
    Tensor lc = ls.narrow(c0, n);
    Tensor logits = logits_buffer.narrow(0, n);
    cuda::gemm(xc, w, logits, forward_args, stream);
    if (!grad) {
      cuda::cross_entropy_forward(logits, tc, lc, stream);
      continue;
    }
    const Tensor wc = ws.narrow(c0, n);
    cuda::cross_entropy_forward_backward(logits, tc, wc, lc, args.grad_scale, stream);
    Tensor dxc = dxs.narrow(c0, n);
    cuda::gemm(logits, w, dxc, dgrad_args, stream);   // dx = g W
    cuda::gemm(logits, xc, dw, wgrad_args, stream);   // dW += g^T x
  }
  if (rows == nullptr) return;
  Tensor losses_flat = losses.view({t});
  scatter_zero_filled(ls, losses_flat, *rows, stream);
  if (grad) {
    Tensor dx_rows = dx.view({t, h});
    scatter_zero_filled(dxs, dx_rows, *rows, stream);
  }
}

}  // namespace megadlm::ops::cuda
