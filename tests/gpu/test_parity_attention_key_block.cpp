// GPU parity of attention against a separate key block (kv_seq != seq and/or key_document_ids,
// include/megadlm/ops/attention.h), which the flash kernels run for head_dim 64 and 128 without
// causal mask and dropout: Fast-dLLM's cached decoding (32 query columns against a 288-column
// canvas, left padding as its own document, a different padding per batch row) and
// context-parallel blocks (queries of shard r against keys of shard r' with documents crossing
// the shard boundary, so that some query rows see no key; queries of a shard against the whole
// gathered sequence). Each call, forward and then backward from its own out and lse, runs through
// the public ops (the dispatch must pick the flash kernels: context_parallel_attention_kernel)
// and through the simple kernels as a second opinion, against the CPU f32 reference on the same
// bf16-rounded inputs, with the tolerances of ContextParallelParity. Every test skips without a
// GPU.
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"
#include "support/attention_cases.h"
#include "support/op_testing.h"
#include "support/tolerances.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/attention_impl.h"
#endif

using namespace megadlm;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;

namespace {


/// One call: queries [B, seq], keys [B, kv_seq]; ids empty = no documents, key_ids empty = the
/// queries' ids (then kv_seq == seq).
struct KeyBlockCase {
  std::string name;
  int64_t batch, seq, kv_seq, heads, kv_heads, dim;
  std::vector<int32_t> query_ids = {}, key_ids = {};
  ops::ChunkMap query_chunks = {}, key_chunks = {};
};

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

struct Inputs {
  Tensor q, k, v, dout;  // host f32, bf16-representable
};

Result run(const KeyBlockCase& c, const Inputs& in, const Stream& stream, bool simple) {
  const bool cuda = stream.is_cuda();
  const Device dev = stream.device();
  const DType act = cuda ? DType::BF16 : DType::F32;
  const Tensor q = in.q.to(dev, act, stream), k = in.k.to(dev, act, stream),
               v = in.v.to(dev, act, stream), dout = in.dout.to(dev, act, stream);
  Tensor qdocs, kdocs;
  AttentionArgs a{.batch = c.batch, .seq = c.seq, .num_heads = c.heads,
                  .num_kv_heads = c.kv_heads, .head_dim = c.dim,
                  .softmax_scale = static_cast<float>(1.0 / std::sqrt(double(c.dim)))};
  a.kv_seq = c.kv_seq;
  a.query_chunks = c.query_chunks;
  a.key_chunks = c.key_chunks;
  if (!c.query_ids.empty()) {
    qdocs = Tensor::from_ints(c.query_ids, {c.batch, c.seq}).to(dev, stream);
    a.document_ids = &qdocs;
  }
  if (!c.key_ids.empty()) {
    kdocs = Tensor::from_ints(c.key_ids, {c.batch, c.kv_seq}).to(dev, stream);
    a.key_document_ids = &kdocs;
  }
  // NaN-poisoned: an element the kernel does not write fails the comparison.
  auto poisoned = [&](const Shape& shape, DType dtype) {
    return Tensor::from_floats(std::vector<float>(static_cast<size_t>(shape_numel(shape)),
                                                  std::numeric_limits<float>::quiet_NaN()),
                               shape, dtype)
        .to(dev, stream);
  };
  Tensor out = poisoned(q.shape(), act), lse = poisoned({c.batch, c.heads, c.seq}, DType::F32);
  Tensor dq = poisoned(q.shape(), act), dk = poisoned(k.shape(), act), dv = poisoned(v.shape(), act);
  bool ran = false;
  if (cuda) {
    EXPECT_TRUE(ops::needs_context_parallel_kernel(a));
#if MEGADLM_WITH_CUDA
    // The point of this suite: these calls run on the flash kernels, both directions.
    using ops::cuda::AttentionKernel;
    EXPECT_EQ(ops::cuda::context_parallel_attention_kernel(a, false), AttentionKernel::Flash);
    EXPECT_EQ(ops::cuda::context_parallel_attention_kernel(a, true), AttentionKernel::Flash);
    if (simple) {
      ops::cuda::attention_forward_with(AttentionKernel::Simple, q, k, v, out, lse, a, stream);
      ops::cuda::attention_backward_with(AttentionKernel::Simple, dout, q, k, v, out, lse, dq, dk,
                                         dv, a, stream);
      ran = true;
    }
#endif
  }
  if (!ran) {
    ops::attention_forward(q, k, v, out, lse, a, stream);
    ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, a, stream);
  }
  return {test::to_doubles(out, stream), test::to_doubles(lse, stream),
          test::to_doubles(dq, stream), test::to_doubles(dk, stream),
          test::to_doubles(dv, stream)};
}

