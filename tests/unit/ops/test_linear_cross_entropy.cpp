// CPU reference of the fused output layer + cross-entropy (ops/linear_cross_entropy.h): gradients
// against finite differences in f64, selected rows against all rows with zero weights elsewhere,
// chunking, and the composition it replaces (gemm + cross_entropy_forward_backward + gemms).
#include <gtest/gtest.h>
#include <vector>
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/linear_cross_entropy.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

constexpr int64_t kT = 7, kH = 5, kV = 11;

struct Problem {
  Tensor x, w, targets, weights;
  explicit Problem(DType dtype, uint64_t seed = 1) {
    x = test::random_tensor({kT, kH}, seed, dtype, -1.0f, 1.0f);
    w = test::random_tensor({kV, kH}, seed + 1, dtype, -1.0f, 1.0f);
    std::vector<int32_t> t(kT);
    for (int64_t i = 0; i < kT; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((3 * i + 2) % kV);
    targets = Tensor::from_ints(t, {kT});
    // Rows 1, 4 and 5 carry no loss (unmasked tokens of the diffusion objective).
    weights = Tensor::from_floats({0.5f, 0.0f, 2.0f, 1.0f, 0.0f, 0.0f, 1.5f}, {kT}, dtype);
  }
};

/// Loss = sum_r weights[r] losses[r] of the fused op (grad_scale 1), for finite differences.
double weighted_loss(const Problem& p, const Tensor* rows) {
  const Stream cpu = Stream::cpu();
  Tensor losses = Tensor::empty({kT}, p.x.dtype(), cpu), dx, dw;
  ops::linear_cross_entropy(p.x, p.w, rows, p.targets, p.weights, losses, dx, dw, {}, cpu);
  return test::inner(losses, p.weights);
}

}  // namespace

TEST(LinearCrossEntropy, GradientsMatchFiniteDifferences) {
  Problem p(DType::F64);
  const Stream cpu = Stream::cpu();
  const Tensor rows = Tensor::from_ints({0, 2, 3, 6}, {4});
  Tensor losses = Tensor::empty({kT}, DType::F64, cpu);
  Tensor dx = Tensor::empty({kT, kH}, DType::F64, cpu);
  Tensor dw = Tensor::zeros({kV, kH}, DType::F64, cpu);
  ops::linear_cross_entropy(p.x, p.w, &rows, p.targets, p.weights, losses, dx, dw,
                            {.grad_scale = 1.0f, .chunk_rows = 3}, cpu);
  const std::vector<double> fd_x = test::finite_difference(p.x, [&] { return weighted_loss(p, &rows); });
  const std::vector<double> fd_w = test::finite_difference(p.w, [&] { return weighted_loss(p, &rows); });
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), fd_x), test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), fd_w), test::kFiniteDiffRelTolF64);
  // Unselected rows: zero loss and zero gradient.
  const std::vector<double> l = test::to_doubles(losses), g = test::to_doubles(dx);
  for (int64_t r : {1, 4, 5}) {
    EXPECT_EQ(l[static_cast<size_t>(r)], 0.0);
    for (int64_t k = 0; k < kH; ++k) EXPECT_EQ(g[static_cast<size_t>(r * kH + k)], 0.0);
  }
}

TEST(LinearCrossEntropy, SelectedRowsGiveTheAllRowsResultWhereWeightsAreNonzero) {
  // Selecting the rows of nonzero weight is exact: the same losses on those rows and the same
  // gradients everywhere (rows of weight 0 have zero gradient).
  Problem p(DType::F64, 7);
  const Stream cpu = Stream::cpu();
  const Tensor rows = Tensor::from_ints({6, 0, 3, 2}, {4});  // any order
  Tensor la = Tensor::empty({kT}, DType::F64, cpu), ls = Tensor::empty({kT}, DType::F64, cpu);
  Tensor dxa = Tensor::empty({kT, kH}, DType::F64, cpu), dxs = Tensor::empty({kT, kH}, DType::F64, cpu);
  Tensor dwa = Tensor::zeros({kV, kH}, DType::F64, cpu), dws = Tensor::zeros({kV, kH}, DType::F64, cpu);
  const ops::LinearCrossEntropyArgs args{.grad_scale = 0.25f, .chunk_rows = 2};
  ops::linear_cross_entropy(p.x, p.w, nullptr, p.targets, p.weights, la, dxa, dwa, args, cpu);
  ops::linear_cross_entropy(p.x, p.w, &rows, p.targets, p.weights, ls, dxs, dws, args, cpu);
  const std::vector<double> a = test::to_doubles(la), s = test::to_doubles(ls);
  for (int64_t r : {0, 2, 3, 6}) EXPECT_NEAR(s[static_cast<size_t>(r)], a[static_cast<size_t>(r)], 1e-12);
  EXPECT_LT(test::max_abs_diff(test::to_doubles(dxs), test::to_doubles(dxa)), 1e-12);
  EXPECT_LT(test::max_abs_diff(test::to_doubles(dws), test::to_doubles(dwa)), 1e-12);
}

