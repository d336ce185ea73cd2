// Block diffusion's mask (AttentionMask::BlockDiffusion / BlockDiffusionCausal, contract in
// include/megadlm/ops/attention.h) as ranges, written once for host and device: the CUDA kernels
// (flash and simple) derive from it which keys a query row sees and which queries see a key row,
// and the unit tests (tests/unit/ops/test_attention_block_diffusion.cpp) check those ranges, and
// the flash kernels' tile plans built from them, against ops::block_diffusion_visible.
//
// Rows of one batch row: 0..L-1 the noisy copy x_t of positions 0..L-1, L..2L-1 the clean copy
// x_0 (seq = 2L). For a position p the ranges hold doc_start, doc_end (p's document) and
// block_start, block_end (p's diffusion block inside it). Documents are contiguous runs and
// blocks contiguous runs inside them, so all four are non-decreasing in p, and:
//   query row i (position p) sees the key rows     noisy i: [bs(p), be(p))  and  L + [ds(p), bs(p))
//                                                  clean i: L + [ds(p), be(p))   (causal: L + [ds(p), p + 1))
//   key row j (position kp) is seen by query rows  noisy j: [bs(kp), be(kp))
//                                                  clean j: [be(kp), de(kp))  and  L + [bs(kp), de(kp))
//                                                           (causal: L + [kp, de(kp)))
// Each range's ends are non-decreasing along the rows of one half, so the ranges of a tile of
// rows inside one half are covered by [lo of its first row, hi of its last row).
#pragma once
#include <cstdint>
#include "megadlm/core/philox.h"  // MDLM_HOST_DEVICE

namespace megadlm::ops::detail {

/// One batch row's block_ranges (int32 [4, L]: doc_start, doc_end, block_start, block_end).
/// Positions are clamped into [0, L] as they are read, so that malformed ranges can make a
/// kernel compute a wrong mask but never address rows outside the batch row.
struct BlockDiffusionRow {
  const int32_t* ranges;
  int half;  ///< L = seq / 2
  bool causal_clean;
  /// AttentionArgs::block_diffusion_strip: N > 0 keeps only the pairs the two causal bulks of the
  /// composed path leave (noisy p: clean keys [max(ds, p - N + 1), bs); clean p: clean keys
  /// [p, be), causal [p, p]); 0: the whole mask. The ends stay non-decreasing (max / min of
  /// non-decreasing ends), so the tile plans below hold unchanged.
  int strip = 0;

  MDLM_HOST_DEVICE static int min_of(int a, int b) { return a < b ? a : b; }
  MDLM_HOST_DEVICE static int max_of(int a, int b) { return a > b ? a : b; }
  MDLM_HOST_DEVICE int at(int which, int p) const {
    const int x = ranges[which * half + p];
    return x < 0 ? 0 : (x > half ? half : x);
  }
  MDLM_HOST_DEVICE int doc_start(int p) const { return at(0, p); }
  MDLM_HOST_DEVICE int doc_end(int p) const { return at(1, p); }
  MDLM_HOST_DEVICE int block_start(int p) const { return at(2, p); }
  MDLM_HOST_DEVICE int block_end(int p) const { return at(3, p); }

  /// The key rows query row i sees: [lo[0], hi[0]) in i's own half, then [lo[1], hi[1]) (the
  /// clean keys of a noisy row; empty, lo = hi = 0, for a clean row). A range may be empty
  /// (hi <= lo): the clean keys of a noisy row in its document's first block.
  MDLM_HOST_DEVICE void keys_of(int i, int (&lo)[2], int (&hi)[2]) const {
    if (i < half) {
      const int bs = block_start(i);
      lo[0] = bs;
      hi[0] = block_end(i);
      const int ds = doc_start(i);
      lo[1] = half + (strip > 0 ? min_of(max_of(ds, i - strip + 1), bs) : ds);
      hi[1] = half + bs;
    } else {
      const int p = i - half;
      lo[0] = half + (strip > 0 ? max_of(doc_start(p), p) : doc_start(p));
      hi[0] = half + (causal_clean ? p + 1 : block_end(p));
      lo[1] = hi[1] = 0;
    }
  }

  /// The query rows that see key row j: [lo[0], hi[0]) noisy rows, [lo[1], hi[1]) clean rows
  /// (empty, lo = hi = 0, for a noisy key; the noisy range of a clean key in its document's last
  /// block is empty too).
  MDLM_HOST_DEVICE void queries_of(int j, int (&lo)[2], int (&hi)[2]) const {
    if (j < half) {
      lo[0] = block_start(j);
      hi[0] = block_end(j);
      lo[1] = hi[1] = 0;
    } else {
      const int kp = j - half;
      const int de = doc_end(kp), be = block_end(kp);
      lo[0] = be;
      hi[0] = strip > 0 ? max_of(be, min_of(de, kp + strip)) : de;  // noisy p < kp + N
      lo[1] = half + (causal_clean ? kp : block_start(kp));
      hi[1] = half + (strip > 0 ? max_of(lo[1] - half, min_of(de, kp + 1)) : de);  // clean p <= kp
    }
  }

  /// The rule itself (ops::block_diffusion_visible on clamped ranges).
  MDLM_HOST_DEVICE bool visible(int i, int j) const {
    const bool noisy_q = i < half, noisy_k = j < half;
    const int p = noisy_q ? i : i - half, kp = noisy_k ? j : j - half;
    if (strip > 0 && !noisy_k && kp <= p - (noisy_q ? strip : 1)) return false;
    if (noisy_q)
      return noisy_k ? block_start(p) <= kp && kp < block_end(p)
                     : doc_start(p) <= kp && kp < block_start(p);
    if (noisy_k) return false;
    return doc_start(p) <= kp && (causal_clean ? kp <= p : kp < block_end(p));
  }
};

/// The tiles of a flash kernel's loop over one tile of rows: two ranges of tiles of `tile` rows,
/// [first[s], first[s] + count[s]) for s = 0, 1 (count 0: empty), visited in that order. Built
/// from the ranges of the tile's first and last rows (keys_of for the forward's query tile,
/// queries_of for the backward's key tile): every pair a row of the tile can see lies in them.
struct BlockDiffusionTiles {
  int first[2], count[2];

  MDLM_HOST_DEVICE static BlockDiffusionTiles of(const int (&lo_first_row)[2],
                                                 const int (&hi_last_row)[2], int tile) {
    BlockDiffusionTiles t;
    for (int s = 0; s < 2; ++s) {
      const int lo = lo_first_row[s], hi = hi_last_row[s];
      t.first[s] = lo / tile;
      t.count[s] = hi > lo ? (hi + tile - 1) / tile - t.first[s] : 0;
    }
    return t;
  }
  MDLM_HOST_DEVICE int total() const { return count[0] + count[1]; }
  /// The n-th tile visited (n < total()), as a tile index.
  MDLM_HOST_DEVICE int tile(int n) const {
    return n < count[0] ? first[0] + n : first[1] + (n - count[0]);
  }
};

}  // namespace megadlm::ops::detail
