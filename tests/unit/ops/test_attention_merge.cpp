// Unit tests of the attention merge (include/megadlm/ops/attention_merge.h) against its formula
// with hand-picked numbers, the -inf rules (an empty block changes nothing, an empty running
// result takes the block), and f32 vs f64 agreement. Its use in the ring (merging every key
// shard gives full attention) is tested in test_attention_context_parallel.cpp.
#include <gtest/gtest.h>
#include <cmath>
#include <limits>
#include <vector>
#include "megadlm/ops/attention_merge.h"
#include "support/op_testing.h"

using namespace megadlm;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor f64(const std::vector<double>& v, const Shape& shape) {
  Tensor t = Tensor::zeros(shape, DType::F64, Stream::cpu());
  for (size_t i = 0; i < v.size(); ++i) t.data<double>()[i] = v[i];
  return t;
}

}  // namespace

TEST(AttentionMerge, WeightsTheTwoResultsByTheirShareOfTheSum) {
  // One row, D = 2: sums of exp are 2 and 6, so the union has 8 and the weights are 1/4, 3/4.
  Tensor out = f64({1.0, -2.0}, {1, 1, 1, 2});
  Tensor lse = f64({std::log(2.0)}, {1, 1, 1});
  const Tensor block = f64({5.0, 2.0}, {1, 1, 1, 2});
  const Tensor block_lse = f64({std::log(6.0)}, {1, 1, 1});
  ops::attention_merge(out, lse, block, block_lse, {1, 1, 1, 2}, Stream::cpu());
  EXPECT_NEAR(out.data<double>()[0], 0.25 * 1.0 + 0.75 * 5.0, 1e-15);
  EXPECT_NEAR(out.data<double>()[1], 0.25 * -2.0 + 0.75 * 2.0, 1e-15);
  EXPECT_NEAR(lse.data<double>()[0], std::log(8.0), 1e-15);
}

TEST(AttentionMerge, LargeLogSumExpsDoNotOverflow) {
  // exp(800) overflows a double; the max-shifted form does not.
  Tensor out = f64({1.0}, {1, 1, 1, 1});
  Tensor lse = f64({800.0}, {1, 1, 1});
  ops::attention_merge(out, lse, f64({3.0}, {1, 1, 1, 1}), f64({800.0}, {1, 1, 1}), {1, 1, 1, 1},
                       Stream::cpu());
  EXPECT_NEAR(out.data<double>()[0], 2.0, 1e-12);
  EXPECT_NEAR(lse.data<double>()[0], 800.0 + std::log(2.0), 1e-12);
}

TEST(AttentionMerge, RowsThatSawNoKeyFollowTheMinusInfinityRules) {
  // Rows (b=0, h=0, i=0..2), D = 1: running -inf + block finite -> the block; running finite +
  // block -inf -> unchanged; both -inf -> unchanged (0, -inf).
  Tensor out = f64({0.0, 4.0, 0.0}, {1, 3, 1, 1});
  Tensor lse = f64({-kInf, 1.5, -kInf}, {1, 1, 3});
  const Tensor block = f64({7.0, 9.0, 0.0}, {1, 3, 1, 1});
  const Tensor block_lse = f64({0.25, -kInf, -kInf}, {1, 1, 3});
  ops::attention_merge(out, lse, block, block_lse, {1, 3, 1, 1}, Stream::cpu());
  EXPECT_EQ(test::to_doubles(out), (std::vector<double>{7.0, 4.0, 0.0}));
  EXPECT_EQ(lse.data<double>()[0], 0.25);
  EXPECT_EQ(lse.data<double>()[1], 1.5);
  EXPECT_EQ(lse.data<double>()[2], -kInf);
}