/// Runs the case on the CPU, the public CUDA op (flash) and the simple kernels; returns the number
/// of query rows (over batch and heads) that see no key, for the caller's expectations.
int64_t check(const KeyBlockCase& c, uint64_t seed) {
  SCOPED_TRACE(c.name + " D=" + std::to_string(c.dim) + " Hq=" + std::to_string(c.heads) +
               " Hkv=" + std::to_string(c.kv_heads));
  const Stream cuda = Stream::create(Device::cuda(0));
  const Stream cpu = Stream::cpu();
  auto input = [&](int64_t rows, int64_t heads, uint64_t s, float lo, float hi) {
    return test::random_tensor({c.batch, rows, heads, c.dim}, s, DType::BF16, lo, hi)
        .to(Device::cpu(), DType::F32, cpu);
  };
  const Inputs in{input(c.seq, c.heads, seed, -2, 2), input(c.kv_seq, c.kv_heads, seed + 1, -2, 2),
                  input(c.kv_seq, c.kv_heads, seed + 2, -1, 1),
                  input(c.seq, c.heads, seed + 3, -1, 1)};
  const Result ref = run(c, in, cpu, false);
  int64_t empty_rows = 0;
  for (double l : ref.lse) empty_rows += std::isinf(l) ? 1 : 0;
  for (bool simple : {false, true}) {
    SCOPED_TRACE(simple ? "simple kernels" : "public op (flash kernels)");
    const Result got = run(c, in, cuda, simple);
    const double e_out = test::rel_l2(got.out, ref.out), e_lse = test::lse_max_abs_error(got.lse, ref.lse);
    const double e_dq = test::rel_l2(got.dq, ref.dq), e_dk = test::rel_l2(got.dk, ref.dk),
                 e_dv = test::rel_l2(got.dv, ref.dv);
    std::printf("[key block parity] %-28s D=%lld Hq=%lld Hkv=%lld %-6s out %.2e lse %.2e dq %.2e "
                "dk %.2e dv %.2e (%lld empty rows)\n",
                c.name.c_str(), static_cast<long long>(c.dim), static_cast<long long>(c.heads),
                static_cast<long long>(c.kv_heads), simple ? "simple" : "flash", e_out, e_lse,
                e_dq, e_dk, e_dv, static_cast<long long>(empty_rows));
    EXPECT_LT(e_out, test::kBf16ParityRelL2);
    EXPECT_LT(e_lse, test::kLseMaxAbs);
    // ContextParallelParity's gradient bound (1.5x the op bound: the gradients of a partial block
    // can be small next to their rounding).
    EXPECT_LT(e_dq, 1.5 * test::kBf16ParityRelL2);
    EXPECT_LT(e_dk, 1.5 * test::kBf16ParityRelL2);
    EXPECT_LT(e_dv, 1.5 * test::kBf16ParityRelL2);
    // A row that sees no key: out exactly 0 (attention_merge relies on it with lse -inf).
    const int64_t d = c.dim;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < c.seq; ++i) {
          if (!std::isinf(ref.lse[static_cast<size_t>((b * c.heads + h) * c.seq + i)])) continue;
          for (int64_t e = 0; e < d; ++e) {
            const double x = got.out[static_cast<size_t>(((b * c.seq + i) * c.heads + h) * d + e)];
            if (x != 0.0) {
              ADD_FAILURE() << "row b " << b << " h " << h << " i " << i
                            << " sees no key but out is " << x;
              b = c.batch, h = c.heads, i = c.seq, e = d;  // one report is enough
            }
          }
        }
  }
  return empty_rows;
}

/// The canvas's document ids of Fast-dLLM's cached decoding: row b is left-padded by pads[b]
/// columns (document 0) before its prompt and generation (document 1).
std::vector<int32_t> padded_rows(const std::vector<int64_t>& pads, int64_t columns, int64_t col0,
                                 int64_t col1) {
  std::vector<int32_t> ids;
  for (int64_t pad : pads)
    for (int64_t i = col0; i < col1; ++i) ids.push_back(i < pad ? 0 : 1);
  (void)columns;
  return ids;
}

/// Packed documents of `seq` tokens per row: lengths cycle through `lengths` (shifted per row),
/// ids from 10 with gaps of 2 (ids need not be consecutive).
std::vector<int32_t> packed(int64_t batch, int64_t seq, const std::vector<int>& lengths) {
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 10;
    size_t next = static_cast<size_t>(b);
    int64_t left = lengths[next % lengths.size()];
    for (int64_t i = 0; i < seq; ++i) {
      if (left-- == 0) {
        id += 2;
        left = lengths[++next % lengths.size()] - 1;
      }
      ids.push_back(id);
    }
  }
  return ids;
}

std::vector<int32_t> rows_at(const std::vector<int32_t>& all, int64_t batch, int64_t seq,
                             const cp::Split& split) {
  std::vector<int32_t> out;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < split.local_len(); ++i)
      out.push_back(all[static_cast<size_t>(b * seq + split.global(i))]);
  return out;
}

}  // namespace

TEST(AttentionKeyBlockParity, CachedDecodingWithoutDocumentsRunsFlash) {
  MDLM_REQUIRE_GPU();
  // 32 query columns against the 288-column canvas (9 key tiles at D = 128, 4.5 at D = 64).
  uint64_t seed = 300;
  for (int64_t dim : {128, 64})
    for (int64_t kv_heads : {4, 16})
      check({"cached, no documents", 3, 32, 288, 16, kv_heads, dim}, seed += 10);
}

