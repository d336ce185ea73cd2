// Block decoding's logic (diffusion/block_sampler.h) against a deterministic fake model whose
// logits are a hash of the tokens a query may see: the block-aligned layout, the configuration
// errors, the exact cache holding exactly the committed tokens (cached == uncached, which fails
// when a block's keys are not rewritten once it is finished), the forwards each mode runs, the
// threshold's tokens per forward and EOS stopping. Agreement with an independent NumPy
// implementation on a real model is tests/e2e/generate_block.sh.
#include <gtest/gtest.h>
#include <map>
#include "megadlm/core/cuda_graph.h"
#include "megadlm/diffusion/block_sampler.h"
#include "support/logits_model.h"

using namespace megadlm;
using test::mix;

namespace {

constexpr int64_t kVocab = 32;
constexpr int32_t kMask = 31;

// The logits of a query: a hash of its position and of the (position, token) of every key it
// sees, in column order, spread over [-4, 4); the mask token is never the favourite. `peak`
// sharpens token (hash % 4) so that a threshold can commit several at once.
std::vector<float> hashed_logits(uint64_t h, float peak) {
  std::vector<float> out;
  for (int64_t v = 0; v < kVocab; ++v) {
    float l = static_cast<float>(mix(h, static_cast<uint64_t>(v)) % 8000) / 1000.0f - 4.0f;
    if (v == static_cast<int64_t>(h % 4)) l += peak;
    out.push_back(v == kMask ? -50.0f : l);
  }
  return out;
}

// Uncached: the doubled rows [x_t | x_0] with block ranges, as training's attention reads them.
// Cached: the exact cache keeps the (position, token) each call wrote at each column; a query
// sees the cached columns of its document (causal: up to its own column).
class HashModel : public LogitsModel {
 public:
  explicit HashModel(float peak = 0.0f) : peak_(peak) {}
  int64_t vocab_size() const override { return kVocab; }
  const Stream& stream() const override { return stream_; }

  Tensor logits(const CanvasBatch& c, const std::vector<int32_t>& rows) override {
    EXPECT_FALSE(c.block_ranges.empty());
    ++uncached_calls;
    const int64_t L = c.seq / 2;
    std::vector<float> out;
    for (int32_t q : rows) {
      const int64_t b = q / c.seq, i = q % c.seq, p = i % L;
      const int32_t* r = c.block_ranges.data() + b * 4 * L;
      const int64_t ds = r[p], bs = r[2 * L + p], be = r[3 * L + p];
      uint64_t h = mix(0, static_cast<uint64_t>(c.positions[static_cast<size_t>(q)]));
      for (int64_t k = 0; k < L; ++k) {
        bool visible;
        int64_t j;  // the key row
        if (i < L) {  // noisy: earlier clean blocks, then its own noisy block
          visible = (k >= ds && k < bs) || (k >= bs && k < be);
          j = k < bs ? L + k : k;
        } else {  // clean (the causal variant's next-token rows)
          visible = causal_clean ? (k >= ds && k <= p) : (k >= ds && k < be);
          j = L + k;
        }
        if (!visible) continue;
        const size_t at = static_cast<size_t>(b * c.seq + j);
        h = mix(h, static_cast<uint64_t>(c.positions[at]) * 1000 + static_cast<uint64_t>(c.tokens[at]));
      }
      const std::vector<float> l = hashed_logits(h, peak_);
      out.insert(out.end(), l.begin(), l.end());
    }
    return Tensor::from_floats(out, {static_cast<int64_t>(rows.size()), kVocab});
  }

