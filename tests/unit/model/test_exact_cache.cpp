// Block decoding's exact key/value cache in the model (model/kv_cache.h, exact mode;
// SelfAttention::context_cached) against training's doubled block-diffusion forward
// [x_t | x_0] with block ranges (GptModel::logits_at without a cache), on a tiny two-layer model,
// both clean-half variants, one row of 12 positions in blocks of 4 plus a padded row:
//  - prefilled blocks 0 and 1 (block by block, or one causal forward), the block [8, 12) with masks
//    gives the noisy copy's logits of that block (1e-5);
//  - the causal variant's next-token logits from the cache (prefill [0, 8), then the column 8
//    alone) are the clean copy's;
//  - the keys of a block written during a step are replaced by the next call at those columns
//    (the cache is not silently recomputed: a stale block gives other logits).
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/kv_cache.h"

using namespace megadlm;

namespace {

constexpr int32_t kMask = 31;
constexpr int64_t L = 12, B = 4;

TransformerConfig config(bool causal) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.seq_length = L;
  c.max_position_embeddings = 16;
  c.position_embedding_type = PositionEmbeddingType::Rope;
  c.normalization = NormType::RMSNorm;
  c.qk_layernorm = true;
  c.activation = MlpActivation::SwiGLU;
  c.vocab_size = c.padded_vocab_size = 32;
  c.init_method_std = 0.3f;
  c.attention_dropout = c.hidden_dropout = 0;
  c.attention_mask = AttentionMaskType::BlockCausal;
  c.block_diffusion_causal_clean = causal;
  return c;
}

// Row 0: 12 tokens, block 2 partly masked. Row 1: 4 pad columns (document 0), then 8 tokens
// (positions 0..7), its block [8, 12) = its positions 4..7.
const std::vector<int32_t> kTokens = {3, 9, 14, 2, 7, 21, 5, 11, 17, kMask, 4, kMask,
                                      0, 0, 0, 0, 6, 8, 10, 12, kMask, 13, kMask, kMask};
int32_t doc(int64_t b, int64_t c) { return b == 1 && c < 4 ? 0 : 1; }
int32_t position(int64_t b, int64_t c) { return b == 1 ? (c < 4 ? static_cast<int32_t>(c) : static_cast<int32_t>(c - 4)) : static_cast<int32_t>(c); }

struct Model {
  explicit Model(const TransformerConfig& c) : model(c, store) {
    rt.stream = Stream::cpu();
    rt.training = false;
    store.materialize(DType::F32, 17, rt.stream);
  }
  std::vector<float> logits(const HostMicroBatch& h, const std::vector<int32_t>& rows, KvCache* cache) {
    ModelRuntime r = rt;
    r.kv_cache = cache;
    return model.logits_at(MicroBatch::upload(h, rt.stream), Tensor::from_ints(rows, {static_cast<int64_t>(rows.size())}), r)
        .to_floats(rt.stream);
  }
  // Training's doubled rows over the 12 columns, both copies `tokens`.
  std::vector<float> doubled(const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows) {
    HostMicroBatch h;
    h.batch = 2;
    h.seq = 2 * L;
    for (int64_t b = 0; b < 2; ++b) {
      for (int copy = 0; copy < 2; ++copy)
        for (int64_t c = 0; c < L; ++c) {
          h.input_ids.push_back(tokens[static_cast<size_t>(b * L + c)]);
          h.positions.push_back(position(b, c));
        }
      std::vector<int32_t> r(4 * L);
      for (int64_t c = 0; c < L; ++c) {
        const int64_t ds = doc(b, c) == 0 ? 0 : (b == 1 ? 4 : 0), de = doc(b, c) == 0 ? 4 : L;
        r[c] = static_cast<int32_t>(ds);
        r[L + c] = static_cast<int32_t>(de);
        r[2 * L + c] = static_cast<int32_t>(std::max(ds, c / B * B));
        r[3 * L + c] = static_cast<int32_t>(std::min(de, (c / B + 1) * B));
      }
      h.block_ranges.insert(h.block_ranges.end(), r.begin(), r.end());
    }
    h.labels = h.input_ids;
    h.loss_weights.assign(h.input_ids.size(), 0.0f);
    return logits(h, rows, nullptr);
  }
  // Columns [c0, c1) through the exact cache; keys visible up to column `written`.
  std::vector<float> cached(const std::vector<int32_t>& tokens, int64_t c0, int64_t c1, int64_t written, bool causal,
                            const std::vector<int32_t>& rows) {
    HostMicroBatch h;
    h.batch = 2;
    h.seq = c1 - c0;
    std::vector<int32_t> keys;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t c = c0; c < c1; ++c) {
        h.input_ids.push_back(tokens[static_cast<size_t>(b * L + c)]);
        h.positions.push_back(position(b, c));
        h.document_ids.push_back(doc(b, c));
      }
      for (int64_t c = 0; c < L; ++c) keys.push_back(c < written ? doc(b, c) : 3);
    }
    h.labels = h.input_ids;
    h.loss_weights.assign(h.input_ids.size(), 0.0f);
    cache.column0 = c0;
    cache.causal = causal;
    cache.key_document_ids = Tensor::from_ints(keys, {2 * L});
    return logits(h, rows, &cache);
  }
  void reset() {
    cache = KvCache{};
    cache.batch = 2;
    cache.seq = L;
    cache.exact = true;
  }
  ParameterStore store;
  GptModel model;
  ModelRuntime rt;
  KvCache cache;
};

