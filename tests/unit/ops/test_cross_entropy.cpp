// Cross-entropy: closed forms (uniform logits give ln V), stability for large logits, f64 finite
// differences of the weighted, scaled loss against the in-place gradient, and target validation.
#include <gtest/gtest.h>
#include <cmath>
#include <string>
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/elementwise.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

TEST(CrossEntropy, UniformLogitsGiveLogOfTheVocabularySize) {
  Stream s = Stream::cpu();
  const int64_t tokens = 3, vocab = 50;
  Tensor logits = Tensor::empty({tokens, vocab}, DType::F32, s);
  ops::fill(logits, 3.7f, s);
  Tensor targets = Tensor::from_ints({0, 17, 49}, {tokens});
  Tensor losses = Tensor::empty({tokens}, DType::F32, s);
  ops::cross_entropy_forward(logits, targets, losses, s);
  for (float l : losses.to_floats(s)) EXPECT_NEAR(l, std::log(50.0), 1e-6);
}

TEST(CrossEntropy, IsStableForLargeLogitsAndShiftInvariant) {
  Stream s = Stream::cpu();
  const std::vector<float> base = {1.0f, -2.0f, 0.5f, 3.0f};
  std::vector<float> shifted;
  for (float v : base) shifted.push_back(v + 20000.0f);  // exp(20000) overflows any float type
  Tensor targets = Tensor::from_ints({3}, {1});
  Tensor l0 = Tensor::empty({1}, DType::F32, s), l1 = Tensor::empty({1}, DType::F32, s);
  ops::cross_entropy_forward(Tensor::from_floats(base, {1, 4}), targets, l0, s);
  ops::cross_entropy_forward(Tensor::from_floats(shifted, {1, 4}), targets, l1, s);
  double sum = 0;
  for (float v : base) sum += std::exp(static_cast<double>(v) - 3.0);
  EXPECT_NEAR(l0.to_floats(s)[0], std::log(sum), 1e-6);
  EXPECT_TRUE(std::isfinite(l1.to_floats(s)[0]));
  EXPECT_NEAR(l1.to_floats(s)[0], l0.to_floats(s)[0], 1e-6);
}

TEST(CrossEntropy, ForwardBackwardMatchesFiniteDifferencesOfTheWeightedLoss) {
  Stream s = Stream::cpu();
  const int64_t tokens = 4, vocab = 7;
  const float grad_scale = 0.37f;
  Tensor logits = test::random_tensor({tokens, vocab}, 1, DType::F64, -3.0f, 3.0f);
  Tensor targets = Tensor::from_ints({2, 0, 6, 2}, {tokens});
  Tensor weights = Tensor::from_floats({1.0f, 0.0f, 2.5f, 0.5f}, {tokens}, DType::F64);
  Tensor losses = Tensor::empty({tokens}, DType::F64, s);
  auto loss = [&] {  // grad_scale * sum_t w_t * loss_t
    ops::cross_entropy_forward(logits, targets, losses, s);
    return static_cast<double>(grad_scale) * test::inner(weights, losses);
  };
  loss();
  const std::vector<double> forward_losses = test::to_doubles(losses);
  Tensor grad = Tensor::empty({tokens, vocab}, DType::F64, s);
  copy_tensor(logits, grad, s);
  Tensor fb_losses = Tensor::empty({tokens}, DType::F64, s);
  ops::cross_entropy_forward_backward(grad, targets, weights, fb_losses, grad_scale, s);
  EXPECT_EQ(test::to_doubles(fb_losses), forward_losses);
  EXPECT_LT(test::rel_l2(test::to_doubles(grad), test::finite_difference(logits, loss)),
            test::kFiniteDiffRelTolF64);
  // A zero-weight token gets a zero gradient row.
  const std::vector<double> g = test::to_doubles(grad);
  for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(g[static_cast<size_t>(vocab + j)], 0.0);
}

TEST(CrossEntropy, F32GradientIsScaledSoftmaxMinusOneHot) {
  Stream s = Stream::cpu();
  Tensor logits = Tensor::from_floats({0, 0, 0, 0, 1, 2, 3, 4}, {2, 4});
  Tensor targets = Tensor::from_ints({1, 3}, {2});
  Tensor weights = Tensor::from_floats({1.0f, 0.5f}, {2});
  Tensor losses = Tensor::empty({2}, DType::F32, s);
  ops::cross_entropy_forward_backward(logits, targets, weights, losses, 2.0f, s);
  const std::vector<float> g = logits.to_floats(s);
  EXPECT_NEAR(g[0], 2.0 * 0.25, 1e-7);
  EXPECT_NEAR(g[1], 2.0 * (0.25 - 1), 1e-7);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0);
  for (int j = 0; j < 4; ++j) {
    const double p = std::exp(1.0 + j) / z;
    EXPECT_NEAR(g[static_cast<size_t>(4 + j)], 1.0 * (j == 3 ? p - 1 : p), 1e-7) << j;
  }
  EXPECT_NEAR(losses.to_floats(s)[1], std::log(z) - 4.0, 1e-6);
}

TEST(CrossEntropy, OutOfRangeTargetIsAnErrorNamingTheTokenAndValue) {
  Stream s = Stream::cpu();
  Tensor logits = test::random_tensor({3, 5}, 2);
  const std::vector<float> before = logits.to_floats(s);
  Tensor targets = Tensor::from_ints({1, 4, 5}, {3});
  Tensor weights = Tensor::from_floats({1, 1, 1}, {3});
  Tensor losses = Tensor::empty({3}, DType::F32, s);
  try {
    ops::cross_entropy_forward_backward(logits, targets, weights, losses, 1.0f, s);
    FAIL() << "a target equal to the vocabulary size was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("token 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is 5"), std::string::npos) << msg;
  }
  EXPECT_EQ(logits.to_floats(s), before);  // validated before anything was overwritten
  Tensor negative = Tensor::from_ints({-3, 0, 0}, {3});
  EXPECT_THROW(ops::cross_entropy_forward(logits, negative, losses, s), Error);
}
