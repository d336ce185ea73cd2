// The MoE experts' FP8 GEMMs on the CPU emulation (docs/fp8.md, "MoE experts"), on one rank:
// every GEMM of every expert against a float64 reference built from the host FP8 rules of
// ops/fp8.h, with the scales the docs define (one per expert weight; one per layer for all
// experts' rows of the fc1 / fc2 inputs and output gradients); an expert without tokens; the
// registered state names; the delayed recipe's recorded amaxes.
#include <gtest/gtest.h>
#include <cmath>
#include <string>
#include "megadlm/model/moe.h"
#include "megadlm/ops/activation.h"
#include "megadlm/ops/fp8.h"
#include "support/op_testing.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

constexpr int kExperts = 4;
constexpr int64_t kHidden = 16, kFfn = 12;
const std::vector<int64_t> kRows = {5, 0, 7, 3};  // expert 1 gets no tokens
constexpr int64_t kTokens = 15;

TransformerConfig config() {
  RunConfig r = test::tiny_run({.layers = 1, .hidden = kHidden, .heads = 2, .query_groups = 2, .kv_channels = 8,
                                .ffn = 2 * kFfn, .seq = 8, .vocab = 16});
  test::make_moe(r, kExperts, 2);
  r.model.activation = MlpActivation::Gelu;
  return r.model;
}

/// x quantized and dequantized with the current scale of `amax` (double values of the codes).
std::vector<double> fake_quant(const std::vector<double>& x, float amax, ops::Fp8Type type) {
  const float s = ops::fp8_current_scale(amax, ops::fp8_max(type));
  std::vector<double> q(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    q[i] = static_cast<double>(ops::fp8_decode(ops::fp8_encode(static_cast<float>(x[i]) * s, type), type)) / s;
  return q;
}

float amax_of(const std::vector<double>& x, size_t begin = 0, size_t end = SIZE_MAX) {
  float m = 0;
  for (size_t i = begin; i < std::min(end, x.size()); ++i) m = std::max(m, static_cast<float>(std::fabs(x[i])));
  return m;
}

/// C[m, n] = A[m, k] B[n, k]^T over the row block [r0, r0 + m) of A and the block `e` of B.
std::vector<double> nt(const std::vector<double>& a, int64_t r0, int64_t m, const std::vector<double>& b,
                       int64_t b0, int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[static_cast<size_t>(i * n + j)] += a[static_cast<size_t>((r0 + i) * k + p)] * b[static_cast<size_t>((b0 + j) * k + p)];
  return c;
}

std::vector<double> slice(const std::vector<double>& v, int64_t begin, int64_t n) {
  return {v.begin() + begin, v.begin() + begin + n};
}

struct Experts {
  ModelParallel mp = ModelParallel::single();
  ParameterStore store;
  MoeExperts experts;
  explicit Experts(Fp8Scaling scaling) {
    Fp8Settings st;
    st.scaling = scaling;
    st.num_layers = 1;
    mp.fp8 = std::make_shared<Fp8State>(st);
    experts = MoeExperts(config(), "decoder.layers.0.mlp.experts.", 0, kExperts, store, mp);
    store.materialize(DType::F32, 9, Stream::cpu());
  }
  int handle(const std::string& name) const {
    for (int p = 0; p < static_cast<int>(store.descs().size()); ++p)
      if (store.desc(p).name == name) return p;
    ADD_FAILURE() << "no parameter " << name;
    return 0;
  }
  std::vector<double> param(int e, const char* part) {
    return test::to_doubles(store.param(handle("decoder.layers.0.mlp.experts." + std::to_string(e) + "." + part)));
  }
  std::vector<double> grad(int e, const char* part) {
    return test::to_doubles(store.grad(handle("decoder.layers.0.mlp.experts." + std::to_string(e) + "." + part)));
  }
};

}  // namespace

