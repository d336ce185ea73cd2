// The key/value cache of the samplers (model/kv_cache.h) on CUDA against the CPU: the same
// bf16-representable weights in a bf16 CUDA model and an f32 CPU model, a padded two-row canvas;
// the refresh's logits and a cached window's logits after tokens of the window changed (the
// cached columns then hold the refresh's keys: the approximation itself must agree) within bf16
// tolerance. Head dim 32 runs the fused QK-norm + RoPE path, 16 the unfused one; the windows run
// CUDA's key-block attention (kv_seq = the canvas, the keys' own documents) and copy_row_block.
#include <gtest/gtest.h>
#include <string>
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/kv_cache.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

TransformerConfig config(int64_t head_dim) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = head_dim;
  c.ffn_hidden_size = 256;
  c.seq_length = 24;
  c.max_position_embeddings = 32;
  c.position_embedding_type = PositionEmbeddingType::Rope;
  c.normalization = NormType::RMSNorm;
  c.qk_layernorm = true;
  c.activation = MlpActivation::SwiGLU;
  c.vocab_size = c.padded_vocab_size = 64;
  c.init_method_std = 0.1f;
  c.attention_dropout = c.hidden_dropout = 0;
  return c;
}

struct Canvas {
  int64_t batch = 2, seq = 24;
  std::vector<int32_t> tokens, positions, docs;
};

// Row 0 behind 5 pads (document 0), row 1 unpadded; 12 masked columns (63) at the end.
Canvas canvas() {
  Canvas c;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 24; ++i) {
      const bool pad = b == 0 && i < 5;
      c.tokens.push_back(pad ? 0 : i >= 12 ? 63 : 1 + (b * 17 + i * 5) % 60);
      c.positions.push_back(b == 0 ? std::max(0, i - 5) : i);
      c.docs.push_back(pad ? 0 : 1);
    }
  return c;
}

struct Side {
  Side(const TransformerConfig& cfg, Stream s, DType dt) : model(cfg, store) {
    rt.stream = s;
    rt.dtype = dt;
    rt.training = false;
    store.materialize(dt, 5, s);
  }
  std::vector<double> logits(const Canvas& c, int64_t col0, int64_t col1, KvCache& cache, bool refresh) {
    const Stream& s = rt.stream;
    if (refresh) {
      cache = KvCache{};
      cache.batch = c.batch;
      cache.seq = c.seq;
      cache.document_ids = Tensor::from_ints(c.docs, {c.batch * c.seq});
      if (s.is_cuda()) cache.document_ids = cache.document_ids.to(s.device(), s);
    }
    cache.refresh = refresh;
    cache.column0 = col0;
    HostMicroBatch h;
    h.batch = c.batch;
    h.seq = col1 - col0;
    std::vector<int32_t> rows;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = col0; i < col1; ++i) {
        const size_t k = static_cast<size_t>(b * c.seq + i);
        h.input_ids.push_back(c.tokens[k]);
        h.positions.push_back(c.positions[k]);
        h.document_ids.push_back(c.docs[k]);
        if (c.docs[k] == 1) rows.push_back(static_cast<int32_t>(b * (col1 - col0) + i - col0));
      }
    h.labels = h.input_ids;
    h.loss_weights.assign(h.input_ids.size(), 0.0f);
    Tensor idx = Tensor::from_ints(rows, {static_cast<int64_t>(rows.size())});
    if (s.is_cuda()) idx = idx.to(s.device(), s);
    ModelRuntime r = rt;
    r.kv_cache = &cache;
    return test::to_doubles(model.logits_at(MicroBatch::upload(h, s), idx, r), s);
  }
  ParameterStore store;
  GptModel model;
  ModelRuntime rt;
};

// Two layers of bf16 activations (and bf16 logits) against f32: twice an op's bf16 bound.
constexpr double kTol = 2 * test::kBf16ParityRelL2;

}  // namespace

TEST(KvCacheParity, RefreshAndCachedWindowsMatchTheCpu) {
  MDLM_REQUIRE_GPU();
  for (const int64_t head_dim : {32, 16}) {
    const TransformerConfig cfg = config(head_dim);
    Side cpu(cfg, Stream::cpu(), DType::F32);
    Side gpu(cfg, gpu_stream(), DType::BF16);
    // The CPU weights rounded to bf16, and the GPU model given exactly those.
    for (size_t h = 0; h < cpu.store.descs().size(); ++h) {
      Tensor p = cpu.store.param(static_cast<int>(h));
      std::vector<float> v = p.to_floats(Stream::cpu());
      for (float& x : v) x = round_to_bf16(x);
      Tensor rounded = Tensor::from_floats(v, p.shape());
      copy_tensor(rounded, p, Stream::cpu());
      Tensor g = gpu.store.param(static_cast<int>(h));
      copy_tensor(rounded, g, gpu.rt.stream);
    }
    gpu.rt.stream.synchronize();
    const std::string tag = "kv cache, head dim " + std::to_string(head_dim);
    Canvas c = canvas();
    KvCache kc, kg;
    expect_close(tag + ", refresh", gpu.logits(c, 0, 24, kg, true), cpu.logits(c, 0, 24, kc, true), kTol);
    for (int b = 0; b < 2; ++b) {  // two tokens decoded in the window [12, 18) of each row
      c.tokens[static_cast<size_t>(b * 24 + 13)] = 7;
      c.tokens[static_cast<size_t>(b * 24 + 16)] = 40;
    }
    expect_close(tag + ", dual window [12, 18)", gpu.logits(c, 12, 18, kg, false), cpu.logits(c, 12, 18, kc, false),
                 kTol);
    expect_close(tag + ", prefix window [12, 24)", gpu.logits(c, 12, 24, kg, false),
                 cpu.logits(c, 12, 24, kc, false), kTol);
  }
}
