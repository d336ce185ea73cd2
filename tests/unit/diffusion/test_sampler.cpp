// The sampler's logic against a deterministic fake model whose logits are a hash of the
// attended tokens: schedule, block order, never remasking, padding invariance, guidance, EOS
// stopping and threshold decoding, each checked against numbers computed here independently.
// Agreement with an independent Python implementation of LLaDA's generate on a real model is
// tests/e2e/generate_reference.sh.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include "megadlm/core/philox.h"
#include "megadlm/diffusion/sampler.h"
#include "support/logits_model.h"

using namespace megadlm;
using test::mix;

namespace {

constexpr int64_t kVocab = 32;
constexpr int32_t kMask = 31;

// Logits of query (b, i): a hash of (position of i, the tokens and positions of i's document
// in row b) spread over [-4, 4). A row sees only its own document, like the real attention.
class HashModel : public LogitsModel {
 public:
  int64_t vocab_size() const override { return kVocab; }
  const Stream& stream() const override { return stream_; }
  Tensor logits(const CanvasBatch& c, const std::vector<int32_t>& rows) override {
    ++calls;
    rows_seen += static_cast<int64_t>(rows.size());
    canvases.push_back(c);
    std::vector<float> out;
    for (int32_t q : rows) {
      const int64_t b = q / c.seq, i = q % c.seq;
      const int32_t doc = c.document_ids.empty() ? 0 : c.document_ids[static_cast<size_t>(q)];
      uint64_t h = mix(0, static_cast<uint64_t>(c.positions[static_cast<size_t>(q)]));
      for (int64_t j = 0; j < c.seq; ++j) {
        const size_t k = static_cast<size_t>(b * c.seq + j);
        if (!c.document_ids.empty() && c.document_ids[k] != doc) continue;
        h = mix(h, static_cast<uint64_t>(c.positions[k]) * 1000 + static_cast<uint64_t>(c.tokens[k]));
      }
      (void)i;
      for (int64_t v = 0; v < kVocab; ++v)
        out.push_back(static_cast<float>(mix(h, static_cast<uint64_t>(v)) % 8000) / 1000.0f - 4.0f + bias[v]);
    }
    return Tensor::from_floats(out, {static_cast<int64_t>(rows.size()), kVocab});
  }
  int calls = 0;
  int64_t rows_seen = 0;
  std::vector<CanvasBatch> canvases;
  // The mask token is never the favourite (a proposal of M would leave its position masked).
  std::vector<float> bias = [] {
    std::vector<float> b(kVocab, 0.0f);
    b[kMask] = -50.0f;
    return b;
  }();

 private:
  Stream stream_ = Stream::cpu();
};

// A model with Fast-dLLM's cache as a real one behaves: a cached step sees the current tokens
// only in its recomputed columns [col0, col1) and, everywhere else, the tokens of the canvas of
// the last refresh (the cached keys and values are those of that canvas). Records every call.
class CachedHashModel : public HashModel {
 public:
  struct Call {
    bool refresh;
    int64_t col0, col1;
    std::vector<int32_t> rows;
  };
  bool supports_kv_cache() const override { return true; }
  Tensor cached_logits(const CanvasBatch& c, const std::vector<int32_t>& rows, int64_t col0, int64_t col1,
                       bool refresh) override {
    cached_calls.push_back({refresh, col0, col1, rows});
    if (refresh) {
      refreshed = c;
      return logits(c, rows);
    }
    EXPECT_EQ(c.batch, refreshed.batch);
    EXPECT_EQ(c.seq, refreshed.seq);
    CanvasBatch seen = c;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < c.seq; ++j)
        if (j < col0 || j >= col1) seen.tokens[static_cast<size_t>(b * c.seq + j)] = refreshed.tokens[static_cast<size_t>(b * c.seq + j)];
    for (int32_t q : rows) EXPECT_TRUE(q % c.seq >= col0 && q % c.seq < col1) << "row " << q << " outside the columns";
    return logits(seen, rows);
  }
  std::vector<Call> cached_calls;
  CanvasBatch refreshed;
};

