// One micro-batch as context-parallel attention sees it: B samples of S positions (padded to
// split over the CP group), this rank's shard of them (sequence_split.h), and the device tensors
// the CP algorithms need besides the activations: the document ids of any rank's shard (the keys
// of a ring step come from another rank, whose documents every rank can cut from the full
// sequence, since every rank of a CP group reads the same samples) and the row reorders of the
// all-gather and all-to-all layouts. They are built on first use and kept for the micro-batch's
// lifetime, so all layers of a model chunk share one upload. Single-threaded use (the model's).
#pragma once
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"

namespace megadlm::cp {

class SequenceLayout {
 public:
  /// `documents`: int32 [batch, seq] document of every position of the full sequences (natural
  /// order), or empty when attention spans each whole row.
  SequenceLayout(int64_t batch, int64_t seq, int cp_size, int cp_rank,
                 std::vector<int32_t> documents);

  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }  ///< full (padded) length S
  /// This rank's shard of the CP split.
  const Split& split() const { return split_; }
  bool has_documents() const { return !documents_.empty(); }

  /// int32 [B, S/n] documents of rank r's shard of the sequences split over n ranks (n = 1: the
  /// natural order), on the stream's device; null without documents.
  const Tensor* documents(int n, int r, const Stream& stream) const;
  /// Block diffusion (docs/parallelism/context_parallel.md): this layout is 2B' rows of one copy
  /// each (B' = batch() / 2 doubled rows [x_t | x_0]); `ranges` are the doubled rows' int32
  /// [B', 4, L] block_ranges (ops/attention.h), L = seq().
  void set_block_diffusion(std::vector<int32_t> ranges);
  bool block_diffusion() const { return !block_ranges_.empty(); }
  /// Whether every diffusion block lies inside one chunk of the split over n ranks (always
  /// without packed documents, since chunks hold whole blocks; with them when no document
  /// starts off the block grid near a chunk boundary).
  bool blocks_in_chunks(int n) const;
  /// int32 [B', 4, 2·L/n] of rank r's shard over n ranks: its rows' ranges in local
  /// coordinates (each global bound x becomes the number of the shard's positions below x), so
  /// the block diffusion rule on the shard's own rows is an ordinary whole-row call.
  const Tensor& local_block_ranges(int n, int r, const Stream& stream) const;
  /// int32 [B', 2·L/n]: the document (its first position) of each row of rank r's shard over n
  /// ranks, both copies; document ids for the key-block calls between shards.
  const Tensor& block_documents(int n, int r, const Stream& stream) const;
  /// gather_rows indices of sequence_split.h for a level-1 group of `a` CP ranks (this rank's).
  const Tensor& block_from_members(int a, const Stream& stream) const;
  const Tensor& members_from_block(int a, const Stream& stream) const;
  /// gather_rows indices between rows of `a` head blocks and peer-major order, for the B·S/cp
  /// local rows.
  const Tensor& peers_from_heads(int a, const Stream& stream) const;
  const Tensor& heads_from_peers(int a, const Stream& stream) const;

 private:
  enum class Kind {
    Documents, BlockFromMembers, MembersFromBlock, PeersFromHeads, HeadsFromPeers,
    LocalBlockRanges, BlockDocuments
  };
  const Tensor& cached(Kind kind, int x, int y, const Stream& stream) const;
  std::vector<int32_t> local_ranges(int n, int rank) const;
  std::vector<int32_t> block_docs(int n, int rank) const;

  int64_t batch_ = 0, seq_ = 0;
  Split split_;
  std::vector<int32_t> documents_;
  std::vector<int32_t> block_ranges_;  // block diffusion: [batch / 2, 4, seq]
  mutable std::map<int, bool> blocks_in_chunks_;  // by split size
  mutable std::map<std::tuple<Kind, int, int>, Tensor> cache_;
};

}  // namespace megadlm::cp
