// Backend parity of whole training steps: the CUDA (bf16, fp32 master) trainer against the CPU
// (fp32) trainer on the same configuration, data and masks. Runs on the device machine.
#include <gtest/gtest.h>
#include <cmath>
#include <cstdio>
#include <sstream>
#include "megadlm/data/mock_dataset.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/training/trainer.h"
#include "support/op_testing.h"

using namespace megadlm;

namespace {

RunConfig parity_run(DeviceKind device, int64_t iters, bool swiglu_rope) {
  RunConfig r;
  TransformerConfig& m = r.model;
  m.num_layers = 2;
  m.hidden_size = 256;
  m.num_attention_heads = 4;
  m.num_query_groups = swiglu_rope ? 2 : 4;
  m.kv_channels = 64;
  m.ffn_hidden_size = 512;
  m.seq_length = 128;
  m.max_position_embeddings = 128;
  m.position_embedding_type = swiglu_rope ? PositionEmbeddingType::Rope : PositionEmbeddingType::LearnedAbsolute;
  m.normalization = swiglu_rope ? NormType::RMSNorm : NormType::LayerNorm;
  m.activation = swiglu_rope ? MlpActivation::SwiGLU : MlpActivation::Gelu;
  m.qk_layernorm = swiglu_rope;
  m.add_bias_linear = m.add_qkv_bias = !swiglu_rope;
  m.untie_embeddings_and_output_weights = swiglu_rope;
  m.vocab_size = 500;
  m.padded_vocab_size = 512;
  m.hidden_dropout = swiglu_rope ? 0.1f : 0.0f;
  m.attention_dropout = 0.0f;
  m.attention_mask = swiglu_rope ? AttentionMaskType::NoMask : AttentionMaskType::Causal;
  r.diffusion.mode = swiglu_rope ? RunningMode::DiffLMNoShift : RunningMode::Vanilla;
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
  return r;
}

void compare_backends(bool swiglu_rope) {
  const int64_t iters = 5;
  auto data = std::make_shared<MockGptDataset>(500, 128, 499);
  std::ostringstream log;
  Trainer cpu(parity_run(DeviceKind::Cpu, iters, swiglu_rope), data, log);
  Trainer gpu(parity_run(DeviceKind::Cuda, iters, swiglu_rope), data, log);

  // Initial weights: the same Philox values, the CUDA ones rounded to bf16.
  auto w_cpu = test::to_doubles(cpu.optimizer().master(), cpu.runtime().stream);
  auto w_gpu = test::to_doubles(gpu.optimizer().master(), gpu.runtime().stream);
  EXPECT_LT(test::rel_l2(w_gpu, w_cpu), 1e-6) << "fp32 masters must be initialised identically";

  for (int64_t i = 0; i < iters; ++i) {
    IterationMetrics a = cpu.step(), b = gpu.step();
    const double dl = std::fabs(a.lm_loss - b.lm_loss) / a.lm_loss;
    const double dg = std::fabs(a.grad_norm - b.grad_norm) / a.grad_norm;
    std::printf("[parity %s] iteration %lld: loss cpu %.6f cuda %.6f (rel %.2e), grad norm cpu %.5f "
                "cuda %.5f (rel %.2e)\n",
                swiglu_rope ? "dlm" : "ar", static_cast<long long>(i + 1), a.lm_loss, b.lm_loss, dl,
                a.grad_norm, b.grad_norm, dg);
    // bf16 activations (8-bit mantissa) through 2 layers. Measured on the H200 before the fused
    // ops (2026-11-29): loss within 3.0e-4, grad norm within 9.2e-3, first-step gradients 1.0e-2;
    // the bounds keep a margin of about 3x for the fused paths' different rounding points (not
    // yet re-measured with them: see docs/benchmarks.md).
    EXPECT_LT(dl, 1e-3) << "iteration " << i + 1;
    EXPECT_LT(dg, 3e-2) << "iteration " << i + 1;
    if (i == 0) {
      auto g_cpu = test::to_doubles(cpu.parameters().flat_grads(), cpu.runtime().stream);
      auto g_gpu = test::to_doubles(gpu.parameters().flat_grads(), gpu.runtime().stream);
      const double rel = test::rel_l2(g_gpu, g_cpu);
      std::printf("[parity %s] first-step gradient rel L2 %.3e\n", swiglu_rope ? "dlm" : "ar", rel);
      EXPECT_LT(rel, 3e-2) << "all gradients of the first step (unclipped: the step folds the clip in)";
    }
  }
}

}  // namespace

TEST(TrainingParity, DiffusionStepOnCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  compare_backends(true);
}

TEST(TrainingParity, AutoregressiveStepWithBiasesOnCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  compare_backends(false);
}

TEST(TrainingParity, DeterministicModeRepeatsARunBitForBit) {
  MDLM_REQUIRE_GPU();
  // --deterministic-mode: two identical CUDA runs give bitwise equal losses and gradient norms
  // (without it the attention dQ accumulation may reorder fp32 additions between runs).
  const int64_t iters = 3;
  auto data = std::make_shared<MockGptDataset>(500, 128, 499);
  std::ostringstream log;
  RunConfig cfg = parity_run(DeviceKind::Cuda, iters, true);
  cfg.model.deterministic_mode = true;
  Trainer a(cfg, data, log), b(cfg, data, log);
  for (int64_t i = 0; i < iters; ++i) {
    const IterationMetrics x = a.step(), y = b.step();
    std::printf("[parity deterministic] iteration %lld: loss %.9g / %.9g, grad norm %.9g / %.9g\n",
                static_cast<long long>(i + 1), x.lm_loss, y.lm_loss, x.grad_norm, y.grad_norm);
    EXPECT_EQ(x.lm_loss, y.lm_loss) << "iteration " << i + 1;
    EXPECT_EQ(x.grad_norm, y.grad_norm) << "iteration " << i + 1;
  }
}
