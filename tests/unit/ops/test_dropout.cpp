// Dropout keyed by global coordinates: the documented counter layout (checked against Philox
// directly), keep rate, scaling, determinism, layout invariance (row, position and column splits,
// context-parallel chunk maps), the exact p = 0 path, and backward as the same mask.
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/core/philox.h"
#include "megadlm/ops/dropout.h"
#include "ops/dropout_mask.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

/// The rule of include/megadlm/ops/dropout.h written out independently of ops/dropout_mask.h.
bool spec_keep(uint64_t seed, uint32_t site, float p, int64_t sample, int64_t position,
               int64_t column) {
  const PhiloxKey key = PhiloxKey::make(seed, RngPurpose::HiddenDropout);
  const PhiloxWords w = philox(key, static_cast<uint32_t>(column / 4),
                               static_cast<uint32_t>(position), static_cast<uint32_t>(sample), site);
  return uniform_from_u32(w.w[column % 4]) >= p;
}

/// out = dropout(ones) over zeros: mask / (1 - p), as doubles.
std::vector<double> mask_of(int64_t rows, int64_t cols, const ops::DropoutArgs& args) {
  Stream s = Stream::cpu();
  Tensor x = Tensor::from_floats(std::vector<float>(static_cast<size_t>(rows * cols), 1.0f), {rows, cols});
  Tensor zero = Tensor::zeros({rows, cols}, DType::F32, s);
  Tensor out = Tensor::empty({rows, cols}, DType::F32, s);
  ops::dropout_add_forward(x, zero, out, args, s);
  return test::to_doubles(out);
}

}  // namespace

TEST(Dropout, FollowsTheDocumentedCounterLayout) {
  const ops::DropoutArgs args{.p = 0.5f, .seed = 1234, .site = 3, .seq_len = 8,
                              .sample_offset = 2, .position_offset = 4, .column_offset = 64};
  const int64_t rows = 16, cols = 6;
  const std::vector<double> out = mask_of(rows, cols, args);
  int kept = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const bool keep = spec_keep(args.seed, args.site, args.p, 2 + r / 8, 4 + r % 8, 64 + c);
      EXPECT_EQ(out[static_cast<size_t>(r * cols + c)], keep ? 2.0 : 0.0) << r << ", " << c;
      kept += keep;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, rows * cols);
  // The worked example of ops/dropout_mask.h: element (9, 5) -> counter {17, 5, 3, site}, word 1.
  const PhiloxWords w = philox(PhiloxKey::make(1234, RngPurpose::HiddenDropout), 17, 5, 3, 3);
  const auto mask = ops::detail::DropoutMask::from_args(args);
  EXPECT_EQ(mask.keep(9, 5), uniform_from_u32(w.w[1]) >= 0.5f);
  EXPECT_EQ(out[9 * cols + 5], mask.keep(9, 5) ? 2.0 : 0.0);
}

TEST(Dropout, KeepsAFractionOneMinusPOfTheElements) {
  const float p = 0.3f;
  const int64_t rows = 64, cols = 1024;
  const std::vector<double> out = mask_of(rows, cols, {.p = p, .seed = 7, .seq_len = 16});
  int64_t kept = 0;
  for (double v : out) kept += v != 0.0;
  const double n = static_cast<double>(rows * cols);
  // Binomial standard deviation of the kept fraction: sqrt(p (1-p) / n) ~ 1.8e-3; allow 5 sigma.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 5 * std::sqrt(p * (1 - p) / n));
}

