// SwiGLU and exact GELU: values at hand-checked points and f64 finite-difference gradients.
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/elementwise.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

TEST(Gelu, MatchesTheErfFormulaAtKnownPoints) {
  Stream s = Stream::cpu();
  Tensor x = Tensor::from_floats({0, 1, -1, 3, -8}, {5}, DType::F64);
  Tensor y = Tensor::empty({5}, DType::F64, s);
  ops::gelu_forward(x, y, s);
  const std::vector<double> v = test::to_doubles(y);
  EXPECT_EQ(v[0], 0.0);
  EXPECT_NEAR(v[1], 0.8413447460685429, 1e-15);         // Phi(1)
  EXPECT_NEAR(v[2], -(1 - 0.8413447460685429), 1e-15);  // -Phi(-1)
  EXPECT_NEAR(v[3], 3 * 0.9986501019683699, 1e-14);     // 3 Phi(3)
  EXPECT_NEAR(v[4], 0.0, 1e-13);                        // -8 Phi(-8) ~ -5e-15
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  Tensor x = test::random_tensor({4, 5}, 1, DType::F64, -4.0f, 4.0f);
  Tensor dy = test::random_tensor({4, 5}, 2, DType::F64);
  Tensor y = Tensor::empty({4, 5}, DType::F64, s);
  auto loss = [&] {
    ops::gelu_forward(x, y, s);
    return test::inner(dy, y);
  };
  Tensor dx = Tensor::empty({4, 5}, DType::F64, s);
  ops::fill(dx, 1e30f, s);
  ops::gelu_backward(dy, x, dx, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
}

TEST(SwiGlu, IsSiluOfTheGateHalfTimesTheUpHalf) {
  Stream s = Stream::cpu();
  // One row, F = 3: gate = (0, 1, -2), up = (5, 2, 3).
  Tensor x = Tensor::from_floats({0, 1, -2, 5, 2, 3}, {1, 6}, DType::F64);
  Tensor y = Tensor::empty({1, 3}, DType::F64, s);
  ops::swiglu_forward(x, y, s);
  const std::vector<double> v = test::to_doubles(y);
  const double sig1 = 1.0 / (1.0 + std::exp(-1.0)), sigm2 = 1.0 / (1.0 + std::exp(2.0));
  EXPECT_EQ(v[0], 0.0);
  EXPECT_NEAR(v[1], 1.0 * sig1 * 2.0, 1e-15);
  EXPECT_NEAR(v[2], -2.0 * sigm2 * 3.0, 1e-15);
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  const int64_t rows = 3, f = 4;
  Tensor x = test::random_tensor({rows, 2 * f}, 3, DType::F64, -3.0f, 3.0f);
  Tensor dy = test::random_tensor({rows, f}, 4, DType::F64);
  Tensor y = Tensor::empty({rows, f}, DType::F64, s);
  auto loss = [&] {
    ops::swiglu_forward(x, y, s);
    return test::inner(dy, y);
  };
  Tensor dx = Tensor::empty({rows, 2 * f}, DType::F64, s);
  ops::fill(dx, -1e30f, s);
  ops::swiglu_backward(dy, x, dx, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
}

TEST(SwiGlu, BackwardRecomputeGivesTheBackwardAndTheForward) {
  // One pass over x for both: dx of swiglu_backward and y of swiglu_forward, bit for bit.
  Stream s = Stream::cpu();
  const int64_t rows = 5, f = 6;
  const Tensor x = test::random_tensor({rows, 2 * f}, 13, DType::F32, -4.0f, 4.0f);
  const Tensor dy = test::random_tensor({rows, f}, 14);
  Tensor dx = Tensor::empty({rows, 2 * f}, DType::F32, s), y = Tensor::empty({rows, f}, DType::F32, s);
  ops::swiglu_backward_recompute(dy, x, dx, y, s);
  Tensor want_dx = Tensor::empty({rows, 2 * f}, DType::F32, s), want_y = Tensor::empty({rows, f}, DType::F32, s);
  ops::swiglu_backward(dy, x, want_dx, s);
  ops::swiglu_forward(x, want_y, s);
  EXPECT_EQ(dx.to_floats(s), want_dx.to_floats(s));
  EXPECT_EQ(y.to_floats(s), want_y.to_floats(s));
  Tensor wrong = Tensor::empty({rows, 2 * f}, DType::F32, s);
  EXPECT_THROW(ops::swiglu_backward_recompute(dy, x, dx, wrong, s), Error);
}

TEST(SwiGlu, F32AgreesWithF64) {
  Stream s = Stream::cpu();
  Tensor x32 = test::random_tensor({5, 12}, 5, DType::F32, -4.0f, 4.0f);
  Tensor x64 = test::random_tensor({5, 12}, 5, DType::F64, -4.0f, 4.0f);
  Tensor y32 = Tensor::empty({5, 6}, DType::F32, s), y64 = Tensor::empty({5, 6}, DType::F64, s);
  ops::swiglu_forward(x32, y32, s);
  ops::swiglu_forward(x64, y64, s);
  // Same inputs (f32 values), math in double: only the final f32 rounding differs.
  EXPECT_LT(test::rel_l2(test::to_doubles(y32), test::to_doubles(y64)), 1e-7);
}
