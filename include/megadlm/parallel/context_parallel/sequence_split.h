// The load-balanced sequence split of context parallelism (Megatron's
// get_batch_on_this_cp_rank, "DualChunkSwap"): every sequence of S positions is cut into 2·n
// chunks of S/(2n) positions, and rank r of n holds chunks r and 2n−1−r, in that order. With
// causal attention each rank then holds one early and one late chunk, so the work per rank is
// balanced; bidirectional attention does not care but keeps the layout.
//
// Worked example (Megatron's, unit-tested in tests/unit/parallel/test_sequence_split.cpp):
//   S = 16, n = 2, chunks of 4:  rank 0 holds 0 1 2 3 | 12 13 14 15
//                                rank 1 holds 4 5 6 7 |  8  9 10 11
//   S = 16, n = 4, chunks of 2:  rank 0 {0 1 | 14 15}, rank 1 {2 3 | 12 13},
//                                rank 2 {4 5 | 10 11}, rank 3 {6 7 |  8  9}
// Rows stay batch-major: a micro-batch of B samples becomes B × S/n local rows, row
// b·(S/n) + i being position global(i) of sample b (the positions fed to RoPE are these global
// positions; the noise, dropout and loss weight of a row are those of its global token).
//
// Hierarchical CP (a2a+p2p): an all-to-all inside a level-1 group of `a` consecutive CP
// ranks (block k = cp_rank / a: CP ranks k·a .. k·a+a−1) hands each member the union of the
// block's chunks for 1/a of the heads. Those chunks, k·a .. k·a+a−1 and their mirrors, are two
// contiguous runs of a chunks: exactly rank k's shard of the same sequence split over cp/a ranks.
// So the level-1 all-to-all maps Split{cp, r} to Split{cp/a, r/a}, and the p2p ring across the
// level-2 group runs on that coarser split. With a = cp (Ulysses, a2a) the block is the whole
// sequence in natural order (Split{1, 0}).
//
// The index maps below (host vectors of int32 row indices for ops::gather_rows) reorder rows
// between these layouts; SequenceLayout (sequence_layout.h) uploads them once per micro-batch.
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/ops/chunk_map.h"

namespace megadlm::cp {

/// One shard of a sequence of `seq` positions split over `size` ranks.
struct Split {
  int size = 1;     ///< ranks the sequence is split over (n)
  int rank = 0;     ///< this shard's rank in [0, n)
  int64_t seq = 0;  ///< full sequence length S, a multiple of 2·n (any length when n = 1)

  int64_t chunk_len() const { return seq / (2 * size); }
  int64_t local_len() const { return seq / size; }
  int first_chunk() const { return rank; }
  int second_chunk() const { return 2 * size - 1 - rank; }
  /// Local position -> global position (the identity for n = 1).
  ops::ChunkMap chunks() const {
    return size == 1 ? ops::ChunkMap{} : ops::ChunkMap{chunk_len(), first_chunk(), second_chunk()};
  }
  int64_t global(int64_t i) const { return chunks().global(i); }
  /// Rank of the split holding global chunk c (c in [0, 2n)).
  int owner_of_chunk(int64_t c) const { return static_cast<int>(c < size ? c : 2 * size - 1 - c); }
  /// Rank holding global position g, and g's local position on that rank.
  int owner(int64_t g) const { return size == 1 ? 0 : owner_of_chunk(g / chunk_len()); }
  int64_t local_on_owner(int64_t g) const;
  /// The same split seen from another rank.
  Split of_rank(int r) const { return {size, r, seq}; }
  /// Throws unless seq splits into 2·size chunks (size 1: any seq > 0).
  void check() const;
};

/// The length a sequence of `seq` positions is padded to so that it splits over `cp` ranks: the
/// next multiple of 2·cp (seq itself when cp = 1 or it divides already).
int64_t padded_length(int64_t seq, int cp);

/// This shard's rows of `full` ([batch, split.seq] batch-major, one value per position):
/// [batch, split.local_len()], local row b·local_len + i = full row b·seq + global(i).
template <typename T>
std::vector<T> shard_rows(const std::vector<T>& full, int64_t batch, const Split& split) {
  split.check();
  MDLM_CHECK(static_cast<int64_t>(full.size()) == batch * split.seq, "cp::shard_rows: ", full.size(),
             " values for ", batch, " x ", split.seq, " positions");
  const int64_t local = split.local_len();
  std::vector<T> out(static_cast<size_t>(batch * local));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < local; ++i)
      out[static_cast<size_t>(b * local + i)] = full[static_cast<size_t>(b * split.seq + split.global(i))];
  return out;
}

// ---- row reorders between layouts (ops::gather_rows indices: dst row m <- src row index[m]) ----

/// After an all-gather (or all-to-all) inside a level-1 group of `a` consecutive ranks of the CP
/// split `cp` (this rank cp.rank, block k = cp.rank / a): the received rows, member j's B × S/cp
/// local rows after member j − 1's, reordered into the block's rows of Split{cp.size / a, k}
/// (B × S·a/cp, batch-major). a = cp.size: the natural order of whole sequences.
std::vector<int32_t> block_from_members(int64_t batch, const Split& cp, int a);
/// The inverse: the block's rows reordered into member-major order (member j's rows, in its
/// local order, at [j·B·S/cp, (j+1)·B·S/cp)).
std::vector<int32_t> members_from_block(int64_t batch, const Split& cp, int a);

/// `rows` rows of `a` column blocks each, seen as rows·a rows of one block (row t·a + p is
/// block p of row t) -> peer-major: row p·rows + t. The send layout of the head all-to-all.
std::vector<int32_t> peers_from_heads(int64_t rows, int a);
/// The inverse (peer-major -> rows of a column blocks).
std::vector<int32_t> heads_from_peers(int64_t rows, int a);

}  // namespace megadlm::cp
