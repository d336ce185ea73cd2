// Block decoding (diffusion/block_sampler.h) on CUDA: a tiny block-diffusion model (block 4, both
// clean-half variants) with the same bf16-representable weights as a bf16 CUDA model and an f32
// CPU model. The exact cache's window logits (CUDA's key-block attention over the cache, the
// causal windows' chunked query maps, copy_row_block) against the CPU within bf16 tolerance; then
// whole decodings: the CUDA tokens equal the CPU tokens, and on the GPU the cached decoding
// equals the uncached one (training's doubled block-diffusion attention, recomputed each step),
// ragged batch, static schedule and threshold, and the causal variant's autoregressive decoding.
// The model's logits are spread wide (init std 0.5) so that bf16 rounding does not reorder them.
#include <gtest/gtest.h>
#include <string>
#include "megadlm/diffusion/block_sampler.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/kv_cache.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

constexpr int32_t kMask = 63;

TransformerConfig config(bool causal_clean) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 32;
  c.ffn_hidden_size = 256;
  c.seq_length = 32;
  c.max_position_embeddings = 64;
  c.position_embedding_type = PositionEmbeddingType::Rope;
  c.normalization = NormType::RMSNorm;
  c.qk_layernorm = true;
  c.activation = MlpActivation::SwiGLU;
  c.vocab_size = c.padded_vocab_size = 64;
  c.init_method_std = 0.5f;
  c.attention_dropout = c.hidden_dropout = 0;
  c.attention_mask = AttentionMaskType::BlockCausal;
  c.block_diffusion_causal_clean = causal_clean;
  return c;
}

// The LogitsModel InferenceModel is, around a bare GptModel on one device.
class Side final : public LogitsModel {
 public:
  Side(const TransformerConfig& cfg, Stream s, DType dt) : model_(cfg, store) {
    rt_.stream = s;
    rt_.dtype = dt;
    rt_.training = false;
    store.materialize(dt, 5, s);
  }
  int64_t vocab_size() const override { return 64; }
  const Stream& stream() const override { return rt_.stream; }
  Tensor logits(const CanvasBatch& c, const std::vector<int32_t>& rows) override {
    HostMicroBatch h = host(c);
    h.block_ranges = c.block_ranges;
    return model_.logits_at(MicroBatch::upload(h, rt_.stream), ints(rows), rt_, 64);
  }
  bool supports_exact_cache() const override { return true; }
  void exact_cache_reset(int64_t batch, int64_t seq) override {
    cache_ = KvCache{};
    cache_.batch = batch;
    cache_.seq = seq;
    cache_.exact = true;
  }
  Tensor exact_cache_logits(const CanvasBatch& w, int64_t col0, const std::vector<int32_t>& key_docs, bool causal,
                            const std::vector<int32_t>& rows) override {
    cache_.column0 = col0;
    cache_.causal = causal;
    cache_.key_document_ids = ints(key_docs);
    ModelRuntime rt = rt_;
    rt.kv_cache = &cache_;
    return model_.logits_at(MicroBatch::upload(host(w), rt_.stream), ints(rows), rt, 64);
  }
  ParameterStore store;

 private:
  static HostMicroBatch host(const CanvasBatch& c) {
    HostMicroBatch h;
    h.batch = c.batch;
    h.seq = c.seq;
    h.input_ids = c.tokens;
    h.positions = c.positions;
    h.document_ids = c.document_ids;
    h.labels = h.input_ids;
    h.loss_weights.assign(h.input_ids.size(), 0.0f);
    return h;
  }
  Tensor ints(const std::vector<int32_t>& v) const {
    Tensor t = Tensor::from_ints(v, {static_cast<int64_t>(v.size())});
    return rt_.stream.is_cuda() ? t.to(rt_.stream.device(), rt_.stream) : t;
  }
  GptModel model_;
  ModelRuntime rt_;
  KvCache cache_;
};

// The CPU weights rounded to bf16, and the GPU model given exactly those.
void same_weights(Side& cpu, Side& gpu) {
  for (size_t h = 0; h < cpu.store.descs().size(); ++h) {
    Tensor p = cpu.store.param(static_cast<int>(h));
    std::vector<float> v = p.to_floats(Stream::cpu());
    for (float& x : v) x = round_to_bf16(x);
    Tensor rounded = Tensor::from_floats(v, p.shape());
    copy_tensor(rounded, p, Stream::cpu());
    Tensor g = gpu.store.param(static_cast<int>(h));
    copy_tensor(rounded, g, gpu.stream());
  }
  gpu.stream().synchronize();
}

std::vector<GenerationRequest> prompts() {  // lengths 7, 2, 4, 1: every remainder mod 4
  return {{{5, 17, 33, 2, 40, 14, 61}, 0}, {{10, 3}, 1}, {{44, 45, 46, 47}, 2}, {{9}, 3}};
}

SamplerConfig sampler(double threshold) {
  SamplerConfig c;
  c.gen_length = 12;
  c.steps = 12;
  c.block_length = 4;
  c.mask_token = kMask;
  c.confidence_threshold = threshold;
  return c;
}

constexpr double kTol = 2 * test::kBf16ParityRelL2;

}  // namespace

