#include <gtest/gtest.h>
#include <cmath>
#include <map>
#include <numeric>
#include "megadlm/diffusion/forward_process.h"

using namespace megadlm;

namespace {

std::vector<std::vector<int32_t>> make_samples(int64_t batch, int64_t seq, int32_t base = 10) {
  std::vector<std::vector<int32_t>> s(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i <= seq; ++i)
      s[static_cast<size_t>(b)].push_back(base + static_cast<int32_t>(b * 1000 + i));
  return s;
}

DiffusionConfig dlm(float varilen = 0.0f) {
  DiffusionConfig c;
  c.mask_token = 7;
  c.varilen_prob = varilen;
  return c;
}

}  // namespace

TEST(ForwardProcess, NoShiftUsesTokensOneToSAsInputAndLabel) {
  auto samples = make_samples(2, 16);
  HostMicroBatch mb = build_micro_batch(samples, 100, dlm(), BatchContext{});
  ASSERT_EQ(mb.seq, 16);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 16; ++i) {
      const size_t k = static_cast<size_t>(b * 16 + i);
      EXPECT_EQ(mb.labels[k], samples[static_cast<size_t>(b)][static_cast<size_t>(i + 1)]);
      EXPECT_EQ(mb.input_ids[k], mb.noise_mask[k] ? 7 : mb.labels[k]);
      EXPECT_EQ(mb.positions[k], i);
    }
  EXPECT_EQ(mb.loss_tokens, 32.0);
}

TEST(ForwardProcess, ExactRatioWeightIsLengthOverMaskedCount) {
  auto samples = make_samples(8, 64);
  HostMicroBatch mb = build_micro_batch(samples, 0, dlm(), BatchContext{});
  for (int64_t b = 0; b < 8; ++b) {
    int n = 0;
    for (int64_t i = 0; i < 64; ++i) n += mb.noise_mask[static_cast<size_t>(b * 64 + i)];
    ASSERT_GE(n, 1) << "at least one masked token per row (MegaDLMs' fallback)";
    for (int64_t i = 0; i < 64; ++i) {
      const size_t k = static_cast<size_t>(b * 64 + i);
      EXPECT_FLOAT_EQ(mb.loss_weights[k], mb.noise_mask[k] ? 64.0f / static_cast<float>(n) : 0.0f);
    }
  }
}

TEST(ForwardProcess, MasksArePureFunctionsOfTheGlobalSampleIndex) {
  auto samples = make_samples(4, 32);
  HostMicroBatch whole = build_micro_batch(samples, 40, dlm(), BatchContext{});
  // The same samples split into two micro-batches of 2 (another layout) see the same noise.
  std::vector<std::vector<int32_t>> first(samples.begin(), samples.begin() + 2);
  std::vector<std::vector<int32_t>> second(samples.begin() + 2, samples.end());
  HostMicroBatch a = build_micro_batch(first, 40, dlm(), BatchContext{});
  HostMicroBatch b = build_micro_batch(second, 42, dlm(), BatchContext{});
  for (size_t k = 0; k < 64; ++k) EXPECT_EQ(a.input_ids[k], whole.input_ids[k]);
  for (size_t k = 0; k < 64; ++k) EXPECT_EQ(b.input_ids[k], whole.input_ids[k + 64]);
  // A different seed gives different noise.
  BatchContext other;
  other.seed = 99;
  HostMicroBatch c = build_micro_batch(samples, 40, dlm(), other);
  EXPECT_NE(c.noise_mask, whole.noise_mask);
}

// The number of masks before the fallback is uniform on
// {0..L}; after the at-least-one fix P(n=1) = 2/(L+1). Checked with a chi-square statistic.
TEST(ForwardProcess, MaskCountIsUniformWithTheAtLeastOneFix) {
  const int64_t L = 15, rows = 40000;
  std::vector<double> counts(L + 1, 0.0);
  auto samples = make_samples(1, L);
  for (int64_t g = 0; g < rows; ++g) {
    HostMicroBatch mb = build_micro_batch(samples, g, dlm(), BatchContext{});
    int n = std::accumulate(mb.noise_mask.begin(), mb.noise_mask.end(), 0);
    counts[static_cast<size_t>(n)] += 1;
  }
  EXPECT_EQ(counts[0], 0.0);
  double chi2 = 0;
  for (int64_t n = 1; n <= L; ++n) {
    const double expected = rows * (n == 1 ? 2.0 : 1.0) / (L + 1);
    chi2 += (counts[static_cast<size_t>(n)] - expected) * (counts[static_cast<size_t>(n)] - expected) / expected;
  }
  // 14 degrees of freedom: P(chi2 > 36.1) = 1e-3.
  EXPECT_LT(chi2, 36.1);
}

