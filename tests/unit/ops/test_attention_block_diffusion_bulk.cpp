// Block diffusion attention as two causal bulks + strips (ops/attention_block_diffusion_bulk.h,
// docs/kernels/attention.md "Bulk and strips"), the proof on the CPU of the math the CUDA path
// runs:
//  - the pieces (the two causal bulks and the strip rule) cover every visible pair of one-document
//    rows exactly once and no invisible pair, and the totals match the visible-pair formulas;
//  - the strip's ranges (BlockDiffusionRow with strip = N, what the CUDA kernels read) equal the
//    strip rule pair by pair, with non-decreasing ends (what the flash tile plans rely on);
//  - the composition run with the CPU backend's ops (causal pieces, the strip, the lse merge;
//    the backward by pieces with the final out and lse, partials summed) equals the CPU
//    reference of the whole mask: out, lse, dq, dk, dv within fp32 rounding, both variants,
//    blocks 4 / 32 / 128, L = 256 .. 1024, GQA;
//  - the host detection of one-document rows.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>
#include "megadlm/ops/attention.h"
#include "ops/attention_block_diffusion.h"
#include "diffusion/block_rows.h"
#include "ops/attention_block_diffusion_bulk.h"
#include "support/op_testing.h"

using namespace megadlm;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;
using megadlm::ops::detail::BlockDiffusionBulkPiece;

namespace {

/// block_ranges [batch, 4, L] of rows holding one document each, in blocks of `block` (the last
/// one shorter when block does not divide L): the builder the block diffusion micro-batches use.
std::vector<int32_t> one_document_ranges(int64_t batch, int64_t L, int64_t block) {
  std::vector<int32_t> r(static_cast<size_t>(batch * 4 * L));
  for (int64_t b = 0; b < batch; ++b)
    megadlm::block_rows::set_document(r.data() + b * 4 * L, L, 0, L, block, [](int64_t, int64_t) {});
  return r;
}

bool in_piece(const BlockDiffusionBulkPiece& p, int64_t i, int64_t j) {
  const int64_t qi = i - p.q_row0, kj = j - p.k_row0;
  return qi >= 0 && qi < p.rows && kj >= 0 && kj < p.rows && kj <= qi;
}

struct CoverCase {
  int64_t L, block;
};

}  // namespace

TEST(BlockDiffusionBulk, PiecesCoverEveryVisiblePairOnce) {
  for (const CoverCase c : {CoverCase{8, 1}, {8, 2}, {8, 8}, {16, 4}, {64, 4}, {128, 32}, {256, 128},
                            {100, 7}, {96, 48}, {256, 256}}) {
    const std::vector<int32_t> r = one_document_ranges(1, c.L, c.block);
    const int64_t N = ops::block_diffusion_one_document_max_block(r.data(), 1, c.L);
    ASSERT_EQ(N, std::min(c.block, c.L));
    const auto pieces = ops::detail::block_diffusion_bulk_pieces(c.L, N);
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << "L=" << c.L << " block=" << c.block << (causal ? " causal" : ""));
      const int64_t S = 2 * c.L;
      int64_t visible = 0, bulk = 0, strip = 0, wrong = 0;
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j < S; ++j) {
          const bool vis = ops::block_diffusion_visible(r.data(), c.L, causal, i, j);
          int count = ops::block_diffusion_visible(r.data(), c.L, causal, i, j, N) ? 1 : 0;
          strip += count;
          for (const BlockDiffusionBulkPiece& p : pieces) {
            const int in = in_piece(p, i, j) ? 1 : 0;
            count += in;
            bulk += in;
          }
          visible += vis;
          if (count != (vis ? 1 : 0)) ++wrong;
        }
      }
      EXPECT_EQ(wrong, 0) << "pairs covered other than once / invisible pairs covered";
      EXPECT_EQ(bulk + strip, visible);
      if (c.L % c.block == 0) {  // docs/kernels/attention.md, "Visible pairs"
        const int64_t want = causal ? c.L * c.L + c.L * c.block / 2 + c.L / 2 : c.L * c.block + c.L * c.L;
        EXPECT_EQ(visible, want);
      }
      // The bulks are (L - N)(L - N + 1)/2 + (L - 1) L / 2 pairs; the strip the rest.
      const int64_t n1 = std::max<int64_t>(c.L - N, 0);
      EXPECT_EQ(bulk, n1 * (n1 + 1) / 2 + (c.L - 1) * c.L / 2);
      if (c.L == 128 && c.block == 32)
        std::printf("[bd bulk cover] L=%lld block=%lld %s: visible %lld = bulk %lld (%.1f%%) + strip %lld\n",
                    static_cast<long long>(c.L), static_cast<long long>(c.block), causal ? "causal" : "bd3",
                    static_cast<long long>(visible), static_cast<long long>(bulk), 100.0 * bulk / visible,
                    static_cast<long long>(strip));
    }
  }
}

