// The attention merge on CUDA (include/megadlm/ops/attention_merge.h): one warp per query row
// (b, h, i). Every lane reads the two log-sum-exps and computes the same weights, the lanes
// update the row's D outputs in strides of 32, then lane 0 writes the merged lse (the row's
// elements are read before it changes, so no other synchronisation is needed). fp32 throughout;
// the block output may be bf16 or f32. Entry -> launch -> attention_merge_warp_per_row_kernel.
#include <cmath>
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <typename T>
__global__ void attention_merge_warp_per_row_kernel(float* __restrict__ out,
                                                    float* __restrict__ lse,
                                                    const T* __restrict__ block_out,
                                                    const float* __restrict__ block_lse,
                                                    AttentionMergeArgs a) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t stat = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  if (stat >= a.batch * a.num_heads * a.seq) return;
  // stat = (b * Hq + h) * S + i, the lse order; the output row is ((b * S + i) * Hq + h) * D.
  const int64_t i = stat % a.seq, h = (stat / a.seq) % a.num_heads, b = stat / (a.seq * a.num_heads);
  const float la = lse[stat], lb = block_lse[stat];
  const float m = fmaxf(la, lb);
  if (m == -INFINITY) return;  // neither has seen a key
  const float merged = m + logf(expf(la - m) + expf(lb - m));
  const float wa = expf(la - merged), wb = expf(lb - merged);
  const int64_t row = ((b * a.seq + i) * a.num_heads + h) * a.head_dim;
  for (int64_t d = lane; d < a.head_dim; d += kWarpSize)
    out[row + d] = wa * out[row + d] + wb * to_float(block_out[row + d]);
  __syncwarp();
  if (lane == 0) lse[stat] = merged;
}

}  // namespace

void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                     const AttentionMergeArgs& args, const Stream& stream) {
  NvtxRange range("attention_merge");
  const int64_t rows = args.batch * args.num_heads * args.seq;
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  auto launch = [&](auto tag) {
    using T = typename decltype(tag)::type;
    attention_merge_warp_per_row_kernel<T>
        <<<megadlm::detail::grid_for(rows, kWarpsPerBlock), kWarpsPerBlock * kWarpSize, 0, s>>>(
            static_cast<float*>(out.data_ptr()), static_cast<float*>(lse.data_ptr()),
            static_cast<const T*>(block_out.data_ptr()),
            static_cast<const float*>(block_lse.data_ptr()), args);
  };
  if (block_out.dtype() == DType::BF16) launch(TypeTag<bf16>{});
  else launch(TypeTag<float>{});
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace megadlm::ops::cuda