TEST(ForwardProcess, UniformLogitsGiveExpectedLossLnV) {
  // With uniform logits every CE is ln V, so the expected per-token loss is
  // E[sum_i w_i] / L * ln V = ln V exactly for the exact-ratio weight (sum of weights = L).
  auto samples = make_samples(4, 32);
  HostMicroBatch mb = build_micro_batch(samples, 0, dlm(), BatchContext{});
  double wsum = std::accumulate(mb.loss_weights.begin(), mb.loss_weights.end(), 0.0);
  EXPECT_NEAR(wsum / mb.loss_tokens, 1.0, 1e-6);
}

TEST(ForwardProcess, VarilenTruncatesWholeMicroBatchesAtTheConfiguredRate) {
  const int64_t S = 64;
  BatchContext ctx;
  ctx.micro_batch_size = 1;
  int truncated = 0;
  const int trials = 20000;
  std::map<int64_t, int> lengths;
  for (int g = 0; g < trials; ++g) {
    int64_t len = varilen_length(g, S, dlm(0.05f), ctx);
    ASSERT_GE(len, 1);
    ASSERT_LE(len, S);
    if (len < S) {
      ++truncated;
      lengths[len]++;
    }
  }
  // Binomial(20000, 0.05): mean 1000, sd 30.8; 5 sd.
  EXPECT_NEAR(truncated, 1000, 155);
  EXPECT_GE(lengths.begin()->first, 1);
  EXPECT_LE(lengths.rbegin()->first, S - 1);
  EXPECT_GT(lengths.size(), 40u);  // spread over {1..S-1}
  // Never in eval, never with causal attention, never in vanilla mode.
  ctx.training = false;
  for (int g = 0; g < 2000; ++g) EXPECT_EQ(varilen_length(g, S, dlm(0.5f), ctx), S);
}

TEST(ForwardProcess, VanillaModeShiftsLabelsByOne) {
  DiffusionConfig c;
  c.mode = RunningMode::Vanilla;
  auto samples = make_samples(2, 8);
  HostMicroBatch mb = build_micro_batch(samples, 0, c, BatchContext{});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 8; ++i) {
      const size_t k = static_cast<size_t>(b * 8 + i);
      EXPECT_EQ(mb.input_ids[k], samples[static_cast<size_t>(b)][static_cast<size_t>(i)]);
      EXPECT_EQ(mb.labels[k], samples[static_cast<size_t>(b)][static_cast<size_t>(i + 1)]);
      EXPECT_EQ(mb.loss_weights[k], 1.0f);
    }
}

TEST(ForwardProcess, EodMaskLossRemovesEodTargetsFromTheNormaliser) {
  auto samples = make_samples(1, 8);
  samples[0][3] = 0;  // an EOD at clean position 2
  BatchContext ctx;
  ctx.eod_token = 0;
  ctx.eod_mask_loss = true;
  HostMicroBatch mb = build_micro_batch(samples, 0, dlm(), ctx);
  EXPECT_EQ(mb.loss_tokens, 7.0);
  EXPECT_EQ(mb.loss_weights[2], 0.0f);
}

TEST(ForwardProcess, EvaluationMasksAreFixedPerSampleAndApartFromTraining) {
  auto samples = make_samples(4, 32);
  BatchContext eval;
  eval.training = false;
  HostMicroBatch a = build_micro_batch(samples, 8, dlm(), eval);
  HostMicroBatch b = build_micro_batch(samples, 8, dlm(), eval);
  EXPECT_EQ(a.noise_mask, b.noise_mask);  // every evaluation sees the same masks
  EXPECT_EQ(a.loss_weights, b.loss_weights);
  HostMicroBatch t = build_micro_batch(samples, 8, dlm(), BatchContext{});
  EXPECT_NE(a.noise_mask, t.noise_mask);  // EvalNoise is its own stream
  HostMicroBatch other = build_micro_batch(samples, 12, dlm(), eval);
  EXPECT_NE(a.noise_mask, other.noise_mask);  // keyed by the validation sample index
}

TEST(ForwardProcess, DocumentsResetPositionsAndNumberTheirTokens) {
  // w = 9 | 1 2 0 3 4 0 5 : input (no shift) 1 2 0 3 4 0 5 with EOD 0 closing each document.
  std::vector<std::vector<int32_t>> samples = {{9, 1, 2, 0, 3, 4, 0, 5}};
  BatchContext ctx;
  ctx.eod_token = 0;
  ctx.reset_position_ids = true;
  ctx.per_document_attention = true;
  HostMicroBatch mb = build_micro_batch(samples, 0, dlm(), ctx);
  EXPECT_EQ(mb.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(mb.document_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 2}));
  DiffusionConfig ar = dlm();
  ar.mode = RunningMode::Vanilla;  // input w_0..w_6 = 9 1 2 0 3 4 0
  mb = build_micro_batch(samples, 0, ar, ctx);
  EXPECT_EQ(mb.positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2}));
  EXPECT_EQ(mb.document_ids, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1}));
  ctx.per_document_attention = false;
  EXPECT_TRUE(build_micro_batch(samples, 0, ar, ctx).document_ids.empty());
}
