// CPU reference of the fused QK-norm + RoPE (ops/qk_norm_rope.h): the composition it replaces
// (split, rms_norm_forward per head, rope_forward, concat), gradients against finite
// differences in f64, norm-only and rope-only forms, and argument checks.
#include <gtest/gtest.h>
#include <vector>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/norm.h"
#include "megadlm/ops/qk_norm_rope.h"
#include "megadlm/ops/rope.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

constexpr int64_t kT = 3, kHq = 4, kHkv = 2, kD = 8;
constexpr int64_t kWidth = (kHq + 2 * kHkv) * kD;

ops::QkNormRopeArgs args_of(int64_t rotary_dim) {
  return {.heads = kHq, .kv_heads = kHkv, .head_dim = kD, .rotary_dim = rotary_dim, .base = 500.0f,
          .eps = 1e-5f};
}

const Tensor& positions() {
  static const Tensor p = Tensor::from_ints({0, 5, 17}, {kT});
  return p;
}

}  // namespace

TEST(QkNormRope, ForwardEqualsSplitNormRopeConcat) {
  const Stream cpu = Stream::cpu();
  const Tensor qkv = test::random_tensor({kT, kWidth}, 11, DType::F32, -2.0f, 2.0f);
  const Tensor wq = test::random_tensor({kD}, 12, DType::F32, 0.5f, 1.5f);
  const Tensor wk = test::random_tensor({kD}, 13, DType::F32, 0.5f, 1.5f);
  for (int64_t rotary : {int64_t{0}, int64_t{4}, kD}) {
    SCOPED_TRACE(rotary);
    const ops::QkNormRopeArgs a = args_of(rotary);
    Tensor out = Tensor::empty({kT, kWidth}, DType::F32, cpu), rstd = Tensor::empty({kT * (kHq + kHkv)}, DType::F32, cpu);
    ops::qk_norm_rope_forward(qkv, wq, wk, positions(), out, rstd, a, cpu);
    // The unfused path of the transformer layer.
    Tensor q = Tensor::empty({kT, kHq * kD}, DType::F32, cpu), k = Tensor::empty({kT, kHkv * kD}, DType::F32, cpu);
    Tensor v = Tensor::empty({kT, kHkv * kD}, DType::F32, cpu);
    ops::split_columns(qkv, {&q, &k, &v}, cpu);
    Tensor qn = Tensor::empty({kT * kHq, kD}, DType::F32, cpu), kn = Tensor::empty({kT * kHkv, kD}, DType::F32, cpu);
    Tensor rq = Tensor::empty({kT * kHq}, DType::F32, cpu), rk = Tensor::empty({kT * kHkv}, DType::F32, cpu);
    ops::rms_norm_forward(q.view({kT * kHq, kD}), wq, qn, rq, a.eps, cpu);
    ops::rms_norm_forward(k.view({kT * kHkv, kD}), wk, kn, rk, a.eps, cpu);
    Tensor qr = qn.view({kT, kHq * kD}), kr = kn.view({kT, kHkv * kD});
    if (rotary > 0) {
      ops::rope_forward(qr, positions(), {kHq, kD, rotary, a.base}, cpu);
      ops::rope_forward(kr, positions(), {kHkv, kD, rotary, a.base}, cpu);
    }
    Tensor want = Tensor::empty({kT, kWidth}, DType::F32, cpu);
    ops::concat_columns({&qr, &kr, &v}, want, cpu);
    // One rounding instead of two (the unfused path rounds the norm output to f32 first).
    EXPECT_LT(test::rel_l2(test::to_doubles(out), test::to_doubles(want)), 1e-6);
    const std::vector<double> r = test::to_doubles(rstd), wq_r = test::to_doubles(rq), wk_r = test::to_doubles(rk);
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t h = 0; h < kHq + kHkv; ++h) {
        const double ref = h < kHq ? wq_r[static_cast<size_t>(t * kHq + h)] : wk_r[static_cast<size_t>(t * kHkv + h - kHq)];
        EXPECT_NEAR(r[static_cast<size_t>(t * (kHq + kHkv) + h)], ref, 1e-6 * ref);
      }
    // In place (inference): written over qkv, the same values, value heads included.
    Tensor inplace = qkv.to(Device::cpu(), DType::F32, cpu), rstd2 = Tensor::empty(rstd.shape(), DType::F32, cpu);
    ops::qk_norm_rope_forward(inplace, wq, wk, positions(), inplace, rstd2, a, cpu);
    EXPECT_EQ(test::to_doubles(inplace), test::to_doubles(out));
    EXPECT_EQ(test::to_doubles(rstd2), test::to_doubles(rstd));
    // Without the value copy (training reads v from qkv): q, k the same, value heads untouched.
    ops::QkNormRopeArgs no_values = a;
    no_values.copy_values = false;
    Tensor qk_only = Tensor::from_floats(std::vector<float>(static_cast<size_t>(kT * kWidth), -7.0f), {kT, kWidth});
    ops::qk_norm_rope_forward(qkv, wq, wk, positions(), qk_only, rstd2, no_values, cpu);
    const std::vector<double> got = test::to_doubles(qk_only), all = test::to_doubles(out);
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t j = 0; j < kWidth; ++j) {
        const size_t i = static_cast<size_t>(t * kWidth + j);
        EXPECT_EQ(got[i], j < (kHq + kHkv) * kD ? all[i] : -7.0) << "token " << t << ", column " << j;
      }
  }
}