SamplerConfig config(int64_t gen, int64_t steps, int64_t block) {
  SamplerConfig c;
  c.gen_length = gen;
  c.steps = steps;
  c.block_length = block;
  c.mask_token = kMask;
  c.seed = 7;
  return c;
}

// softmax probability of the argmax of a logits row, in double.
std::pair<int32_t, double> argmax_conf(const float* l, int64_t v) {
  int32_t best = 0;
  for (int64_t k = 1; k < v; ++k) if (l[k] > l[best]) best = static_cast<int32_t>(k);
  double s = 0;
  for (int64_t k = 0; k < v; ++k) s += std::exp(static_cast<double>(l[k]) - l[best]);
  return {best, 1.0 / s};
}

}  // namespace

TEST(Sampler, TransferScheduleIsLladasGetNumTransferTokens) {
  EXPECT_EQ(transfer_schedule(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(transfer_schedule(8, 8), (std::vector<int64_t>(8, 1)));
  EXPECT_EQ(transfer_schedule(3, 5), (std::vector<int64_t>{1, 1, 1, 0, 0}));
}

TEST(Sampler, RejectsConfigurationsTheReferenceAssertsOn) {
  const auto p1 = sampler_config_problems(config(100, 100, 32), kVocab);
  ASSERT_EQ(p1.size(), 1u);
  EXPECT_NE(p1[0].find("`--gen-length 100` is not a multiple of `--block-length 32`"), std::string::npos);
  const auto p2 = sampler_config_problems(config(64, 30, 16), kVocab);
  ASSERT_EQ(p2.size(), 1u);
  EXPECT_NE(p2[0].find("`--steps 30` is not a multiple of the number of blocks 4"), std::string::npos);
  SamplerConfig c = config(8, 8, 8);
  c.mask_token = kVocab;
  EXPECT_EQ(sampler_config_problems(c, kVocab).size(), 1u);
  EXPECT_TRUE(sampler_config_problems(config(64, 32, 16), kVocab).empty());
}

TEST(Sampler, CanvasIsLeftPaddedWithOwnPositionsAndDocuments) {
  std::vector<int64_t> start;
  const CanvasBatch c = build_canvas({{5, 6, 7}, {9}}, 2, kMask, 0, start);
  EXPECT_EQ(c.seq, 5);
  EXPECT_EQ(start, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{5, 6, 7, kMask, kMask, 0, 0, 9, kMask, kMask}));
  EXPECT_EQ(c.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 0, 1, 2}));
  EXPECT_EQ(c.document_ids, (std::vector<int32_t>{1, 1, 1, 1, 1, 0, 0, 1, 1, 1}));
  const CanvasBatch same = build_canvas({{5, 6}, {1, 2}}, 2, kMask, 0, start);
  EXPECT_TRUE(same.document_ids.empty());  // nothing padded: plain attention
}

TEST(Sampler, CompactRowsPutsEachRowsLiveDocumentFirst) {
  std::vector<int64_t> start;
  const CanvasBatch c = build_canvas({{5, 6, 7}, {9}}, 2, kMask, 0, start);
  const std::optional<CompactCanvas> k = compact_rows(c, {3, 4, 7, 9});
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->canvas.tokens, (std::vector<int32_t>{5, 6, 7, kMask, kMask, 9, kMask, kMask, 0, 0}));
  EXPECT_EQ(k->canvas.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 0, 1}));
  EXPECT_EQ(k->canvas.document_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(k->lengths, (std::vector<int32_t>{5, 3}));
  EXPECT_EQ(k->rows, (std::vector<int32_t>{3, 4, 5, 7}));
  // Not exact, so not offered: a requested padding token, three documents in a row, no documents.
  EXPECT_FALSE(compact_rows(c, {5}).has_value());
  CanvasBatch three = c;
  three.document_ids = {0, 1, 2, 2, 2, 0, 0, 1, 1, 1};
  EXPECT_FALSE(compact_rows(three, {4}).has_value());
  EXPECT_FALSE(compact_rows(build_canvas({{5, 6}, {1, 2}}, 2, kMask, 0, start), {2}).has_value());
}

