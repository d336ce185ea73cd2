// RMSNorm and LayerNorm: closed-form forward checks, f64 finite-difference gradients for x, weight
// and bias, and the accumulation contract (dx written, dweight/dbias added).
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/norm.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

Tensor filled(const Shape& shape, DType dtype, float value) {
  Tensor t = Tensor::empty(shape, dtype, Stream::cpu());
  ops::fill(t, value, Stream::cpu());
  return t;
}

}  // namespace

TEST(RmsNorm, ForwardOfAConstantRowIsTheWeightScaledByItsRms) {
  Stream s = Stream::cpu();
  const float eps = 1e-5f;
  Tensor x = Tensor::from_floats({2, 2, 2, 2, -3, -3, -3, -3}, {2, 4}, DType::F64);
  Tensor w = Tensor::from_floats({1, 2, 3, 4}, {4}, DType::F64);
  Tensor y = Tensor::empty({2, 4}, DType::F64, s);
  Tensor rstd = Tensor::empty({2}, DType::F32, s);
  ops::rms_norm_forward(x, w, y, rstd, eps, s);
  const std::vector<double> yv = test::to_doubles(y), rv = test::to_doubles(rstd);
  for (int r = 0; r < 2; ++r) {
    const double c = r == 0 ? 2.0 : -3.0;
    const double inv = 1.0 / std::sqrt(c * c + static_cast<double>(eps));
    EXPECT_FLOAT_EQ(rv[static_cast<size_t>(r)], inv);
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(yv[static_cast<size_t>(r * 4 + j)], c * inv * (j + 1), 1e-14);
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  const int64_t rows = 3, cols = 8;
  Tensor x = test::random_tensor({rows, cols}, 1, DType::F64, -2.0f, 2.0f);
  Tensor w = test::random_tensor({cols}, 2, DType::F64, 0.5f, 1.5f);
  Tensor dy = test::random_tensor({rows, cols}, 3, DType::F64);
  Tensor y = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor rstd = Tensor::empty({rows}, DType::F64, s);
  auto loss = [&] {
    ops::rms_norm_forward(x, w, y, rstd, 1e-5f, s);
    return test::inner(dy, y);
  };
  loss();
  Tensor dx = filled({rows, cols}, DType::F64, 1e30f);  // written, so the garbage must vanish
  Tensor dw = Tensor::zeros({cols}, DType::F64, s);
  ops::rms_norm_backward(dy, x, w, rstd, dx, dw, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), test::finite_difference(w, loss)),
            test::kFiniteDiffRelTolF64);
}

// The production layout: f32 statistics and main grad next to the activations. With f64
// activations the only error is the f32 rounding of rstd (relative 6e-8, cubed in dx: < 2e-7).
TEST(RmsNorm, BackwardWithF32StatisticsAndMainGradMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  const int64_t rows = 4, cols = 6;
  Tensor x = test::random_tensor({rows, cols}, 4, DType::F64, -2.0f, 2.0f);
  Tensor w = test::random_tensor({cols}, 5, DType::F64, 0.5f, 1.5f);
  Tensor dy = test::random_tensor({rows, cols}, 6, DType::F64);
  Tensor y = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor rstd = Tensor::empty({rows}, DType::F32, s);
  auto loss = [&] {
    ops::rms_norm_forward(x, w, y, rstd, 1e-6f, s);
    return test::inner(dy, y);
  };
  loss();
  Tensor dx = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor dw = Tensor::zeros({cols}, DType::F32, s);
  ops::rms_norm_backward(dy, x, w, rstd, dx, dw, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
  // dweight is stored in f32: its own rounding (6e-8) dominates.
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), test::finite_difference(w, loss)),
            test::kFiniteDiffRelTolF64);
}

TEST(RmsNorm, BackwardWritesDxAndAccumulatesDweight) {
  Stream s = Stream::cpu();
  const int64_t rows = 3, cols = 5;
  Tensor x = test::random_tensor({rows, cols}, 7);
  Tensor w = test::random_tensor({cols}, 8);
  Tensor dy = test::random_tensor({rows, cols}, 9);
  Tensor y = Tensor::empty({rows, cols}, DType::F32, s);
  Tensor rstd = Tensor::empty({rows}, DType::F32, s);
  ops::rms_norm_forward(x, w, y, rstd, 1e-5f, s);
  Tensor dx_once = Tensor::empty({rows, cols}, DType::F32, s);
  Tensor dw_once = Tensor::zeros({cols}, DType::F32, s);
  ops::rms_norm_backward(dy, x, w, rstd, dx_once, dw_once, s);

  Tensor dx = filled({rows, cols}, DType::F32, 7.0f);
  Tensor dw = test::random_tensor({cols}, 10);
  const std::vector<double> dw0 = test::to_doubles(dw), g = test::to_doubles(dw_once);
  ops::rms_norm_backward(dy, x, w, rstd, dx, dw, s);
  ops::rms_norm_backward(dy, x, w, rstd, dx, dw, s);
  EXPECT_EQ(dx.to_floats(s), dx_once.to_floats(s));
  const std::vector<double> dw2 = test::to_doubles(dw);
  for (size_t c = 0; c < dw2.size(); ++c) EXPECT_NEAR(dw2[c], dw0[c] + 2 * g[c], 1e-6);
}

