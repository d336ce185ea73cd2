// Unit tests of the context-parallel fields of the attention op (include/megadlm/ops/attention.h:
// kv_seq, query_chunks / key_chunks, key_document_ids) on the CPU reference: a shard of queries
// against another shard of keys (or against the whole sequence) matches the textbook formula
// written on global positions and global document ids, rows that see no key give (0, -inf),
// attention dropout drops what the unsplit call drops, the backward matches finite differences,
// and merging the blocks of every key shard (ops/attention_merge.h) gives full attention.
// Also the routing predicate that sends these calls to the simple CUDA kernels.
#include <gtest/gtest.h>
#include <cmath>
#include <limits>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/ops/attention_merge.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"
#include "ops/attention_dropout_mask.h"
#include "ops/cpu/cpu_ops.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;
using megadlm::cp::Split;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;

namespace {

constexpr int64_t kB = 2, kS = 8, kHq = 4, kHkv = 2, kD = 5;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// Packed documents of the two rows; documents cross the chunk boundaries of both splits.
const std::vector<int32_t> kDocs = {0, 0, 0, 1, 1, 1, 2, 2,  // row 0
                                    0, 0, 0, 0, 0, 1, 1, 1};  // row 1

/// The whole-sequence inputs [B, S, H, D] (f64), O(1) scores.
struct Full {
  Tensor q = test::random_tensor({kB, kS, kHq, kD}, 11, DType::F64, -1.5f, 1.5f);
  Tensor k = test::random_tensor({kB, kS, kHkv, kD}, 12, DType::F64, -1.5f, 1.5f);
  Tensor v = test::random_tensor({kB, kS, kHkv, kD}, 13, DType::F64);
};

/// Global positions of a block's rows: a shard of a split, or all of them (split of size 1).
std::vector<int64_t> positions(const Split& s) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < s.local_len(); ++i) p.push_back(s.global(i));
  return p;
}

/// Rows `pos` of every batch row of x [B, S, H, D].
Tensor rows_of(const Tensor& x, const std::vector<int64_t>& pos, int64_t heads) {
  const int64_t n = static_cast<int64_t>(pos.size()), w = heads * kD;
  Tensor out = Tensor::zeros({kB, n, heads, kD}, x.dtype(), Stream::cpu());
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < w; ++e)
        out.data<double>()[(b * n + i) * w + e] = x.data<double>()[(b * kS + pos[static_cast<size_t>(i)]) * w + e];
  return out;
}

Tensor docs_of(const std::vector<int64_t>& pos) {
  std::vector<int32_t> d;
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t p : pos) d.push_back(kDocs[static_cast<size_t>(b * kS + p)]);
  return Tensor::from_ints(d, {kB, static_cast<int64_t>(pos.size())});
}

struct Block {
  Split queries, keys;
  bool causal = false, documents = false;
  float dropout = 0.0f;
};

/// The op arguments of a block, plus the document tensors they point to.
struct BlockArgs {
  Tensor qdocs, kdocs;
  AttentionArgs a;
  explicit BlockArgs(const Block& blk) {
    const auto qp = positions(blk.queries), kp = positions(blk.keys);
    a = AttentionArgs{.batch = kB, .seq = static_cast<int64_t>(qp.size()), .num_heads = kHq,
                      .num_kv_heads = kHkv, .head_dim = kD,
                      .mask = blk.causal ? AttentionMask::Causal : AttentionMask::None,
                      .softmax_scale = static_cast<float>(1.0 / std::sqrt(double(kD))),
                      .dropout_p = blk.dropout, .dropout_seed = 99, .dropout_site = 4,
                      .sample_offset = 3, .head_offset = 2};
    a.kv_seq = static_cast<int64_t>(kp.size());
    a.query_chunks = blk.queries.chunks();
    a.key_chunks = blk.keys.chunks();
    if (blk.documents) {
      qdocs = docs_of(qp);
      kdocs = docs_of(kp);
      a.document_ids = &qdocs;
      a.key_document_ids = &kdocs;
    }
  }
};

