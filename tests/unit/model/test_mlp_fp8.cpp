// The SwiGLU MLP's backward under FP8 delayed scaling (docs/fp8.md, "Training"): the activation's
// backward pass makes fc1's output gradient and fc2's recomputed input as the codes their GEMMs
// read (ops::fp8_swiglu_backward; on the CPU its definition, swiglu_backward_recompute then the
// two casts, the CUDA kernel is checked against that on the device by
// Fp8Parity.FusedSwigluBackwardCodesEqualTheUnfusedCasts). Checked here: the op is that
// composition bit for bit (values and amaxes), and in the MLP each cast lands in its own
// linear's state slot.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <string>
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/mlp.h"
#include "megadlm/ops/activation.h"
#include "megadlm/ops/fp8_gemm.h"
#include "support/op_testing.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

ops::Fp8CastTarget target(float scale, float amax, ops::Fp8Type type) {
  return {.scale = Tensor::from_floats({scale}, {1}), .amax = Tensor::from_floats({amax}, {1}), .type = type};
}

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (float v : t.to_floats(Stream::cpu())) m = std::max(m, std::fabs(v));
  return m;
}

int slot(const Fp8State& st, const std::string& name) {
  for (int i = 0; i < st.size(); ++i)
    if (st.name(i) == name) return i;
  ADD_FAILURE() << "no FP8 state " << name;
  return 0;
}

}  // namespace

TEST(Fp8SwigluBackward, IsTheBackwardThenTheTwoCastsOnTheCpu) {
  const Stream cpu = Stream::cpu();
  constexpr int64_t kRows = 5, kF = 3;
  const Tensor fc1_out = test::random_tensor({kRows, 2 * kF}, 3, DType::F32, -4.0f, 4.0f);
  const Tensor dact = test::random_tensor({kRows, kF}, 4, DType::F32, -0.5f, 0.5f);
  // amax0 above the values (dfc1) and below them (act): both max rules show.
  const ops::Fp8CastTarget td = target(64.0f, 100.0f, ops::Fp8Type::E5M2), ta = target(8.0f, 1e-3f, ops::Fp8Type::E4M3);
  ops::Fp8Tensor dfc1, act;
  ops::fp8_swiglu_backward(dact, fc1_out, td, ta, dfc1, act, cpu);

  Tensor dx = Tensor::empty({kRows, 2 * kF}, DType::F32, cpu), y = Tensor::empty({kRows, kF}, DType::F32, cpu);
  ops::swiglu_backward_recompute(dact, fc1_out, dx, y, cpu);
  Tensor ad = Tensor::from_floats({100.0f}, {1}), aa = Tensor::from_floats({1e-3f}, {1});
  const ops::Fp8Tensor want_d = ops::fp8_quantize(dx, td.scale, ops::Fp8Type::E5M2, true, &ad, cpu);
  const ops::Fp8Tensor want_a = ops::fp8_quantize(y, ta.scale, ops::Fp8Type::E4M3, true, &aa, cpu);
  EXPECT_EQ(dfc1.data.to_floats(cpu), want_d.data.to_floats(cpu));
  EXPECT_EQ(act.data.to_floats(cpu), want_a.data.to_floats(cpu));
  EXPECT_EQ(dfc1.type, ops::Fp8Type::E5M2);
  EXPECT_EQ(act.type, ops::Fp8Type::E4M3);
  EXPECT_EQ(td.amax.to_floats(cpu)[0], 100.0f);
  EXPECT_EQ(ta.amax.to_floats(cpu)[0], max_abs(y));
  EXPECT_EQ(dfc1.scale_inv.to_floats(cpu)[0], 1.0f / 64.0f);
  // fc1_out must be [rows, 2 f].
  EXPECT_THROW(ops::fp8_swiglu_backward(dact, dx.narrow(0, 4), td, ta, dfc1, act, cpu), Error);
}

TEST(Fp8SwigluBackward, TheMlpCastsIntoItsLinearsSlots) {
  const Stream cpu = Stream::cpu();
  RunConfig r = test::tiny_run({.layers = 1, .hidden = 16, .heads = 2, .query_groups = 2, .kv_channels = 8,
                                .ffn = 24, .seq = 6, .vocab = 16});
  ASSERT_EQ(r.model.activation, MlpActivation::SwiGLU);
  Fp8Settings st;
  st.scaling = Fp8Scaling::Delayed;
  st.num_layers = 1;
  ModelParallel mp = ModelParallel::single();
  mp.fp8 = std::make_shared<Fp8State>(st);
  ParameterStore store;
  const Mlp mlp(r.model, "decoder.layers.0.", store, mp);
  store.materialize(DType::F32, 9, cpu);
  Fp8State& state = *mp.fp8;
  state.begin_step(cpu);

  MicroBatch mb;
  mb.batch = 2;
  mb.seq = 6;
  const ModelRuntime rt{.stream = cpu};
  const Tensor x = test::random_tensor({12, 16}, 5, DType::F32, -1.0f, 1.0f);
  Mlp::Saved saved;
  mlp.forward(x, mb, saved, rt);
  Tensor act = Tensor::empty({12, 24}, DType::F32, cpu);
  ops::swiglu_forward(saved.fc1_out, act, cpu);
  const Tensor dy = test::random_tensor({12, 16}, 6, DType::F32, -1e-2f, 1e-2f);
  const Tensor dx = mlp.backward(dy, mb, saved, rt);
  EXPECT_EQ(dx.rows(), 12);

  const std::string p = "decoder.layers.0.mlp.";
  const auto amax = [&](const std::string& name) { return state.amax(slot(state, p + name), cpu).to_floats(cpu)[0]; };
  EXPECT_EQ(amax("linear_fc1_gate.input"), max_abs(x));
  EXPECT_EQ(amax("linear_fc2.grad_output"), max_abs(dy));
  EXPECT_EQ(amax("linear_fc2.input"), max_abs(act));
  // Only the fused backward raises fc1's output-gradient amax (fc1's state is named by its first
  // part, the gate), as an e5m2 (gradient) cast.
  EXPECT_GT(amax("linear_fc1_gate.grad_output"), 0.0f);
  EXPECT_NE(amax("linear_fc1_gate.grad_output"), max_abs(act));
  EXPECT_EQ(state.type(slot(state, p + "linear_fc1_gate.grad_output")), ops::Fp8Type::E5M2);
}
