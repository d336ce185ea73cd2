// The FP8 linear layer (tp::Fp8Linear, docs/fp8.md "Training") and the delayed-scaling state
// (Fp8State) on the CPU backend, against the exact-arithmetic reference of
// tests/golden/fp8_linear_reference.py:
//  - the quantized operands bit for bit (same scale, rounding, saturation as the reference);
//  - y, dx, dW within 4 fp32 ulps of the exact result: the emulation's products and sums are
//    exact (decoded FP8 values summed in double), only the product of the two inverse scales is
//    rounded to fp32 before the final rounding (2 roundings more than the reference's one);
//  - delayed scaling over micro-batches: scales bit for bit over six steps, and the state saved
//    with state() and restored with set_state() continues bitwise.
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <cmath>
#include <memory>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/fp8.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/fp8_gemm.h"
#include "megadlm/parallel/fp8_state.h"
#include "megadlm/parallel/tensor_parallel/layers.h"

using namespace megadlm;

namespace {

constexpr int kT = 8, kIn = 16, kOut = 12;

struct Fp8LinearCase {
  int grad_type;  // 0 e4m3, 1 e5m2
  uint32_t scales[3];  // x, w, dy
  uint32_t x[kT * kIn], w[kOut * kIn], dy[kT * kOut];
  uint32_t qx[kT * kIn], qw[kOut * kIn], qdy[kT * kOut];
  uint32_t y[kT * kOut], dx[kT * kIn], dw[kOut * kIn];
};
struct Fp8DelayedStateCase {
  int type, len, algo, margin;
  uint32_t amax[12];  // 6 steps x 2 micro-batches
  uint32_t scale[6];
};
#include "golden/fp8_linear_reference.inc"

float f(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
Tensor tensor(const uint32_t* v, int64_t rows, int64_t cols) {
  std::vector<float> d(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < d.size(); ++i) d[i] = f(v[i]);
  return Tensor::from_floats(d, {rows, cols});
}
void expect_close(const Tensor& got, const uint32_t* want, const char* what) {
  const std::vector<float> g = got.to_floats(Stream::cpu());
  for (size_t i = 0; i < g.size(); ++i) {
    const float w = f(want[i]);
    // 4 ulps of the reference (relative 2^-21), the bound explained at the top of the file.
    EXPECT_NEAR(g[i], w, std::fabs(w) * 4.8e-7f + 1e-30f) << what << "[" << i << "]";
  }
}

Fp8Settings tensorwise(int grad_type) {
  Fp8Settings s;
  s.scaling = Fp8Scaling::Tensorwise;
  s.grad_type = grad_type == 0 ? ops::Fp8Type::E4M3 : ops::Fp8Type::E5M2;
  return s;
}

void run_linear_case(const Fp8LinearCase& c) {
  const Stream& s = Stream::cpu();
  const Tensor x = tensor(c.x, kT, kIn), w = tensor(c.w, kOut, kIn), dy = tensor(c.dy, kT, kOut);
  // The operands the layer quantizes: the scales and codes of the reference, bit for bit.
  const ops::Fp8Type grad = c.grad_type == 0 ? ops::Fp8Type::E4M3 : ops::Fp8Type::E5M2;
  const struct {
    const Tensor* v;
    ops::Fp8Type type;
    uint32_t scale;
    const uint32_t* q;
    const char* name;
  } operands[] = {{&x, ops::Fp8Type::E4M3, c.scales[0], c.qx, "x"},
                  {&w, ops::Fp8Type::E4M3, c.scales[1], c.qw, "w"},
                  {&dy, grad, c.scales[2], c.qdy, "dy"}};
  for (const auto& o : operands) {
    Tensor amax = Tensor::zeros({1}, DType::F32, s), scale = Tensor::zeros({1}, DType::F32, s);
    ops::fp8_amax(*o.v, amax, s);
    ops::fp8_scale_from_amax(amax, scale, o.type, s);
    EXPECT_EQ(bits_of(scale.to_floats(s)[0]), o.scale) << o.name << " scale";
    const ops::Fp8Tensor q = ops::fp8_quantize(*o.v, scale, o.type, true, nullptr, s);
    const std::vector<float> got = q.data.to_floats(s);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(bits_of(got[i]), o.q[i]) << o.name << "[" << i << "]";
  }
  // The layer itself: forward, data and weight gradient.
  auto state = std::make_shared<Fp8State>(tensorwise(c.grad_type));
  tp::Fp8Linear lin(state, "layer.linear", ModelParallel::single());
  state->begin_step(s);
  Tensor y = Tensor::empty({kT, kOut}, DType::F32, s);
  lin.forward(x, w, y, {}, s);
  expect_close(y, c.y, "y");
  Tensor dw = Tensor::zeros({kOut, kIn}, DType::F32, s);
  const Tensor dx = lin.backward(dy, tp::LinearInput::rows(x), w, dw, s);
  expect_close(dx, c.dx, "dx");
  expect_close(dw, c.dw, "dw");
  // dW accumulates (the fp32 main-grad contract): a second backward doubles it.
  lin.backward(dy, tp::LinearInput::rows(x), w, dw, s);
  const std::vector<float> twice = dw.to_floats(s);
  for (size_t i = 0; i < twice.size(); ++i)
    EXPECT_NEAR(twice[i], 2 * f(c.dw[i]), std::fabs(f(c.dw[i])) * 1e-6f + 1e-30f) << "dw twice [" << i << "]";
}

std::filesystem::path source_root() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "..";
}

}  // namespace

