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
//  - the MoE experts (one MoE layer, 8 experts, top-2, 200 tokens: chunks of every size, so the
//    CUDA weight-gradient GEMMs pad them to 16): looser than the linear, because the SwiGLU
//    output between the two expert GEMMs is bf16 on CUDA and f32 on the CPU before its FP8 cast
//    (and the router's bf16 logits can send a token elsewhere): y 3e-2, gradients 8e-2. The
//    first device run (2026-12-06) also had the CPU's f32 weights, not their bf16 values, and
//    measured 3.7e-2 / 6.5e-2: weights near a rounding boundary got other codes; now both sides
//    start from the same bf16 values, checked;
//  - a training step: bf16 activations on CUDA round differently before each cast, which can
//    move values across FP8 rounding boundaries: loss 3e-3, grad norm 5e-2 (3x the bf16 step
//    parity bounds of TrainingParity.*).
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <sstream>
#include "megadlm/core/dtype.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/model/moe.h"
#include "megadlm/parallel/fp8_state.h"
#include "megadlm/parallel/tensor_parallel/layers.h"
#include "megadlm/training/trainer.h"
#include "parity.h"
#include "support/op_testing.h"
#include "support/tiny_model.h"

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

const char* scaling_name(Fp8Scaling s) {
  return s == Fp8Scaling::Delayed ? "delayed" : s == Fp8Scaling::Tensorwise ? "tensorwise" : "blockwise";
}

void linear_parity(Fp8Scaling scaling, int64_t tokens = 256) {
  const int64_t in = 256, out = 384;
  Stream gpu = test::parity::gpu_stream();
  const Stream& cpu = Stream::cpu();
  const auto xv = values(tokens * in, 1, 3.0f), wv = values(out * in, 2, 0.05f), dyv = values(tokens * out, 3, 1e-3f);
  struct Side {
    std::vector<double> y, dx, dw;
  } res[2];
  std::vector<double> params[2];
  std::vector<float> shared_params;
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
      tp::LinearInput kept;  // the column-wise codes of x, made by the forward's quantize pass
      lin.forward(x, w, y, {}, s, &kept);
      Tensor dw = Tensor::zeros({out, in}, DType::F32, s);
      const Tensor dx = lin.backward(dy, kept, w, dw, s);
      // From x quantized again instead: the same codes, so the same weight gradient bit for bit;
      // on CUDA only the transposed codes are kept (one byte an element).
      Tensor dw_from_x = Tensor::zeros({out, in}, DType::F32, s);
      lin.backward(dy, tp::LinearInput::rows(x), w, dw_from_x, s);
      s.synchronize();
      EXPECT_EQ(test::to_doubles(dw_from_x, s), test::to_doubles(dw, s)) << (side == 0 ? "cpu" : "cuda");
      if (side == 1) {
        EXPECT_FALSE(kept.codes.data.defined());
        ASSERT_TRUE(kept.codes.data_t.defined());
        // Bytes (held in an I32 tensor); blockwise pads the token rows to a multiple of 128.
        const int64_t rows = scaling == Fp8Scaling::Blockwise ? (tokens + 127) / 128 * 128 : tokens;
        EXPECT_EQ(kept.codes.data_t.numel() * 4, rows * in);
      }
      res[side] = {test::to_doubles(y, s), test::to_doubles(dx, s), test::to_doubles(dw, s)};
      state->finish_step(nullptr, nullptr, s);
    }
  }
  ASSERT_EQ(params[0].size(), params[1].size());
  EXPECT_EQ(test::rel_l2(params[1], params[0]), 0.0) << "the two sides do not start from the same weights";
  const double ey = test::rel_l2(res[1].y, res[0].y), edx = test::rel_l2(res[1].dx, res[0].dx),
               edw = test::rel_l2(res[1].dw, res[0].dw);
  std::printf("[parity fp8 linear %s, %lld tokens] rel L2 y %.3e dx %.3e dw %.3e\n", scaling_name(scaling),
              static_cast<long long>(tokens), ey, edx, edw);
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