TEST(Dropout, ScalesKeptValuesByOneOverOneMinusP) {
  Stream s = Stream::cpu();
  const ops::DropoutArgs args{.p = 0.25f, .seed = 11, .site = 1, .seq_len = 4};
  Tensor x = test::random_tensor({8, 10}, 1, DType::F64);
  Tensor res = test::random_tensor({8, 10}, 2, DType::F64);
  Tensor out = Tensor::empty({8, 10}, DType::F64, s);
  ops::dropout_add_forward(x, res, out, args, s);
  const std::vector<double> xv = test::to_doubles(x), rv = test::to_doubles(res),
                            ov = test::to_doubles(out);
  int kept = 0, dropped = 0;
  for (size_t i = 0; i < ov.size(); ++i) {
    if (ov[i] == rv[i]) {
      ++dropped;
    } else {
      ++kept;
      EXPECT_NEAR(ov[i] - rv[i], xv[i] / 0.75, 1e-15) << i;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(dropped, 0);
}

TEST(Dropout, ZeroProbabilityIsAnExactAddAndCopy) {
  Stream s = Stream::cpu();
  Tensor x = test::random_tensor({6, 9}, 3), res = test::random_tensor({6, 9}, 4);
  Tensor out = Tensor::empty({6, 9}, DType::F32, s);
  ops::dropout_add_forward(x, res, out, {.p = 0.0f, .seed = 5, .seq_len = 3}, s);
  const std::vector<float> xv = x.to_floats(s), rv = res.to_floats(s), ov = out.to_floats(s);
  for (size_t i = 0; i < ov.size(); ++i) EXPECT_EQ(ov[i], rv[i] + xv[i]);
  Tensor dx = Tensor::empty({6, 9}, DType::F32, s);
  ops::dropout_backward(x, dx, {.p = 0.0f, .seed = 5, .seq_len = 3}, s);
  EXPECT_EQ(dx.to_floats(s), xv);
}

TEST(Dropout, IsDeterministicAndChangesWithSeedOrSite) {
  const ops::DropoutArgs args{.p = 0.5f, .seed = 99, .site = 4, .seq_len = 8};
  const std::vector<double> a = mask_of(16, 32, args), b = mask_of(16, 32, args);
  EXPECT_EQ(a, b);
  ops::DropoutArgs other_seed = args, other_site = args;
  other_seed.seed = 100;
  other_site.site = 5;
  auto differing = [&](const std::vector<double>& c) {
    int n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != c[i];
    return n;
  };
  // Independent masks with p = 0.5 differ on about half of the 512 elements.
  EXPECT_GT(differing(mask_of(16, 32, other_seed)), 150);
  EXPECT_GT(differing(mask_of(16, 32, other_site)), 150);
}

// The promise of docs/architecture.md: an element is dropped or kept whichever rank holds it. The full
// tensor is 2 samples x 8 positions x 12 columns; each split below is one way a parallel layout
// (data parallel rows, context parallel positions, tensor parallel columns) cuts it.
TEST(Dropout, MaskIsTheSameHoweverRowsPositionsOrColumnsAreSplit) {
  const int64_t samples = 2, seq = 8, cols = 12;
  ops::DropoutArgs full{.p = 0.4f, .seed = 2024, .site = 6, .seq_len = seq, .sample_offset = 5};
  const std::vector<double> ref = mask_of(samples * seq, cols, full);
  auto at = [&](int64_t sample, int64_t pos, int64_t col) {
    return ref[static_cast<size_t>((sample * seq + pos) * cols + col)];
  };

  // One sample per call: rows [8, 16) are sample 6.
  ops::DropoutArgs second = full;
  second.sample_offset = 6;
  const std::vector<double> half = mask_of(seq, cols, second);
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(half[static_cast<size_t>(p * cols + c)], at(1, p, c)) << p << ", " << c;

  // Positions [4, 8) of both samples, as a context-parallel rank holds them.
  ops::DropoutArgs chunk = full;
  chunk.seq_len = 4;
  chunk.position_offset = 4;
  const std::vector<double> cp = mask_of(samples * 4, cols, chunk);
  for (int64_t b = 0; b < samples; ++b)
    for (int64_t p = 0; p < 4; ++p)
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_EQ(cp[static_cast<size_t>((b * 4 + p) * cols + c)], at(b, 4 + p, c));

  // Columns [6, 12), an offset that is not a multiple of the four columns one Philox call serves.
  ops::DropoutArgs tp = full;
  tp.column_offset = 6;
  const std::vector<double> right = mask_of(samples * seq, 6, tp);
  for (int64_t r = 0; r < samples * seq; ++r)
    for (int64_t c = 0; c < 6; ++c)
      EXPECT_EQ(right[static_cast<size_t>(r * 6 + c)], at(r / seq, r % seq, 6 + c));
}

TEST(Dropout, BackwardRegeneratesTheForwardMask) {
  Stream s = Stream::cpu();
  const ops::DropoutArgs args{.p = 0.2f, .seed = 3, .site = 2, .seq_len = 5, .sample_offset = 9,
                              .position_offset = 1, .column_offset = 3};
  const std::vector<double> forward = mask_of(10, 7, args);
  Tensor ones = Tensor::from_floats(std::vector<float>(70, 1.0f), {10, 7});
  Tensor dx = Tensor::empty({10, 7}, DType::F32, s);
  ops::dropout_backward(ones, dx, args, s);
  EXPECT_EQ(test::to_doubles(dx), forward);
}

TEST(Dropout, BackwardMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  const ops::DropoutArgs args{.p = 0.3f, .seed = 8, .site = 0, .seq_len = 3};
  Tensor x = test::random_tensor({6, 5}, 5, DType::F64);
  Tensor res = test::random_tensor({6, 5}, 6, DType::F64);
  Tensor dy = test::random_tensor({6, 5}, 7, DType::F64);
  Tensor out = Tensor::empty({6, 5}, DType::F64, s);
  auto loss = [&] {
    ops::dropout_add_forward(x, res, out, args, s);
    return test::inner(dy, out);
  };
  Tensor dx = Tensor::empty({6, 5}, DType::F64, s);
  ops::dropout_backward(dy, dx, args, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
  // The residual's gradient is dy itself.
  EXPECT_LT(test::rel_l2(test::to_doubles(dy), test::finite_difference(res, loss)),
            test::kFiniteDiffRelTolF64);
}

TEST(Dropout, ContextParallelShardsDropWhatTheWholeSequenceDrops) {
  // Two samples of 8 positions; CP rank 1 of 2 holds positions 2..5 of each (chunks 1 and 2).
  // Its 8 local rows, with the chunk map, drop exactly the elements of those global rows.
  const ops::DropoutArgs whole{.p = 0.5f, .seed = 77, .site = 2, .seq_len = 8, .sample_offset = 4};
  const int64_t cols = 12;
  const std::vector<double> full = mask_of(16, cols, whole);
  ops::DropoutArgs shard = whole;
  shard.seq_len = 4;
  shard.chunks = ops::ChunkMap{2, 1, 2};
  // With SP on top the rows are cut again: rows 4.. of the shard are row_offset 4.
  for (int64_t row_offset : {0, 4}) {
    shard.row_offset = row_offset;
    const int64_t rows = 8 - row_offset;
    const std::vector<double> local = mask_of(rows, cols, shard);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t g = row_offset + r;                    // row of the shard
      const int64_t full_row = (g / 4) * 8 + 2 + g % 4;  // sample g / 4, position 2 + g % 4
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_EQ(local[static_cast<size_t>(r * cols + c)], full[static_cast<size_t>(full_row * cols + c)])
            << "shard row " << g << ", column " << c;
    }
  }
}