TEST(Fp8Linear, HybridForwardBackwardMatchReference) { run_linear_case(kFp8LinearHybrid); }

TEST(Fp8Linear, E4m3ForwardBackwardMatchReference) { run_linear_case(kFp8LinearE4m3); }

TEST(Fp8Linear, ReferenceIsNotTheHighPrecisionResult) {
  // The test can fail: the fp32 GEMM of the unquantized operands is not within the bound.
  const Stream& s = Stream::cpu();
  const Fp8LinearCase& c = kFp8LinearHybrid;
  const Tensor x = tensor(c.x, kT, kIn), w = tensor(c.w, kOut, kIn);
  Tensor y = Tensor::empty({kT, kOut}, DType::F32, s);
  ops::gemm(x, w, y, {.trans_b = true}, s);
  const std::vector<float> g = y.to_floats(s);
  int differ = 0;
  for (size_t i = 0; i < g.size(); ++i) differ += std::fabs(g[i] - f(c.y[i])) > std::fabs(f(c.y[i])) * 4.8e-7f;
  EXPECT_GT(differ, static_cast<int>(g.size()) / 2);
}

TEST(Fp8Linear, WeightCastOncePerStep) {
  // The weight is quantized at its first use in a step and reused (a changed weight is not seen
  // until the next begin_step): what "cast once per optimizer step" means.
  const Stream& s = Stream::cpu();
  const Fp8LinearCase& c = kFp8LinearHybrid;
  auto state = std::make_shared<Fp8State>(tensorwise(1));
  tp::Fp8Linear lin(state, "layer.linear", ModelParallel::single());
  const Tensor x = tensor(c.x, kT, kIn);
  Tensor w = tensor(c.w, kOut, kIn);
  state->begin_step(s);
  Tensor y1 = Tensor::empty({kT, kOut}, DType::F32, s), y2 = Tensor::empty({kT, kOut}, DType::F32, s),
         y3 = Tensor::empty({kT, kOut}, DType::F32, s);
  lin.forward(x, w, y1, {}, s);
  ops::scale_inplace(w, 2.0f, s);
  lin.forward(x, w, y2, {}, s);
  EXPECT_EQ(y1.to_floats(s), y2.to_floats(s));  // the cached cast
  state->begin_step(s);
  lin.forward(x, w, y3, {}, s);
  const std::vector<float> a = y1.to_floats(s), b = y3.to_floats(s);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], 2 * a[i], std::fabs(a[i]) * 1e-6f + 1e-30f);
}

