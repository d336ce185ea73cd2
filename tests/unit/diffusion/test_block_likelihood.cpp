// Block-diffusion likelihood estimators (diffusion/likelihood.h): the ELBO is training's doubled
// [x_t | x_0] forward of the same samples and noise, the diffusion term alone (the causal clean
// half's next-token loss excluded, and reported apart as the exact AR NLL); the block estimator with one block holding the whole answer
// is exactly the full-sequence estimator (the same draws) of the same weights run
// bidirectionally; its block ranges; refusals. The NumPy reference of several blocks is
// tests/e2e/evaluate_block_diffusion.sh.
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/diffusion/likelihood.h"
#include "megadlm/model/gpt_model.h"
#include "support/logits_model.h"

using namespace megadlm;
using test::GptLogits;

namespace {

TransformerConfig tiny_bd_model(bool causal_clean) {
  TransformerConfig c = test::tiny_logits_config();
  c.attention_mask = AttentionMaskType::BlockCausal;
  c.block_diffusion_causal_clean = causal_clean;
  return c;
}

std::vector<std::vector<int32_t>> samples_of(int64_t seq) {
  std::vector<std::vector<int32_t>> samples;
  for (int b = 0; b < 3; ++b) {
    std::vector<int32_t> s;
    for (int64_t i = 0; i <= seq; ++i) s.push_back(static_cast<int32_t>(1 + (b * 13 + i * 7) % 28));
    samples.push_back(s);
  }
  return samples;
}

}  // namespace

TEST(BlockLikelihoodElbo, OneDrawIsTrainingsDiffusionLossOfTheDoubledRows) {
  for (const bool causal : {false, true}) {
    const TransformerConfig cfg = tiny_bd_model(causal);
    ParameterStore store;
    GptModel model(cfg, store);
    const ModelRuntime rt = test::cpu_eval_runtime();
    store.materialize(DType::F32, 3, rt.stream);
    const auto samples = samples_of(cfg.seq_length);
    DiffusionConfig dc;
    dc.mask_token = 29;
    dc.varilen_prob = 0;
    dc.block_size = 4;
    dc.loss_weight = DlmLossWeight::InvTEps;
    BatchContext ctx;
    ctx.seed = 21;
    ctx.training = false;
    DiffusionConfig no_ar = dc;  // what the ELBO must equal: the noisy half's term alone
    if (causal) {
      dc.ar_loss_weight = 1.0f;  // a checkpoint trained with the next-token loss
      dc.diffusion_loss_scale = 0.3f;
    }
    const HostMicroBatch hm = build_micro_batch(samples, 40, no_ar, ctx);
    ASSERT_EQ(hm.seq, 2 * cfg.seq_length);
    Tensor sum = Tensor::zeros({1}, DType::F32, rt.stream);
    ModelRecord rec;
    model.forward(MicroBatch::upload(hm, rt.stream), rec, sum, 0.0f, rt);
    const double expected = static_cast<double>(sum.data<float>()[0]) / hm.loss_tokens;
    GptLogits logits(model, rt, cfg.padded_vocab_size);
    const ElboResult e = monte_carlo_elbo(logits, samples, 40, dc, 21, 1);
    EXPECT_NEAR(e.per_token(), expected, 1e-5 * expected) << "causal clean " << causal;
    EXPECT_EQ(e.tokens, 3.0 * cfg.seq_length);  // every token of every sample
    if (causal) {  // the training loss with the AR term is another number
      const HostMicroBatch with_ar = build_micro_batch(samples, 40, dc, ctx);
      Tensor s2 = Tensor::zeros({1}, DType::F32, rt.stream);
      ModelRecord r2;
      model.forward(MicroBatch::upload(with_ar, rt.stream), r2, s2, 0.0f, rt);
      EXPECT_GT(std::abs(static_cast<double>(s2.data<float>()[0]) / with_ar.loss_tokens - e.per_token()), 1e-3);
      // The exact next-token NLL of the clean half: training's AR term alone (diffusion scale 0).
      DiffusionConfig ar_only = dc;
      ar_only.diffusion_loss_scale = 0.0f;
      const HostMicroBatch am = build_micro_batch(samples, 40, ar_only, ctx);
      Tensor s3 = Tensor::zeros({1}, DType::F32, rt.stream);
      ModelRecord r3;
      model.forward(MicroBatch::upload(am, rt.stream), r3, s3, 0.0f, rt);
      EXPECT_EQ(e.ar_tokens, 3.0 * (cfg.seq_length - 1));
      EXPECT_NEAR(e.ar_nll_sum, static_cast<double>(s3.data<float>()[0]), 1e-5 * e.ar_nll_sum);
    } else {
      EXPECT_EQ(e.ar_tokens, 0.0);
    }
  }
}

