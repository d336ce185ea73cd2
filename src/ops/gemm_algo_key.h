// Internal: the keys of the CUDA GEMM's cuBLASLt algorithm caches (src/ops/cuda/gemm.cpp, and
// the hasher fp8.cu shares), in plain C++ with no CUDA header so that a CPU unit test can check
// which problems share an algorithm (tests/unit/ops/test_gemm_algo_key.cpp).
//
// Two keys per product: the problem's own (its cache entry: the algorithm it runs) and the key
// of the problem cuBLASLt's heuristic is asked about (heuristic_key):
//   default mode      the size bucket of M and K (heuristic_bucket): one heuristic call per
//                     bucket; the bucket's algorithm runs a size where cuBLASLt accepts it,
//                     else the size is asked about exactly (so the choice can depend on M).
//   batch-invariant   a fixed M (kInvariantM) and the exact K: one algorithm per (N, K,
//                     transposes, dtypes, alignments up to 16 bytes, bias), used for every M or
//                     refused with an error, never replaced by a per-M choice. Both keys carry
//                     `invariant`, so the two modes' algorithms never mix in a cache.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include "megadlm/core/dtype.h"

namespace megadlm::ops::detail {

/// FNV-1a over 64-bit words: the hash of the GEMM algorithm caches' keys (gemm.cpp, fp8.cu).
struct KeyHasher {
  size_t h = 1469598103934665603ull;
  void mix(uint64_t v) { h = (h ^ v) * 1099511628211ull; }
};

/// One cuBLASLt product as its algorithm caches see it (row-major C[m, n] = op(A) op(B), K = k).
struct AlgoKey {
  int device;
  int64_t m, n, k;
  bool trans_a, trans_b, has_bias;
  DType ab, c;
  uint32_t align_a, align_b, align_c, align_bias;
  bool invariant = false;  ///< chosen in batch-invariant mode (ops::batch_invariant())
  bool operator==(const AlgoKey& o) const {
    return device == o.device && m == o.m && n == o.n && k == o.k && trans_a == o.trans_a &&
           trans_b == o.trans_b && has_bias == o.has_bias && ab == o.ab && c == o.c &&
           align_a == o.align_a && align_b == o.align_b && align_c == o.align_c &&
           align_bias == o.align_bias && invariant == o.invariant;
  }
};

struct AlgoKeyHash {
  size_t operator()(const AlgoKey& key) const {
    KeyHasher hash;
    hash.mix(static_cast<uint64_t>(key.device));
    hash.mix(static_cast<uint64_t>(key.m));
    hash.mix(static_cast<uint64_t>(key.n));
    hash.mix(static_cast<uint64_t>(key.k));
    hash.mix((key.trans_a ? 1u : 0u) | (key.trans_b ? 2u : 0u) | (key.has_bias ? 4u : 0u) |
             (key.invariant ? 8u : 0u));
    hash.mix(static_cast<uint64_t>(key.ab) << 8 | static_cast<uint64_t>(key.c));
    hash.mix(static_cast<uint64_t>(key.align_a) << 32 | key.align_b);
    hash.mix(static_cast<uint64_t>(key.align_c) << 32 | key.align_bias);
    return hash.h;
  }
};

/// The size the heuristic is asked about for M and K in the default mode: a power of two up to
/// 128 (at least 16), then a multiple of 128. cuBLASLt's heuristic takes milliseconds a call (the
/// 1.7B at seq 8192 on the H200: three gaps of 3.2-3.6 ms an iteration, one per new masked-row
/// count of the LM head), so sizes that vary from call to call share the algorithm chosen for
/// their bucket's size, where cublasLtMatmulAlgoCheck accepts it for the actual one. Sizes
/// already on a bucket boundary (every fixed training shape of the 1.7B) are asked about exactly.
inline int64_t heuristic_bucket(int64_t x) {
  if (x > 128) return (x + 127) / 128 * 128;
  int64_t p = 16;
  while (p < x) p *= 2;
  return p;
}

/// The M at which batch-invariant mode asks the heuristic: large enough that its choice is a
/// kernel for many rows (no small-M split-K specialisation to avoid), fixed so that the choice is
/// the same whatever M a call has.
constexpr int64_t kInvariantM = 4096;

/// Batch-invariant mode tells the heuristic at most this pointer alignment (bytes). The
/// operands of one layer can be views at a row offset that depends on the batch (an expert's
/// rows inside the permuted tokens, a row of the LM head's gather), whose largest power-of-two
/// divisor then varies (128 or 256 bytes at 64 bf16 columns a row); 16 bytes is what cuBLASLt's
/// vectorised (and TMA) kernels need, so capping there keeps them and the choice fixed.
constexpr uint32_t kInvariantAlignment = 16;

/// `key` (the problem's own: its actual M, K and pointer alignments) in the given mode: the
/// `invariant` bit set, and in batch-invariant mode the alignments capped at kInvariantAlignment.
inline AlgoKey problem_key(AlgoKey key, bool invariant) {
  key.invariant = invariant;
  if (invariant) {
    for (uint32_t* align : {&key.align_a, &key.align_b, &key.align_c, &key.align_bias})
      if (*align > kInvariantAlignment) *align = kInvariantAlignment;
  }
  return key;
}

/// The problem whose heuristic answer `key` runs (see the top of this file).
inline AlgoKey heuristic_key(const AlgoKey& key) {
  AlgoKey h = key;
  if (key.invariant) {
    h.m = kInvariantM;  // K stays exact: a row's reduction is over all of it
  } else {
    h.m = heuristic_bucket(key.m);
    h.k = heuristic_bucket(key.k);
  }
  return h;
}

}  // namespace megadlm::ops::detail
