// parallel/context_parallel/sequence_split.h: the split's index math and the row reorders.
#include "megadlm/parallel/context_parallel/sequence_split.h"

namespace megadlm::cp {

void Split::check() const {
  MDLM_CHECK(size >= 1 && rank >= 0 && rank < size, "cp::Split: rank ", rank, " of ", size);
  MDLM_CHECK(seq > 0 && (size == 1 || seq % (2 * size) == 0), "cp::Split: a sequence of ", seq,
             " positions does not split into 2 x ", size, " equal chunks");
}

int64_t Split::local_on_owner(int64_t g) const {
  if (size == 1) return g;
  const int64_t c = g / chunk_len(), off = g % chunk_len();
  return c == owner_of_chunk(c) ? off : chunk_len() + off;  // first or second chunk of the owner
}

int64_t padded_length(int64_t seq, int cp) {
  MDLM_CHECK(seq > 0 && cp >= 1, "cp::padded_length: seq ", seq, ", cp ", cp);
  if (cp == 1) return seq;
  const int64_t m = 2 * static_cast<int64_t>(cp);
  return (seq + m - 1) / m * m;
}

namespace {

/// The block split of a level-1 group of `a` ranks containing cp.rank, and its first member.
Split block_split(const Split& cp, int a) {
  cp.check();
  MDLM_CHECK(a >= 1 && cp.size % a == 0, "cp: a level-1 group of ", a, " ranks does not divide ",
             "the CP size ", cp.size);
  return Split{cp.size / a, cp.rank / a, cp.seq};
}

}  // namespace

std::vector<int32_t> block_from_members(int64_t batch, const Split& cp, int a) {
  const Split blk = block_split(cp, a);
  const int first_member = blk.rank * a;
  const int64_t local = cp.local_len(), blk_len = blk.local_len();
  std::vector<int32_t> index(static_cast<size_t>(batch * blk_len));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < blk_len; ++i) {
      const int64_t g = blk.global(i);
      const int j = cp.owner(g) - first_member;
      MDLM_CHECK(j >= 0 && j < a, "cp::block_from_members: position ", g, " is not in block ",
                 blk.rank);
      index[static_cast<size_t>(b * blk_len + i)] =
          static_cast<int32_t>((j * batch + b) * local + cp.local_on_owner(g));
    }
  }
  return index;
}

std::vector<int32_t> members_from_block(int64_t batch, const Split& cp, int a) {
  const Split blk = block_split(cp, a);
  const int64_t local = cp.local_len(), blk_len = blk.local_len();
  std::vector<int32_t> index(static_cast<size_t>(a * batch * local));
  for (int j = 0; j < a; ++j) {
    const Split member = cp.of_rank(blk.rank * a + j);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < local; ++i) {
        const int64_t g = member.global(i);
        index[static_cast<size_t>((j * batch + b) * local + i)] =
            static_cast<int32_t>(b * blk_len + blk.local_on_owner(g));
      }
    }
  }
  return index;
}

std::vector<int32_t> peers_from_heads(int64_t rows, int a) {
  std::vector<int32_t> index(static_cast<size_t>(rows * a));
  for (int p = 0; p < a; ++p)
    for (int64_t t = 0; t < rows; ++t)
      index[static_cast<size_t>(p * rows + t)] = static_cast<int32_t>(t * a + p);
  return index;
}

std::vector<int32_t> heads_from_peers(int64_t rows, int a) {
  std::vector<int32_t> index(static_cast<size_t>(rows * a));
  for (int p = 0; p < a; ++p)
    for (int64_t t = 0; t < rows; ++t)
      index[static_cast<size_t>(t * a + p)] = static_cast<int32_t>(p * rows + t);
  return index;
}

}  // namespace megadlm::cp
