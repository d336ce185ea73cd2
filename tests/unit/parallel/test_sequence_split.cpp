// Unit tests of the context-parallel sequence split (parallel/context_parallel/sequence_split.h):
// the worked examples of docs/parallelism/context_parallel.md (S = 16 over 2 and 4 ranks), the
// inverse maps,
// batch-major shards, padding lengths, and the row reorders of the all-gather / all-to-all
// layouts against hand-derived index lists.
#include <gtest/gtest.h>
#include <algorithm>
#include <numeric>
#include <vector>
#include "megadlm/parallel/context_parallel/sequence_layout.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"

using megadlm::cp::Split;
namespace cp = megadlm::cp;

namespace {

std::vector<int64_t> positions_of(const Split& s) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < s.local_len(); ++i) out.push_back(s.global(i));
  return out;
}

/// index[index2[m]] for every m: the composition of two gather_rows permutations.
std::vector<int32_t> compose(const std::vector<int32_t>& first, const std::vector<int32_t>& second) {
  std::vector<int32_t> out(second.size());
  for (size_t m = 0; m < second.size(); ++m) out[m] = first[static_cast<size_t>(second[m])];
  return out;
}

std::vector<int32_t> identity(size_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

TEST(SequenceSplit, TwoRanksHoldTheSpecsChunks) {
  // Megatron's load-balanced order: S = 16, cp = 2, chunks of 4.
  EXPECT_EQ(positions_of({2, 0, 16}), (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(positions_of({2, 1, 16}), (std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
}

TEST(SequenceSplit, FourRanksHoldTheSpecsChunks) {
  EXPECT_EQ(positions_of({4, 0, 16}), (std::vector<int64_t>{0, 1, 14, 15}));
  EXPECT_EQ(positions_of({4, 1, 16}), (std::vector<int64_t>{2, 3, 12, 13}));
  EXPECT_EQ(positions_of({4, 2, 16}), (std::vector<int64_t>{4, 5, 10, 11}));
  EXPECT_EQ(positions_of({4, 3, 16}), (std::vector<int64_t>{6, 7, 8, 9}));
}

TEST(SequenceSplit, EveryPositionHasOneOwnerAndComesBack) {
  for (int n : {1, 2, 3, 4, 8}) {
    const Split any{n, 0, 48};
    std::vector<int> seen(48, 0);
    for (int r = 0; r < n; ++r) {
      const Split s = any.of_rank(r);
      for (int64_t i = 0; i < s.local_len(); ++i) {
        const int64_t g = s.global(i);
        ++seen[static_cast<size_t>(g)];
        EXPECT_EQ(any.owner(g), r) << "n " << n << " g " << g;
        EXPECT_EQ(any.local_on_owner(g), i) << "n " << n << " g " << g;
      }
    }
    for (int c : seen) EXPECT_EQ(c, 1) << "n " << n;
  }
}

TEST(SequenceSplit, OneRankIsTheIdentityMap) {
  const Split one{1, 0, 7};  // any length splits over one rank
  EXPECT_TRUE(one.chunks().identity());
  EXPECT_EQ(one.global(5), 5);
  EXPECT_NO_THROW(one.check());
  EXPECT_THROW((Split{2, 0, 6}).check(), megadlm::Error);  // 6 is not a multiple of 4
  EXPECT_THROW((Split{2, 2, 8}).check(), megadlm::Error);  // rank outside the split
}

TEST(SequenceSplit, ShardRowsKeepsBatchMajorRowsOfGlobalPositions) {
  // Two samples of 8 positions, value = 100 * sample + position; cp = 2, rank 1: chunks 1, 2.
  std::vector<int> full;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 8; ++i) full.push_back(100 * b + i);
  EXPECT_EQ(cp::shard_rows(full, 2, Split{2, 1, 8}), (std::vector<int>{2, 3, 4, 5, 102, 103, 104, 105}));
  EXPECT_EQ(cp::shard_rows(full, 2, Split{2, 0, 8}), (std::vector<int>{0, 1, 6, 7, 100, 101, 106, 107}));
}

TEST(SequenceSplit, PaddedLengthIsTheNextMultipleOfTwiceCp) {
  EXPECT_EQ(cp::padded_length(15, 2), 16);
  EXPECT_EQ(cp::padded_length(16, 2), 16);
  EXPECT_EQ(cp::padded_length(9, 4), 16);
  EXPECT_EQ(cp::padded_length(1, 4), 8);
  EXPECT_EQ(cp::padded_length(5, 1), 5);
}

TEST(SequenceSplit, AllGatherOrderBecomesNaturalOrder) {
  // S = 16, cp = 2: after an all-gather rank 0's rows (0..3, 12..15) come first, rank 1's
  // (4..11) next; natural position p is gathered row:
  const std::vector<int32_t> want{0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 4, 5, 6, 7};
  EXPECT_EQ(cp::block_from_members(1, Split{2, 0, 16}, 2), want);
  EXPECT_EQ(cp::block_from_members(1, Split{2, 1, 16}, 2), want);  // the same for every rank
}

TEST(SequenceSplit, LevelOneBlockOfTwoRanksIsTheCoarserSplit) {
  // S = 16, cp = 4, level-1 groups of a = 2: CP ranks 0 and 1 form block 0, which is rank 0 of
  // the split over 2 (positions 0..3 | 12..15). Member 0 sends positions 0 1 14 15 (rows 0..3),
  // member 1 positions 2 3 12 13 (rows 4..7); in block order 0 1 2 3 12 13 14 15:
  EXPECT_EQ(cp::block_from_members(1, Split{4, 0, 16}, 2),
            (std::vector<int32_t>{0, 1, 4, 5, 6, 7, 2, 3}));
  // Block 1 (CP ranks 2, 3) is rank 1 of the split over 2: positions 4..11; member 0 (rank 2)
  // holds 4 5 10 11, member 1 (rank 3) 6 7 8 9.
  EXPECT_EQ(cp::block_from_members(1, Split{4, 3, 16}, 2),
            (std::vector<int32_t>{0, 1, 4, 5, 6, 7, 2, 3}));
  // Two samples: the second sample's rows follow the first's in every member's part.
  EXPECT_EQ(cp::block_from_members(2, Split{4, 0, 16}, 2),
            (std::vector<int32_t>{0, 1, 8, 9, 10, 11, 2, 3, 4, 5, 12, 13, 14, 15, 6, 7}));
}

TEST(SequenceSplit, MembersFromBlockInvertsBlockFromMembers) {
  for (int cp_size : {2, 4, 8}) {
    for (int a = 1; a <= cp_size; a *= 2) {
      for (int r = 0; r < cp_size; ++r) {
        const Split s{cp_size, r, 32};
        const auto there = cp::block_from_members(3, s, a);
        const auto back = cp::members_from_block(3, s, a);
        EXPECT_EQ(compose(there, back), identity(back.size())) << cp_size << " " << a << " " << r;
        EXPECT_EQ(compose(back, there), identity(there.size())) << cp_size << " " << a << " " << r;
      }
    }
  }
}

TEST(SequenceSplit, HeadBlocksGoPeerMajorAndBack) {
  // 2 rows of 2 head blocks: rows of one block are (row 0, block 0), (0, 1), (1, 0), (1, 1);
  // peer-major puts block 0 of both rows first.
  EXPECT_EQ(cp::peers_from_heads(2, 2), (std::vector<int32_t>{0, 2, 1, 3}));
  EXPECT_EQ(cp::peers_from_heads(3, 2), (std::vector<int32_t>{0, 2, 4, 1, 3, 5}));
  const auto there = cp::peers_from_heads(5, 4), back = cp::heads_from_peers(5, 4);
  EXPECT_EQ(compose(there, back), identity(20));
}

// Block diffusion's layout (docs/parallelism/context_parallel.md, "Block diffusion"): one doubled
// row of L = 8, blocks of 2, over 2 ranks (chunks of 2; rank 0 holds positions 0 1 6 7, rank 1
// 2 3 4 5). Values derived by hand.
namespace {
/// [1, 4, 8] ranges: documents [0, d) and [d, 8), blocks of 2 from each document's start.
std::vector<int32_t> one_row_ranges(int d) {
  std::vector<int32_t> r(32);
  for (int p = 0; p < 8; ++p) {
    const int ds = p < d ? 0 : d, de = p < d ? d : 8, bs = ds + (p - ds) / 2 * 2;
    r[p] = ds;
    r[8 + p] = de;
    r[16 + p] = bs;
    r[24 + p] = std::min(bs + 2, de);
  }
  return r;
}
std::vector<int32_t> host(const megadlm::Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}
}  // namespace

TEST(SequenceSplit, BlockDiffusionShardsGetLocalRangesAndDocuments) {
  using megadlm::Stream;
  megadlm::cp::SequenceLayout rank0(2, 8, 2, 0, {}), rank1(2, 8, 2, 1, {});
  rank0.set_block_diffusion(one_row_ranges(8));  // one document: every block inside a chunk
  rank1.set_block_diffusion(one_row_ranges(8));
  EXPECT_TRUE(rank0.blocks_in_chunks(2));
  // Rank 0, positions 0 1 6 7: doc [0, 8) -> local [0, 4); blocks [0, 2) -> [0, 2), [6, 8) -> [2, 4).
  const megadlm::Tensor& r0 = rank0.local_block_ranges(2, 0, Stream::cpu());
  EXPECT_EQ(r0.shape(), (megadlm::Shape{1, 4, 4}));
  EXPECT_EQ(host(r0), (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 2, 2, 2, 2, 4, 4}));
  // Rank 1, positions 2 3 4 5: blocks [2, 4) -> [0, 2), [4, 6) -> [2, 4).
  EXPECT_EQ(host(rank1.local_block_ranges(2, 1, Stream::cpu())),
            (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 2, 2, 2, 2, 4, 4}));
  // Documents [0, 3) and [3, 8): blocks [3, 5) straddles the chunk boundary at 4.
  megadlm::cp::SequenceLayout packed(2, 8, 2, 1, {});
  packed.set_block_diffusion(one_row_ranges(3));
  EXPECT_FALSE(packed.blocks_in_chunks(2));
  // Rank 1's positions 2 3 4 5: doc starts 0 3 3 3 -> local 0 1 1 1, doc ends 3 8 8 8 -> 1 4 4 4,
  // blocks [2, 3) [3, 5) [3, 5) [5, 7) -> [0, 1) [1, 3) [1, 3) [3, 4).
  EXPECT_EQ(host(packed.local_block_ranges(2, 1, Stream::cpu())),
            (std::vector<int32_t>{0, 1, 1, 1, 1, 4, 4, 4, 0, 1, 1, 3, 1, 3, 3, 4}));
  // Document ids of both copies (each position's document start).
  EXPECT_EQ(host(packed.block_documents(2, 1, Stream::cpu())), (std::vector<int32_t>{0, 3, 3, 3, 0, 3, 3, 3}));
  EXPECT_EQ(host(packed.block_documents(2, 0, Stream::cpu())), (std::vector<int32_t>{0, 0, 3, 3, 0, 0, 3, 3}));
}