// One token per step (S = G): each step decodes the masked position of the current block whose
// argmax is most probable, recomputed here step by step from the fake model.
TEST(Sampler, GreedyOneTokenPerStepFollowsTheMostConfidentPositionWithinBlocks) {
  HashModel model;
  const std::vector<int32_t> prompt = {3, 4, 5};
  const SamplerConfig cfg = config(8, 8, 4);
  const auto res = generate(model, {{prompt, 0}}, cfg);
  ASSERT_EQ(res[0].tokens.size(), 8u);
  EXPECT_EQ(res[0].steps, 8);
  // Independent replay: the same canvas, decoded by LLaDA's rule (docs/generation.md).
  HashModel oracle;
  std::vector<int32_t> x = prompt;
  x.resize(11, kMask);
  for (int64_t step = 0; step < 8; ++step) {
    const int64_t block_end = 3 + (step / 4 + 1) * 4;
    CanvasBatch c;
    c.batch = 1;
    c.seq = 11;
    c.tokens = x;
    for (int32_t i = 0; i < 11; ++i) c.positions.push_back(i);
    std::vector<int32_t> rows;
    for (int32_t p = 0; p < block_end; ++p) if (x[static_cast<size_t>(p)] == kMask) rows.push_back(p);
    Tensor l = oracle.logits(c, rows);
    int32_t best_pos = -1, best_tok = 0;
    double best_conf = -1;
    for (size_t r = 0; r < rows.size(); ++r) {
      auto [tok, conf] = argmax_conf(l.data<float>() + r * kVocab, kVocab);
      if (conf > best_conf) {
        best_conf = conf;
        best_pos = rows[r];
        best_tok = tok;
      }
    }
    x[static_cast<size_t>(best_pos)] = best_tok;
  }
  EXPECT_EQ(res[0].tokens, std::vector<int32_t>(x.begin() + 3, x.end()));
}

TEST(Sampler, BlocksAreDecodedInOrderAndTokensAreNeverRemasked) {
  HashModel model;
  const SamplerConfig cfg = config(12, 6, 4);  // 3 blocks, 2 steps each, 2 tokens per step
  const auto res = generate(model, {{{1, 2}, 0}}, cfg);
  ASSERT_EQ(model.calls, 6);
  for (int s = 0; s < 6; ++s) {
    const std::vector<int32_t>& t = model.canvases[static_cast<size_t>(s)].tokens;
    int64_t masked = 0;
    for (int32_t v : t) masked += v == kMask;
    EXPECT_EQ(masked, 12 - 2 * s);  // two decoded per step
    for (int64_t p = 2 + 4 * (s / 2 + 1); p < 14; ++p) EXPECT_EQ(t[static_cast<size_t>(p)], kMask);  // later blocks untouched
    EXPECT_EQ(t[0], 1);
    EXPECT_EQ(t[1], 2);
    if (s > 0) {
      const std::vector<int32_t>& prev = model.canvases[static_cast<size_t>(s - 1)].tokens;
      for (size_t p = 0; p < t.size(); ++p)
        if (prev[p] != kMask) {
          EXPECT_EQ(t[p], prev[p]) << "position " << p << " changed at step " << s;
        }
    }
  }
  EXPECT_EQ(std::count(res[0].tokens.begin(), res[0].tokens.end(), kMask), 0);
}

TEST(Sampler, StepsWithNothingToTransferAreNotRun) {
  HashModel model;
  const auto res = generate(model, {{{1}, 0}}, config(4, 8, 4));  // 4 tokens over 8 steps
  EXPECT_EQ(model.calls, 4);
  EXPECT_EQ(res[0].steps, 4);
}

