// Supervised fine-tuning noise: the prompt is never masked, the response is masked at LLaDA's
// rate p = (1 - 1e-3) t + 1e-3 with t recomputed here from Philox, and the two loss
// normalisations give the weights and normalisers of LLaDA's SFT recipe (docs/finetuning.md).
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/core/philox.h"
#include "megadlm/diffusion/sft_process.h"

using namespace megadlm;

namespace {

std::vector<std::vector<int32_t>> samples(int64_t batch, int64_t seq) {
  std::vector<std::vector<int32_t>> s(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i <= seq; ++i) s[static_cast<size_t>(b)].push_back(static_cast<int32_t>(1 + (b * 7 + i) % 50));
  return s;
}

double p_of(uint64_t seed, int64_t g) {
  const float t = uniform_from_u32(philox(PhiloxKey::make(seed, RngPurpose::DiffusionTime), 0, 0,
                                          static_cast<uint32_t>(g), 0).w[0]);
  return (1.0 - 1e-3) * t + 1e-3;
}

}  // namespace

TEST(SftProcess, PromptTokensAreNeverMaskedAndResponsesCarryLladasWeight) {
  DiffusionConfig cfg;
  cfg.mask_token = 99;
  cfg.sft = true;
  BatchContext ctx;
  ctx.seed = 17;
  const int64_t seq = 24, batch = 64;
  std::vector<int64_t> prompts;
  for (int64_t b = 0; b < batch; ++b) prompts.push_back(b % 20);
  const auto s = samples(batch, seq);
  const HostMicroBatch mb = build_sft_micro_batch(s, prompts, 1000, cfg, ctx);
  ASSERT_EQ(mb.seq, seq);
  EXPECT_EQ(mb.loss_tokens, static_cast<double>(batch));  // answer_len: one per sample
  int64_t masked_total = 0;
  double expected_total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const double p = p_of(17, 1000 + b);
    const int64_t answer = seq - prompts[static_cast<size_t>(b)];
    expected_total += p * static_cast<double>(answer);
    for (int64_t i = 0; i < seq; ++i) {
      const size_t k = static_cast<size_t>(b * seq + i);
      EXPECT_EQ(mb.labels[k], s[static_cast<size_t>(b)][static_cast<size_t>(i + 1)]);
      EXPECT_EQ(mb.positions[k], i);
      if (i < prompts[static_cast<size_t>(b)]) {
        ASSERT_EQ(mb.noise_mask[k], 0) << "prompt token " << i << " of sample " << b << " was masked";
        EXPECT_EQ(mb.input_ids[k], mb.labels[k]);
        EXPECT_EQ(mb.loss_weights[k], 0.0f);
      } else if (mb.noise_mask[k]) {
        ++masked_total;
        EXPECT_EQ(mb.input_ids[k], 99);
        EXPECT_FLOAT_EQ(mb.loss_weights[k], static_cast<float>(1.0 / (p * static_cast<double>(answer))));
      } else {
        EXPECT_EQ(mb.loss_weights[k], 0.0f);
      }
    }
  }
  // Bernoulli(p_b) per response token: the count is near its expectation (sd ~ sqrt(total/4)).
  EXPECT_NEAR(static_cast<double>(masked_total), expected_total, 4 * std::sqrt(expected_total));
}

TEST(SftProcess, TokenNormalisationWeighsByOneOverPAndCountsAnswerTokens) {
  DiffusionConfig cfg;
  cfg.mask_token = 99;
  cfg.sft = true;
  cfg.sft_loss_norm = SftLossNorm::Token;
  BatchContext ctx;
  ctx.seed = 3;
  const HostMicroBatch mb = build_sft_micro_batch(samples(2, 10), {3, 9}, 0, cfg, ctx);
  EXPECT_EQ(mb.loss_tokens, 7.0 + 1.0);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 10; ++i) {
      const size_t k = static_cast<size_t>(b * 10 + i);
      if (mb.noise_mask[k]) {
        EXPECT_FLOAT_EQ(mb.loss_weights[k], static_cast<float>(1.0 / p_of(3, b)));
      }
    }
}

TEST(SftProcess, EvaluationNoiseIsFixedAndApartFromTraining) {
  DiffusionConfig cfg;
  cfg.mask_token = 99;
  BatchContext train, eval;
  train.seed = eval.seed = 5;
  eval.training = false;
  const auto s = samples(8, 32);
  const std::vector<int64_t> p(8, 4);
  const HostMicroBatch a = build_sft_micro_batch(s, p, 0, cfg, eval), b = build_sft_micro_batch(s, p, 0, cfg, eval);
  const HostMicroBatch t = build_sft_micro_batch(s, p, 0, cfg, train);
  EXPECT_EQ(a.noise_mask, b.noise_mask);
  EXPECT_NE(a.noise_mask, t.noise_mask);
}

TEST(SftProcess, RejectsAPromptThatLeavesNoResponse) {
  DiffusionConfig cfg;
  EXPECT_THROW(build_sft_micro_batch(samples(1, 8), {8}, 0, cfg, BatchContext{}), Error);
}