TEST(LayerNorm, ForwardGivesZeroMeanUnitVarianceRowsBeforeTheAffineMap) {
  Stream s = Stream::cpu();
  const int64_t rows = 3, cols = 16;
  Tensor x = test::random_tensor({rows, cols}, 11, DType::F64, 3.0f, 5.0f);  // large mean
  Tensor w = test::random_tensor({cols}, 12, DType::F64, 0.5f, 1.5f);
  Tensor b = test::random_tensor({cols}, 13, DType::F64);
  Tensor y = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor mean = Tensor::empty({rows}, DType::F64, s), rstd = Tensor::empty({rows}, DType::F64, s);
  ops::layer_norm_forward(x, w, b, y, mean, rstd, 0.0f, s);
  const std::vector<double> xv = test::to_doubles(x), yv = test::to_doubles(y),
                            wv = test::to_doubles(w), bv = test::to_doubles(b),
                            mv = test::to_doubles(mean), rv = test::to_doubles(rstd);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0;
    for (int64_t c = 0; c < cols; ++c) mu += xv[static_cast<size_t>(r * cols + c)] / cols;
    EXPECT_NEAR(mv[static_cast<size_t>(r)], mu, 1e-14);
    double zsum = 0, zsq = 0;  // xhat recovered from y through the affine map
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const double z = (yv[i] - bv[static_cast<size_t>(c)]) / wv[static_cast<size_t>(c)];
      EXPECT_NEAR(z, (xv[i] - mu) * rv[static_cast<size_t>(r)], 1e-12);
      zsum += z;
      zsq += z * z;
    }
    EXPECT_NEAR(zsum / cols, 0.0, 1e-12);
    EXPECT_NEAR(zsq / cols, 1.0, 1e-12);  // eps = 0: exactly unit variance
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  const int64_t rows = 3, cols = 7;
  Tensor x = test::random_tensor({rows, cols}, 14, DType::F64, -2.0f, 3.0f);
  Tensor w = test::random_tensor({cols}, 15, DType::F64, 0.5f, 1.5f);
  Tensor b = test::random_tensor({cols}, 16, DType::F64);
  Tensor dy = test::random_tensor({rows, cols}, 17, DType::F64);
  Tensor y = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor mean = Tensor::empty({rows}, DType::F64, s), rstd = Tensor::empty({rows}, DType::F64, s);
  auto loss = [&] {
    ops::layer_norm_forward(x, w, b, y, mean, rstd, 1e-5f, s);
    return test::inner(dy, y);
  };
  loss();
  Tensor dx = filled({rows, cols}, DType::F64, -1e30f);
  Tensor dw = Tensor::zeros({cols}, DType::F64, s), db = Tensor::zeros({cols}, DType::F64, s);
  ops::layer_norm_backward(dy, x, w, mean, rstd, dx, dw, db, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), test::finite_difference(w, loss)),
            test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(db), test::finite_difference(b, loss)),
            test::kFiniteDiffRelTolF64);
}

TEST(LayerNorm, BackwardWithoutBiasMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  const int64_t rows = 2, cols = 9;
  Tensor x = test::random_tensor({rows, cols}, 18, DType::F64);
  Tensor w = test::random_tensor({cols}, 19, DType::F64, 0.5f, 1.5f);
  Tensor dy = test::random_tensor({rows, cols}, 20, DType::F64);
  Tensor y = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor mean = Tensor::empty({rows}, DType::F32, s), rstd = Tensor::empty({rows}, DType::F32, s);
  auto loss = [&] {
    ops::layer_norm_forward(x, w, Tensor(), y, mean, rstd, 1e-5f, s);
    return test::inner(dy, y);
  };
  loss();
  Tensor dx = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor dw = Tensor::zeros({cols}, DType::F64, s);
  Tensor no_dbias;
  ops::layer_norm_backward(dy, x, w, mean, rstd, dx, dw, no_dbias, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), test::finite_difference(w, loss)),
            test::kFiniteDiffRelTolF64);
}

