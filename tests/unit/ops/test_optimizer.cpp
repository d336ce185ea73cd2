// AdamW: one step against a hand computation, bias correction at a later step, decoupled weight
// decay, the model-parameter copy in its own dtype, and the clip coefficient folded into the step.
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/optimizer.h"
#include "support/op_testing.h"

using namespace megadlm;

namespace {

/// The header's formula in double, for one element.
struct AdamRef {
  double p, m, v;
  void step(double g, const ops::AdamWArgs& a) {
    const double b1 = a.beta1, b2 = a.beta2;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, static_cast<double>(a.step)));
    const double vhat = v / (1 - std::pow(b2, static_cast<double>(a.step)));
    p -= static_cast<double>(a.lr) * (mhat / (std::sqrt(vhat) + static_cast<double>(a.eps)) +
                                      static_cast<double>(a.weight_decay) * p);
  }
};

}  // namespace

TEST(AdamW, FirstStepMatchesAHandComputation) {
  Stream s = Stream::cpu();
  Tensor p = Tensor::from_floats({1.0f}, {1});
  Tensor g = Tensor::from_floats({0.5f}, {1});
  Tensor m = Tensor::zeros({1}, DType::F32, s), v = Tensor::zeros({1}, DType::F32, s);
  Tensor none;
  const ops::AdamWArgs args{.lr = 0.1f, .weight_decay = 0.01f, .step = 1};
  ops::adamw_step(p, g, m, v, none, args, s);
  // The betas are the f32 values 0.9f and 0.999f, so 1 - beta is not exactly 0.1 / 0.001:
  // m = (1 - 0.9f) * 0.5, v = (1 - 0.999f) * 0.25; the bias corrections divide those factors out
  // again, so mhat = g = 0.5 and vhat = g^2 = 0.25 exactly in real arithmetic, and
  // update = 0.5 / (0.5 + 1e-8) + 0.01 * 1 = 1.00999998; p = 1 - 0.1 * update = 0.899000002.
  EXPECT_FLOAT_EQ(m.to_floats(s)[0], static_cast<float>((1.0 - double{0.9f}) * 0.5));
  EXPECT_FLOAT_EQ(v.to_floats(s)[0], static_cast<float>((1.0 - double{0.999f}) * 0.25));
  EXPECT_NEAR(p.to_floats(s)[0], 0.899000002, 2e-7);  // a few fp32 ulps of 0.9
}

TEST(AdamW, LaterStepsMatchTheBiasCorrectedFormula) {
  Stream s = Stream::cpu();
  const int64_t n = 64;
  Tensor p = test::random_tensor({n}, 1);
  Tensor m = test::random_tensor({n}, 2, DType::F32, -0.1f, 0.1f);
  Tensor v = test::random_tensor({n}, 3, DType::F32, 0.0f, 0.01f);
  std::vector<AdamRef> ref;
  const std::vector<float> p0 = p.to_floats(s), m0 = m.to_floats(s), v0 = v.to_floats(s);
  for (int64_t i = 0; i < n; ++i) ref.push_back({p0[static_cast<size_t>(i)], m0[static_cast<size_t>(i)], v0[static_cast<size_t>(i)]});
  Tensor none;
  for (int64_t step = 5; step <= 7; ++step) {
    Tensor g = test::random_tensor({n}, 10 + static_cast<uint64_t>(step));
    const std::vector<float> gv = g.to_floats(s);
    const ops::AdamWArgs args{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-6f,
                              .weight_decay = 0.1f, .step = step};
    ops::adamw_step(p, g, m, v, none, args, s);
    for (int64_t i = 0; i < n; ++i) ref[static_cast<size_t>(i)].step(gv[static_cast<size_t>(i)], args);
  }
  const std::vector<float> pv = p.to_floats(s), mv = m.to_floats(s), vv = v.to_floats(s);
  for (int64_t i = 0; i < n; ++i) {
    const AdamRef& r = ref[static_cast<size_t>(i)];
    // fp32 element math against double over three steps: a few ulps (6e-8 relative) each.
    EXPECT_NEAR(pv[static_cast<size_t>(i)], r.p, 1e-6 * std::fabs(r.p)) << i;
    EXPECT_NEAR(mv[static_cast<size_t>(i)], r.m, 1e-6 * std::fabs(r.m)) << i;
    EXPECT_NEAR(vv[static_cast<size_t>(i)], r.v, 1e-6 * std::fabs(r.v)) << i;
  }
}

TEST(AdamW, WeightDecayIsDecoupledFromTheGradient) {
  Stream s = Stream::cpu();
  // Zero gradient: the Adam term vanishes and only p -= lr * wd * p remains.
  Tensor p = Tensor::from_floats({2.0f, -4.0f}, {2});
  Tensor g = Tensor::zeros({2}, DType::F32, s);
  Tensor m = Tensor::zeros({2}, DType::F32, s), v = Tensor::zeros({2}, DType::F32, s);
  Tensor none;
  ops::adamw_step(p, g, m, v, none, {.lr = 0.5f, .weight_decay = 0.1f, .step = 1}, s);
  EXPECT_EQ(p.to_floats(s), (std::vector<float>{1.9f, -3.8f}));
}