TEST(Sampler, PaddedBatchesGiveEveryRowItsResultAlone) {
  for (const Remasking rm : {Remasking::LowConfidence, Remasking::Random}) {
    for (const double temperature : {0.0, 0.7}) {
      SamplerConfig cfg = config(8, 4, 4);
      cfg.remasking = rm;
      cfg.temperature = temperature;
      cfg.cfg_scale = temperature > 0 ? 0.5 : 0.0;
      const std::vector<GenerationRequest> reqs = {{{1, 2, 3, 4, 5}, 0}, {{6}, 1}, {{7, 8, 9}, 2}, {{}, 3}};
      HashModel batched;
      const auto together = generate(batched, reqs, cfg);
      for (size_t r = 0; r < reqs.size(); ++r) {
        HashModel alone;
        const auto single = generate(alone, {reqs[r]}, cfg);
        EXPECT_EQ(single[0].tokens, together[r].tokens) << "request " << r << ", " << remasking_name(rm)
                                                        << ", temperature " << temperature;
      }
    }
  }
}

TEST(Sampler, SeedAndSampleIndexKeyTheRandomNumbers) {
  SamplerConfig cfg = config(16, 16, 16);
  cfg.temperature = 1.0;
  HashModel m;
  const auto a = generate(m, {{{1, 2}, 0}}, cfg);
  const auto b = generate(m, {{{1, 2}, 0}}, cfg);
  const auto c = generate(m, {{{1, 2}, 5}}, cfg);
  cfg.seed = 8;
  const auto d = generate(m, {{{1, 2}, 0}}, cfg);
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  EXPECT_NE(a[0].tokens, c[0].tokens);
  EXPECT_NE(a[0].tokens, d[0].tokens);
}

// With guidance the unconditional canvas is the same canvas with the prompt tokens set to M, and
// both are evaluated in one call (conditional rows first).
TEST(Sampler, GuidanceEvaluatesThePromptMaskedCanvasAlongside) {
  HashModel model;
  SamplerConfig cfg = config(4, 4, 4);
  cfg.cfg_scale = 1.5;
  generate(model, {{{1, 2, 4, 3}, 0}}, cfg);
  const CanvasBatch& c = model.canvases[0];
  ASSERT_EQ(c.batch, 2);
  EXPECT_EQ(std::vector<int32_t>(c.tokens.begin(), c.tokens.begin() + 8),
            (std::vector<int32_t>{1, 2, 4, 3, kMask, kMask, kMask, kMask}));
  // The unconditional canvas: every prompt token M (a prompt never holds M: request_problems).
  EXPECT_EQ(std::vector<int32_t>(c.tokens.begin() + 8, c.tokens.end()), std::vector<int32_t>(8, kMask));
  // Queried: the 4 generated positions, one fewer each step, in both halves.
  EXPECT_EQ(model.rows_seen, 2 * (4 + 3 + 2 + 1));
}

TEST(Sampler, StoppingAtEosKeepsTheReferencePrefixAndSkipsLaterBlocks) {
  // A bias that makes EOS (token 0) the clear favourite: the first block is all EOS.
  SamplerConfig cfg = config(12, 12, 4);
  cfg.eos_token = 0;
  HashModel full_model;
  full_model.bias[0] = 6.0f;
  const auto full = generate(full_model, {{{5, 6}, 0}}, cfg);
  cfg.stop_at_eos = true;
  HashModel stop_model;
  stop_model.bias[0] = 6.0f;
  const auto stopped = generate(stop_model, {{{5, 6}, 0}}, cfg);
  ASSERT_TRUE(stopped[0].stopped_at_eos);
  const auto eos = std::find(full[0].tokens.begin(), full[0].tokens.end(), 0);
  ASSERT_NE(eos, full[0].tokens.end());
  EXPECT_EQ(stopped[0].tokens, std::vector<int32_t>(full[0].tokens.begin(), eos + 1));
  EXPECT_LT(stop_model.calls, full_model.calls);
  EXPECT_EQ(full[0].steps, 12);
  EXPECT_EQ(stopped[0].steps, stop_model.calls);
}