  bool supports_exact_cache() const override { return true; }
  void exact_cache_reset(int64_t batch, int64_t seq) override {
    batch_ = batch;
    seq_ = seq;
    pos_.assign(static_cast<size_t>(batch * seq), -1);
    tok_.assign(static_cast<size_t>(batch * seq), -1);
  }
  Tensor exact_cache_logits(const CanvasBatch& w, int64_t col0, const std::vector<int32_t>& key_docs, bool causal,
                            const std::vector<int32_t>& rows) override {
    calls.push_back({col0, w.seq, causal});
    for (int64_t b = 0; b < w.batch; ++b)
      for (int64_t i = 0; i < w.seq; ++i) {
        const size_t at = static_cast<size_t>(b * seq_ + col0 + i), from = static_cast<size_t>(b * w.seq + i);
        pos_[at] = w.positions[from];
        tok_[at] = w.tokens[from];
      }
    std::vector<float> out;
    for (int32_t q : rows) {
      const int64_t b = q / w.seq, col = col0 + q % w.seq;
      const int32_t doc = w.document_ids[static_cast<size_t>(q)];
      uint64_t h = mix(0, static_cast<uint64_t>(w.positions[static_cast<size_t>(q)]));
      for (int64_t k = 0; k < seq_; ++k) {
        const size_t at = static_cast<size_t>(b * seq_ + k);
        if (key_docs[at] != doc || (causal && k > col)) continue;
        h = mix(h, static_cast<uint64_t>(pos_[at]) * 1000 + static_cast<uint64_t>(tok_[at]));
      }
      const std::vector<float> l = hashed_logits(h, peak_);
      out.insert(out.end(), l.begin(), l.end());
    }
    return Tensor::from_floats(out, {static_cast<int64_t>(rows.size()), kVocab});
  }

  struct Call {
    int64_t col0, width;
    bool causal;
  };
  std::vector<Call> calls;
  int uncached_calls = 0;
  bool causal_clean = false;

 private:
  float peak_;
  Stream stream_ = Stream::cpu();
  int64_t batch_ = 0, seq_ = 0;
  std::vector<int32_t> pos_, tok_;
};

SamplerConfig config(int64_t gen, int64_t steps, int64_t block) {
  SamplerConfig c;
  c.gen_length = gen;
  c.steps = steps;
  c.block_length = block;
  c.mask_token = kMask;
  c.seed = 5;
  return c;
}

std::vector<GenerationRequest> ragged() {
  return {{{3, 4, 5, 6, 7, 8, 9}, 0}, {{10, 11}, 1}, {{12, 13, 14, 15}, 2}, {{16}, 3}};
}

std::vector<GenerationResult> run(HashModel& m, const SamplerConfig& c, BlockDecoding d,
                                  const std::vector<GenerationRequest>& req = ragged()) {
  m.causal_clean = d.causal_clean;
  return generate_blocks(m, req, c, d);
}

}  // namespace

TEST(BlockSampler, LayoutAlignsBlocksToEachRowsPositions) {
  // Block 4, prompts 7, 2, 4, 1, gen 8: Pmax 7 -> first decoded block J = 1; pads 4*(1 - P/4).
  const BlockLayout l = block_layout({7, 2, 4, 1}, 8, 4);
  EXPECT_EQ(l.first_block, 1);
  EXPECT_EQ(l.pad, (std::vector<int64_t>{0, 4, 0, 4}));
  EXPECT_EQ(l.end, (std::vector<int64_t>{15, 14, 12, 13}));
  EXPECT_EQ(l.seq, 16);
  for (size_t b = 0; b < l.pad.size(); ++b) EXPECT_EQ(l.pad[b] % 4, 0);  // position p at column pad + p
  const BlockLayout one = block_layout({8}, 4, 4);  // a prompt ending on a boundary: no partial block
  EXPECT_EQ(one.first_block, 2);
  EXPECT_EQ(one.seq, 12);
}