TEST(AdamW, WritesTheUpdatedMasterIntoTheModelParamInItsDtype) {
  Stream s = Stream::cpu();
  const int64_t n = 16;
  Tensor g = test::random_tensor({n}, 4);
  for (DType dt : {DType::BF16, DType::F64, DType::F32}) {
    Tensor p = test::random_tensor({n}, 5);
    Tensor m = Tensor::zeros({n}, DType::F32, s), v = Tensor::zeros({n}, DType::F32, s);
    Tensor model = Tensor::zeros({n}, dt, s);
    ops::adamw_step(p, g, m, v, model, {.lr = 0.01f, .step = 1}, s);
    const std::vector<float> master = p.to_floats(s), got = model.to_floats(s);
    for (int64_t i = 0; i < n; ++i) {
      const float expected = dt == DType::BF16 ? round_to_bf16(master[static_cast<size_t>(i)])
                                               : master[static_cast<size_t>(i)];
      EXPECT_EQ(got[static_cast<size_t>(i)], expected) << dtype_name(dt) << " element " << i;
    }
  }
}

TEST(AdamW, MultiTensorStepEqualsOneStepPerSegment) {
  // Segments of odd sizes and offsets (state and parameter offsets differ, as under the
  // distributed optimizer), with and without weight decay, and a gap that must stay untouched.
  Stream s = Stream::cpu();
  const int64_t n = 40;
  const std::vector<ops::AdamWSegment> segs = {
      {.state_offset = 0, .param_offset = 3, .numel = 7, .decay = true},
      {.state_offset = 7, .param_offset = 10, .numel = 13, .decay = false},
      {.state_offset = 25, .param_offset = 25, .numel = 15, .decay = true}};  // state 20..24 unused
  const ops::AdamWArgs args{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};
  auto state = [&](uint64_t seed) {
    return std::vector<Tensor>{test::random_tensor({n}, seed), test::random_tensor({n}, seed + 1, DType::F32, -0.1f, 0.1f),
                               test::random_tensor({n}, seed + 2, DType::F32, -0.01f, 0.01f),
                               test::random_tensor({n}, seed + 3, DType::F32, 0.0f, 0.001f),
                               Tensor::zeros({n}, DType::BF16, s)};
  };
  std::vector<Tensor> a = state(50), b = state(50);
  ops::adamw_step_multi(a[0], a[1], a[2], a[3], a[4], segs, args, s);
  for (const ops::AdamWSegment& g : segs) {
    Tensor p = b[0].slice_flat(g.state_offset, {g.numel}), gr = b[1].slice_flat(g.state_offset, {g.numel});
    Tensor m = b[2].slice_flat(g.state_offset, {g.numel}), v = b[3].slice_flat(g.state_offset, {g.numel});
    Tensor model = b[4].slice_flat(g.param_offset, {g.numel});
    ops::AdamWArgs one = args;
    one.weight_decay = g.decay ? args.weight_decay : 0.0f;
    ops::adamw_step(p, gr, m, v, model, one, s);
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a[i].to_floats(s), b[i].to_floats(s)) << "buffer " << i;
  const std::vector<float> untouched = state(50)[0].to_floats(s), after = a[0].to_floats(s);
  for (int64_t i = 20; i < 25; ++i) EXPECT_EQ(after[static_cast<size_t>(i)], untouched[static_cast<size_t>(i)]);
  // A segment outside the buffers is rejected.
  std::vector<ops::AdamWSegment> bad = {{.state_offset = 35, .param_offset = 0, .numel = 10}};
  EXPECT_THROW(ops::adamw_step_multi(a[0], a[1], a[2], a[3], a[4], bad, args, s), Error);
}

namespace {

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float f : t.to_floats(Stream::cpu())) {
    uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    out.push_back(u);
  }
  return out;
}

}  // namespace

TEST(AdamW, GradScaleIsBitwiseTheStepOnGradientsScaledFirst) {
  // The trainer folds the clip coefficient into the step: reading g * grad_scale must give the
  // very bits that ops::scale_inplace(g, coeff) followed by an unscaled step gives, for the
  // single and the multi-tensor step, and leave the gradients as they were.
  Stream s = Stream::cpu();
  const int64_t n = 4099;
  const std::vector<ops::AdamWSegment> segs = {{.state_offset = 0, .param_offset = 0, .numel = 1000, .decay = true},
                                               {.state_offset = 1000, .param_offset = 1000, .numel = 3099, .decay = false}};
  for (const float coeff : {0.37312f, 1e-3f, 0.999999f}) {
    for (const bool multi : {false, true}) {
      auto state = [&] {
        return std::vector<Tensor>{test::random_tensor({n}, 60), test::random_tensor({n}, 61, DType::F32, -3.0f, 3.0f),
                                   test::random_tensor({n}, 62, DType::F32, -0.1f, 0.1f),
                                   test::random_tensor({n}, 63, DType::F32, 0.0f, 0.01f),
                                   Tensor::zeros({n}, DType::BF16, s)};
      };
      const ops::AdamWArgs args{.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 4};
      ops::AdamWArgs scaled = args;
      scaled.grad_scale = coeff;
      auto run = [&](std::vector<Tensor>& b, const ops::AdamWArgs& a) {
        if (multi) ops::adamw_step_multi(b[0], b[1], b[2], b[3], b[4], segs, a, s);
        else ops::adamw_step(b[0], b[1], b[2], b[3], b[4], a, s);
      };
      std::vector<Tensor> first = state(), folded = state();
      const std::vector<uint32_t> grads_before = bits(folded[1]);
      ops::scale_inplace(first[1], coeff, s);
      run(first, args);
      run(folded, scaled);
      const char* names[] = {"master", "grad", "exp_avg", "exp_avg_sq", "bf16 param"};
      for (int i : {0, 2, 3, 4})
        EXPECT_EQ(bits(first[static_cast<size_t>(i)]), bits(folded[static_cast<size_t>(i)]))
            << names[i] << ", coeff " << coeff << (multi ? ", multi-tensor" : ", single");
      EXPECT_EQ(bits(folded[1]), grads_before) << "the step changed its gradients";
      EXPECT_NE(bits(first[0]), bits(state()[0])) << "the step did nothing";
    }
  }
}
