// Fast-dLLM's key/value cache in the model (model/kv_cache.h, SelfAttention::forward_cached)
// against the plain forward (GptModel::logits_at without a cache):
//  - a refresh gives the plain logits, and fills one K and one V per layer;
//  - a window computed right after the refresh (nothing changed) gives the plain logits of its
//    columns, also for padded rows (document ids: the pads stay invisible);
//  - on one layer a window after its own tokens changed is still exact (a layer's keys and values
//    depend only on its own token), on two layers it is not: the other columns' cached keys
//    really are the refresh's, so the cache is used and not silently recomputed;
//  - the unfused attention path (LayerNorm QK-norm) gives the same as the fused one's contract.
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/kv_cache.h"

using namespace megadlm;

namespace {

TransformerConfig config(int layers, NormType qk_norm = NormType::RMSNorm) {
  TransformerConfig c;
  c.num_layers = layers;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.seq_length = 12;
  c.max_position_embeddings = 16;
  c.position_embedding_type = PositionEmbeddingType::Rope;
  c.normalization = qk_norm;
  c.qk_layernorm = true;
  c.activation = MlpActivation::SwiGLU;
  c.vocab_size = c.padded_vocab_size = 32;
  c.init_method_std = 0.3f;
  c.attention_dropout = c.hidden_dropout = 0;
  return c;
}

struct Canvas {
  int64_t batch, seq;
  std::vector<int32_t> tokens, positions, docs;  // docs empty: no padding
};

struct Model {
  explicit Model(const TransformerConfig& c) : cfg(c), model(c, store) {
    rt.stream = Stream::cpu();
    rt.training = false;
    store.materialize(DType::F32, 11, rt.stream);
  }
  // Logits of `rows` (flat canvas indices inside [col0, col1)) from the columns [col0, col1).
  std::vector<float> run(const Canvas& c, const std::vector<int32_t>& rows, int64_t col0, int64_t col1,
                         KvCache* cache) {
    HostMicroBatch h;
    h.batch = c.batch;
    h.seq = col1 - col0;
    std::vector<int32_t> local;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = col0; i < col1; ++i) {
        const size_t k = static_cast<size_t>(b * c.seq + i);
        h.input_ids.push_back(c.tokens[k]);
        h.positions.push_back(c.positions[k]);
        if (!c.docs.empty()) h.document_ids.push_back(c.docs[k]);
      }
    for (int32_t r : rows) local.push_back(static_cast<int32_t>(r / c.seq * (col1 - col0) + r % c.seq - col0));
    h.labels = h.input_ids;
    h.loss_weights.assign(h.input_ids.size(), 0.0f);
    ModelRuntime r = rt;
    r.kv_cache = cache;
    if (cache != nullptr) cache->column0 = col0;
    return model
        .logits_at(MicroBatch::upload(h, rt.stream), Tensor::from_ints(local, {static_cast<int64_t>(local.size())}), r)
        .to_floats(rt.stream);
  }
  std::vector<float> plain(const Canvas& c, const std::vector<int32_t>& rows) { return run(c, rows, 0, c.seq, nullptr); }
  std::vector<float> refresh(const Canvas& c, const std::vector<int32_t>& rows, KvCache& cache) {
    cache = KvCache{};
    cache.batch = c.batch;
    cache.seq = c.seq;
    cache.refresh = true;
    if (!c.docs.empty()) cache.document_ids = Tensor::from_ints(c.docs, {c.batch * c.seq});
    std::vector<float> out = run(c, rows, 0, c.seq, &cache);
    cache.refresh = false;
    return out;
  }

  TransformerConfig cfg;
  ParameterStore store;
  GptModel model;
  ModelRuntime rt;
};

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Two rows: the first padded by three pad tokens (document 0), positions from each row's start.
Canvas two_rows() {
  Canvas c{2, 12, {}, {}, {}};
  const std::vector<int32_t> a = {0, 0, 0, 5, 9, 2, 31, 31, 31, 31, 31, 31};
  const std::vector<int32_t> b = {7, 3, 8, 1, 4, 6, 31, 31, 31, 31, 31, 31};
  c.tokens = a;
  c.tokens.insert(c.tokens.end(), b.begin(), b.end());
  for (int i = 0; i < 12; ++i) c.positions.push_back(i < 3 ? i : i - 3);
  for (int i = 0; i < 12; ++i) c.positions.push_back(i);
  for (int i = 0; i < 12; ++i) c.docs.push_back(i < 3 ? 0 : 1);
  c.docs.insert(c.docs.end(), 12, 1);
  return c;
}