/// The textbook formula on global coordinates: query at global position gq sees key gk iff same
/// document and (causal) gk <= gq; softmax over the block's visible keys; dropout keeps element
/// (gq, gk) iff the unsplit call (identity maps, all S rows) keeps it.
void naive_block(const Full& f, const Block& blk, std::vector<double>& out, std::vector<double>& lse) {
  const auto qp = positions(blk.queries), kp = positions(blk.keys);
  const BlockArgs ba(blk);
  AttentionArgs whole = ba.a;
  whole.seq = kS;
  whole.kv_seq = 0;
  whole.query_chunks = whole.key_chunks = {};
  const auto mask = ops::detail::AttentionDropoutMask::from_args(whole);
  const double scale = ba.a.softmax_scale;
  const int64_t nq = static_cast<int64_t>(qp.size());
  out.assign(static_cast<size_t>(kB * nq * kHq * kD), 0.0);
  lse.assign(static_cast<size_t>(kB * kHq * nq), kNegInf);
  const double* Q = f.q.data<double>();
  const double* K = f.k.data<double>();
  const double* V = f.v.data<double>();
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t h = 0; h < kHq; ++h) {
      const int64_t kh = h / (kHq / kHkv);
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t gq = qp[static_cast<size_t>(i)];
        std::vector<double> s;
        std::vector<int64_t> seen;
        for (int64_t gk : kp) {
          const bool same_doc = !blk.documents || kDocs[b * kS + gq] == kDocs[b * kS + gk];
          if (!same_doc || (blk.causal && gk > gq)) continue;
          double dot = 0;
          for (int64_t d = 0; d < kD; ++d)
            dot += Q[((b * kS + gq) * kHq + h) * kD + d] * K[((b * kS + gk) * kHkv + kh) * kD + d];
          s.push_back(dot * scale);
          seen.push_back(gk);
        }
        if (s.empty()) continue;  // (0, -inf)
        double z = 0;
        for (double x : s) z += std::exp(x);
        lse[(b * kHq + h) * nq + i] = std::log(z);
        for (size_t j = 0; j < s.size(); ++j) {
          double p = std::exp(s[j]) / z;
          if (blk.dropout > 0) p = mask.keep(b, h, gq, seen[j]) ? p / (1.0 - blk.dropout) : 0.0;
          for (int64_t d = 0; d < kD; ++d)
            out[((b * nq + i) * kHq + h) * kD + d] += p * V[((b * kS + seen[j]) * kHkv + kh) * kD + d];
        }
      }
    }
  }
}

struct Result {
  Tensor out, lse;
};

Result run_block(const Full& f, const Block& blk) {
  const BlockArgs ba(blk);
  const Tensor q = rows_of(f.q, positions(blk.queries), kHq);
  const Tensor k = rows_of(f.k, positions(blk.keys), kHkv);
  const Tensor v = rows_of(f.v, positions(blk.keys), kHkv);
  Result r{Tensor::zeros(q.shape(), DType::F64, Stream::cpu()),
           Tensor::zeros({kB, kHq, ba.a.seq}, DType::F64, Stream::cpu())};
  ops::cpu::attention_forward(q, k, v, r.out, r.lse, ba.a, Stream::cpu());
  return r;
}

std::vector<Block> blocks() {
  std::vector<Block> out;
  for (bool causal : {false, true})
    for (bool docs : {false, true}) {
      for (int r = 0; r < 2; ++r)
        for (int s = 0; s < 2; ++s) out.push_back({{2, r, kS}, {2, s, kS}, causal, docs});
      for (int r = 0; r < 4; ++r) out.push_back({{4, r, kS}, {1, 0, kS}, causal, docs});  // all keys
    }
  return out;
}

std::string name(const Block& b) {
  return "queries " + std::to_string(b.queries.rank) + "/" + std::to_string(b.queries.size) +
         " keys " + std::to_string(b.keys.rank) + "/" + std::to_string(b.keys.size) +
         (b.causal ? " causal" : "") + (b.documents ? " documents" : "") +
         (b.dropout > 0 ? " dropout" : "");
}

void expect_lse_equal(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) EXPECT_EQ(got[i], want[i]) << "row " << i;
    else EXPECT_NEAR(got[i], want[i], 1e-12) << "row " << i;
  }
}

}  // namespace

TEST(AttentionContextParallel, ShardAgainstShardMatchesTheGlobalFormula) {
  const Full f;
  for (Block blk : blocks()) {
    for (float p : {0.0f, 0.3f}) {
      blk.dropout = p;
      SCOPED_TRACE(name(blk));
      const Result r = run_block(f, blk);
      std::vector<double> out, lse;
      naive_block(f, blk, out, lse);
      EXPECT_LT(test::max_abs_diff(test::to_doubles(r.out), out), 1e-12);
      expect_lse_equal(test::to_doubles(r.lse), lse);
    }
  }
}

TEST(AttentionContextParallel, QueriesThatSeeNoKeyGetZeroAndMinusInfinity) {
  // Causal, queries of rank 0 of 2 (positions 0 1 | 6 7) against the keys of rank 1 (2 3 | 4 5):
  // positions 0 and 1 precede every key, 6 and 7 follow every one.
  const Full f;
  const Block blk{{2, 0, kS}, {2, 1, kS}, true, false};
  const Result r = run_block(f, blk);
  const auto lse = test::to_doubles(r.lse), out = test::to_doubles(r.out);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < kHq; ++h)
      for (int64_t i = 0; i < 4; ++i) {
        const double l = lse[(b * kHq + h) * 4 + i];
        if (i < 2) {
          EXPECT_EQ(l, kNegInf);
          for (int64_t d = 0; d < kD; ++d) EXPECT_EQ(out[((b * 4 + i) * kHq + h) * kD + d], 0.0);
        } else {
          EXPECT_TRUE(std::isfinite(l));
        }
      }
}