namespace {
void run_delayed_case(const Fp8DelayedStateCase& c) {
  const Stream& s = Stream::cpu();
  Fp8Settings st;
  st.scaling = Fp8Scaling::Delayed;
  st.fwd_type = st.grad_type = c.type == 0 ? ops::Fp8Type::E4M3 : ops::Fp8Type::E5M2;
  st.history_len = c.len;
  st.algo = c.algo == 1 ? ops::AmaxComputeAlgo::Max : ops::AmaxComputeAlgo::MostRecent;
  st.margin = c.margin;
  Fp8State state(st);
  const int i = state.add("t.input", Fp8State::Role::Input);
  std::unique_ptr<Fp8State> resumed;
  for (int step = 0; step < 6; ++step) {
    Fp8State& run = resumed ? *resumed : state;
    run.begin_step(s);
    EXPECT_EQ(bits_of(run.scale(i, s).to_floats(s)[0]), step == 0 ? bits_of(1.0f) : c.scale[step - 1])
        << "scale used in step " << step;
    for (int mb = 0; mb < 2; ++mb) {  // a micro-batch's tensor whose amax is the case's
      const float a = f(c.amax[2 * step + mb]);
      const Tensor x = Tensor::from_floats({a * 0.5f, -a, 0.0f}, {1, 3});
      Tensor amax = run.amax(i, s);
      ops::fp8_quantize(x, run.scale(i, s), run.type(i), false, &amax, s);
    }
    run.finish_step(nullptr, nullptr, s);
    EXPECT_EQ(bits_of(run.scale(i, s).to_floats(s)[0]), c.scale[step]) << "after step " << step;
    if (step == 2) {  // checkpoint and resume from here: the continuation is bitwise the same
      resumed = std::make_unique<Fp8State>(st);
      const int j = resumed->add("t.input", Fp8State::Role::Input);
      resumed->set_state(j, state.state(i), s);
    }
  }
}
}  // namespace

TEST(Fp8State, DelayedMaxHistory3Margin1) { run_delayed_case(kFp8DelayedMax3); }
TEST(Fp8State, DelayedMostRecentHistory1E5m2) { run_delayed_case(kFp8DelayedRecent1); }
TEST(Fp8State, DelayedMostRecentHistory4Margin2) { run_delayed_case(kFp8DelayedRecent4); }

TEST(Fp8State, RejectsStateOfAnotherHistoryLength) {
  Fp8Settings st;
  st.history_len = 4;
  Fp8State state(st);
  const int i = state.add("t.weight", Fp8State::Role::Weight);
  EXPECT_THROW(state.set_state(i, {1.0f, 2.0f}, Stream::cpu()), std::exception);
}

TEST(Fp8State, BfloatLayers) {
  Fp8Settings st;
  st.num_layers = 6;
  st.bf16_start = 1;
  st.bf16_end = 2;
  Fp8State state(st);
  const bool want[6] = {false, true, true, true, false, false};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(state.fp8_layer(l), want[l]) << "layer " << l;
}