TEST(BlockDecodingParity, ExactCacheWindowsMatchTheCpu) {
  MDLM_REQUIRE_GPU();
  for (const bool causal : {false, true}) {
    Side cpu(config(causal), Stream::cpu(), DType::F32);
    Side gpu(config(causal), gpu_stream(), DType::BF16);
    same_weights(cpu, gpu);
    // Two rows of 12 columns: row 0 padded by 4 (document 0), prompt, then masks in [8, 12).
    CanvasBatch w;
    std::vector<int32_t> docs;
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 12; ++c) {
        const bool pad = b == 0 && c < 4;
        w.tokens.push_back(pad ? 0 : c >= 9 ? kMask : 1 + (b * 13 + c * 7) % 60);
        w.positions.push_back(pad ? c : b == 0 ? c - 4 : c);
        w.document_ids.push_back(pad ? 0 : 1);
      }
    auto slice = [&](int64_t c0, int64_t c1) {
      CanvasBatch s;
      s.batch = 2;
      s.seq = c1 - c0;
      for (int b = 0; b < 2; ++b)
        for (int64_t c = c0; c < c1; ++c) {
          const size_t k = static_cast<size_t>(b * 12 + c);
          s.tokens.push_back(w.tokens[k]);
          s.positions.push_back(w.positions[k]);
          s.document_ids.push_back(w.document_ids[k]);
        }
      return s;
    };
    auto key_docs = [&](int64_t written) {
      std::vector<int32_t> k;
      for (int b = 0; b < 2; ++b)
        for (int c = 0; c < 12; ++c) k.push_back(c < written ? w.document_ids[static_cast<size_t>(b * 12 + c)] : 3);
      return k;
    };
    cpu.exact_cache_reset(2, 12);
    gpu.exact_cache_reset(2, 12);
    const std::string tag = causal ? "causal clean" : "block-causal clean";
    // Prefill [0, 8) (causal: one forward from column 0; else two blocks), then the block [8, 12).
    if (causal) {
      expect_close(tag + ", prefill", test::to_doubles(gpu.exact_cache_logits(slice(0, 8), 0, key_docs(8), true, {7, 15}), gpu.stream()),
                   test::to_doubles(cpu.exact_cache_logits(slice(0, 8), 0, key_docs(8), true, {7, 15}), cpu.stream()), kTol);
    } else {
      for (int64_t c0 : {0, 4})
        expect_close(tag + ", prefill block " + std::to_string(c0 / 4),
                     test::to_doubles(gpu.exact_cache_logits(slice(c0, c0 + 4), c0, key_docs(c0 + 4), false, {3, 7}), gpu.stream()),
                     test::to_doubles(cpu.exact_cache_logits(slice(c0, c0 + 4), c0, key_docs(c0 + 4), false, {3, 7}), cpu.stream()), kTol);
    }
    const std::vector<int32_t> rows = {0, 1, 2, 3, 4, 5, 6, 7};
    expect_close(tag + ", block [8, 12)",
                 test::to_doubles(gpu.exact_cache_logits(slice(8, 12), 8, key_docs(12), false, rows), gpu.stream()),
                 test::to_doubles(cpu.exact_cache_logits(slice(8, 12), 8, key_docs(12), false, rows), cpu.stream()), kTol);
    if (causal)  // the finished block's causal update: the chunked query map
      expect_close(tag + ", causal update [8, 12)",
                   test::to_doubles(gpu.exact_cache_logits(slice(8, 12), 8, key_docs(12), true, rows), gpu.stream()),
                   test::to_doubles(cpu.exact_cache_logits(slice(8, 12), 8, key_docs(12), true, rows), cpu.stream()), kTol);
  }
}

TEST(BlockDecodingParity, CudaTokensEqualCpuAndCachedEqualsUncached) {
  MDLM_REQUIRE_GPU();
  for (const bool causal : {false, true})
    for (const bool ar : {false, true}) {
      if (ar && !causal) continue;
      for (const double threshold : {0.0, 0.3}) {
        if (ar && threshold > 0) continue;
        Side cpu(config(causal), Stream::cpu(), DType::F32);
        Side gpu(config(causal), gpu_stream(), DType::BF16);
        same_weights(cpu, gpu);
        BlockDecoding exact, none;
        exact.causal_clean = none.causal_clean = causal;
        exact.autoregressive = none.autoregressive = ar;
        none.exact_cache = false;
        const SamplerConfig sc = sampler(threshold);
        const auto want = generate_blocks(cpu, prompts(), sc, exact);
        const auto got = generate_blocks(gpu, prompts(), sc, exact);
        const auto uncached = generate_blocks(gpu, prompts(), sc, none);
        const std::string tag = std::string(causal ? "causal" : "block-causal") + (ar ? ", ar" : ", block") +
                                ", threshold " + std::to_string(threshold);
        for (size_t r = 0; r < want.size(); ++r) {
          EXPECT_EQ(got[r].tokens, want[r].tokens) << tag << ", row " << r << ": CUDA vs CPU";
          EXPECT_EQ(uncached[r].tokens, got[r].tokens) << tag << ", row " << r << ": CUDA uncached vs cached";
          EXPECT_EQ(got[r].steps, want[r].steps) << tag << ", row " << r;
        }
      }
    }
}
