// One micro-batch as the model consumes it: token ids already noised (diffusion) or shifted
// (autoregressive), the clean targets, per-token loss weights, positions. Built by
// diffusion/forward_process (or the AR path) on the host, then uploaded.
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm {

struct HostMicroBatch {
  int64_t batch = 0;         ///< B samples
  int64_t seq = 0;           ///< S tokens per sample (after any varilen truncation)
  int64_t first_sample = 0;  ///< global index (dataset order) of sample 0
  std::vector<int32_t> input_ids;     ///< [B*S] model input (mask token where noised)
  std::vector<int32_t> labels;        ///< [B*S] targets (the clean tokens)
  std::vector<float> loss_weights;    ///< [B*S] weight of each token's CE in the loss sum
  std::vector<int32_t> positions;     ///< [B*S] position ids (RoPE / learned embeddings)
  std::vector<uint8_t> noise_mask;    ///< [B*S] 1 where the input was replaced by the mask token
  /// [B*S] document of each token within its row (0, 1, ...), or empty: attention then spans
  /// the whole row. Tokens attend only to tokens of their own document.
  std::vector<int32_t> document_ids;
  double loss_tokens = 0;             ///< sum of the Megatron loss mask: the normaliser's share
};

struct MicroBatch {
  int64_t batch = 0, seq = 0, first_sample = 0;
  Tensor input_ids, labels, loss_weights, positions;  ///< on the model's device
  Tensor document_ids;  ///< int32 [B*S] or undefined (see HostMicroBatch)
  /// With document_ids: int32 [documents + 1], the flat token index where each document starts,
  /// then B*S (ops::AttentionArgs::document_starts: cuDNN's ragged batch without a host sync).
  Tensor document_starts;
  /// int32 [R]: the rows of nonzero loss weight, ascending (the output layer computes logits for
  /// these rows only, ops::linear_cross_entropy); R may be 0.
  Tensor loss_rows;
  double loss_tokens = 0;
  int64_t tokens() const { return batch * seq; }

  static MicroBatch upload(const HostMicroBatch& h, const Stream& stream);
};

}  // namespace megadlm