TEST(BlockSampler, ConfigurationProblemsNameTheFlag) {
  SamplerConfig c = config(10, 10, 4);
  BlockDecoding d;
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    for (const std::string& x : v)
      if (x.find(s) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has(block_decoding_problems(c, d, kVocab), "`--gen-length 10` is not a multiple of `--block-length 4`"));
  c = config(8, 8, 4);
  EXPECT_TRUE(block_decoding_problems(c, d, kVocab).empty());
  c.cfg_scale = 1.0;
  EXPECT_TRUE(has(block_decoding_problems(c, d, kVocab), "`--cfg-scale`"));
  c.cfg_scale = 0;
  c.kv_cache = KvCacheMode::Dual;
  EXPECT_TRUE(has(block_decoding_problems(c, d, kVocab), "`--kv-cache dual`"));
  c.kv_cache = KvCacheMode::None;
  d.autoregressive = true;
  EXPECT_TRUE(has(block_decoding_problems(c, d, kVocab), "`--decode ar` needs a model whose clean stream is causal"));
  d.causal_clean = true;
  EXPECT_TRUE(block_decoding_problems(c, d, kVocab).empty());
  HashModel m;
  EXPECT_THROW(run(m, c, d, {{{}, 0}}), Error);  // an empty prompt has nothing to predict from
}

TEST(BlockSampler, CudaGraphsAreRefusedWhereTheyCannotRunNamingTheFlag) {
  const SamplerConfig c = config(8, 8, 4);
  BlockDecoding d;
  d.cuda_graphs = true;
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    for (const std::string& x : v)
      if (x.find(s) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(block_decoding_problems(c, d, kVocab).empty());
  d.exact_cache = false;
  EXPECT_TRUE(has(block_decoding_problems(c, d, kVocab), "`--cuda-graphs` captures the steps of the exact cache"));
  d.exact_cache = true;
  d.autoregressive = d.causal_clean = true;
  EXPECT_TRUE(has(block_decoding_problems(c, d, kVocab), "`--decode ar` writes a new cache column every token"));
  d.autoregressive = false;
  // A model without CUDA graphs of its steps (the LogitsModel default).
  HashModel m;
  try {
    run(m, c, d);
    ADD_FAILURE() << "--cuda-graphs accepted by a model without graphs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`--cuda-graphs`"), std::string::npos) << e.what();
  }
}

// The model calls of block decoding under GraphSchedule (model/exact_cache_graphs.h keys a call
// by its window and cache shapes and the causal flag, its site by the first column): the
// block-causal variant's prefill runs eagerly, each decoded block is captured once at its first
// step, and its later steps and its cache update replay. Ragged prompts 7, 2, 4, 1 with blocks of
// 4 and 12 generated: canvas of 20 columns (prompt 0 ends at 7 + 12 = 19), prefill [0, 4),
// blocks at columns 4, 8, 12, 16 (the last without an update).
TEST(BlockSampler, CudaGraphScheduleOverTheSamplersCalls) {
  for (const bool causal : {false, true}) {
    HashModel m;
    BlockDecoding d;
    d.causal_clean = causal;
    run(m, config(12, 12, 4), d);
    GraphSchedule g;
    std::vector<GraphAction> acts;
    for (const HashModel::Call& call : m.calls)
      acts.push_back(g.next({{4, call.width, 20, call.causal ? 1 : 0}, call.col0}));
    const int64_t calls = static_cast<int64_t>(m.calls.size());
    EXPECT_EQ(g.eager() + g.captures() + g.replays(), calls);
    if (!causal) {
      EXPECT_EQ(g.eager(), 1);
      EXPECT_EQ(g.captures(), 4);
      EXPECT_EQ(g.replays(), calls - 5);
      EXPECT_EQ(acts[0], GraphAction::Eager);
      for (size_t k = 1; k < acts.size(); ++k) {  // a capture exactly where the column changes
        EXPECT_EQ(acts[k] == GraphAction::Capture, m.calls[k].col0 != m.calls[k - 1].col0) << "call " << k;
      }
    } else {
      // The causal update is a shape of its own: eager once (the prefill), then captured at
      // each block's column and run once; the first block's first step is its shape's first run.
      EXPECT_EQ(g.eager(), 2);
      // Captures: blocks 1..4 (block 1 at its second step) and the 3 causal updates (columns 4, 8, 12).
      EXPECT_EQ(g.captures(), 7);
    }
  }
}

