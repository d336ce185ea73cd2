// One micro-batch as the model consumes it: token ids already noised (diffusion) or shifted
// (autoregressive), the clean targets, per-token loss weights, positions. Built by
// diffusion/forward_process (or the AR path) on the host, then uploaded.
//
// Context parallelism: every rank of a CP group builds the same full host micro-batch (the
// data group decides the samples), and upload() keeps this rank's shard of it: each sequence
// padded to split into 2·cp chunks (see pad_for_context_parallel), then the rows of chunks r and
// 2cp−1−r (parallel/context_parallel/sequence_split.h). Positions stay the global ones (RoPE),
// loss weights and labels those of the global tokens; `seq` becomes the local length S/cp and
// `cp` describes the split for the attention and the dropout masks. Block diffusion splits the
// original positions and keeps both copies of them (upload's block diffusion case).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/chunk_map.h"
#include "megadlm/parallel/context_parallel/sequence_layout.h"

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
  /// Block diffusion (diffusion/forward_process.h): seq = 2L holds each row as [x_t | x_0], and
  /// this holds [B, 4, L] int32: per position the document and block ranges (doc_start, doc_end,
  /// block_start, block_end; ops::AttentionArgs::block_ranges). Empty otherwise.
  std::vector<int32_t> block_ranges;
};

/// The micro-batch padded so its sequences split over `cp` ranks: each row extended to
/// cp::padded_length(seq, cp) with padding tokens (id 0, label 0, loss weight 0, positions
/// continuing the row) placed in a document of their own, so no real token attends to them and
/// they attend to nothing real: every real token computes exactly what it computes unpadded,
/// and the padding contributes nothing to the loss or any gradient. Without document ids the
/// real tokens become document 0 and the padding document 1. Unchanged when nothing is missing.
HostMicroBatch pad_for_context_parallel(const HostMicroBatch& h, int cp);

struct MicroBatch {
  int64_t batch = 0;
  int64_t seq = 0;  ///< positions per sample on this rank (S / cp under context parallelism)
  int64_t first_sample = 0;
  Tensor input_ids, labels, loss_weights, positions;  ///< on the model's device, [B*seq]
  Tensor document_ids;  ///< int32 [B*seq] or undefined (see HostMicroBatch)
  /// With document_ids: int32 [documents + 1], the flat token index where each document starts,
  /// then B*seq (ops::AttentionArgs::document_starts: cuDNN's ragged batch without a host sync).
  Tensor document_starts;
  /// Inference only, with document_ids: int32 [B], each row's live length: its first
  /// row_lengths[b] positions are one document and the rest padding whose outputs nothing reads
  /// (ops::AttentionArgs::row_lengths: cuDNN's padding mask instead of its ragged batch).
  Tensor row_lengths;
  /// int32 [R]: the rows of nonzero loss weight, ascending (the output layer computes logits for
  /// these rows only, ops::linear_cross_entropy); R may be 0.
  Tensor loss_rows;
  /// Block diffusion: int32 [B, 4, seq / 2] (see HostMicroBatch), or undefined.
  Tensor block_ranges;
  /// Block diffusion without CP: the longest diffusion block when every row is one document,
  /// else 0 (ops::AttentionArgs::block_diffusion_max_block).
  int64_t block_diffusion_max_block = 0;
  double loss_tokens = 0;  ///< of the whole (unsplit) micro-batch
  /// Context parallelism: the split of the full sequences and the views CP attention needs
  /// (null without CP).
  std::shared_ptr<const cp::SequenceLayout> cp;
  /// With CP: the sequences' length before the padding to 2·cp chunks (positions at or past it
  /// are padding, which MoE layers do not route); 0 without CP.
  int64_t unpadded_seq = 0;
  /// Block diffusion under CP: each local row is [x_t | x_0] of this rank's positions, and `cp`
  /// describes 2·batch rows of L positions (one copy each); position_map() does not apply then
  /// (hidden dropout and random router logits are refused with it, rule D-11).
  bool doubled_rows = false;
  int64_t tokens() const { return batch * seq; }
  /// Global position of each of the `seq` local positions (the identity without CP).
  ops::ChunkMap position_map() const { return cp && !doubled_rows ? cp->split().chunks() : ops::ChunkMap{}; }

  /// Uploads `h`, or with cp_size > 1 this CP rank's shard of it (see the top of the file).
  static MicroBatch upload(const HostMicroBatch& h, const Stream& stream, int cp_rank = 0,
                           int cp_size = 1);
};

}  // namespace megadlm