std::vector<int32_t> columns(const Canvas& c, int64_t col0, int64_t col1) {
  std::vector<int32_t> rows;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = col0; i < col1; ++i) rows.push_back(static_cast<int32_t>(b * c.seq + i));
  return rows;
}

}  // namespace

TEST(KvCache, RefreshAndAnUnchangedWindowGiveThePlainLogits) {
  for (const NormType qk : {NormType::RMSNorm, NormType::LayerNorm}) {  // fused and unfused attention
    Model m(config(2, qk));
    const Canvas c = two_rows();
    KvCache cache;
    const std::vector<int32_t> all = columns(c, 0, 12);
    EXPECT_LE(max_diff(m.refresh(c, all, cache), m.plain(c, all)), 1e-6);
    ASSERT_EQ(cache.k.size(), 2u);
    EXPECT_EQ(cache.k[1].shape(), (Shape{2 * 12, 2 * 4}));
    for (const auto& [col0, col1] : std::vector<std::pair<int64_t, int64_t>>{{6, 9}, {6, 12}, {9, 12}}) {
      const std::vector<int32_t> rows = columns(c, col0, col1);
      EXPECT_LE(max_diff(m.run(c, rows, col0, col1, &cache), m.plain(c, rows)), 1e-5)
          << "columns [" << col0 << ", " << col1 << ")";
    }
  }
}

TEST(KvCache, OneLayerIsExactAfterTheWindowChangesTwoLayersAreNot) {
  const Canvas before = two_rows();
  Canvas after = before;
  for (int64_t b = 0; b < 2; ++b) {  // decode two positions of the window [6, 9) in each row
    after.tokens[static_cast<size_t>(b * 12 + 6)] = 17;
    after.tokens[static_cast<size_t>(b * 12 + 8)] = 23;
  }
  const std::vector<int32_t> rows = columns(before, 6, 9);
  for (const int layers : {1, 2}) {
    Model m(config(layers));
    KvCache cache;
    m.refresh(before, columns(before, 0, 12), cache);
    const double d = max_diff(m.run(after, rows, 6, 9, &cache), m.plain(after, rows));
    if (layers == 1) {
      EXPECT_LE(d, 1e-5) << "one layer: keys and values depend only on the tokens";
    } else {
      EXPECT_GT(d, 1e-3) << "two layers: the columns outside the window must keep the refresh's keys";
    }
    // A refresh of the new canvas makes it exact again.
    m.refresh(after, columns(after, 0, 12), cache);
    EXPECT_LE(max_diff(m.run(after, rows, 6, 9, &cache), m.plain(after, rows)), 1e-5) << layers << " layers";
  }
}

TEST(KvCache, AWindowOutsideTheCacheIsRefused) {
  Model m(config(1));
  const Canvas c = two_rows();
  KvCache cache;
  EXPECT_THROW(m.run(c, columns(c, 6, 9), 6, 9, &cache), Error);  // never refreshed: 0 x 0 canvases
  m.refresh(c, columns(c, 0, 12), cache);
  cache.seq = 8;  // a window past the cached columns
  EXPECT_THROW(m.run(c, columns(c, 6, 9), 6, 9, &cache), Error);
}

TEST(KvCache, LogitsAtTheRealVocabularyAreTheFirstColumns) {
  TransformerConfig cfg = config(1);
  cfg.vocab_size = 20;  // padded to 32
  Model m(cfg);
  const Canvas c = two_rows();
  const std::vector<int32_t> rows = {3, 7, 15};
  const std::vector<float> full = m.plain(c, rows);
  HostMicroBatch h;
  h.batch = 2;
  h.seq = 12;
  h.input_ids = h.labels = c.tokens;
  h.positions = c.positions;
  h.document_ids = c.docs;
  h.loss_weights.assign(24, 0.0f);
  const std::vector<float> real =
      m.model.logits_at(MicroBatch::upload(h, m.rt.stream), Tensor::from_ints(rows, {3}), m.rt, 20).to_floats(m.rt.stream);
  ASSERT_EQ(real.size(), 3u * 20u);
  for (size_t r = 0; r < 3; ++r)
    for (size_t v = 0; v < 20; ++v) EXPECT_EQ(real[r * 20 + v], full[r * 32 + v]);
}