TEST(LinearCrossEntropy, MatchesTheUnfusedHeadAndAccumulatesIntoTheMainGrad) {
  // All rows (the AR mode): the losses and gradients of gemm + cross_entropy_forward_backward +
  // the two gradient gemms, in f32, with dweight added to an existing main grad.
  Problem p(DType::F32, 3);
  const Stream cpu = Stream::cpu();
  Tensor losses = Tensor::empty({kT}, DType::F32, cpu), dx = Tensor::empty({kT, kH}, DType::F32, cpu);
  Tensor dw = test::random_tensor({kV, kH}, 99, DType::F32);
  const std::vector<double> dw0 = test::to_doubles(dw);
  ops::linear_cross_entropy(p.x, p.w, nullptr, p.targets, p.weights, losses, dx, dw,
                            {.grad_scale = 0.5f, .chunk_rows = 4}, cpu);
  Tensor logits = Tensor::empty({kT, kV}, DType::F32, cpu), ref_losses = Tensor::empty({kT}, DType::F32, cpu);
  ops::gemm(p.x, p.w, logits, {.trans_b = true}, cpu);
  ops::cross_entropy_forward_backward(logits, p.targets, p.weights, ref_losses, 0.5f, cpu);
  Tensor ref_dx = Tensor::empty({kT, kH}, DType::F32, cpu), ref_dw = Tensor::zeros({kV, kH}, DType::F32, cpu);
  ops::gemm(logits, p.w, ref_dx, {}, cpu);
  ops::gemm(logits, p.x, ref_dw, {.trans_a = true, .beta = 1.0f}, cpu);
  std::vector<double> want_dw = test::to_doubles(ref_dw);
  for (size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += dw0[i];
  // Only fp32 summation order differs.
  EXPECT_LT(test::rel_l2(test::to_doubles(losses), test::to_doubles(ref_losses)), test::kF32AccumRelL2);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::to_doubles(ref_dx)), test::kF32AccumRelL2);
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), want_dw), test::kF32AccumRelL2);
}

TEST(LinearCrossEntropy, EvaluationWritesLossesOnlyAndRejectsBadInput) {
  Problem p(DType::F32, 5);
  const Stream cpu = Stream::cpu();
  const Tensor rows = Tensor::from_ints({2, 3}, {2});
  Tensor losses = Tensor::empty({kT}, DType::F32, cpu), none;
  ops::linear_cross_entropy(p.x, p.w, &rows, p.targets, p.weights, losses, none, none, {}, cpu);
  const std::vector<double> l = test::to_doubles(losses);
  EXPECT_GT(l[2], 0.0);
  EXPECT_EQ(l[0], 0.0);
  const Tensor twice = Tensor::from_ints({2, 2}, {2});
  EXPECT_THROW(ops::linear_cross_entropy(p.x, p.w, &twice, p.targets, p.weights, losses, none, none, {}, cpu),
               Error);
  EXPECT_THROW(ops::linear_cross_entropy(p.x, p.w, &rows, p.targets, p.weights, losses, none, none,
                                         {.grad_scale = 1.0f}, cpu),
               Error);  // training needs dx and dweight
  EXPECT_THROW(ops::linear_cross_entropy(p.x, p.w, &rows, p.targets, p.weights, losses, none, none,
                                         {.chunk_rows = 0}, cpu),
               Error);
}