TEST(MoeExpertsFp8, EveryGemmMatchesTheFp8Reference) {
  const Stream& s = Stream::cpu();
  Experts ex(Fp8Scaling::Tensorwise);
  const ops::Fp8Type e4 = ops::Fp8Type::E4M3, e5 = ops::Fp8Type::E5M2;
  const Tensor x = test::random_tensor({kTokens, kHidden}, 31, DType::F32);
  const Tensor dy = test::random_tensor({kTokens, kHidden}, 32, DType::F32);
  ex.mp.fp8->begin_step(s);
  ex.store.zero_grads(s);
  MoeExperts::Saved saved;
  saved.source_rows = kRows;  // one source: this rank
  const Tensor y = ex.experts.forward(x, kRows, saved, s);
  const std::vector<double> fc1_out = test::to_doubles(saved.fc1_out), act = test::to_doubles(saved.act_out);
  const std::vector<double> xd = test::to_doubles(x), dyd = test::to_doubles(dy);
  const Tensor dx = ex.experts.backward(dy, saved, s);

  // Layer-wide activation scales (all experts' rows of the micro-batch); per-expert weight scales.
  const std::vector<double> xq = fake_quant(xd, amax_of(xd), e4), aq = fake_quant(act, amax_of(act), e4);
  const std::vector<double> dyq = fake_quant(dyd, amax_of(dyd), e5);
  // The reference dact (fp32 GEMM of the same codes) through the op's GELU backward gives dfc1.
  std::vector<double> dact(static_cast<size_t>(kTokens * kFfn)), y_ref(static_cast<size_t>(kTokens * kHidden)),
      fc1_ref(static_cast<size_t>(kTokens * kFfn));
  int64_t r = 0;
  for (int e = 0; e < kExperts; ++e) {
    const int64_t n = kRows[static_cast<size_t>(e)];
    const std::vector<double> w1 = ex.param(e, "linear_fc1.weight"), w2 = ex.param(e, "linear_fc2.weight");
    const std::vector<double> w1q = fake_quant(w1, amax_of(w1), e4), w2q = fake_quant(w2, amax_of(w2), e4);
    const std::vector<double> h = nt(xq, r, n, w1q, 0, kFfn, kHidden);
    std::copy(h.begin(), h.end(), fc1_ref.begin() + r * kFfn);
    const std::vector<double> ye = nt(aq, r, n, w2q, 0, kHidden, kFfn);
    std::copy(ye.begin(), ye.end(), y_ref.begin() + r * kHidden);
    // dact = dy W2 (W2 [H, F]): nt against W2^T.
    std::vector<double> w2t(static_cast<size_t>(kFfn * kHidden));
    for (int64_t i = 0; i < kHidden; ++i)
      for (int64_t j = 0; j < kFfn; ++j) w2t[static_cast<size_t>(j * kHidden + i)] = w2q[static_cast<size_t>(i * kFfn + j)];
    const std::vector<double> da = nt(dyq, r, n, w2t, 0, kFfn, kHidden);
    std::copy(da.begin(), da.end(), dact.begin() + r * kFfn);
    r += n;
  }
  EXPECT_LT(test::rel_l2(fc1_out, fc1_ref), 1e-6) << "fc1 forward";
  EXPECT_LT(test::rel_l2(test::to_doubles(y), y_ref), 1e-6) << "fc2 forward";
  Tensor dact_t = Tensor::from_floats(std::vector<float>(dact.begin(), dact.end()), {kTokens, kFfn});
  Tensor fc1_t = Tensor::from_floats(std::vector<float>(fc1_out.begin(), fc1_out.end()), {kTokens, kFfn});
  Tensor dfc1_t = Tensor::empty({kTokens, kFfn}, DType::F32, s);
  ops::gelu_backward(dact_t, fc1_t, dfc1_t, s);
  const std::vector<double> dfc1 = test::to_doubles(dfc1_t), dfq = fake_quant(dfc1, amax_of(dfc1), e5);
  std::vector<double> dx_ref(static_cast<size_t>(kTokens * kHidden));
  r = 0;
  for (int e = 0; e < kExperts; ++e) {
    const int64_t n = kRows[static_cast<size_t>(e)];
    const std::vector<double> w1 = ex.param(e, "linear_fc1.weight");
    const std::vector<double> w1q = fake_quant(w1, amax_of(w1), e4);
    std::vector<double> w1t(static_cast<size_t>(kHidden * kFfn));
    for (int64_t i = 0; i < kFfn; ++i)
      for (int64_t j = 0; j < kHidden; ++j) w1t[static_cast<size_t>(j * kFfn + i)] = w1q[static_cast<size_t>(i * kHidden + j)];
    const std::vector<double> dxe = nt(dfq, r, n, w1t, 0, kHidden, kFfn);
    std::copy(dxe.begin(), dxe.end(), dx_ref.begin() + r * kHidden);
    // Weight gradients: dW2 = dy^T act, dW1 = dfc1^T x over the expert's rows (transposed nt).
    std::vector<double> dw2(static_cast<size_t>(kHidden * kFfn), 0.0), dw1(static_cast<size_t>(kFfn * kHidden), 0.0);
    for (int64_t t = r; t < r + n; ++t) {
      for (int64_t i = 0; i < kHidden; ++i)
        for (int64_t j = 0; j < kFfn; ++j)
          dw2[static_cast<size_t>(i * kFfn + j)] += dyq[static_cast<size_t>(t * kHidden + i)] * aq[static_cast<size_t>(t * kFfn + j)];
      for (int64_t i = 0; i < kFfn; ++i)
        for (int64_t j = 0; j < kHidden; ++j)
          dw1[static_cast<size_t>(i * kHidden + j)] += dfq[static_cast<size_t>(t * kFfn + i)] * xq[static_cast<size_t>(t * kHidden + j)];
    }
    if (n == 0) {
      EXPECT_EQ(test::max_abs_diff(ex.grad(e, "linear_fc1.weight"), dw1), 0.0) << "expert " << e << " has no tokens";
      EXPECT_EQ(test::max_abs_diff(ex.grad(e, "linear_fc2.weight"), dw2), 0.0) << "expert " << e << " has no tokens";
    } else {
      EXPECT_LT(test::rel_l2(ex.grad(e, "linear_fc2.weight"), dw2), 1e-6) << "dW2 of expert " << e;
      EXPECT_LT(test::rel_l2(ex.grad(e, "linear_fc1.weight"), dw1), 1e-6) << "dW1 of expert " << e;
    }
    r += n;
  }
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), dx_ref), 1e-6) << "fc1 data gradient";
  // FP8 is really in effect: the fp32 GEMM of the unquantized operands differs.
  r = 0;
  const std::vector<double> w1e0 = ex.param(0, "linear_fc1.weight");
  EXPECT_GT(test::rel_l2(slice(fc1_out, 0, kRows[0] * kFfn), nt(xd, 0, kRows[0], w1e0, 0, kFfn, kHidden)), 1e-3);
}