TEST(BlockDiffusionBulk, StripRangesEqualTheStripRule) {
  for (const CoverCase c : {CoverCase{8, 2}, {64, 4}, {128, 32}, {256, 128}, {100, 7}, {384, 48}, {256, 256}}) {
    const std::vector<int32_t> r = one_document_ranges(1, c.L, c.block);
    const int N = static_cast<int>(ops::block_diffusion_one_document_max_block(r.data(), 1, c.L));
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << "L=" << c.L << " block=" << c.block << (causal ? " causal" : ""));
      const ops::detail::BlockDiffusionRow row{r.data(), static_cast<int>(c.L), causal, N};
      const int S = static_cast<int>(2 * c.L);
      int64_t wrong_keys = 0, wrong_queries = 0, wrong_rule = 0, not_monotone = 0, no_own_key = 0;
      int prev_k[2][2][2] = {}, prev_q[2][2][2] = {};  // [half][range][lo/hi]
      for (int x = 0; x < S; ++x) {
        int klo[2], khi[2], qlo[2], qhi[2];
        row.keys_of(x, klo, khi);
        row.queries_of(x, qlo, qhi);
        const int h = x < c.L ? 0 : 1;
        const bool first_of_half = x == 0 || x == c.L;
        for (int s = 0; s < 2; ++s) {
          if (!first_of_half && (klo[s] < prev_k[h][s][0] || khi[s] < prev_k[h][s][1] ||
                                 qlo[s] < prev_q[h][s][0] || qhi[s] < prev_q[h][s][1]))
            ++not_monotone;
          prev_k[h][s][0] = klo[s], prev_k[h][s][1] = khi[s];
          prev_q[h][s][0] = qlo[s], prev_q[h][s][1] = qhi[s];
        }
        const auto in = [](int y, const int(&lo)[2], const int(&hi)[2]) {
          return (lo[0] <= y && y < hi[0]) || (lo[1] <= y && y < hi[1]);
        };
        if (!in(x, klo, khi)) ++no_own_key;
        for (int y = 0; y < S; ++y) {
          const bool want = ops::block_diffusion_visible(r.data(), c.L, causal, x, y, N);
          if (in(y, klo, khi) != want) ++wrong_keys;
          if (in(y, qlo, qhi) != ops::block_diffusion_visible(r.data(), c.L, causal, y, x, N)) ++wrong_queries;
          if (row.visible(x, y) != want) ++wrong_rule;
        }
      }
      EXPECT_EQ(wrong_keys, 0);
      EXPECT_EQ(wrong_queries, 0);
      EXPECT_EQ(wrong_rule, 0);
      EXPECT_EQ(not_monotone, 0);
      EXPECT_EQ(no_own_key, 0) << "a strip row without its own key (the flash kernels divide by l)";
    }
  }
}

TEST(BlockDiffusionBulk, DetectsOneDocumentRows) {
  const int64_t L = 64;
  std::vector<int32_t> r = one_document_ranges(2, L, 16);
  EXPECT_EQ(ops::block_diffusion_one_document_max_block(r.data(), 2, L), 16);
  r = one_document_ranges(1, 100, 7);
  EXPECT_EQ(ops::block_diffusion_one_document_max_block(r.data(), 1, 100), 7);
  // Two documents in the second row: no promise.
  r = one_document_ranges(2, L, 16);
  int32_t* row = r.data() + 4 * L;
  for (int64_t p = 0; p < L; ++p) {
    const int64_t ds = p < 40 ? 0 : 40, de = p < 40 ? 40 : L, bs = ds + (p - ds) / 16 * 16;
    row[p] = static_cast<int32_t>(ds);
    row[L + p] = static_cast<int32_t>(de);
    row[2 * L + p] = static_cast<int32_t>(bs);
    row[3 * L + p] = static_cast<int32_t>(std::min(bs + 16, de));
  }
  EXPECT_EQ(ops::block_diffusion_one_document_max_block(r.data(), 2, L), 0);
}

