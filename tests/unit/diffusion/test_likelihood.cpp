// Likelihood estimators: LLaDA's stratified masks as the header defines them, convergence of the
// Monte-Carlo estimate to the estimator's exact expectation (enumerated here over every k and
// every mask set) as --mc-num grows, the ELBO equal to the model's own evaluation loss, and
// GptModel::logits_at equal to the full evaluation forward's logits (and unchanged by padding
// in another document).
#include <gtest/gtest.h>
#include <cmath>
#include <numeric>
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/diffusion/likelihood.h"
#include "megadlm/model/gpt_model.h"
#include "support/logits_model.h"

using namespace megadlm;
using test::GptLogits;
using test::mix;

namespace {

constexpr int64_t kVocab = 24;
constexpr int32_t kMask = 23;

// Logits of a position: a hash of its position and of the whole row (so the CE of a token
// depends on which other tokens are masked), spread over [-3, 3).
class HashModel : public LogitsModel {
 public:
  int64_t vocab_size() const override { return kVocab; }
  const Stream& stream() const override { return stream_; }
  Tensor logits(const CanvasBatch& c, const std::vector<int32_t>& rows) override {
    std::vector<float> out;
    for (int32_t q : rows) {
      const int64_t b = q / c.seq;
      uint64_t h = mix(1, static_cast<uint64_t>(q % c.seq));
      for (int64_t j = 0; j < c.seq; ++j) h = mix(h, static_cast<uint64_t>(c.tokens[static_cast<size_t>(b * c.seq + j)]));
      for (int64_t v = 0; v < kVocab; ++v)
        out.push_back(static_cast<float>(mix(h, static_cast<uint64_t>(v)) % 6000) / 1000.0f - 3.0f);
    }
    return Tensor::from_floats(out, {static_cast<int64_t>(rows.size()), kVocab});
  }

 private:
  Stream stream_ = Stream::cpu();
};

double ce(const float* l, int32_t target) {
  double m = -INFINITY, s = 0;
  for (int64_t v = 0; v < kVocab; ++v) m = std::max(m, static_cast<double>(l[v]));
  for (int64_t v = 0; v < kVocab; ++v) s += std::exp(l[v] - m);
  return std::log(s) + m - l[target];
}

// (Ly / n) * sum of the CE of the masked answer positions, for one mask set.
double masked_score(HashModel& model, const LikelihoodRequest& r, const std::vector<uint8_t>& mask) {
  const int64_t lc = static_cast<int64_t>(r.context.size()), ly = static_cast<int64_t>(r.continuation.size());
  CanvasBatch c;
  c.batch = 1;
  c.seq = lc + ly;
  c.tokens = r.context;
  std::vector<int32_t> rows;
  int64_t n = 0;
  for (int64_t a = 0; a < ly; ++a) {
    c.tokens.push_back(mask[static_cast<size_t>(a)] ? kMask : r.continuation[static_cast<size_t>(a)]);
    if (mask[static_cast<size_t>(a)]) {
      rows.push_back(static_cast<int32_t>(lc + a));
      ++n;
    }
  }
  for (int64_t i = 0; i < c.seq; ++i) c.positions.push_back(static_cast<int32_t>(i));
  Tensor l = model.logits(c, rows);
  double total = 0;
  for (size_t k = 0; k < rows.size(); ++k)
    total += ce(l.data<float>() + k * kVocab, r.continuation[static_cast<size_t>(rows[k] - lc)]);
  return total * static_cast<double>(ly) / static_cast<double>(n);
}

}  // namespace

TEST(LikelihoodMasks, EachRowMasksExactlyItsStratifiedCountOfAnswerPositions) {
  for (int64_t ly : {1, 3, 7, 16}) {
    for (int64_t batch : {1, 4, 5}) {
      std::vector<int64_t> n;
      const auto masks = likelihood_masks(11, 3, 2, ly, batch, n);
      ASSERT_EQ(masks.size(), static_cast<size_t>(batch));
      // n_m = ((round(k + m Ly / B) - 1) mod Ly) + 1 with the same k for every row: the rows'
      // counts are the stratified sequence starting at n_0 = k.
      const int64_t k = n[0];
      for (int64_t m = 0; m < batch; ++m) {
        const double x = std::nearbyint(static_cast<double>(k) + static_cast<double>(m) * static_cast<double>(ly) / static_cast<double>(batch));
        EXPECT_EQ(n[static_cast<size_t>(m)], (static_cast<int64_t>(x) - 1) % ly + 1);
        EXPECT_EQ(std::accumulate(masks[static_cast<size_t>(m)].begin(), masks[static_cast<size_t>(m)].end(), int64_t{0}),
                  n[static_cast<size_t>(m)]);
      }
    }
  }
  std::vector<int64_t> n1, n2;
  EXPECT_EQ(likelihood_masks(11, 3, 2, 9, 4, n1), likelihood_masks(11, 3, 2, 9, 4, n2));
  EXPECT_NE(likelihood_masks(11, 3, 2, 9, 4, n1), likelihood_masks(11, 3, 3, 9, 4, n2));
}