TEST(AttentionContextParallel, MergingEveryKeyShardGivesFullAttention) {
  const Full f;
  for (bool causal : {false, true}) {
    for (float p : {0.0f, 0.3f}) {
      for (int n : {2, 4}) {
        for (int r = 0; r < n; ++r) {
          const Split queries{n, r, kS};
          SCOPED_TRACE(std::to_string(r) + "/" + std::to_string(n) + (causal ? " causal" : ""));
          const int64_t nq = queries.local_len();
          Tensor acc = Tensor::zeros({kB, nq, kHq, kD}, DType::F64, Stream::cpu());
          Tensor acc_lse = Tensor::zeros({kB, kHq, nq}, DType::F64, Stream::cpu());
          ops::fill(acc_lse, -INFINITY, Stream::cpu());
          for (int s = 0; s < n; ++s) {  // the ring's order from this rank: r, r-1, ...
            const Block blk{queries, {n, (r - s + n) % n, kS}, causal, true, p};
            const Result part = run_block(f, blk);
            ops::attention_merge(acc, acc_lse, part.out, part.lse, {kB, nq, kHq, kD}, Stream::cpu());
          }
          std::vector<double> out, lse;
          naive_block(f, {queries, {1, 0, kS}, causal, true, p}, out, lse);
          EXPECT_LT(test::max_abs_diff(test::to_doubles(acc), out), 1e-12);
          expect_lse_equal(test::to_doubles(acc_lse), lse);
        }
      }
    }
  }
}

TEST(AttentionContextParallel, BackwardMatchesFiniteDifferences) {
  // Causal, documents and dropout: the ring's hardest block (rank 1's queries, rank 0's keys).
  const Full f;
  for (const Block& blk : {Block{{2, 1, kS}, {2, 0, kS}, true, true, 0.3f},
                           Block{{4, 2, kS}, {1, 0, kS}, true, true, 0.3f},
                           Block{{2, 0, kS}, {2, 1, kS}, false, true, 0.0f}}) {
    SCOPED_TRACE(name(blk));
    const BlockArgs ba(blk);
    Tensor q = rows_of(f.q, positions(blk.queries), kHq);
    Tensor k = rows_of(f.k, positions(blk.keys), kHkv);
    Tensor v = rows_of(f.v, positions(blk.keys), kHkv);
    const Tensor dout = test::random_tensor(q.shape(), 77, DType::F64);
    auto loss = [&] {
      Tensor out = Tensor::zeros(q.shape(), DType::F64, Stream::cpu());
      Tensor lse = Tensor::zeros({kB, kHq, ba.a.seq}, DType::F64, Stream::cpu());
      ops::cpu::attention_forward(q, k, v, out, lse, ba.a, Stream::cpu());
      return test::inner(dout, out);
    };
    Tensor out = Tensor::zeros(q.shape(), DType::F64, Stream::cpu());
    Tensor lse = Tensor::zeros({kB, kHq, ba.a.seq}, DType::F64, Stream::cpu());
    ops::cpu::attention_forward(q, k, v, out, lse, ba.a, Stream::cpu());
    Tensor dq = Tensor::zeros(q.shape(), DType::F64, Stream::cpu());
    Tensor dk = Tensor::zeros(k.shape(), DType::F64, Stream::cpu());
    Tensor dv = Tensor::zeros(v.shape(), DType::F64, Stream::cpu());
    ops::cpu::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, ba.a, Stream::cpu());
    EXPECT_LT(test::rel_l2(test::to_doubles(dq), test::finite_difference(q, loss)), test::kFiniteDiffRelTolF64);
    EXPECT_LT(test::rel_l2(test::to_doubles(dk), test::finite_difference(k, loss)), test::kFiniteDiffRelTolF64);
    EXPECT_LT(test::rel_l2(test::to_doubles(dv), test::finite_difference(v, loss)), test::kFiniteDiffRelTolF64);
  }
}

TEST(AttentionContextParallel, OnlyContextParallelBlocksLeaveTheFlashKernels) {
  const AttentionArgs plain{.batch = 1, .seq = 8, .num_heads = 2, .num_kv_heads = 2, .head_dim = 64,
                            .mask = AttentionMask::Causal, .softmax_scale = 0.125f};
  EXPECT_FALSE(ops::needs_context_parallel_kernel(plain));
  AttentionArgs a = plain;
  a.query_chunks = a.key_chunks = Split{2, 1, 16}.chunks();  // a ring's own block: local causal
  EXPECT_FALSE(ops::needs_context_parallel_kernel(a));
  a.dropout_p = 0.1f;  // dropout by global position needs the map
  EXPECT_TRUE(ops::needs_context_parallel_kernel(a));
  a = plain;
  a.key_chunks = Split{2, 0, 16}.chunks();  // causal between different shards
  EXPECT_TRUE(ops::needs_context_parallel_kernel(a));
  a.mask = AttentionMask::None;  // bidirectional: the maps change nothing
  EXPECT_FALSE(ops::needs_context_parallel_kernel(a));
  a.kv_seq = 16;  // all-gathered keys
  EXPECT_TRUE(ops::needs_context_parallel_kernel(a));
  a = plain;
  const Tensor docs = Tensor::from_ints(std::vector<int32_t>(8, 0), {1, 8});
  a.document_ids = &docs;
  EXPECT_FALSE(ops::needs_context_parallel_kernel(a));
  a.key_document_ids = &docs;
  EXPECT_TRUE(ops::needs_context_parallel_kernel(a));
}