void expect_near(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  EXPECT_LT(worst, 1e-5) << what;
}

}  // namespace

TEST(ExactCache, BlockStepEqualsTheDoubledForwardOfItsNoisyCopy) {
  for (const bool causal : {false, true}) {
    Model m(config(causal));
    m.reset();
    if (causal) {
      m.cached(kTokens, 0, 8, 8, true, {0});
    } else {
      m.cached(kTokens, 0, 4, 4, false, {0});
      m.cached(kTokens, 4, 8, 8, false, {0});
    }
    // The block [8, 12) of both rows: rows 0..3 and 4..7 of the window; the noisy copy's rows
    // 8..11 and 24 + 8..11 of the doubled batch.
    const std::vector<float> got = m.cached(kTokens, 8, 12, 12, false, {0, 1, 2, 3, 4, 5, 6, 7});
    const std::vector<float> want = m.doubled(kTokens, {8, 9, 10, 11, 32, 33, 34, 35});
    expect_near(got, want, causal ? "causal clean" : "block-causal clean");
  }
}

TEST(ExactCache, CausalNextTokenLogitsAreTheCleanCopys) {
  Model m(config(true));
  m.reset();
  std::vector<int32_t> t = kTokens;
  // Prefill [0, 8): the next-token logits of column 7; then column 8 alone: those of column 8.
  const std::vector<float> p = m.cached(t, 0, 8, 8, true, {7, 15});
  expect_near(p, m.doubled(t, {L + 7, 2 * L + L + 7}), "prefill's last column");
  t[8] = 19;
  t[L + 8] = 23;
  const std::vector<float> one = m.cached(t, 8, 9, 9, true, {0, 1});
  expect_near(one, m.doubled(t, {L + 8, 2 * L + L + 8}), "one column after the prefill");
  // The finished block [8, 12) under the causal rule: its last column's clean logits.
  for (int64_t c : {9, 10, 11}) {
    t[static_cast<size_t>(c)] = static_cast<int32_t>(c);
    t[static_cast<size_t>(L + c)] = static_cast<int32_t>(c + 1);
  }
  const std::vector<float> upd = m.cached(t, 8, 12, 12, true, {3, 7});
  expect_near(upd, m.doubled(t, {L + 11, 2 * L + L + 11}), "the causal update of a block");
}

TEST(ExactCache, AStaleBlockChangesTheLogits) {
  Model m(config(false));
  m.reset();
  m.cached(kTokens, 0, 4, 4, false, {0});
  m.cached(kTokens, 4, 8, 8, false, {0});
  const std::vector<float> fresh = m.cached(kTokens, 8, 12, 12, false, {0});
  std::vector<int32_t> t = kTokens;
  t[5] = 30;  // block 1 decoded differently, its keys not rewritten
  const std::vector<float> stale = m.cached(t, 8, 12, 12, false, {0});
  EXPECT_EQ(fresh, stale);  // the window does not recompute block 1
  m.cached(t, 4, 8, 8, false, {0});
  const std::vector<float> rewritten = m.cached(t, 8, 12, 12, false, {0});
  EXPECT_NE(fresh, rewritten);
  expect_near(rewritten, m.doubled(t, {8}), "after the rewrite");
}
