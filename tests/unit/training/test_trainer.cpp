// The training loop on the CPU: a tiny diffusion LM on mock data learns, runs are reproducible,
// and gradient accumulation does not change the step (global loss normalisation).
#include <gtest/gtest.h>
#include <cmath>
#include <sstream>
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/trainer.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

// The tiny model: 2 layers, hidden 64, 4 heads, seq 64 (vocab 128 keeps it fast).
RunConfig tiny_run(int64_t iters, int mbs, int gbs) {
  RunConfig r = test::tiny_run({.query_groups = 4, .seq = 64}, iters);
  r.model.norm_epsilon = 1e-6f;
  r.optimizer.min_lr = 3e-4f;
  r.optimizer.lr_warmup_iters = 5;
  r.optimizer.adam_beta2 = 0.95f;
  r.optimizer.clip_grad = 1.0f;  // Megatron's default
  r.training.micro_batch_size = mbs;
  r.training.global_batch_size = gbs;
  r.data.mock_data = true;
  return r;
}

std::vector<IterationMetrics> run(const RunConfig& r) {
  auto data = std::make_shared<MockGptDataset>(r.model.vocab_size, r.model.seq_length,
                                               r.diffusion.mask_token);
  std::ostringstream log;
  Trainer t(r, data, log);
  return t.train();
}

double mean_loss(const std::vector<IterationMetrics>& m, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += m[i].lm_loss;
  return s / static_cast<double>(to - from);
}

}  // namespace

TEST(Trainer, TinyDiffusionModelLearnsMockDataAndIsReproducible) {
  RunConfig r = tiny_run(100, 4, 8);
  auto a = run(r);
  ASSERT_EQ(a.size(), 100u);
  // Diffusion losses are noisy (random mask ratio per sample): compare 10-iteration means.
  const double start = mean_loss(a, 0, 10), end = mean_loss(a, 90, 100);
  EXPECT_NEAR(a[0].lm_loss, std::log(128.0), 0.5) << "initial loss should be about ln V";
  EXPECT_LT(end, 0.6 * start) << "start " << start << " end " << end;
  auto b = run(r);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].lm_loss, b[i].lm_loss) << "iteration " << i + 1;
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "iteration " << i + 1;
  }
}

TEST(Trainer, GradientAccumulationMatchesOneLargeMicroBatch) {
  // Same global batch of 8 samples as 1 x 8 or 4 x 2: the losses and gradients are the same
  // function (global normalisation); only summation order differs (f32).
  auto one = run(tiny_run(3, 8, 8));
  auto four = run(tiny_run(3, 2, 8));
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(one[i].lm_loss, four[i].lm_loss, 1e-5 * one[i].lm_loss) << "iteration " << i + 1;
    EXPECT_NEAR(one[i].grad_norm, four[i].grad_norm, 1e-4 * one[i].grad_norm) << "iteration " << i + 1;
  }
}

TEST(Trainer, RecomputedNormOutputsGiveTheSameStepBitwise) {
  // --recompute-granularity selective --recompute-modules layernorm: the norm outputs are
  // recomputed in backward from their saved inputs by the same kernel: the same bits. With
  // hidden dropout the residual adds run outside the GEMMs; both forms must hold.
  for (const float dropout : {0.0f, 0.1f}) {
    RunConfig kept = tiny_run(4, 2, 4);
    kept.model.hidden_dropout = dropout;
    RunConfig recomputed = kept;
    recomputed.model.recompute_granularity = RecomputeGranularity::Selective;
    recomputed.model.recompute_norms = true;
    const auto a = run(kept), b = run(recomputed);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].lm_loss, b[i].lm_loss) << "dropout " << dropout << ", iteration " << i + 1;
      EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "dropout " << dropout << ", iteration " << i + 1;
    }
  }
}

TEST(Trainer, LogsMegatronStyleIterationLines) {
  RunConfig r = tiny_run(2, 2, 2);
  r.training.log_interval = 1;
  auto data = std::make_shared<MockGptDataset>(128, 64, 127);
  std::ostringstream log;
  Trainer t(r, data, log);
  t.train();
  const std::string s = log.str();
  for (const char* key : {"iteration        2/       2 |", "consumed samples:", "elapsed time per iteration (ms):",
                          "throughput per GPU (TFLOP/s/GPU):", "learning rate:", "global batch size:",
                          "lm loss:", "grad norm:", "number of skipped iterations:", "number of nan iterations:"})
    EXPECT_NE(s.find(key), std::string::npos) << key << "\n" << s;
}