/// `varilen_prob` 1: every micro-batch cut to a drawn length (--difflm-varilen-prob), the same
/// draws on both sides: token counts that are no multiple of 16 or 128.
void step_parity(Fp8Recipe recipe, float varilen_prob = 0.0f, int64_t iters = 4) {
  auto data = std::make_shared<MockGptDataset>(500, 128, 499);
  std::ostringstream log;
  auto run = [&](DeviceKind device) {
    RunConfig r = fp8_run(device, recipe, iters);
    r.diffusion.varilen_prob = varilen_prob;
    return r;
  };
  Trainer cpu(run(DeviceKind::Cpu), data, log);
  Trainer gpu(run(DeviceKind::Cuda), data, log);
  for (int64_t i = 0; i < iters; ++i) {
    const IterationMetrics a = cpu.step(), b = gpu.step();
    const double dl = std::fabs(a.lm_loss - b.lm_loss) / a.lm_loss;
    const double dg = std::fabs(a.grad_norm - b.grad_norm) / a.grad_norm;
    std::printf("[parity fp8 step %s] iteration %lld: loss cpu %.6f cuda %.6f (rel %.2e), grad norm cpu %.5f "
                "cuda %.5f (rel %.2e)\n",
                recipe == Fp8Recipe::Delayed ? "delayed" : recipe == Fp8Recipe::Tensorwise ? "tensorwise" : "blockwise",
                static_cast<long long>(i + 1),
                a.lm_loss, b.lm_loss, dl, a.grad_norm, b.grad_norm, dg);
    ASSERT_TRUE(std::isfinite(b.lm_loss) && std::isfinite(b.grad_norm));
    EXPECT_LT(dl, 3e-3) << "iteration " << i + 1;
    EXPECT_LT(dg, 5e-2) << "iteration " << i + 1;
  }
}

