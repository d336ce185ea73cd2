// Kernels around the cuDNN attention graphs (contracts in attention_cudnn_prep.h). All tiny:
// O(documents) or one pass over the fp32 statistics.
#include <algorithm>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/attention_cudnn_prep.h"

namespace megadlm::ops::cuda::cudnn_prep {
namespace {

__global__ void ragged_layout_kernel(const int32_t* __restrict__ starts, int64_t num_docs,
                                     int64_t bucket, RaggedPerToken per_token,
                                     int32_t* __restrict__ seq_len, int64_t* __restrict__ q_offsets,
                                     int64_t* __restrict__ kv_offsets,
                                     int64_t* __restrict__ o_offsets,
                                     int64_t* __restrict__ stats_offsets) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n > bucket) return;
  // Documents past num_docs are empty and start at the end of the buffer.
  const int64_t start = starts[n < num_docs ? n : num_docs];
  q_offsets[n] = start * per_token.q;
  kv_offsets[n] = start * per_token.kv;
  o_offsets[n] = start * per_token.o;
  const int64_t row_len = per_token.stats_row_len;
  stats_offsets[n] = row_len > 0 ? (start / row_len) * per_token.stats * row_len + start % row_len
                                 : start * per_token.stats;
  if (n < bucket) {
    const int64_t end = starts[n + 1 < num_docs ? n + 1 : num_docs];
    seq_len[n] = static_cast<int32_t>(end - start);
  }
}

template <bool kToThd>
__global__ void lse_layout_kernel(const float* __restrict__ src, float* __restrict__ dst,
                                  int64_t batch, int64_t heads, int64_t seq) {
  const int64_t n = batch * heads * seq;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    // i walks the [B, S, H] (thd) order so that the thd side is contiguous.
    const int64_t h = i % heads;
    const int64_t bs = i / heads;
    const int64_t s = bs % seq, b = bs / seq;
    const int64_t bhs = (b * heads + h) * seq + s;
    if constexpr (kToThd) dst[i] = src[bhs];
    else dst[bhs] = src[i];
  }
}

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
}

}  // namespace

void launch_ragged_layout(const int32_t* starts, int64_t num_docs, int64_t bucket,
                          RaggedPerToken per_token, int32_t* seq_len, int64_t* q_offsets,
                          int64_t* kv_offsets, int64_t* o_offsets, int64_t* stats_offsets,
                          cudaStream_t stream) {
  ragged_layout_kernel<<<blocks_for(bucket + 1), 256, 0, stream>>>(
      starts, num_docs, bucket, per_token, seq_len, q_offsets, kv_offsets, o_offsets, stats_offsets);
  MDLM_CUDA_CHECK_LAUNCH();
}

void launch_lse_to_thd(const float* bhs, float* thd, int64_t batch, int64_t heads, int64_t seq,
                       cudaStream_t stream) {
  lse_layout_kernel<true><<<blocks_for(batch * heads * seq), 256, 0, stream>>>(bhs, thd, batch,
                                                                               heads, seq);
  MDLM_CUDA_CHECK_LAUNCH();
}

void launch_lse_from_thd(const float* thd, float* bhs, int64_t batch, int64_t heads, int64_t seq,
                         cudaStream_t stream) {
  lse_layout_kernel<false><<<blocks_for(batch * heads * seq), 256, 0, stream>>>(thd, bhs, batch,
                                                                                heads, seq);
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace megadlm::ops::cuda::cudnn_prep