TEST(AttentionKeyBlockParity, CachedDecodingWithPaddingDocumentsRunsFlash) {
  MDLM_REQUIRE_GPU();
  // Rows padded by 0, 37 and 150 columns; the query block is columns [128, 160), so row 2's
  // first 22 queries are padding (they see the padding keys only: a block of mixed documents),
  // the other rows' queries all see [pad, 288).
  const std::vector<int64_t> pads = {0, 37, 150};
  KeyBlockCase c{"cached, padding documents", 3, 32, 288, 16, 4, 128};
  c.query_ids = padded_rows(pads, 288, 128, 160);
  c.key_ids = padded_rows(pads, 288, 0, 288);
  uint64_t seed = 400;
  for (int64_t dim : {128, 64})
    for (int64_t kv_heads : {4, 16}) {
      c.dim = dim;
      c.kv_heads = kv_heads;
      EXPECT_EQ(check(c, seed += 10), 0);
    }
}

TEST(AttentionKeyBlockParity, ContextParallelShardBlocksRunFlash) {
  MDLM_REQUIRE_GPU();
  // 4 shards of 256-token rows (load-balanced: chunks of 32); documents of 1..45 tokens cross
  // every chunk boundary, and those inside one of the query shard's chunks have no key in another
  // shard: those rows see no key (out 0, lse -inf).
  const int64_t batch = 2, seq = 256;
  const std::vector<int32_t> ids = packed(batch, seq, {20, 45, 7, 1, 33, 12, 40, 26, 3});
  uint64_t seed = 500;
  int64_t empty = 0;
  for (int64_t dim : {128, 64})
    for (int r : {0, 2})
      for (int rk : {1, 3}) {
        const cp::Split queries{4, r, seq}, keys{4, rk, seq};
        KeyBlockCase c{"cp q " + std::to_string(r) + "/4 k " + std::to_string(rk) + "/4",
                       batch, queries.local_len(), keys.local_len(), 8, 2, dim};
        c.query_ids = rows_at(ids, batch, seq, queries);
        c.key_ids = rows_at(ids, batch, seq, keys);
        c.query_chunks = queries.chunks();
        c.key_chunks = keys.chunks();
        empty += check(c, seed += 10);
      }
  EXPECT_GT(empty, 0) << "the documents were meant to leave some query rows without a key";
}

TEST(AttentionKeyBlockParity, ContextParallelAllGatherBlocksRunFlash) {
  MDLM_REQUIRE_GPU();
  // Queries of one shard against the whole gathered sequence (kv_seq = S), with and without
  // packed documents; every query sees at least its own position.
  const int64_t batch = 2, seq = 256;
  const std::vector<int32_t> ids = packed(batch, seq, {20, 45, 7, 1, 33, 12, 40, 26, 3});
  uint64_t seed = 600;
  for (int64_t dim : {128, 64})
    for (bool docs : {false, true})
      for (int r : {0, 3}) {
        const cp::Split queries{4, r, seq};
        KeyBlockCase c{std::string("all_gather q ") + std::to_string(r) + "/4" +
                           (docs ? " docs" : ""),
                       batch, queries.local_len(), seq, 8, 4, dim};
        if (docs) {
          c.query_ids = rows_at(ids, batch, seq, queries);
          c.key_ids = ids;
        }
        c.query_chunks = queries.chunks();
        EXPECT_EQ(check(c, seed += 10), 0);
      }
}

TEST(AttentionKeyBlockParity, RowsWithoutAnyVisibleKeyGiveZeroAndMinusInfinity) {
  MDLM_REQUIRE_GPU();
  // Row 0: every query document is after every key document (the empty key range sits at
  // kv_seq, a multiple of both key tiles); row 1: before (the range sits at 0); row 2: queries of
  // documents 3 (no key) and 5 (keys 40..) in one query tile.
  const int64_t seq = 40, kv_seq = 128;
  KeyBlockCase c{"no visible key", 3, seq, kv_seq, 4, 2, 128};
  for (int64_t i = 0; i < seq; ++i) c.query_ids.push_back(9);
  for (int64_t i = 0; i < seq; ++i) c.query_ids.push_back(0);
  for (int64_t i = 0; i < seq; ++i) c.query_ids.push_back(i < 20 ? 3 : 5);
  for (int64_t j = 0; j < kv_seq; ++j) c.key_ids.push_back(static_cast<int32_t>(j / 40));
  for (int64_t j = 0; j < kv_seq; ++j) c.key_ids.push_back(7);
  for (int64_t j = 0; j < kv_seq; ++j) c.key_ids.push_back(j < 40 ? 1 : 5);
  uint64_t seed = 700;
  for (int64_t dim : {128, 64}) {
    c.dim = dim;
    // Rows 0 and 1 entirely, and row 2's first 20 queries, over 4 heads.
    EXPECT_EQ(check(c, seed += 10), 4 * (seq + seq + 20));
  }
}