/// One MoE layer (8 experts, top-2, SwiGLU, 200 tokens) with its expert GEMMs in FP8: forward and
/// backward on the CPU (f32 emulation) and on CUDA (bf16 activations, cuBLASLt FP8 GEMMs per
/// expert), the same parameters (materialized from one seed) and inputs.
void moe_experts_parity(Fp8Scaling scaling) {
  const int64_t tokens = 200, h = 256;
  RunConfig r = test::tiny_run({.layers = 1, .hidden = h, .heads = 4, .query_groups = 2, .kv_channels = 64,
                                .ffn = 512, .seq = tokens, .vocab = 512});
  test::make_moe(r, 8, 2);  // expert width 256
  const TransformerConfig cfg = r.model;
  Stream gpu = test::parity::gpu_stream();
  const auto xv = values(tokens * h, 11, 1.0f), dyv = values(tokens * h, 12, 1e-3f);
  struct Side {
    std::vector<double> y, dx, dw1, dw2;
  } res[2];
  std::vector<double> params[2];
  std::vector<float> shared_params;
  for (int side = 0; side < 2; ++side) {
    const Stream& s = side == 0 ? Stream::cpu() : static_cast<const Stream&>(gpu);
    const DType act = side == 0 ? DType::F32 : DType::BF16;
    Fp8Settings st;
    st.scaling = scaling;
    st.num_layers = 1;
    ModelParallel mp = ModelParallel::single();
    mp.fp8 = std::make_shared<Fp8State>(st);
    ParameterStore store;
    MoeLayer layer(cfg, 0, "decoder.layers.0.", store, mp);
    store.materialize(act, 5, s);
    // Both sides start from the CPU's parameters rounded to bf16 (what CUDA can hold): a weight
    // whose two sides differ near an FP8 rounding boundary gets another code (measured on the
    // H100 before this: rel L2 3.7e-2 in y and 6.5e-2 in dx, where the linear test's agree).
    Tensor flat = store.flat_params();
    if (side == 0) {
      float* p = flat.data<float>();
      for (int64_t i = 0; i < flat.numel(); ++i) p[i] = round_to_bf16(p[i]);
      shared_params.assign(p, p + flat.numel());
    } else {
      copy_tensor(on(shared_params, {flat.numel()}, s, act), flat, s);
    }
    params[side] = test::to_doubles(flat, s);
    MoeStepState moe(cfg, DType::F32, s);
    ModelRuntime rt;
    rt.stream = s;
    rt.dtype = act;
    rt.training = true;
    rt.moe = &moe;
    MicroBatch mb;
    mb.batch = 1;
    mb.seq = tokens;
    const Tensor x = on(xv, {tokens, h}, s, act), dy = on(dyv, {tokens, h}, s, act);
    // Delayed: one step to fill the history, then the compared step with the updated scales.
    for (int step = 0; step < (scaling == Fp8Scaling::Delayed ? 2 : 1); ++step) {
      mp.fp8->begin_step(s);
      moe.begin_step(s);
      store.zero_grads(s);
      MoeLayer::Saved saved;
      const Tensor y = layer.forward(x, mb, saved, rt);
      const Tensor dx = layer.backward(dy, mb, saved, rt);
      s.synchronize();
      int w1 = -1, w2 = -1;
      for (int p = 0; p < static_cast<int>(store.descs().size()); ++p) {
        if (store.desc(p).name == "decoder.layers.0.mlp.experts.3.linear_fc1_gate.weight") w1 = p;
        if (store.desc(p).name == "decoder.layers.0.mlp.experts.3.linear_fc2.weight") w2 = p;
      }
      ASSERT_GE(w1, 0);
      ASSERT_GE(w2, 0);
      res[side] = {test::to_doubles(y, s), test::to_doubles(dx, s), test::to_doubles(store.grad(w1), s),
                   test::to_doubles(store.grad(w2), s)};
      mp.fp8->finish_step(nullptr, nullptr, s);
    }
  }
  ASSERT_EQ(params[0].size(), params[1].size());
  EXPECT_EQ(test::rel_l2(params[1], params[0]), 0.0) << "the two sides do not start from the same weights";
  const double ey = test::rel_l2(res[1].y, res[0].y), edx = test::rel_l2(res[1].dx, res[0].dx),
               edw1 = test::rel_l2(res[1].dw1, res[0].dw1), edw2 = test::rel_l2(res[1].dw2, res[0].dw2);
  std::printf("[parity fp8 experts %s] rel L2 y %.3e dx %.3e dW1(expert 3) %.3e dW2(expert 3) %.3e\n",
              scaling == Fp8Scaling::Delayed ? "delayed" : "tensorwise", ey, edx, edw1, edw2);
  // Same weights and inputs; what still differs is the activation between fc1 and fc2 and the
  // gradient dfc1 (bf16 on CUDA, f32 on the CPU) before their casts: a few % of their elements
  // land on the next FP8 code (e4m3 forward; e5m2, 2 mantissa bits, for dfc1), and under
  // tensorwise scaling dfc1's own amax (bf16 vs f32) moves its scale. Measured on the H100
  // (2026-12-06): y 1.95e-2 / 1.82e-2, dx 5.69e-2 / 4.38e-2, dW1 5.82e-2 / 4.89e-2, dW2
  // 2.79e-2 / 2.87e-2 (tensorwise / delayed). A wrong scale or expert mapping gives 0.5 and more.
  EXPECT_LT(ey, 3e-2);
  EXPECT_LT(edx, 8e-2);
  EXPECT_LT(edw1, 8e-2);
  EXPECT_LT(edw2, 5e-2);
  EXPECT_GT(test::rel_l2(res[0].dw2, std::vector<double>(res[0].dw2.size(), 0.0)), 0.0) << "expert 3 got no tokens";
}

