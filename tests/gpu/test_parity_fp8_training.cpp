// Backend parity of FP8 training (docs/fp8.md "Training"): the CUDA FP8 linear (fused
// quantize + transpose + amax kernel, cuBLASLt TN FP8 GEMMs) against the CPU emulation, and whole
// FP8 training steps of a small model, CUDA (bf16 activations) vs CPU (fp32 emulation). Runs on
// the device machine; skipped without a GPU.
//
// Bounds (not yet measured on a device; to be recorded in docs/fp8.md after the first run):
//  - the linear, same bf16-representable inputs on both sides: the scales and FP8 codes are the
//    same (the kernels use the host's rounding rules, bit-exact per Fp8Parity.*), only the GEMM's
//    accumulation order and the bf16 rounding of y and dx differ: rel L2 1e-2 (bf16 outputs),
//    1e-3 (fp32 dW);
//  - a training step: bf16 activations on CUDA round differently before each cast, which can
//    move values across FP8 rounding boundaries: loss 3e-3, grad norm 5e-2 (3x the bf16 step
//    parity bounds of TrainingParity.*).
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <sstream>
#include "megadlm/core/dtype.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/parallel/fp8_state.h"
#include "megadlm/parallel/tensor_parallel/layers.h"
#include "megadlm/training/trainer.h"
#include "parity.h"
#include "support/op_testing.h"

using namespace megadlm;

namespace {

/// bf16-representable values in [-mag, mag), deterministic in (i, salt).
std::vector<float> values(int64_t n, uint32_t salt, float mag) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = 0x9E3779B97F4A7C15ull ^ salt;
  for (auto& e : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    e = round_to_bf16(mag * (static_cast<float>(x % 20001) / 10000.0f - 1.0f));
  }
  return v;
}

Tensor on(const std::vector<float>& v, const Shape& shape, const Stream& s, DType dtype) {
  Tensor host = Tensor::from_floats(v, shape);
  if (s.device().is_cpu()) return host;
  Tensor t = Tensor::empty(shape, dtype, s);
  copy_tensor(host, t, s);
  return t;
}

void linear_parity(Fp8Scaling scaling) {
  const int64_t tokens = 256, in = 256, out = 384;
  Stream gpu = test::parity::gpu_stream();
  const Stream& cpu = Stream::cpu();
  const auto xv = values(tokens * in, 1, 3.0f), wv = values(out * in, 2, 0.05f), dyv = values(tokens * out, 3, 1e-3f);
  struct Side {
    std::vector<double> y, dx, dw;
  } res[2];
  for (int side = 0; side < 2; ++side) {
    const Stream& s = side == 0 ? cpu : gpu;
    const DType act = side == 0 ? DType::F32 : DType::BF16;
    Fp8Settings st;
    st.scaling = scaling;
    auto state = std::make_shared<Fp8State>(st);
    tp::Fp8Linear lin(state, "parity.linear", ModelParallel::single());
    const Tensor x = on(xv, {tokens, in}, s, act), w = on(wv, {out, in}, s, act), dy = on(dyv, {tokens, out}, s, act);
    // Delayed: one step to fill the history, then the compared step with the updated scales.
    for (int step = 0; step < (scaling == Fp8Scaling::Delayed ? 2 : 1); ++step) {
      state->begin_step(s);
      Tensor y = Tensor::empty({tokens, out}, act, s);
      lin.forward(x, w, y, {}, s);
      Tensor dw = Tensor::zeros({out, in}, DType::F32, s);
      const Tensor dx = lin.backward(dy, x, w, dw, s);
      s.synchronize();
      res[side] = {test::to_doubles(y, s), test::to_doubles(dx, s), test::to_doubles(dw, s)};
      state->finish_step(nullptr, nullptr, s);
    }
  }
  const double ey = test::rel_l2(res[1].y, res[0].y), edx = test::rel_l2(res[1].dx, res[0].dx),
               edw = test::rel_l2(res[1].dw, res[0].dw);
  std::printf("[parity fp8 linear %s] rel L2 y %.3e dx %.3e dw %.3e\n",
              scaling == Fp8Scaling::Delayed ? "delayed" : "tensorwise", ey, edx, edw);
  EXPECT_LT(ey, 1e-2);
  EXPECT_LT(edx, 1e-2);
  EXPECT_LT(edw, 1e-3);
}

