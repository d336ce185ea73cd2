// The element -> random number mapping of dropout (contract in include/megadlm/ops/dropout.h),
// written once for host and device so the CPU and CUDA backends drop exactly the same elements.
//
// Element (r, c) of x [R, C] is micro-batch row g = row_offset + r and has global coordinates
//   sample   = sample_offset + g / seq_len
//   position = position_offset + chunks.global(g % seq_len)   (chunks: identity without CP)
//   column   = column_offset + c
// and is kept iff uniform_from_u32(philox(key(seed, HiddenDropout),
//                                  {column / 4, position, sample mod 2^32, site}).w[column % 4]) >= p.
// Worked example: seq_len 8, sample_offset 2, position_offset 4, column_offset 64: element (9, 5)
// is sample 3, position 5, column 69 -> counter {17, 5, 3, site}, word 1.
// One Philox call serves four consecutive global columns (a CUDA thread can take all four).
#pragma once
#include <cstdint>
#include "megadlm/core/philox.h"
#include "megadlm/ops/dropout.h"

namespace megadlm::ops::detail {

/// Everything needed to decide keep/drop for any element; trivially copyable, so a CUDA kernel
/// can take it by value.
struct DropoutMask {
  PhiloxKey key;
  uint32_t site;
  float p;
  float scale;  ///< 1 / (1 - p) in fp32, the factor applied to kept values
  int64_t seq_len;
  int64_t sample_offset;
  int64_t position_offset;
  int64_t column_offset;
  int64_t row_offset;
  ChunkMap chunks;

  static DropoutMask from_args(const DropoutArgs& a) {
    return DropoutMask{PhiloxKey::make(a.seed, RngPurpose::HiddenDropout),
                       a.site,
                       a.p,
                       1.0f / (1.0f - a.p),
                       a.seq_len,
                       a.sample_offset,
                       a.position_offset,
                       a.column_offset,
                       a.row_offset,
                       a.chunks};
  }

  /// The four words of row r for the group of four global columns containing global column g.
  MDLM_HOST_DEVICE PhiloxWords words(int64_t r, int64_t g) const {
    const int64_t row = row_offset + r;
    const int64_t sample = sample_offset + row / seq_len;
    const int64_t position = position_offset + chunks.global(row % seq_len);
    return philox(key, static_cast<uint32_t>(g / 4), static_cast<uint32_t>(position),
                  static_cast<uint32_t>(sample), site);
  }

  /// Whether a word drawn for an element keeps it.
  MDLM_HOST_DEVICE bool keeps(uint32_t word) const { return uniform_from_u32(word) >= p; }

  /// Whether element (r, c) of the local x is kept.
  MDLM_HOST_DEVICE bool keep(int64_t r, int64_t c) const {
    const int64_t g = column_offset + c;
    return keeps(words(r, g).w[g % 4]);
  }
};

}  // namespace megadlm::ops::detail