TEST(Fp8Linear, GoldenTableMatchesItsScript) {
  const std::filesystem::path root = source_root();
  const std::filesystem::path script = root / "tests" / "golden" / "fp8_linear_reference.py";
  const std::filesystem::path inc = root / "tests" / "golden" / "fp8_linear_reference.inc";
  if (std::system("python3 -c 'import fractions' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 not found: the golden table is not regenerated";
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("fp8_linear_reference_" + std::to_string(::getpid()) + ".inc");
  const std::string cmd = "python3 '" + script.string() + "' > '" + out.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string fresh = slurp(out), committed = slurp(inc);
  std::filesystem::remove(out);
  EXPECT_FALSE(fresh.empty());
  EXPECT_TRUE(fresh == committed) << "tests/golden/fp8_linear_reference.inc differs from its script; regenerate it";
}

// --fp8-recipe blockwise: the layer's three GEMMs equal the block-scaled emulation of
// ops/fp8.h on the operands quantized by hand (x 1x128 row-wise tiles for fprop and column-wise
// tiles along the tokens for wgrad, W 128x128 blocks in both orientations, dy e5m2 tiles both
// ways), for 256 tokens and for 200 (a varilen-truncated micro-batch: the layer pads the token
// rows to 256 with zeros, which must give the unpadded result: zero rows change no tile's amax
// and add nothing). No state: two steps give the same numbers.
namespace {

std::vector<float> lcg_values(size_t n, uint32_t seed, float mag) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (float& e : v) {
    s = s * 1664525u + 1013904223u;
    e = mag * (static_cast<float>(s >> 8) / 8388608.0f - 1.0f) * ((s & 0x30u) == 0 ? 16.0f : 1.0f);
  }
  return v;
}

std::vector<float> transpose_of(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> o(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) o[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
  return o;
}

/// d [n, m] = block-scaled GEMM of a [m, k] (granularity ga, type ta) and b [n, k] (1x128 tiles,
/// type tb), both quantized from the given K-contiguous values.
std::vector<float> block_gemm(const std::vector<float>& a, int64_t m, ops::Fp8Granularity ga, ops::Fp8Type ta,
                              const std::vector<float>& b, int64_t n, ops::Fp8Type tb, int64_t k) {
  // The layer pads K (tokens) with zeros to a multiple of 128: so does the reference (partial
  // tiles would give the same scales; the GEMM reference wants whole K-blocks).
  const int64_t kp = (k + 127) / 128 * 128;
  auto pad = [&](const std::vector<float>& v, int64_t rows) {
    std::vector<float> o(static_cast<size_t>(rows * kp), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      std::copy(v.begin() + r * k, v.begin() + (r + 1) * k, o.begin() + r * kp);
    return o;
  };
  const std::vector<float> ap = pad(a, m), bp = pad(b, n);
  std::vector<uint8_t> qa(ap.size()), qb(bp.size());
  std::vector<float> sa(static_cast<size_t>(ops::fp8_block_grid_size(ga, m, kp)));
  std::vector<float> sb(static_cast<size_t>(ops::fp8_block_grid_size(ops::Fp8Granularity::Tile1x128, n, kp)));
  ops::fp8_quantize_blockwise(ap, m, kp, ga, ta, true, qa, sa);
  ops::fp8_quantize_blockwise(bp, n, kp, ops::Fp8Granularity::Tile1x128, tb, true, qb, sb);
  std::vector<float> d(static_cast<size_t>(m * n));
  ops::fp8_block_gemm_reference(qa, ta, ga, sa, qb, tb, ops::Fp8Granularity::Tile1x128, sb, m, n, kp, 1.0f, d);
  return d;
}

void expect_rel_close(const Tensor& got, const std::vector<float>& want, const char* what) {
  const std::vector<float> g = got.to_floats(Stream::cpu());
  ASSERT_EQ(g.size(), want.size()) << what;
  // Power-of-2 scales make every dequantized product exact: only the fp32 summation of the
  // emulation differs from the double sums of the reference (a few ulps of the largest terms).
  float scale = 0.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], std::fabs(want[i]) * 1e-5f + scale * 1e-6f) << what << "[" << i << "]";
}

void blockwise_linear(int64_t tokens) {
  const Stream& s = Stream::cpu();
  const int64_t in = 256, out = 384;
  const std::vector<float> xv = lcg_values(static_cast<size_t>(tokens * in), 1, 2.0f);
  const std::vector<float> wv = lcg_values(static_cast<size_t>(out * in), 2, 0.05f);
  const std::vector<float> dyv = lcg_values(static_cast<size_t>(tokens * out), 3, 1e-3f);
  const Tensor x = Tensor::from_floats(xv, {tokens, in}), w = Tensor::from_floats(wv, {out, in}),
               dy = Tensor::from_floats(dyv, {tokens, out});
  Fp8Settings st;
  st.scaling = Fp8Scaling::Blockwise;
  auto state = std::make_shared<Fp8State>(st);
  tp::Fp8Linear lin(state, "layer.linear", ModelParallel::single());
  using G = ops::Fp8Granularity;
  const ops::Fp8Type e4 = ops::Fp8Type::E4M3, e5 = ops::Fp8Type::E5M2;
  // fprop: d [tokens, out] = W (BLK) x x (VEC along in).
  const std::vector<float> y_ref = block_gemm(wv, out, G::Block128x128, e4, xv, tokens, e4, in);
  // dgrad: d [tokens, in] = Wᵀ (BLK) x dy (VEC along out).
  const std::vector<float> dx_ref = block_gemm(transpose_of(wv, out, in), in, G::Block128x128, e4, dyv, tokens, e5, out);
  // wgrad: d [out, in] = xᵀ (VEC along tokens) x dyᵀ (VEC along tokens).
  const std::vector<float> dw_ref =
      block_gemm(transpose_of(xv, tokens, in), in, G::Tile1x128, e4, transpose_of(dyv, tokens, out), out, e5, tokens);
  for (int step = 0; step < 2; ++step) {
    state->begin_step(s);
    Tensor y = Tensor::empty({tokens, out}, DType::F32, s);
    lin.forward(x, w, y, {}, s);
    expect_rel_close(y, y_ref, "y");
    Tensor dw = Tensor::zeros({out, in}, DType::F32, s);
    const Tensor dx = lin.backward(dy, tp::LinearInput::rows(x), w, dw, s);
    ASSERT_EQ(dx.rows(), tokens);
    expect_rel_close(dx, dx_ref, "dx");
    expect_rel_close(dw, dw_ref, "dw");
    state->finish_step(nullptr, nullptr, s);  // nothing to do: no state
  }
  // The residual-add form (beta, addend) pads the addend too.
  Tensor res = Tensor::from_floats(lcg_values(static_cast<size_t>(tokens * out), 4, 1.0f), {tokens, out});
  Tensor y2 = Tensor::empty({tokens, out}, DType::F32, s);
  lin.forward(x, w, y2, {.beta = 1.0f, .addend = &res}, s);
  std::vector<float> want = res.to_floats(s);
  for (size_t i = 0; i < want.size(); ++i) want[i] += y_ref[i];
  expect_rel_close(y2, want, "y + residual");
}

}  // namespace

TEST(Fp8Linear, BlockwiseMatchesTheBlockScaledEmulation) { blockwise_linear(256); }

TEST(Fp8Linear, BlockwisePadsTruncatedTokenRows) { blockwise_linear(200); }

TEST(Fp8Linear, KeptInputCodesGiveTheGradientsOfTheInput) {
  // The forward keeps the column-wise codes of x for the weight gradient (tp::LinearInput)
  // instead of x: the gradients must be those of the backward that quantizes x again, bit for
  // bit, under every recipe (blockwise with token rows that need padding), and with
  // --no-fp8-wgrad x itself is kept.
  const Stream& s = Stream::cpu();
  const int64_t tokens = 200, in = 256, out = 128;
  const Tensor x = Tensor::from_floats(lcg_values(static_cast<size_t>(tokens * in), 11, 2.0f), {tokens, in});
  const Tensor w = Tensor::from_floats(lcg_values(static_cast<size_t>(out * in), 12, 0.05f), {out, in});
  const Tensor dy = Tensor::from_floats(lcg_values(static_cast<size_t>(tokens * out), 13, 1e-3f), {tokens, out});
  for (const Fp8Scaling scaling : {Fp8Scaling::Delayed, Fp8Scaling::Tensorwise, Fp8Scaling::Blockwise})
    for (const bool wgrad : {true, false}) {
      SCOPED_TRACE(testing::Message() << "scaling " << static_cast<int>(scaling) << " wgrad " << wgrad);
      Fp8Settings st;
      st.scaling = scaling;
      st.wgrad = wgrad;
      auto state = std::make_shared<Fp8State>(st);
      tp::Fp8Linear lin(state, "layer.linear", ModelParallel::single());
      for (int step = 0; step < 2; ++step) {  // step 1: delayed scaling's scales from step 0's amaxes
        state->begin_step(s);
        Tensor y = Tensor::empty({tokens, out}, DType::F32, s), y_kept = Tensor::empty({tokens, out}, DType::F32, s);
        lin.forward(x, w, y, {}, s);
        tp::LinearInput kept;
        lin.forward(x, w, y_kept, {}, s, &kept);
        EXPECT_EQ(y.to_floats(s), y_kept.to_floats(s));
        EXPECT_EQ(kept.x.defined(), !wgrad);
        EXPECT_EQ(kept.codes.defined(), wgrad);
        Tensor dw = Tensor::zeros({out, in}, DType::F32, s), dw_kept = Tensor::zeros({out, in}, DType::F32, s);
        const Tensor dx = lin.backward(dy, tp::LinearInput::rows(x), w, dw, s);
        const Tensor dx_kept = lin.backward(dy, kept, w, dw_kept, s);
        EXPECT_EQ(dx.to_floats(s), dx_kept.to_floats(s));
        const std::vector<float> a = dw.to_floats(s), b = dw_kept.to_floats(s);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits_of(a[i]), bits_of(b[i])) << "dw[" << i << "]";
        EXPECT_GT(*std::max_element(a.begin(), a.end()), 0.0f);  // a real gradient, not zeros
        state->finish_step(nullptr, nullptr, s);
      }
    }
}
