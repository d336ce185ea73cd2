// Where the rows of a context-parallel shard sit in their full sequence, for the ops that key
// something by position (the causal mask and attention dropout in ops/attention.h, hidden dropout
// in ops/dropout.h). Context parallelism (parallel/context_parallel/sequence_split.h) gives each
// rank two equal chunks of every sequence: local positions [0, len) are global chunk `first` and
// [len, 2·len) global chunk `second`. Example: a sequence of 16 split over 2 ranks into chunks of
// 4; rank 0 holds chunks 0 and 3, so ChunkMap{4, 0, 3} maps local 0..7 to 0..3, 12..15.
// len 0 is the identity (an unsplit sequence), the default everywhere.
// Host and device: kernels take it by value.
#pragma once
#include <cstdint>
#include "megadlm/core/philox.h"  // MDLM_HOST_DEVICE

namespace megadlm::ops {

struct ChunkMap {
  int64_t len = 0;     ///< positions per chunk; 0: the identity
  int64_t first = 0;   ///< global chunk of local positions [0, len)
  int64_t second = 0;  ///< global chunk of local positions [len, 2·len)

  MDLM_HOST_DEVICE bool identity() const { return len == 0; }

  /// Global position of local position i.
  MDLM_HOST_DEVICE int64_t global(int64_t i) const {
    if (len == 0) return i;
    return i < len ? first * len + i : second * len + (i - len);
  }

  /// Same mapping (identities are equal whatever their chunk fields hold).
  MDLM_HOST_DEVICE bool same_as(const ChunkMap& o) const {
    if (len == 0 || o.len == 0) return len == o.len;
    return len == o.len && first == o.first && second == o.second;
  }
};

}  // namespace megadlm::ops