TEST(BlockLikelihoodLoglik, OneBlockHoldingTheAnswerIsTheFullSequenceEstimatorOfTheSameWeights) {
  TransformerConfig bd = tiny_bd_model(false);
  TransformerConfig full = bd;
  full.attention_mask = AttentionMaskType::NoMask;
  ParameterStore s1, s2;
  GptModel m1(bd, s1), m2(full, s2);
  const ModelRuntime rt = test::cpu_eval_runtime();
  s1.materialize(DType::F32, 7, rt.stream);
  s2.materialize(DType::F32, 7, rt.stream);
  GptLogits l1(m1, rt, 30), l2(m2, rt, 30);
  LikelihoodConfig lc;
  lc.mc_num = 8;
  lc.mc_batch = 4;
  lc.mask_token = 29;
  lc.seed = 5;
  const LikelihoodRequest r{{3, 9, 4}, {7, 11, 2, 8, 15}, 2};  // 8 tokens
  const LikelihoodResult want = conditional_loglikelihood(l2, r, lc);
  for (const int64_t b : {8, 16}) {  // one block holds everything
    lc.block_size = b;
    const LikelihoodResult got = conditional_loglikelihood(l1, r, lc);
    ASSERT_EQ(got.estimates.size(), want.estimates.size());
    for (size_t k = 0; k < want.estimates.size(); ++k) EXPECT_NEAR(got.estimates[k], want.estimates[k], 1e-4);
  }
  // Two blocks: a different conditional (the second block's answer sees the first only clean).
  lc.block_size = 4;
  const LikelihoodResult two = conditional_loglikelihood(l1, r, lc);
  EXPECT_GT(std::abs(two.loglikelihood - want.loglikelihood), 1e-3);
  EXPECT_TRUE(std::isfinite(two.loglikelihood));
  lc.cfg_scale = 1.0;
  EXPECT_THROW(conditional_loglikelihood(l1, r, lc), Error);
}

TEST(BlockLikelihoodRanges, BlocksAtAbsoluteMultiplesOfTheBlockSizeAndARaggedLastBlock) {
  // n = 10, B = 4: one document [0, 10); blocks [0,4) [4,8) [8,10).
  const std::vector<int32_t> r = block_likelihood_ranges(10, 4);
  ASSERT_EQ(r.size(), 40u);
  for (int j = 0; j < 10; ++j) {
    EXPECT_EQ(r[static_cast<size_t>(j)], 0);
    EXPECT_EQ(r[static_cast<size_t>(10 + j)], 10);
    EXPECT_EQ(r[static_cast<size_t>(20 + j)], j / 4 * 4);
    EXPECT_EQ(r[static_cast<size_t>(30 + j)], std::min(j / 4 * 4 + 4, 10));
  }
}

TEST(BlockCanvasPadding, PaddedHalvesGiveTheSameLogitsAtTheRenumberedRows) {
  // pad_block_canvas (what InferenceModel does on CUDA for half lengths that are not multiples
  // of 128, here multiples of 8): each half gets a document of its own appended, which no real
  // token sees, so every real row's logits stay those of the unpadded canvas. Both clean-half
  // variants; every row of both halves of two doubled rows of 6 tokens in blocks of 4.
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal clean half" : "block-causal clean half");
    const TransformerConfig cfg = tiny_bd_model(causal);
    ParameterStore store;
    GptModel model(cfg, store);
    const ModelRuntime rt = test::cpu_eval_runtime();
    store.materialize(DType::F32, 11, rt.stream);
    GptLogits logits(model, rt, 30);
    const int64_t n = 6;
    const std::vector<int32_t> ranges = block_likelihood_ranges(n, 4);
    CanvasBatch c;
    c.seq = 2 * n;
    for (int b = 0; b < 2; ++b) {
      for (int half = 0; half < 2; ++half)
        for (int64_t i = 0; i < n; ++i) {
          const bool masked = half == 0 && (i + b) % 3 == 1;
          c.tokens.push_back(masked ? 29 : static_cast<int32_t>(1 + (b * 11 + i * 5) % 28));
          c.positions.push_back(static_cast<int32_t>(i));
        }
      c.block_ranges.insert(c.block_ranges.end(), ranges.begin(), ranges.end());
      ++c.batch;
    }
    std::vector<int32_t> rows(static_cast<size_t>(c.batch * c.seq));
    for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int32_t>(r);
    std::vector<int32_t> padded_rows = rows;
    const CanvasBatch p = pad_block_canvas(c, 8, padded_rows);
    ASSERT_EQ(p.seq, 16);
    ASSERT_EQ(p.batch, 2);
    EXPECT_EQ(padded_rows[7], 8 + 1);        // row 0, clean half, position 1
    EXPECT_EQ(padded_rows[12 + 2], 16 + 2);  // row 1, noisy half, position 2
    EXPECT_EQ(p.tokens[static_cast<size_t>(16 + 8 + 1)], c.tokens[12 + 6 + 1]);
    const std::vector<float> want = logits.logits(c, rows).to_floats(rt.stream);
    const std::vector<float> got = logits.logits(p, padded_rows).to_floats(rt.stream);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t k = 0; k < want.size(); ++k) worst = std::max(worst, std::abs(static_cast<double>(got[k]) - want[k]));
    EXPECT_LT(worst, 1e-5);
    // A length that already is a multiple is left alone.
    std::vector<int32_t> same_rows = rows;
    const CanvasBatch same = pad_block_canvas(c, 3, same_rows);
    EXPECT_EQ(same.seq, c.seq);
    EXPECT_EQ(same_rows, rows);
  }
}