TEST(Sampler, ConfidenceThresholdDecodesSeveralPositionsPerStepAndAtLeastOne) {
  HashModel strict, loose;
  SamplerConfig cfg = config(8, 8, 8);
  cfg.confidence_threshold = 1.0;  // nothing reaches 1: exactly one token per step
  const auto one = generate(strict, {{{1, 2}, 0}}, cfg);
  EXPECT_EQ(strict.calls, 8);
  const auto exact = generate(loose, {{{1, 2}, 0}}, config(8, 8, 8));
  EXPECT_EQ(one[0].tokens, exact[0].tokens);  // one per step, most confident first: the exact sampler
  HashModel eager;
  cfg.confidence_threshold = 1e-9;  // everything passes: one step per block
  generate(eager, {{{1, 2}, 0}}, cfg);
  EXPECT_EQ(eager.calls, 1);
}

// The cache: one refresh at the first step of every block, then only the block's columns (dual)
// or the block and everything after it (prefix), querying only the block's masked positions.
// Outside those columns nothing changes within a block, so with the model above (stale columns
// really stale) every row gets the exact sampler's tokens: the columns are the right ones.
TEST(Sampler, KvCacheRefreshesEachBlockThenRecomputesOnlyItsColumns) {
  for (const KvCacheMode mode : {KvCacheMode::Dual, KvCacheMode::Prefix}) {
    for (const double w : {0.0, 1.5}) {
      SamplerConfig cfg = config(12, 6, 4);  // 3 blocks of 2 steps
      cfg.cfg_scale = w;
      const std::vector<GenerationRequest> reqs = {{{1, 2, 3}, 0}, {{4}, 1}};
      HashModel plain;
      const auto exact = generate(plain, reqs, cfg);
      cfg.kv_cache = mode;
      CachedHashModel model;
      const auto res = generate(model, reqs, cfg);
      const std::string what = std::string(kv_cache_mode_name(mode)) + ", cfg " + std::to_string(w);
      EXPECT_EQ(model.calls, 6) << what;
      ASSERT_EQ(model.cached_calls.size(), 6u) << what;
      const int64_t seq = 3 + 12;
      for (size_t k = 0; k < 6; ++k) {
        const auto& call = model.cached_calls[k];
        const int64_t block_start = 3 + 4 * static_cast<int64_t>(k / 2), block_end = block_start + 4;
        EXPECT_EQ(call.refresh, k % 2 == 0) << what << ", call " << k;
        if (call.refresh) continue;
        EXPECT_EQ(call.col0, block_start) << what;
        EXPECT_EQ(call.col1, mode == KvCacheMode::Dual ? block_end : seq) << what;
        for (int32_t q : call.rows) EXPECT_LT(q % seq, block_end) << what;
        EXPECT_EQ(call.rows.size(), (w > 0 ? 2u : 1u) * 2u * 2u) << what;  // 2 masks left per row
      }
      for (size_t r = 0; r < reqs.size(); ++r) EXPECT_EQ(res[r].tokens, exact[r].tokens) << what << ", request " << r;
    }
  }
}

TEST(Sampler, KvCacheWithThresholdKeepsTheBlockBatchAndNeedsACachingModel) {
  SamplerConfig cfg = config(8, 8, 4);
  cfg.confidence_threshold = 0.2;
  const std::vector<GenerationRequest> reqs = {{{1, 2}, 0}, {{3, 4, 5}, 1}};
  HashModel plain;
  const auto fast = generate(plain, reqs, cfg);
  cfg.kv_cache = KvCacheMode::Dual;
  CachedHashModel model;
  const auto res = generate(model, reqs, cfg);
  for (size_t r = 0; r < reqs.size(); ++r) EXPECT_EQ(res[r].tokens, fast[r].tokens) << "request " << r;
  for (const auto& call : model.cached_calls) EXPECT_EQ(call.rows.empty(), false);
  for (const CanvasBatch& c : model.canvases) EXPECT_EQ(c.batch, 2);  // rows stay while the block runs
  HashModel no_cache;
  try {
    generate(no_cache, reqs, cfg);
    FAIL() << "a model without a cache ran --kv-cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`--kv-cache dual`: this model has no key/value cache"), std::string::npos)
        << e.what();
  }
}