TEST(BlockSampler, CachedEqualsUncachedAndTheCacheIsRewrittenAfterEachBlock) {
  for (const bool causal : {false, true})
    for (const double threshold : {0.0, 0.2})
      for (const Remasking rm : {Remasking::LowConfidence, Remasking::Random}) {
        SamplerConfig c = config(8, 4, 4);
        c.confidence_threshold = threshold;
        c.remasking = rm;
        BlockDecoding exact, none;
        exact.causal_clean = none.causal_clean = causal;
        none.exact_cache = false;
        HashModel a(3.0f), b(3.0f);
        const auto ra = run(a, c, exact), rb = run(b, c, none);
        for (size_t r = 0; r < ra.size(); ++r) {
          EXPECT_EQ(ra[r].tokens, rb[r].tokens) << "row " << r << " causal " << causal << " threshold " << threshold;
          EXPECT_EQ(ra[r].steps, rb[r].steps);
          EXPECT_EQ(ra[r].tokens.size(), 8u);
          for (int32_t t : ra[r].tokens) EXPECT_NE(t, kMask);
        }
        EXPECT_EQ(a.uncached_calls, 0);
        EXPECT_TRUE(b.calls.empty());
        // Columns 0..15, J = 1: the prefill of block 0, then blocks 1, 2, 3 with an update of
        // blocks 1 and 2 (not of the last) under the clean rule.
        ASSERT_FALSE(a.calls.empty());
        EXPECT_EQ(a.calls.front().col0, 0);
        EXPECT_EQ(a.calls.front().width, 4);
        EXPECT_EQ(a.calls.front().causal, causal);
        int updates = 0;
        for (const auto& call : a.calls) updates += call.col0 >= 4 && call.causal == causal && causal;
        if (causal) EXPECT_EQ(updates, 2);
        EXPECT_EQ(a.calls.back().col0, 12);
      }
}

TEST(BlockSampler, AStaleCacheWouldChangeTheTokens) {
  // The hash sees the cached tokens: decoding the same canvas where the last block's keys are
  // those of a step with masks gives other logits, so the equality above tests the rewrite.
  HashModel m;
  m.exact_cache_reset(1, 4);
  CanvasBatch w;
  w.batch = 1;
  w.seq = 4;
  w.tokens = {1, 2, kMask, kMask};
  w.positions = {0, 1, 2, 3};
  w.document_ids = {1, 1, 1, 1};
  const std::vector<int32_t> docs = {1, 1, 1, 1};
  Tensor stale = m.exact_cache_logits(w, 0, docs, false, {3});
  w.tokens = {1, 2, 3, kMask};
  Tensor fresh = m.exact_cache_logits(w, 0, docs, false, {3});
  EXPECT_NE(stale.data<float>()[0], fresh.data<float>()[0]);
}

TEST(BlockSampler, OneRequestAloneEqualsItInARaggedBatch) {
  for (const bool causal : {false, true}) {
    SamplerConfig c = config(8, 8, 4);
    BlockDecoding d;
    d.causal_clean = causal;
    HashModel batch_model;
    const auto all = run(batch_model, c, d);
    for (size_t r = 0; r < all.size(); ++r) {
      HashModel alone;
      const auto one = run(alone, c, d, {ragged()[r]});
      EXPECT_EQ(one[0].tokens, all[r].tokens) << "row " << r;
      EXPECT_EQ(one[0].steps, all[r].steps);
    }
  }
}

TEST(BlockSampler, StaticScheduleThresholdAndTokensPerForward) {
  // Static: s = 8 / 2 = 4 steps a block; a block of m masks commits transfer_schedule(m, 4).
  // Row 1 (prompt 2): blocks hold 2, 4 and 2 masks -> 2 + 4 + 2 forwards; row 3 (prompt 1):
  // 3, 4, 1 masks -> 3 + 4 + 1.
  SamplerConfig c = config(8, 8, 4);
  HashModel m;
  const auto r = run(m, c, {});
  EXPECT_EQ(r[1].steps, 8);
  EXPECT_EQ(r[3].steps, 8);
  EXPECT_EQ(r[2].steps, 8);  // prompt 4: blocks of 4 and 4 masks
  // A sharp model and a threshold: fewer forwards than tokens, never more than one a token.
  c.confidence_threshold = 0.5;
  HashModel sharp(12.0f);
  const auto t = run(sharp, c, {});
  int64_t tokens = 0, steps = 0;
  for (const auto& x : t) {
    tokens += static_cast<int64_t>(x.tokens.size());
    steps += x.steps;
    EXPECT_LE(x.steps, 8);
  }
  EXPECT_LT(steps, tokens);
}

