// The attention merge on CUDA (include/megadlm/ops/attention_merge.h): one warp per query row
// (b, h, i). Every lane reads the two log-sum-exps and computes the same weights, the lanes
// update the row's D outputs in strides of 32, then lane 0 writes the merged lse (the row's
// elements are read before it changes, so no other synchronisation is needed). fp32 arithmetic;
// the block output may be bf16 or f32, the running output f32 or bf16 (rounded once per call);
// out and lse may hold more rows than the block (out_seq, out_row0). Entry -> launch -> attention_merge_warp_per_row_kernel.
#include <cmath>
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <typename O, typename T>
__global__ void attention_merge_warp_per_row_kernel(O* __restrict__ out,
                                                    float* __restrict__ lse,
                                                    const T* __restrict__ block_out,
                                                    const float* __restrict__ block_lse,
                                                    AttentionMergeArgs a) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t stat = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / kWarpSize;
  if (stat >= a.batch * a.num_heads * a.seq) return;
  // stat = (b * Hq + h) * S + i, the block's lse order; the block's output row is
  // ((b * S + i) * Hq + h) * D; out and lse hold S_out rows a batch row, this one at out_row0 + i.
  const int64_t i = stat % a.seq, h = (stat / a.seq) % a.num_heads, b = stat / (a.seq * a.num_heads);
  const int64_t s_out = a.out_seq > 0 ? a.out_seq : a.seq, io = a.out_row0 + i;
  const int64_t ostat = (b * a.num_heads + h) * s_out + io;
  const float la = lse[ostat], lb = block_lse[stat];
  const float m = fmaxf(la, lb);
  if (m == -INFINITY) return;  // neither has seen a key
  const float merged = m + logf(expf(la - m) + expf(lb - m));
  const float wa = expf(la - merged), wb = expf(lb - merged);
  const int64_t row = ((b * a.seq + i) * a.num_heads + h) * a.head_dim;
  const int64_t orow = ((b * s_out + io) * a.num_heads + h) * a.head_dim;
  for (int64_t d = lane; d < a.head_dim; d += kWarpSize)
    out[orow + d] = from_float<O>(wa * to_float(out[orow + d]) + wb * to_float(block_out[row + d]));
  __syncwarp();
  if (lane == 0) lse[ostat] = merged;
}

}  // namespace

void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                     const AttentionMergeArgs& args, const Stream& stream) {
  NvtxRange range("attention_merge");
  const int64_t rows = args.batch * args.num_heads * args.seq;
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  auto launch = [&](auto out_tag, auto tag) {
    using O = typename decltype(out_tag)::type;
    using T = typename decltype(tag)::type;
    attention_merge_warp_per_row_kernel<O, T>
        <<<megadlm::detail::grid_for(rows, kWarpsPerBlock), kWarpsPerBlock * kWarpSize, 0, s>>>(
            static_cast<O*>(out.data_ptr()), static_cast<float*>(lse.data_ptr()),
            static_cast<const T*>(block_out.data_ptr()),
            static_cast<const float*>(block_lse.data_ptr()), args);
  };
  auto with_block = [&](auto out_tag) {
    if (block_out.dtype() == DType::BF16) launch(out_tag, TypeTag<bf16>{});
    else launch(out_tag, TypeTag<float>{});
  };
  if (out.dtype() == DType::BF16) with_block(TypeTag<bf16>{});
  else with_block(TypeTag<float>{});
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace megadlm::ops::cuda
