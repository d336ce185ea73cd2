// The attention test case shared by the CPU reference tests (tests/unit/ops/test_attention.cpp)
// and the GPU parity tests (tests/gpu/test_parity_attention.cpp): a shape, a mask and an optional
// dropout, turned into ops::AttentionArgs and the q / k,v / lse shapes. Header-only.
#pragma once
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>
#include <string>
#include "megadlm/core/tensor.h"
#include "megadlm/ops/attention.h"

namespace megadlm::test {

struct AttentionCase {
  int64_t batch, seq, heads, kv_heads, dim;
  ops::AttentionMask mask;
};

inline std::string name_of(const AttentionCase& c) {
  return "B=" + std::to_string(c.batch) + " S=" + std::to_string(c.seq) + " Hq=" +
         std::to_string(c.heads) + " Hkv=" + std::to_string(c.kv_heads) + " D=" +
         std::to_string(c.dim) + (c.mask == ops::AttentionMask::Causal ? " causal" : " no-mask");
}

/// Attention dropout of a case (p = 0: none), at global offsets. The CUDA flash kernels need
/// key_offset a multiple of 4.
struct AttentionDropout {
  float p = 0.0f;
  int64_t sample_offset = 0, head_offset = 0, query_offset = 0, key_offset = 0;
  bool documents = false;  ///< packed rows: per-document attention
  int document_pattern = 0;  ///< with documents: which packing (test_parity_attention.cpp)
};

/// The op arguments of a case: softmax scale 1/sqrt(head_dim), dropout keyed by (seed, site).
inline ops::AttentionArgs attention_args(const AttentionCase& c, const AttentionDropout& d,
                                         uint64_t dropout_seed, uint32_t dropout_site) {
  return {.batch = c.batch,
          .seq = c.seq,
          .num_heads = c.heads,
          .num_kv_heads = c.kv_heads,
          .head_dim = c.dim,
          .mask = c.mask,
          .softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dim))),
          .dropout_p = d.p,
          .dropout_seed = dropout_seed,
          .dropout_site = dropout_site,
          .sample_offset = d.sample_offset,
          .head_offset = d.head_offset,
          .query_offset = d.query_offset,
          .key_offset = d.key_offset};
}

inline Shape q_shape(const AttentionCase& c) { return {c.batch, c.seq, c.heads, c.dim}; }
inline Shape kv_shape(const AttentionCase& c) { return {c.batch, c.seq, c.kv_heads, c.dim}; }
inline Shape lse_shape(const AttentionCase& c) { return {c.batch, c.heads, c.seq}; }

/// The bound on |lse_cuda - lse_cpu|. lse is fp32 computed from exactly the bf16 inputs the CPU
/// sees, so it differs only by summation order and the exp2 approximation. It is a log, so a
/// relative error means nothing near 0: the bound is absolute. Measured on H200: 1.2e-5 worst
/// (flash, S up to 2048; docs/benchmarks.md, "Backend parity"). 1e-4 is ~8x that; a wrong row or
/// a missing block of keys moves lse by O(0.1) or more.
constexpr double kLseMaxAbs = 1e-4;

/// Largest |got - want| of two lse vectors; infinite unless every row that sees no key (-inf)
/// is -inf on both sides, or when got holds a NaN.
inline double lse_max_abs_error(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::isnan(got[i]) ? INFINITY : std::fabs(got[i] - want[i]));
  }
  return worst;
}

}  // namespace megadlm::test