TEST(BlockSampler, StopsAtEosAfterTheBlock) {
  SamplerConfig c = config(12, 12, 4);
  HashModel probe;
  const auto full = run(probe, c, {});
  // Make row 0's second generated token the EOS: it finishes after its first decoded block.
  c.eos_token = full[0].tokens[1];
  c.stop_at_eos = true;
  HashModel m;
  const auto r = run(m, c, {});
  ASSERT_TRUE(r[0].stopped_at_eos);
  const auto first = std::find(full[0].tokens.begin(), full[0].tokens.end(), c.eos_token);
  EXPECT_EQ(r[0].tokens, std::vector<int32_t>(full[0].tokens.begin(), first + 1));
  EXPECT_LT(r[0].steps, full[0].steps);
}

TEST(BlockSampler, ACallersStopRuleEndsARowAfterTheBlockWhereItHolds) {
  // Prompts 7, 2, 4, 1, block 4, gen 12: row 0's decoded blocks end at generated tokens 1, 5, 9
  // (its prompt ends inside column block 1), row 2's at 4, 8, 12. The rule stops row 0 once it
  // has 2 or more tokens (after its second block: 5 tokens) and row 2 after its first block; the
  // other rows run to the end. Stopped rows keep exactly the full run's first tokens.
  SamplerConfig c = config(12, 12, 4);
  HashModel probe;
  const auto full = run(probe, c, {});
  BlockDecoding d;
  std::vector<std::vector<size_t>> asked(4);
  d.stop_after_block = [&](size_t request, const std::vector<int32_t>& generated) {
    asked[request].push_back(generated.size());
    EXPECT_EQ(generated, std::vector<int32_t>(full[request].tokens.begin(),
                                              full[request].tokens.begin() + static_cast<int64_t>(generated.size())));
    return (request == 0 && generated.size() >= 2) || request == 2;
  };
  HashModel m;
  const auto r = run(m, c, d);
  EXPECT_EQ(asked[0], (std::vector<size_t>{1, 5}));
  EXPECT_EQ(asked[2], (std::vector<size_t>{4}));
  EXPECT_EQ(r[0].tokens, std::vector<int32_t>(full[0].tokens.begin(), full[0].tokens.begin() + 5));
  EXPECT_EQ(r[2].tokens, std::vector<int32_t>(full[2].tokens.begin(), full[2].tokens.begin() + 4));
  EXPECT_EQ(r[1].tokens, full[1].tokens);
  EXPECT_EQ(r[3].tokens, full[3].tokens);
  EXPECT_LT(r[0].steps, full[0].steps);
  EXPECT_LT(r[2].steps, full[2].steps);
  EXPECT_FALSE(r[0].stopped_at_eos);
}

TEST(BlockSampler, OddBlocksOfTheCausalVariantUpdateColumnByColumn) {
  // Block 3: a causal cache update of an odd width away from column 0 runs one column at a time
  // (the cache's causal windows need column 0 or an even width); the tokens stay the uncached ones.
  SamplerConfig c = config(9, 9, 3);
  BlockDecoding exact, none;
  exact.causal_clean = none.causal_clean = true;
  none.exact_cache = false;
  HashModel a, b;
  const auto ra = run(a, c, exact), rb = run(b, c, none);
  for (size_t r = 0; r < ra.size(); ++r) EXPECT_EQ(ra[r].tokens, rb[r].tokens) << "row " << r;
  int single = 0;
  for (const auto& call : a.calls) single += call.causal && call.width == 1;
  // Prompts up to 7 tokens: J = 2, blocks 2..5 decoded (columns 6..17), updates of blocks 2, 3, 4.
  EXPECT_EQ(single, 3 * 3);
}