// A prompt holding the mask token ran, and the block's transfer counts (made
// for the generated positions) left a generated position masked. Refused, naming the prompt.
TEST(Sampler, RefusesPromptsHoldingTheMaskToken) {
  HashModel model;
  const SamplerConfig cfg = config(4, 4, 4);
  try {
    generate(model, {{{5, 6}, 0}, {{5, kMask, 6}, 3}}, cfg);
    ADD_FAILURE() << "a prompt holding the mask token was run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 3 holds the mask token 31 at position 1 (of 3)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(model.calls, 0);
}

// A canvas longer than the model's positions ran without a word.
class ShortModel : public HashModel {
 public:
  int64_t max_positions() const override { return 10; }
};

TEST(Sampler, RefusesCanvasesLongerThanTheModelsPositions) {
  ShortModel model;
  EXPECT_NO_THROW(generate(model, {{{5, 6}, 0}}, config(8, 8, 8)));  // 2 + 8 = 10
  const auto problems = request_problems({{{5, 6}, 0}, {{5, 6, 7}, 1}}, config(8, 8, 8), kVocab, 10);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("prompt 1 (3 tokens) plus `--gen-length 8` needs 11 positions; the model has 10"),
            std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("`--gen-length` at most 7 with this prompt, or prompts of at most 2 tokens"),
            std::string::npos) << problems[0];
  const auto huge = request_problems({{{5}, 0}}, config(100000000, 100000000, 100000000), kVocab, 10);
  ASSERT_EQ(huge.size(), 1u);
  EXPECT_NE(huge[0].find("`--gen-length 100000000` is more than the model's 10 positions"), std::string::npos) << huge[0];
  EXPECT_THROW(generate(model, {{{5, 6, 7}, 0}}, config(8, 8, 8)), Error);
  EXPECT_TRUE(request_problems({{{5, 6, 7}, 0}}, config(8, 8, 8), kVocab, 0).empty());  // 0: no limit
}

// Generate_difflm writes each row as soon as it is final. A row that stops at EOS
// is reported after its block, before the rows that go on; every report is the returned result.
TEST(Sampler, ReportsEachRequestWhenItIsFinished) {
  SamplerConfig cfg = config(12, 12, 4);
  cfg.eos_token = 0;
  cfg.stop_at_eos = true;
  HashModel model;
  model.bias[0] = 6.0f;  // EOS is the favourite: rows stop early...
  std::vector<std::pair<size_t, int>> reports;  // (request, model calls so far)
  std::vector<GenerationResult> seen(3);
  const auto results = generate(model, {{{5, 6}, 0}, {{7}, 1}, {{8, 9, 10}, 2}}, cfg,
                                [&](size_t r, const GenerationResult& g) {
                                  reports.emplace_back(r, model.calls);
                                  seen[r] = g;
                                });
  ASSERT_EQ(reports.size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(seen[r].tokens, results[r].tokens);
    EXPECT_EQ(seen[r].stopped_at_eos, results[r].stopped_at_eos);
  }
  // ...and each is reported when its block ends, not after the whole batch.
  for (const auto& [r, calls] : reports)
    if (results[r].stopped_at_eos) EXPECT_LE(calls, model.calls);
  EXPECT_TRUE(results[0].stopped_at_eos || results[1].stopped_at_eos || results[2].stopped_at_eos);
}