RunConfig fp8_run(DeviceKind device, Fp8Recipe recipe, int64_t iters) {
  RunConfig r;
  TransformerConfig& m = r.model;
  m.num_layers = 2;
  m.hidden_size = 256;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.kv_channels = 64;
  m.ffn_hidden_size = 512;
  m.seq_length = 128;
  m.max_position_embeddings = 128;
  m.position_embedding_type = PositionEmbeddingType::Rope;
  m.normalization = NormType::RMSNorm;
  m.activation = MlpActivation::SwiGLU;
  m.qk_layernorm = true;
  m.add_bias_linear = m.add_qkv_bias = false;
  m.untie_embeddings_and_output_weights = true;
  m.vocab_size = 500;
  m.padded_vocab_size = 512;
  m.hidden_dropout = m.attention_dropout = 0.0f;
  m.attention_mask = AttentionMaskType::NoMask;
  r.diffusion.mode = RunningMode::DiffLMNoShift;
  r.diffusion.mask_token = 499;
  r.diffusion.varilen_prob = 0.0f;
  r.optimizer.lr = 1e-3f;
  r.optimizer.lr_decay_iters = iters;
  r.optimizer.weight_decay = 0.1f;
  r.training.micro_batch_size = 2;
  r.training.global_batch_size = 4;
  r.training.train_iters = iters;
  r.training.log_interval = 1000;
  r.training.device = device;
  r.training.bf16 = device == DeviceKind::Cuda;
  r.fp8.format = Fp8Format::Hybrid;
  r.fp8.recipe = recipe;
  r.fp8.amax_history_len = 4;
  r.fp8.amax_compute_algo = Fp8AmaxComputeAlgo::Max;
  return r;
}

void step_parity(Fp8Recipe recipe) {
  const int64_t iters = 4;
  auto data = std::make_shared<MockGptDataset>(500, 128, 499);
  std::ostringstream log;
  Trainer cpu(fp8_run(DeviceKind::Cpu, recipe, iters), data, log);
  Trainer gpu(fp8_run(DeviceKind::Cuda, recipe, iters), data, log);
  for (int64_t i = 0; i < iters; ++i) {
    const IterationMetrics a = cpu.step(), b = gpu.step();
    const double dl = std::fabs(a.lm_loss - b.lm_loss) / a.lm_loss;
    const double dg = std::fabs(a.grad_norm - b.grad_norm) / a.grad_norm;
    std::printf("[parity fp8 step %s] iteration %lld: loss cpu %.6f cuda %.6f (rel %.2e), grad norm cpu %.5f "
                "cuda %.5f (rel %.2e)\n",
                recipe == Fp8Recipe::Delayed ? "delayed" : "tensorwise", static_cast<long long>(i + 1),
                a.lm_loss, b.lm_loss, dl, a.grad_norm, b.grad_norm, dg);
    ASSERT_TRUE(std::isfinite(b.lm_loss) && std::isfinite(b.grad_norm));
    EXPECT_LT(dl, 3e-3) << "iteration " << i + 1;
    EXPECT_LT(dg, 5e-2) << "iteration " << i + 1;
  }
}

}  // namespace

TEST(Fp8TrainingParity, LinearTensorwiseCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  linear_parity(Fp8Scaling::Tensorwise);
}

TEST(Fp8TrainingParity, LinearDelayedCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  linear_parity(Fp8Scaling::Delayed);
}

TEST(Fp8TrainingParity, TensorwiseStepCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  step_parity(Fp8Recipe::Tensorwise);
}

TEST(Fp8TrainingParity, DelayedStepCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  step_parity(Fp8Recipe::Delayed);
}