// The estimator's exact expectation: k uniform on 1..Ly (the draw of the header), each row's
// n_m from k, the mask set uniform among the subsets of size n_m.
TEST(ConditionalLoglikelihood, MonteCarloConvergesToTheEstimatorsExpectation) {
  HashModel model;
  const LikelihoodRequest req{{3, 4, 5}, {6, 7, 8, 9}, 0};
  const int64_t ly = 4, batch = 4;
  std::vector<double> g(static_cast<size_t>(ly + 1), 0.0), subsets(static_cast<size_t>(ly + 1), 0.0);
  for (int bits = 1; bits < (1 << ly); ++bits) {
    std::vector<uint8_t> mask(static_cast<size_t>(ly));
    int n = 0;
    for (int a = 0; a < ly; ++a) n += mask[static_cast<size_t>(a)] = (bits >> a) & 1;
    g[static_cast<size_t>(n)] += masked_score(model, req, mask);
    subsets[static_cast<size_t>(n)] += 1;
  }
  double exact = 0;
  for (int64_t k = 1; k <= ly; ++k) {
    for (int64_t m = 0; m < batch; ++m) {
      const double x = std::nearbyint(static_cast<double>(k) + static_cast<double>(m * ly) / static_cast<double>(batch));
      const int64_t n = (static_cast<int64_t>(x) - 1) % ly + 1;
      exact += g[static_cast<size_t>(n)] / subsets[static_cast<size_t>(n)] / static_cast<double>(ly * batch);
    }
  }
  LikelihoodConfig cfg;
  cfg.mask_token = kMask;
  cfg.mc_batch = batch;
  cfg.seed = 5;
  cfg.mc_num = 32;
  const LikelihoodResult small = conditional_loglikelihood(model, req, cfg);
  cfg.mc_num = 2048;
  const LikelihoodResult large = conditional_loglikelihood(model, req, cfg);
  ASSERT_EQ(large.estimates.size(), 512u);
  EXPECT_NEAR(-large.loglikelihood, exact, 4 * large.standard_error) << "standard error " << large.standard_error;
  EXPECT_LT(large.standard_error, small.standard_error / 4);  // ~1/sqrt(repeats): 8x fewer
  EXPECT_LT(std::fabs(-large.loglikelihood - exact), std::fabs(-small.loglikelihood - exact) + 2 * large.standard_error);
}

TEST(ConditionalLoglikelihood, OneMaskedTokenNeedsOneSampleAndGuidanceAtScaleZeroChangesNothing) {
  HashModel model;
  const LikelihoodRequest req{{3, 4}, {6}, 2};
  LikelihoodConfig cfg;
  cfg.mask_token = kMask;
  cfg.mc_num = cfg.mc_batch = 1;
  const LikelihoodResult r = conditional_loglikelihood(model, req, cfg);
  EXPECT_NEAR(-r.loglikelihood, masked_score(model, req, {1}), 1e-6);  // f32 losses
  cfg.mc_num = cfg.mc_batch = 8;
  EXPECT_NEAR(conditional_loglikelihood(model, req, cfg).loglikelihood, r.loglikelihood, 1e-6);
}

TEST(MonteCarloElbo, OneDrawIsTheModelsEvaluationLossOfTheSameSamples) {
  const TransformerConfig cfg = test::tiny_logits_config();
  ParameterStore store;
  GptModel model(cfg, store);
  const ModelRuntime rt = test::cpu_eval_runtime();
  store.materialize(DType::F32, 3, rt.stream);
  std::vector<std::vector<int32_t>> samples;
  for (int b = 0; b < 3; ++b) {
    std::vector<int32_t> s;
    for (int i = 0; i <= cfg.seq_length; ++i) s.push_back(static_cast<int32_t>(1 + (b * 13 + i * 7) % 28));
    samples.push_back(s);
  }
  DiffusionConfig dc;
  dc.mask_token = 29;
  dc.varilen_prob = 0;
  BatchContext ctx;
  ctx.seed = 21;
  ctx.training = false;
  const HostMicroBatch hm = build_micro_batch(samples, 40, dc, ctx);
  Tensor sum = Tensor::zeros({1}, DType::F32, rt.stream);
  ModelRecord rec;
  model.forward(MicroBatch::upload(hm, rt.stream), rec, sum, 0.0f, rt);
  const double expected = static_cast<double>(sum.data<float>()[0]) / hm.loss_tokens;
  GptLogits logits(model, rt, cfg.padded_vocab_size);
  const ElboResult e = monte_carlo_elbo(logits, samples, 40, dc, 21, 1);
  EXPECT_NEAR(e.per_token(), expected, 1e-5 * expected);  // f32 sums in another order
  EXPECT_EQ(e.tokens, hm.loss_tokens);
  const ElboResult e3 = monte_carlo_elbo(logits, samples, 40, dc, 21, 3);
  EXPECT_EQ(e3.per_draw.size(), 3u);
  EXPECT_DOUBLE_EQ(e3.per_draw[0], e.per_draw[0]);  // draw 0 is the seed's draw
  EXPECT_NE(e3.per_draw[1], e3.per_draw[0]);
}

