// Rotary embedding: identity at position 0, the header's formula on a hand-checked pair (with the
// fp32 angle for f32 tensors), norm preservation, backward as the inverse rotation, and f64 finite
// differences.
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/ops/rope.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

Tensor positions_of(std::vector<int32_t> p) {
  const int64_t n = static_cast<int64_t>(p.size());
  return Tensor::from_ints(p, {n});
}

}  // namespace

TEST(Rope, PositionZeroIsTheIdentity) {
  Stream s = Stream::cpu();
  const ops::RopeArgs args{.heads = 3, .head_dim = 8, .rotary_dim = 8};
  Tensor x = test::random_tensor({2, 3, 8}, 1);
  const std::vector<float> before = x.to_floats(s);
  ops::rope_forward(x, positions_of({0, 0}), args, s);
  EXPECT_EQ(x.to_floats(s), before);
}

TEST(Rope, RotatesEachPairByPositionTimesInverseFrequency) {
  Stream s = Stream::cpu();
  // head_dim 6, rotary_dim 4: pairs (0, 2) and (1, 3) rotate, elements 4 and 5 pass through.
  const ops::RopeArgs args{.heads = 1, .head_dim = 6, .rotary_dim = 4, .base = 100.0f};
  Tensor x = Tensor::from_floats({1, 1, 0, 0, 5, 6}, {1, 1, 6}, DType::F64);
  ops::rope_forward(x, positions_of({3}), args, s);
  const std::vector<double> y = test::to_doubles(x);
  const double theta0 = 3.0, theta1 = 3.0 / 10.0;  // inv_freq = 100^(-0/4), 100^(-2/4)
  EXPECT_NEAR(y[0], std::cos(theta0), 1e-15);
  EXPECT_NEAR(y[2], std::sin(theta0), 1e-15);
  EXPECT_NEAR(y[1], std::cos(theta1), 1e-15);
  EXPECT_NEAR(y[3], std::sin(theta1), 1e-15);
  EXPECT_EQ(y[4], 5.0);
  EXPECT_EQ(y[5], 6.0);
}

TEST(Rope, F32FormsTheAngleInFloatAsMegatronDoes) {
  Stream s = Stream::cpu();
  const ops::RopeArgs args{.heads = 1, .head_dim = 8, .rotary_dim = 8};
  const int32_t p = 30011;
  Tensor x = Tensor::from_floats({1, 1, 1, 1, 0, 0, 0, 0}, {1, 1, 8});
  ops::rope_forward(x, positions_of({p}), args, s);
  const std::vector<float> y = x.to_floats(s);
  for (int i = 0; i < 4; ++i) {
    const float inv = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / 8.0f);
    const float theta = static_cast<float>(p) * inv;  // rounded to fp32 before cos/sin
    EXPECT_NEAR(y[static_cast<size_t>(i)], std::cos(static_cast<double>(theta)), 1e-6) << i;
    EXPECT_NEAR(y[static_cast<size_t>(i + 4)], std::sin(static_cast<double>(theta)), 1e-6) << i;
  }
}

TEST(Rope, PreservesTheNormOfEveryHeadVector) {
  Stream s = Stream::cpu();
  const ops::RopeArgs args{.heads = 2, .head_dim = 10, .rotary_dim = 6, .base = 500.0f};
  Tensor x = test::random_tensor({4, 2, 10}, 2, DType::F64);
  const std::vector<double> before = test::to_doubles(x);
  ops::rope_forward(x, positions_of({0, 7, 123, 4095}), args, s);
  const std::vector<double> after = test::to_doubles(x);
  bool changed = false;
  for (size_t v = 0; v < 8; ++v) {
    double n0 = 0, n1 = 0;
    for (size_t j = 0; j < 10; ++j) {
      n0 += before[v * 10 + j] * before[v * 10 + j];
      n1 += after[v * 10 + j] * after[v * 10 + j];
      changed |= before[v * 10 + j] != after[v * 10 + j];
    }
    EXPECT_NEAR(n1, n0, 1e-13 * n0);
  }
  EXPECT_TRUE(changed);
}

TEST(Rope, BackwardUndoesForward) {
  Stream s = Stream::cpu();
  const ops::RopeArgs args{.heads = 2, .head_dim = 8, .rotary_dim = 8};
  Tensor x = test::random_tensor({3, 2, 8}, 3, DType::F64);
  const std::vector<double> before = test::to_doubles(x);
  Tensor pos = positions_of({5, 17, 900});
  ops::rope_forward(x, pos, args, s);
  ops::rope_backward(x, pos, args, s);
  EXPECT_LT(test::max_abs_diff(test::to_doubles(x), before), 1e-14);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  const ops::RopeArgs args{.heads = 2, .head_dim = 6, .rotary_dim = 4, .base = 10000.0f};
  Tensor x = test::random_tensor({3, 2, 6}, 4, DType::F64);
  Tensor dy = test::random_tensor({3, 2, 6}, 5, DType::F64);
  Tensor pos = positions_of({1, 2, 40});
  Tensor y = Tensor::empty({3, 2, 6}, DType::F64, s);
  auto loss = [&] {
    copy_tensor(x, y, s);
    ops::rope_forward(y, pos, args, s);
    return test::inner(dy, y);
  };
  Tensor dx = Tensor::empty({3, 2, 6}, DType::F64, s);
  copy_tensor(dy, dx, s);
  ops::rope_backward(dx, pos, args, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
}
