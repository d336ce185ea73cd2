// Reductions: exact sums on small integers (any summation order gives the same float) and the
// accumulate-into-output contract.
#include <gtest/gtest.h>
#include "megadlm/ops/reduce.h"
#include "support/op_testing.h"

using namespace megadlm;

TEST(SumSquares, AddsTheSquaredNormIntoOut) {
  Stream s = Stream::cpu();
  Tensor out = Tensor::from_floats({1.0f}, {1});
  ops::sum_squares(Tensor::from_floats({1, -2, 3}, {3}), out, s);
  EXPECT_EQ(out.to_floats(s)[0], 15.0f);
  ops::sum_squares(Tensor::from_floats({4, 0.5f}, {2, 1}, DType::F64), out, s);
  EXPECT_EQ(out.to_floats(s)[0], 31.25f);
  ops::sum_squares(Tensor::from_floats({2, -2}, {2}, DType::BF16), out, s);
  EXPECT_EQ(out.to_floats(s)[0], 39.25f);
}

TEST(SumSquares, AccumulatesInDouble) {
  Stream s = Stream::cpu();
  // 4096^2 = 2^24, where f32 spacing is 2: an f32 running sum would drop each following 1.
  Tensor out = Tensor::zeros({1}, DType::F32, s);
  ops::sum_squares(Tensor::from_floats({4096, 1, 1, 1, 1}, {5}), out, s);
  EXPECT_EQ(out.to_floats(s)[0], 16777220.0f);
}

TEST(SumRows, AddsColumnSumsIntoOut) {
  Stream s = Stream::cpu();
  Tensor x = Tensor::from_floats({1, 2, 3, 10, 20, 30}, {2, 3});
  Tensor out = Tensor::from_floats({100, 200, 300}, {3});
  ops::sum_rows(x, out, s);
  EXPECT_EQ(out.to_floats(s), (std::vector<float>{111, 222, 333}));
  Tensor x64 = Tensor::from_floats({1, 2, 3, 10, 20, 30}, {2, 3}, DType::F64);
  Tensor out64 = Tensor::zeros({3}, DType::F64, s);
  ops::sum_rows(x64, out64, s);
  EXPECT_EQ(test::to_doubles(out64), (std::vector<double>{11, 22, 33}));
}

TEST(Dot, AddsTheInnerProductIntoOut) {
  Stream s = Stream::cpu();
  Tensor a = Tensor::from_floats({1, 2, 3}, {3}), b = Tensor::from_floats({4, -5, 6}, {3});
  Tensor out = Tensor::from_floats({0.5f}, {1});
  ops::dot(a, b, out, s);
  EXPECT_EQ(out.to_floats(s)[0], 12.5f);
  ops::dot(a, b, out, s);
  EXPECT_EQ(out.to_floats(s)[0], 24.5f);
}