TEST(GptModelLogitsAt, EqualsTheEvaluationForwardsLogitsAndIgnoresOtherDocuments) {
  const TransformerConfig cfg = test::tiny_logits_config();
  ParameterStore store;
  GptModel model(cfg, store);
  const ModelRuntime rt = test::cpu_eval_runtime();
  store.materialize(DType::F32, 4, rt.stream);
  HostMicroBatch h;
  h.batch = 1;
  h.seq = 6;
  h.input_ids = h.labels = {3, 9, 29, 29, 4, 29};
  h.positions = {0, 1, 2, 3, 4, 5};
  h.loss_weights.assign(6, 0.0f);
  ModelRecord rec;
  Tensor sum = Tensor::zeros({1}, DType::F32, rt.stream);
  model.forward(MicroBatch::upload(h, rt.stream), rec, sum, 0.0f, rt);
  const std::vector<float> full = rec.logits.to_floats(rt.stream);  // [6, 32]
  GptLogits logits(model, rt, cfg.padded_vocab_size);
  CanvasBatch c{1, 6, h.input_ids, h.positions, {}};
  const std::vector<float> at = logits.logits(c, {2, 5, 0}).to_floats(rt.stream);
  const int64_t v = cfg.padded_vocab_size;
  // Inference adds the residual branches inside the output GEMMs (one rounding of each sum,
  // in double on the CPU) where training adds the rounded product: fp32 rounding apart.
  for (int k = 0; k < 3; ++k) {
    const int row = std::vector<int>{2, 5, 0}[static_cast<size_t>(k)];
    for (int64_t j = 0; j < v; ++j)
      EXPECT_NEAR(at[static_cast<size_t>(k * v + j)], full[static_cast<size_t>(row * v + j)], 1e-5);
  }
  // The same row behind three pad tokens of document 0, its positions from 0: bitwise the same.
  CanvasBatch padded{1, 9, {0, 0, 0, 3, 9, 29, 29, 4, 29}, {0, 1, 2, 0, 1, 2, 3, 4, 5}, {0, 0, 0, 1, 1, 1, 1, 1, 1}};
  const std::vector<float> p = logits.logits(padded, {5, 8, 3}).to_floats(rt.stream);
  EXPECT_EQ(p, at);
}

// compact_rows moves each left-padded row's live tokens to its front (the padding mask's layout
// on cuDNN); the live tokens' logits are bitwise those of the padded canvas (CPU runs documents).
TEST(GptModelLogitsAt, CompactedRowsGiveThePaddedCanvasLogits) {
  const TransformerConfig cfg = test::tiny_logits_config();
  ParameterStore store;
  GptModel model(cfg, store);
  const ModelRuntime rt = test::cpu_eval_runtime();
  store.materialize(DType::F32, 5, rt.stream);
  GptLogits logits(model, rt, cfg.padded_vocab_size);
  std::vector<int64_t> start;
  const CanvasBatch c = build_canvas({{3, 9, 4}, {7}, {5, 6}}, 3, 29, 0, start);  // seq 6
  const std::vector<int32_t> rows{3, 4, 5, 8, 10, 11, 13, 17, 15};  // live tokens of all rows
  const std::optional<CompactCanvas> compact = compact_rows(c, rows);
  ASSERT_TRUE(compact.has_value());
  EXPECT_EQ(compact->lengths, (std::vector<int32_t>{6, 4, 5}));
  EXPECT_EQ(compact->rows, (std::vector<int32_t>{3, 4, 5, 6, 8, 9, 12, 16, 14}));
  const std::vector<float> want = logits.logits(c, rows).to_floats(rt.stream);
  const std::vector<float> got = logits.logits(compact->canvas, compact->rows).to_floats(rt.stream);
  EXPECT_EQ(got, want);
}