TEST(QkNormRope, BackwardMatchesFiniteDifferences) {
  const Stream cpu = Stream::cpu();
  for (bool norm : {true, false}) {
    SCOPED_TRACE(norm ? "norm + rope" : "rope only");
    Tensor qkv = test::random_tensor({kT, kWidth}, 21, DType::F64, -2.0f, 2.0f);
    Tensor wq = test::random_tensor({kD}, 22, DType::F64, 0.5f, 1.5f);
    Tensor wk = test::random_tensor({kD}, 23, DType::F64, 0.5f, 1.5f);
    const Tensor dy = test::random_tensor({kT, kWidth}, 24, DType::F64);
    const ops::QkNormRopeArgs a = args_of(6);
    const Tensor none;
    auto loss = [&] {
      Tensor out = Tensor::empty({kT, kWidth}, DType::F64, cpu), rstd = Tensor::empty({kT * (kHq + kHkv)}, DType::F64, cpu);
      ops::qk_norm_rope_forward(qkv, norm ? wq : none, norm ? wk : none, positions(), out, rstd, a, cpu);
      return test::inner(out, dy);
    };
    Tensor out = Tensor::empty({kT, kWidth}, DType::F64, cpu), rstd = Tensor::empty({kT * (kHq + kHkv)}, DType::F64, cpu);
    ops::qk_norm_rope_forward(qkv, norm ? wq : none, norm ? wk : none, positions(), out, rstd, a, cpu);
    Tensor grad = dy.to(Device::cpu(), DType::F64, cpu);  // replaced in place
    Tensor dwq = Tensor::zeros({kD}, DType::F64, cpu), dwk = Tensor::zeros({kD}, DType::F64, cpu);
    Tensor none_q, none_k;
    ops::qk_norm_rope_backward(grad, qkv, norm ? wq : none, norm ? wk : none, rstd, positions(),
                               norm ? dwq : none_q, norm ? dwk : none_k, a, cpu);
    EXPECT_LT(test::rel_l2(test::to_doubles(grad), test::finite_difference(qkv, loss)), test::kFiniteDiffRelTolF64);
    if (norm) {
      EXPECT_LT(test::rel_l2(test::to_doubles(dwq), test::finite_difference(wq, loss)), test::kFiniteDiffRelTolF64);
      EXPECT_LT(test::rel_l2(test::to_doubles(dwk), test::finite_difference(wk, loss)), test::kFiniteDiffRelTolF64);
    }
  }
}

TEST(QkNormRope, RejectsBadShapes) {
  const Stream cpu = Stream::cpu();
  const Tensor qkv = test::random_tensor({kT, kWidth - kD}, 1);
  Tensor out = Tensor::empty({kT, kWidth - kD}, DType::F32, cpu), rstd;
  const Tensor none;
  EXPECT_THROW(ops::qk_norm_rope_forward(qkv, none, none, positions(), out, rstd, args_of(kD), cpu), Error);
  const Tensor good = test::random_tensor({kT, kWidth}, 2);
  Tensor out2 = Tensor::empty({kT, kWidth}, DType::F32, cpu);
  EXPECT_THROW(ops::qk_norm_rope_forward(good, none, none, positions(), out2, rstd, args_of(5), cpu), Error);
}