void moe_step_parity(Fp8Recipe recipe) {
  const int64_t iters = 4;
  auto run = [&](DeviceKind device) {
    RunConfig r = fp8_run(device, recipe, iters);
    test::make_moe(r, 8, 2);
    r.model.moe.shared_expert_size = 128;
    return r;
  };
  auto data = std::make_shared<MockGptDataset>(500, 128, 499);
  std::ostringstream log;
  Trainer cpu(run(DeviceKind::Cpu), data, log);
  Trainer gpu(run(DeviceKind::Cuda), data, log);
  for (int64_t i = 0; i < iters; ++i) {
    const IterationMetrics a = cpu.step(), b = gpu.step();
    const double dl = std::fabs(a.lm_loss - b.lm_loss) / a.lm_loss;
    const double dg = std::fabs(a.grad_norm - b.grad_norm) / a.grad_norm;
    std::printf("[parity fp8 moe step %s] iteration %lld: loss cpu %.6f cuda %.6f (rel %.2e), grad norm rel %.2e\n",
                recipe == Fp8Recipe::Delayed ? "delayed" : recipe == Fp8Recipe::Tensorwise ? "tensorwise" : "blockwise",
                static_cast<long long>(i + 1), a.lm_loss,
                b.lm_loss, dl, dg);
    ASSERT_TRUE(std::isfinite(b.lm_loss) && std::isfinite(b.grad_norm));
    // The dense FP8 step's bounds; the MoE bf16 step parity (MoeParity) allows the same 3e-3 /
    // 4e-2 for tokens the bf16 router sends elsewhere. Not yet measured on a device.
    EXPECT_LT(dl, 3e-3) << "iteration " << i + 1;
    EXPECT_LT(dg, 5e-2) << "iteration " << i + 1;
  }
}

}  // namespace

TEST(Fp8TrainingParity, MoeExpertsTensorwiseCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  moe_experts_parity(Fp8Scaling::Tensorwise);
}

TEST(Fp8TrainingParity, MoeExpertsDelayedCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  moe_experts_parity(Fp8Scaling::Delayed);
}

TEST(Fp8TrainingParity, MoeTensorwiseStepCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  moe_step_parity(Fp8Recipe::Tensorwise);
}

TEST(Fp8TrainingParity, MoeDelayedStepCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  moe_step_parity(Fp8Recipe::Delayed);
}

TEST(Fp8TrainingParity, LinearTensorwiseCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  linear_parity(Fp8Scaling::Tensorwise);
}

TEST(Fp8TrainingParity, LinearDelayedCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  linear_parity(Fp8Scaling::Delayed);
}

// A micro-batch truncated by --difflm-varilen-prob: 331 tokens, no multiple of 16, the K of the
// weight gradient's cuBLASLt GEMM (its codes padded along K with zeros on CUDA).
TEST(Fp8TrainingParity, LinearOverATruncatedMicroBatchCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  linear_parity(Fp8Scaling::Delayed, 331);
  linear_parity(Fp8Scaling::Tensorwise, 331);
}

TEST(Fp8TrainingParity, TensorwiseStepCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  step_parity(Fp8Recipe::Tensorwise);
}

TEST(Fp8TrainingParity, DelayedStepCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  step_parity(Fp8Recipe::Delayed);
}

// --fp8-recipe blockwise (docs/fp8.md "Blockwise scaling"): 1x128 tiles for x and dy, 128x128
// blocks for W, power-of-2 scales; the same bounds as the per-tensor recipes (a tile's amax is
// read from bf16 values on CUDA and f32 on the CPU, so a scale can differ by a power of two near
// a boundary, as a per-tensor one can). 200 tokens: the token rows are padded to 256 for the
// cuBLASLt block modes (zero rows, the unpadded result).
TEST(Fp8TrainingParity, BlockwiseLinearCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  linear_parity(Fp8Scaling::Blockwise);
}

TEST(Fp8TrainingParity, BlockwiseLinearPaddedTokensCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  linear_parity(Fp8Scaling::Blockwise, 200);
}

TEST(Fp8TrainingParity, BlockwiseStepCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  step_parity(Fp8Recipe::Blockwise);
}

// Every micro-batch truncated (16 drawn lengths of 2 rows each). The ~125M blockwise convergence
// run on the H100 (2026-12-07) stopped with an unspecified launch failure between iterations 111
// and 120, where its micro-batches 455, 465 and 471 were cut to 5784, 6184 and 2072 tokens
// (earlier cuts to 168 ... 6064 tokens had passed); the delayed and bf16 runs of the same data
// went on. These steps put such counts through every recipe's whole step on the device.
TEST(Fp8TrainingParity, TruncatedMicroBatchStepsCudaMatchCpu) {
  MDLM_REQUIRE_GPU();
  for (Fp8Recipe recipe : {Fp8Recipe::Blockwise, Fp8Recipe::Delayed, Fp8Recipe::Tensorwise})
    step_parity(recipe, 1.0f, 8);
}
