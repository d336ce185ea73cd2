// The kernel around the cuDNN attention graphs (contract in attention_cudnn_prep.h): O(documents).
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
  stats_offsets[n] = (start / row_len) * per_token.stats * row_len + start % row_len;
  if (n < bucket) {
    const int64_t end = starts[n + 1 < num_docs ? n + 1 : num_docs];
    seq_len[n] = static_cast<int32_t>(end - start);
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

}  // namespace megadlm::ops::cuda::cudnn_prep