TEST(AttentionMerge, LayoutsFollowTheAttentionOp) {
  // B = 2, S = 3, Hq = 2, D = 4: out [B, S, Hq, D], lse [B, Hq, S]. Each row merged by hand.
  const ops::AttentionMergeArgs a{2, 3, 2, 4};
  const int64_t n = 2 * 3 * 2 * 4, rows = 2 * 2 * 3;
  const Tensor o0 = test::random_tensor({n}, 1, DType::F64), o1 = test::random_tensor({n}, 2, DType::F64);
  const Tensor l0 = test::random_tensor({rows}, 3, DType::F64, -2, 2);
  const Tensor l1 = test::random_tensor({rows}, 4, DType::F64, -2, 2);
  Tensor out = f64(test::to_doubles(o0), {n});
  Tensor lse = f64(test::to_doubles(l0), {rows});
  ops::attention_merge(out, lse, o1, l1, a, Stream::cpu());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t st = (b * 2 + h) * 3 + i;
        const double x = l0.data<double>()[st], y = l1.data<double>()[st];
        const double m = std::log(std::exp(x) + std::exp(y));
        EXPECT_NEAR(lse.data<double>()[st], m, 1e-14);
        for (int64_t d = 0; d < 4; ++d) {
          const int64_t e = ((b * 3 + i) * 2 + h) * 4 + d;
          EXPECT_NEAR(out.data<double>()[e],
                      std::exp(x - m) * o0.data<double>()[e] + std::exp(y - m) * o1.data<double>()[e],
                      1e-14);
        }
      }
}

TEST(AttentionMerge, RejectsMismatchedShapes) {
  Tensor out = Tensor::zeros({8}, DType::F32, Stream::cpu());
  Tensor lse = Tensor::zeros({2}, DType::F32, Stream::cpu());
  const Tensor block = Tensor::zeros({6}, DType::F32, Stream::cpu());
  EXPECT_THROW(ops::attention_merge(out, lse, block, lse, {1, 2, 1, 4}, Stream::cpu()), Error);
}

TEST(AttentionMerge, MergesIntoARowWindowOfALargerOutput) {
  // Block diffusion's composed path merges a bulk of S = 3 rows into rows [2, 5) of a batch row
  // of S_out = 6 (out_seq, out_row0): the same as merging the copied rows, and the other rows of
  // out and lse untouched. B = 2, Hq = 2, D = 4.
  const int64_t B = 2, S = 3, So = 6, H = 2, D = 4, row0 = 2;
  const Tensor o0 = test::random_tensor({B * So * H * D}, 5, DType::F64);
  const Tensor l0 = test::random_tensor({B * H * So}, 6, DType::F64, -2, 2);
  const Tensor o1 = test::random_tensor({B * S * H * D}, 7, DType::F64);
  const Tensor l1 = test::random_tensor({B * H * S}, 8, DType::F64, -2, 2);
  Tensor out = f64(test::to_doubles(o0), {B * So * H * D}), lse = f64(test::to_doubles(l0), {B * H * So});
  ops::attention_merge(out, lse, o1, l1,
                       {.batch = B, .seq = S, .num_heads = H, .head_dim = D, .out_seq = So, .out_row0 = row0},
                       Stream::cpu());
  // The reference: the window's rows copied out, merged with the plain layout.
  std::vector<double> wo(static_cast<size_t>(B * S * H * D)), wl(static_cast<size_t>(B * H * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t h = 0; h < H; ++h) {
        wl[static_cast<size_t>((b * H + h) * S + i)] = l0.data<double>()[(b * H + h) * So + row0 + i];
        for (int64_t d = 0; d < D; ++d)
          wo[static_cast<size_t>(((b * S + i) * H + h) * D + d)] = o0.data<double>()[((b * So + row0 + i) * H + h) * D + d];
      }
  Tensor ref_o = f64(wo, {B * S * H * D}), ref_l = f64(wl, {B * H * S});
  ops::attention_merge(ref_o, ref_l, o1, l1, {B, S, H, D}, Stream::cpu());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < So; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const bool inside = r >= row0 && r < row0 + S;
        const int64_t st = (b * H + h) * So + r;
        EXPECT_EQ(lse.data<double>()[st],
                  inside ? ref_l.data<double>()[(b * H + h) * S + r - row0] : l0.data<double>()[st])
            << "b " << b << " row " << r << " h " << h;
        for (int64_t d = 0; d < D; ++d) {
          const int64_t e = ((b * So + r) * H + h) * D + d;
          EXPECT_EQ(out.data<double>()[e],
                    inside ? ref_o.data<double>()[((b * S + r - row0) * H + h) * D + d] : o0.data<double>()[e])
              << "b " << b << " row " << r << " h " << h << " d " << d;
        }
      }
  // A window past the end of the rows is refused.
  EXPECT_THROW(ops::attention_merge(out, lse, o1, l1,
                                    {.batch = B, .seq = S, .num_heads = H, .head_dim = D, .out_seq = So,
                                     .out_row0 = 4},
                                    Stream::cpu()),
               Error);
}
