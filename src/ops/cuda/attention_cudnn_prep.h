// Internal: the small kernel around the cuDNN attention graphs (attention_cudnn_prep.cu): the
// ragged (THD) offsets and lengths of packed documents.
#pragma once
#include <cuda_runtime.h>
#include <cstdint>

namespace megadlm::ops::cuda::cudnn_prep {

/// From the document starts (flat token indices, ascending, starts[num_docs] = total tokens) to
/// the per-document tensors of a ragged batch of `bucket` >= num_docs documents (the extra ones
/// empty, at the end of the buffer): seq_len[n] (int32, [bucket]) and the element offsets of
/// document n in q, k/v, o (start times the elements per token of each) and in the statistics
/// (int64, [bucket + 1] each). Statistics: megadlm's lse layout [B, stats, S] (stats = heads,
/// stats_row_len = S), where a document starting at token s of row b begins at
/// (b * stats) * S + s (documents never cross rows).
struct RaggedPerToken {
  int64_t q, kv, o, stats;
  int64_t stats_row_len;
};
void launch_ragged_layout(const int32_t* starts, int64_t num_docs, int64_t bucket,
                          RaggedPerToken per_token, int32_t* seq_len, int64_t* q_offsets,
                          int64_t* kv_offsets, int64_t* o_offsets, int64_t* stats_offsets,
                          cudaStream_t stream);

}  // namespace megadlm::ops::cuda::cudnn_prep
