// The element -> random number mapping of attention dropout (contract in
// include/megadlm/ops/attention.h), written once for host and device so that the CPU reference,
// the flash kernels and the simple CUDA kernels drop exactly the same probabilities, whichever
// rank or shard computes them.
//
// Element (b, h, i, j) of the probability matrix has global coordinates
//   sample = sample_offset + b    head = head_offset + h
//   query  = query_offset + query_chunks.global(i)    key = key_offset + key_chunks.global(j)
// (the chunk maps place context-parallel shards; identity otherwise: query_offset + i, ...)
// and is kept iff uniform_from_u32(philox(key(seed, AttentionDropout),
//                 {key / 4, query, sample mod 2^32, (site << 16) | head}).w[key % 4]) >= p.
// Worked example: sample_offset 3, head_offset 4, query_offset 0, key_offset 8, site 2: element
// (1, 1, 5, 6) is sample 4, head 5, query 5, key 14 -> counter {3, 5, 4, 0x20005}, word 2.
// One Philox call serves four consecutive global keys of one query row; the flash kernels arrange
// their fragments so one thread consumes all four (docs/kernels/attention.md).
#pragma once
#include <cstdint>
#include "megadlm/core/philox.h"
#include "megadlm/ops/attention.h"

namespace megadlm::ops::detail {

/// Everything needed to decide keep/drop for any element; trivially copyable, so a CUDA kernel
/// takes it by value.
struct AttentionDropoutMask {
  PhiloxKey key;
  /// keeps(word) <=> word >= threshold. uniform_from_u32(w) = (w >> 8) * 2^-24 is exact, so
  /// uniform_from_u32(w) >= p  <=>  (w >> 8) >= ceil(p * 2^24)  <=>  w >= ceil(p * 2^24) * 256:
  /// one integer compare on the device instead of a conversion and a float compare.
  uint32_t threshold;
  uint32_t site;
  float p;
  float scale;  ///< 1 / (1 - p) in fp32, the factor applied to kept probabilities
  int64_t sample_offset, head_offset, query_offset, key_offset;
  ChunkMap query_chunks, key_chunks;

  static AttentionDropoutMask from_args(const AttentionArgs& a) {
    // p * 2^24 is exact in double (p is a float); p < 1 keeps the product below 2^32 / 256.
    const double units = static_cast<double>(a.dropout_p) * 16777216.0;
    auto t = static_cast<uint32_t>(units);
    if (static_cast<double>(t) < units) ++t;  // ceil
    return AttentionDropoutMask{PhiloxKey::make(a.dropout_seed, RngPurpose::AttentionDropout),
                                t << 8,
                                a.dropout_site,
                                a.dropout_p,
                                1.0f / (1.0f - a.dropout_p),
                                a.sample_offset,
                                a.head_offset,
                                a.query_offset,
                                a.key_offset,
                                a.query_chunks,
                                a.key_chunks};
  }

  /// Global key position of local key row j.
  MDLM_HOST_DEVICE int64_t global_key(int64_t j) const { return key_offset + key_chunks.global(j); }

  /// The four words of local (b, h, query row i) for the global keys 4 * key_group + 0..3.
  MDLM_HOST_DEVICE PhiloxWords group_words(int64_t b, int64_t h, int64_t i,
                                           uint32_t key_group) const {
    return philox(key, key_group, static_cast<uint32_t>(query_offset + query_chunks.global(i)),
                  static_cast<uint32_t>(sample_offset + b),
                  (site << 16) | static_cast<uint32_t>(head_offset + h));
  }

  /// The four words of local (b, h, query row i) for the group containing global key `gkey`
  /// (its own word is w[gkey % 4]).
  MDLM_HOST_DEVICE PhiloxWords words(int64_t b, int64_t h, int64_t i, int64_t gkey) const {
    return group_words(b, h, i, static_cast<uint32_t>(gkey / 4));
  }

  /// Whether a word drawn for an element keeps it (see `threshold`).
  MDLM_HOST_DEVICE bool keeps(uint32_t word) const { return word >= threshold; }

  /// Whether element (b, h, i, j) of the local probability matrix is kept.
  MDLM_HOST_DEVICE bool keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t gkey = global_key(j);
    const PhiloxWords w = words(b, h, i, gkey);
    // A select chain, not w.w[gkey % 4]: a runtime index would put the words in local memory
    // on the device.
    const int64_t k = gkey % 4;
    return keeps(k == 0 ? w.w[0] : k == 1 ? w.w[1] : k == 2 ? w.w[2] : w.w[3]);
  }
};

}  // namespace megadlm::ops::detail