TEST(MoeExpertsFp8, StateHoldsEveryExpertAndDelayedRecordsTheLayerAmaxes) {
  const Stream& s = Stream::cpu();
  Experts ex(Fp8Scaling::Delayed);
  Fp8State& st = *ex.mp.fp8;
  // Two GEMMs x (input, grad_output, one weight per expert).
  ASSERT_EQ(st.size(), 2 * (2 + kExperts));
  std::vector<std::string> names;
  for (int i = 0; i < st.size(); ++i) names.push_back(st.name(i));
  auto slot = [&](const std::string& n) {
    const auto it = std::find(names.begin(), names.end(), "decoder.layers.0.mlp.experts." + n);
    EXPECT_NE(it, names.end()) << n;
    return static_cast<int>(it - names.begin());
  };
  const int in1 = slot("linear_fc1.input"), go2 = slot("linear_fc2.grad_output");
  const int w1_empty = slot("1.linear_fc1.weight"), w2_3 = slot("3.linear_fc2.weight");
  const Tensor x = test::random_tensor({kTokens, kHidden}, 41, DType::F32);
  const Tensor dy = test::random_tensor({kTokens, kHidden}, 42, DType::F32);
  st.begin_step(s);
  ex.store.zero_grads(s);
  MoeExperts::Saved saved;
  saved.source_rows = kRows;
  ex.experts.forward(x, kRows, saved, s);
  ex.experts.backward(dy, saved, s);
  auto amax = [&](int i) { return st.amax(i, s).to_floats(s)[0]; };
  EXPECT_EQ(amax(in1), amax_of(test::to_doubles(x))) << "the fc1 input amax covers all experts' rows";
  EXPECT_EQ(amax(go2), amax_of(test::to_doubles(dy)));
  // The expert without tokens still has its weight cast (its history does not depend on routing).
  EXPECT_EQ(amax(w1_empty), amax_of(ex.param(1, "linear_fc1.weight")));
  EXPECT_EQ(amax(w2_3), amax_of(ex.param(3, "linear_fc2.weight")));
  st.finish_step(nullptr, nullptr, s);
  // The next step's scale of the fc1 input is fp8_max / amax (margin 0, history 1).
  EXPECT_FLOAT_EQ(st.state(in1).back(), 448.0f / amax_of(test::to_doubles(x)));
}