TEST(LayerNorm, BackwardWritesDxAndAccumulatesDweightAndDbias) {
  Stream s = Stream::cpu();
  const int64_t rows = 4, cols = 6;
  Tensor x = test::random_tensor({rows, cols}, 21);
  Tensor w = test::random_tensor({cols}, 22);
  Tensor b = test::random_tensor({cols}, 23);
  Tensor dy = test::random_tensor({rows, cols}, 24);
  Tensor y = Tensor::empty({rows, cols}, DType::F32, s);
  Tensor mean = Tensor::empty({rows}, DType::F32, s), rstd = Tensor::empty({rows}, DType::F32, s);
  ops::layer_norm_forward(x, w, b, y, mean, rstd, 1e-5f, s);
  Tensor dx_once = Tensor::empty({rows, cols}, DType::F32, s);
  Tensor dw_once = Tensor::zeros({cols}, DType::F32, s), db_once = Tensor::zeros({cols}, DType::F32, s);
  ops::layer_norm_backward(dy, x, w, mean, rstd, dx_once, dw_once, db_once, s);

  Tensor dx = filled({rows, cols}, DType::F32, 3.0f);
  Tensor dw = test::random_tensor({cols}, 25), db = test::random_tensor({cols}, 26);
  const std::vector<double> dw0 = test::to_doubles(dw), db0 = test::to_doubles(db);
  const std::vector<double> gw = test::to_doubles(dw_once), gb = test::to_doubles(db_once);
  ops::layer_norm_backward(dy, x, w, mean, rstd, dx, dw, db, s);
  ops::layer_norm_backward(dy, x, w, mean, rstd, dx, dw, db, s);
  EXPECT_EQ(dx.to_floats(s), dx_once.to_floats(s));
  const std::vector<double> dw2 = test::to_doubles(dw), db2 = test::to_doubles(db);
  for (size_t c = 0; c < dw2.size(); ++c) {
    EXPECT_NEAR(dw2[c], dw0[c] + 2 * gw[c], 1e-6);
    EXPECT_NEAR(db2[c], db0[c] + 2 * gb[c], 1e-6);
  }
  // dbias is the column sum of dy.
  const std::vector<double> dyv = test::to_doubles(dy);
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += dyv[static_cast<size_t>(r * cols + c)];
    EXPECT_NEAR(gb[static_cast<size_t>(c)], sum, 1e-6);
  }
}

TEST(AddRmsNorm, ForwardIsAddThenNormAndBackwardAddsTheResidualGradient) {
  // The fused residual forms against their definitions, and their gradients against finite
  // differences of L = <dy, y> + <dsum, sum> (both outputs of the forward carry gradient).
  Stream s = Stream::cpu();
  const int64_t rows = 5, cols = 7;
  Tensor x = test::random_tensor({rows, cols}, 31, DType::F64), r = test::random_tensor({rows, cols}, 32, DType::F64);
  Tensor w = test::random_tensor({cols}, 33, DType::F64, 0.5f, 1.5f);
  Tensor sum = Tensor::empty({rows, cols}, DType::F64, s), y = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor rstd = Tensor::empty({rows}, DType::F64, s);
  ops::add_rms_norm_forward(x, r, w, sum, y, rstd, 1e-5f, s);
  Tensor want_sum = Tensor::empty({rows, cols}, DType::F64, s), want_y = Tensor::empty({rows, cols}, DType::F64, s);
  Tensor want_rstd = Tensor::empty({rows}, DType::F64, s);
  ops::add(x, r, want_sum, s);
  ops::rms_norm_forward(want_sum, w, want_y, want_rstd, 1e-5f, s);
  EXPECT_EQ(test::to_doubles(sum), test::to_doubles(want_sum));
  EXPECT_EQ(test::to_doubles(y), test::to_doubles(want_y));

  const Tensor dy = test::random_tensor({rows, cols}, 34, DType::F64);
  const Tensor dsum = test::random_tensor({rows, cols}, 35, DType::F64);
  auto loss = [&] {
    Tensor s2 = Tensor::empty({rows, cols}, DType::F64, s), y2 = Tensor::empty({rows, cols}, DType::F64, s);
    Tensor r2 = Tensor::empty({rows}, DType::F64, s);
    ops::add_rms_norm_forward(x, r, w, s2, y2, r2, 1e-5f, s);
    return test::inner(y2, dy) + test::inner(s2, dsum);
  };
  // dL/dsum = dsum + norm backward; dL/dx = dL/dresidual = that.
  Tensor dx = dsum.to(Device::cpu(), DType::F64, s);  // in place: dx is the dresidual tensor
  Tensor dw = Tensor::zeros({cols}, DType::F64, s);
  ops::rms_norm_backward_add(dy, sum, w, rstd, dx, dx, dw, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)), test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(r, loss)), test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), test::finite_difference(w, loss)), test::kFiniteDiffRelTolF64);
}