namespace {

Tensor poisoned(const Shape& shape, DType dtype) {
  return Tensor::from_floats(std::vector<float>(static_cast<size_t>(shape_numel(shape)),
                                                std::numeric_limits<float>::quiet_NaN()),
                             shape, dtype);
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST(BlockDiffusionBulk, CompositionEqualsTheWholeMaskOnCpu) {
  struct Case {
    int64_t L, block;
  };
  const int64_t B = 2, H = 4, Hkv = 2, D = 16;
  for (const Case c : {Case{256, 4}, Case{256, 32}, Case{256, 128}, Case{512, 32}, Case{1024, 4},
                       Case{1024, 128}, Case{100, 7}}) {
    const int64_t S = 2 * c.L;
    const std::vector<int32_t> ranges = one_document_ranges(B, c.L, c.block);
    const Tensor r = Tensor::from_ints(ranges, {B, 4, c.L});
    const uint64_t seed = static_cast<uint64_t>(c.L * 131 + c.block);
    const Tensor q = test::random_tensor({B, S, H, D}, seed + 1, DType::F32, -1.5f, 1.5f);
    const Tensor k = test::random_tensor({B, S, Hkv, D}, seed + 2, DType::F32, -1.5f, 1.5f);
    const Tensor v = test::random_tensor({B, S, Hkv, D}, seed + 3, DType::F32);
    const Tensor dout = test::random_tensor({B, S, H, D}, seed + 4, DType::F32);
    for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
      SCOPED_TRACE(testing::Message() << "L=" << c.L << " block=" << c.block
                                      << (mask == AttentionMask::BlockDiffusionCausal ? " causal" : ""));
      AttentionArgs a{.batch = B, .seq = S, .num_heads = H, .num_kv_heads = Hkv, .head_dim = D,
                      .mask = mask, .softmax_scale = 0.25f};
      a.block_ranges = &r;
      // The reference: the whole mask in one call.
      Tensor out = poisoned({B, S, H, D}, DType::F32), lse = poisoned({B, H, S}, DType::F32);
      ops::attention_forward(q, k, v, out, lse, a, Stream::cpu());
      Tensor dq = poisoned({B, S, H, D}, DType::F32), dk = poisoned({B, S, Hkv, D}, DType::F32),
             dv = poisoned({B, S, Hkv, D}, DType::F32);
      ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, a, Stream::cpu());
      // The composition.
      AttentionArgs ac = a;
      ac.block_diffusion_max_block = ops::block_diffusion_one_document_max_block(ranges.data(), B, c.L);
      ASSERT_EQ(ac.block_diffusion_max_block, std::min(c.block, c.L));
      Tensor out2 = poisoned({B, S, H, D}, DType::F32), lse2 = poisoned({B, H, S}, DType::F32);
      ops::detail::block_diffusion_bulk_forward(q, k, v, out2, lse2, ac, Stream::cpu());
      Tensor dq2 = poisoned({B, S, H, D}, DType::F32), dk2 = poisoned({B, S, Hkv, D}, DType::F32),
             dv2 = poisoned({B, S, Hkv, D}, DType::F32);
      ops::detail::block_diffusion_bulk_backward(dout, q, k, v, out2, lse2, dq2, dk2, dv2, ac, Stream::cpu());
      // Relative to each output's largest entry: fp32 rounding of a different summation order.
      const auto err = [](const Tensor& x, const Tensor& y) {
        const std::vector<double> a = test::to_doubles(x), b = test::to_doubles(y);
        return test::max_abs_diff(a, b) / std::max(max_abs(b), 1e-30);
      };
      const double e_out = err(out2, out), e_lse = err(lse2, lse), e_dq = err(dq2, dq), e_dk = err(dk2, dk),
                   e_dv = err(dv2, dv);
      std::printf("[bd bulk cpu] L=%lld block=%lld %s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                  static_cast<long long>(c.L), static_cast<long long>(c.block),
                  mask == AttentionMask::BlockDiffusionCausal ? "causal" : "bd3", e_out, e_lse, e_dq, e_dk, e_dv);
      EXPECT_LT(e_out, 2e-6);
      EXPECT_LT(e_lse, 2e-6);
      EXPECT_LT(e_dq, 2e-5);
      EXPECT_LT(e_dk, 2e-5);
      EXPECT_LT(e_dv, 2e-5);
      // The pieces alone are not the answer: the strip without the bulks is far from it.
      Tensor out3 = poisoned({B, S, H, D}, DType::F32), lse3 = poisoned({B, H, S}, DType::F32);
      ops::attention_forward(q, k, v, out3, lse3, ops::detail::block_diffusion_strip_args(ac), Stream::cpu());
      EXPECT_GT(err(out3, out), 1e-2);
    }
  }
}

TEST(BlockDiffusionBulk, RejectsAStripWithoutItsBlockSize) {
  const int64_t B = 1, L = 8, S = 16, H = 2, D = 4;
  const Tensor r = Tensor::from_ints(one_document_ranges(B, L, 4), {B, 4, L});
  const Tensor q = test::random_tensor({B, S, H, D}, 1), k = test::random_tensor({B, S, H, D}, 2),
               v = test::random_tensor({B, S, H, D}, 3);
  Tensor out = Tensor::empty({B, S, H, D}, DType::F32, Stream::cpu()),
         lse = Tensor::empty({B, H, S}, DType::F32, Stream::cpu());
  AttentionArgs a{.batch = B, .seq = S, .num_heads = H, .num_kv_heads = H, .head_dim = D,
                  .mask = AttentionMask::BlockDiffusion, .softmax_scale = 0.5f};
  a.block_ranges = &r;
  a.block_diffusion_strip = true;
  EXPECT_THROW(ops::attention_forward(q, k, v, out, lse, a, Stream::cpu()), Error);
  a.block_diffusion_strip = false;
  a.block_diffusion_max_block = 4;
  a.mask = AttentionMask::None;
  a.block_ranges = nullptr;
  EXPECT_THROW(ops::attention_forward(q, k, v, out, lse, a, Stream::cpu()), Error);
}
