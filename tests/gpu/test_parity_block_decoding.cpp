// Block decoding (diffusion/block_sampler.h) on CUDA: a tiny block-diffusion model (block 4, both
// clean-half variants) with the same bf16-representable weights as a bf16 CUDA model and an f32
// CPU model. The exact cache's window logits (CUDA's key-block attention over the cache, the
// causal windows' chunked query maps, copy_row_block) against the CPU within bf16 tolerance; then
// whole decodings (ragged batch, static schedule and threshold, both variants, the causal one's
// autoregressive decoding) checked at every model call: the CUDA logits and proposals equal the
// CPU's given the same call, and the GPU's uncached forward of the same state (training's doubled
// block-diffusion attention); whole-trajectory agreement is reported (a bf16 near-tie may send
// CUDA and CPU down different valid paths; a tiny random model has logit gaps of 0.002).
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/diffusion/block_sampler.h"
#include "megadlm/model/exact_cache_graphs.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/kv_cache.h"
#include "megadlm/ops/gemm.h"
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
    if (compact && c.block_ranges.empty()) {
      // As InferenceModel::logits runs the full-sequence sampler: live tokens first, the
      // padding mask of their lengths (compact_rows).
      if (const std::optional<CompactCanvas> cc = compact_rows(c, rows)) {
        MicroBatch mb = MicroBatch::upload(host(cc->canvas), rt_.stream);
        mb.row_lengths = ints(cc->lengths);
        return model_.logits_at(mb, ints(cc->rows), rt_, 64);
      }
    }
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
    graphs_.reset();
  }
  Tensor exact_cache_logits(const CanvasBatch& w, int64_t col0, const std::vector<int32_t>& key_docs, bool causal,
                            const std::vector<int32_t>& rows) override {
    cache_.column0 = col0;
    cache_.causal = causal;
    ModelRuntime rt = rt_;
    rt.kv_cache = &cache_;
    Tensor out;
    if (use_graphs_) {  // as InferenceModel runs --cuda-graphs
      out = graphs_.logits(model_, cache_, rt, host(w), key_docs, ints(rows), 64);
    } else {
      cache_.key_document_ids = ints(key_docs);
      out = model_.logits_at(MicroBatch::upload(host(w), rt_.stream), ints(rows), rt, 64);
    }
    if (record) recorded.push_back(test::to_doubles(out, rt_.stream));
    return out;
  }
  std::string exact_cache_graphs_unsupported() const override {
    return ExactCacheGraphs::unsupported(model_, rt_.stream.device());
  }
  void set_exact_cache_graphs(bool on) override {
    if (on) {
      const std::string why = exact_cache_graphs_unsupported();
      MDLM_CHECK(why.empty(), why);
    }
    if (on != use_graphs_) graphs_.reset();
    use_graphs_ = on;
  }
  const GraphSchedule& graph_schedule() const { return graphs_.schedule(); }
  ParameterStore store;
  bool compact = false;  ///< logits(): compact the rows as InferenceModel does
  bool record = false;   ///< keep every exact_cache_logits result in `recorded`
  std::vector<std::vector<double>> recorded;

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
  ExactCacheGraphs graphs_;
  bool use_graphs_ = false;
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

// The CUDA model as the sampler sees it, checked at every call against the CPU model given the
// same call (their exact caches stay in step) and against the GPU's own uncached forward of the
// same state (training's doubled rows over the columns written so far, rebuilt from a shadow of
// the cache): logits within bf16 tolerance, and the same proposed token (argmax) wherever the
// CPU's top two logits are more than kDecisive apart (the GPU-vs-GPU check: twice the tolerance,
// two bf16 computations). Whole decodings are then compared token for
// token where no near-tie lies on the way; where one does, bf16 and f32 may take different but
// equally valid paths (reported, not failed: the rows' tokens up to that decision must agree).
constexpr double kDecisive = 1.0;  // logits spread over ~35: several bf16 roundings of the largest

class Checked final : public LogitsModel {
 public:
  Checked(Side& gpu, Side& cpu, int64_t block) : gpu_(gpu), cpu_(cpu), block_(block) {}
  int64_t vocab_size() const override { return 64; }
  const Stream& stream() const override { return gpu_.stream(); }
  Tensor logits(const CanvasBatch& c, const std::vector<int32_t>& rows) override { return gpu_.logits(c, rows); }
  bool supports_exact_cache() const override { return true; }
  void exact_cache_reset(int64_t batch, int64_t seq) override {
    gpu_.exact_cache_reset(batch, seq);
    cpu_.exact_cache_reset(batch, seq);
    batch_ = batch;
    seq_ = seq;
    tokens_.assign(static_cast<size_t>(batch * seq), 0);
    positions_ = docs_ = tokens_;
  }
  Tensor exact_cache_logits(const CanvasBatch& w, int64_t col0, const std::vector<int32_t>& key_docs, bool causal,
                            const std::vector<int32_t>& rows) override {
    for (int64_t b = 0; b < w.batch; ++b)
      for (int64_t i = 0; i < w.seq; ++i) {
        const size_t at = static_cast<size_t>(b * seq_ + col0 + i), from = static_cast<size_t>(b * w.seq + i);
        tokens_[at] = w.tokens[from];
        positions_[at] = w.positions[from];
        docs_[at] = w.document_ids[from];
      }
    Tensor g = gpu_.exact_cache_logits(w, col0, key_docs, causal, rows);
    const std::vector<double> got = test::to_doubles(g, gpu_.stream());
    const std::vector<double> want =
        test::to_doubles(cpu_.exact_cache_logits(w, col0, key_docs, causal, rows), cpu_.stream());
    check("CUDA vs CPU", got, want);
    // The same state without a cache: the doubled rows over [0, L), L = the columns written.
    const int64_t L = col0 + w.seq;
    CanvasBatch d;
    d.batch = batch_;
    d.seq = 2 * L;
    for (int64_t b = 0; b < batch_; ++b) {
      for (int copy = 0; copy < 2; ++copy)
        for (int64_t c = 0; c < L; ++c) {
          d.tokens.push_back(tokens_[static_cast<size_t>(b * seq_ + c)]);
          d.positions.push_back(positions_[static_cast<size_t>(b * seq_ + c)]);
        }
      const int32_t* doc = docs_.data() + b * seq_;
      for (int field = 0; field < 4; ++field)
        for (int64_t c = 0; c < L; ++c) {
          int64_t ds = c, de = c + 1;
          while (ds > 0 && doc[ds - 1] == doc[c]) --ds;
          while (de < L && doc[de] == doc[c]) ++de;
          const int64_t v[4] = {ds, de, std::max(ds, c / block_ * block_), std::min(de, (c / block_ + 1) * block_)};
          d.block_ranges.push_back(static_cast<int32_t>(v[field]));
        }
    }
    std::vector<int32_t> drows;  // causal calls: the clean copy (the causal clean stream); else the noisy one
    for (int32_t r : rows) {
      const int64_t b = r / w.seq, c = col0 + r % w.seq;
      drows.push_back(static_cast<int32_t>(b * 2 * L + (causal ? L + c : c)));
    }
    check("cached vs uncached (GPU)", got, test::to_doubles(gpu_.logits(d, drows), gpu_.stream()));
    return g;
  }
  int calls = 0;
  double worst_cpu = 0, worst_uncached = 0;

 private:
  void check(const std::string& what, const std::vector<double>& got, const std::vector<double>& want) {
    ++calls;
    ASSERT_EQ(got.size(), want.size()) << what;
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    const double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
    (what[0] == 'C' ? worst_cpu : worst_uncached) = std::max(what[0] == 'C' ? worst_cpu : worst_uncached, rel);
    EXPECT_LE(rel, what[0] == 'C' ? kTol : 2 * kTol) << what;
    for (size_t r = 0; r < got.size() / 64; ++r) {
      const auto row = want.begin() + static_cast<std::ptrdiff_t>(r * 64);
      std::vector<double> sorted(row, row + 64);
      std::sort(sorted.rbegin(), sorted.rend());
      if (sorted[0] - sorted[1] <= kDecisive) continue;
      const auto top = [](auto first) { return std::max_element(first, first + 64) - first; };
      EXPECT_EQ(top(got.begin() + static_cast<std::ptrdiff_t>(r * 64)), top(row)) << what << ", row " << r;
    }
  }
  Side& gpu_;
  Side& cpu_;
  int64_t block_, batch_ = 0, seq_ = 0;
  std::vector<int32_t> tokens_, positions_, docs_;
};

TEST(BlockDecodingParity, CudaDecodingCheckedAtEveryCallAgainstCpuAndUncached) {
  MDLM_REQUIRE_GPU();
  for (const bool causal : {false, true})
    for (const bool ar : {false, true}) {
      if (ar && !causal) continue;
      for (const double threshold : {0.0, 0.3}) {
        if (ar && threshold > 0) continue;
        Side cpu(config(causal), Stream::cpu(), DType::F32);
        Side gpu(config(causal), gpu_stream(), DType::BF16);
        same_weights(cpu, gpu);
        Side cpu_alone(config(causal), Stream::cpu(), DType::F32);
        same_weights(cpu_alone, gpu);  // the same rounded weights (gpu keeps cpu's)
        BlockDecoding exact, none;
        exact.causal_clean = none.causal_clean = causal;
        exact.autoregressive = none.autoregressive = ar;
        none.exact_cache = false;
        const SamplerConfig sc = sampler(threshold);
        const std::string tag = std::string(causal ? "causal" : "block-causal") + (ar ? ", ar" : ", block") +
                                ", threshold " + std::to_string(threshold);
        Checked checked(gpu, cpu, 4);
        const auto got = generate_blocks(checked, prompts(), sc, exact);
        EXPECT_GT(checked.calls, 0) << tag;
        // Whole trajectories: CPU alone, GPU uncached (reported).
        const auto want = generate_blocks(cpu_alone, prompts(), sc, exact);
        const auto uncached = generate_blocks(gpu, prompts(), sc, none);
        int same_cpu = 0, same_uncached = 0;
        for (size_t r = 0; r < want.size(); ++r) {
          same_cpu += got[r].tokens == want[r].tokens;
          same_uncached += got[r].tokens == uncached[r].tokens;
        }
        std::printf("[parity] block decoding %s: %d calls, logits rel_l2 vs CPU <= %.2e, vs uncached <= %.2e; "
                    "whole decodings: %d/%zu rows equal to the CPU's, %d/%zu to the GPU's uncached\n",
                    tag.c_str(), checked.calls / 2, checked.worst_cpu, checked.worst_uncached, same_cpu, want.size(),
                    same_uncached, want.size());
      }
    }
}

// ---- batch-invariant mode (generate_difflm --batch-invariant) ---------------------------------
//
// With ops::set_batch_invariant(true) a prompt decodes to the same tokens alone and in a ragged
// batch on CUDA, and the first decoding forward gives its rows bitwise the same logits: one
// cuBLASLt algorithm per GEMM shape for every M (src/ops/cuda/gemm.cpp), attention on kernels
// whose key order does not depend on the batch (src/ops/attention_support.h). head_dim 64, so
// that without the mode the full sequence would run cuDNN and the cache's key block the flash
// key tiles.

namespace {

struct BatchInvariant {
  BatchInvariant() { ops::set_batch_invariant(true); }
  ~BatchInvariant() { ops::set_batch_invariant(false); }
};

TransformerConfig invariant_config(bool block_diffusion) {
  TransformerConfig c = config(false);
  c.kv_channels = 64;  // the flash kernels' head size
  if (!block_diffusion) c.attention_mask = AttentionMaskType::NoMask;
  return c;
}

/// Forwards to `inner`, keeping the logits of the first call that asks for any, per batch row in
/// the order asked (the rows of one batch row are asked in increasing column order).
class FirstForward final : public LogitsModel {
 public:
  explicit FirstForward(Side& inner) : inner_(inner) {}
  int64_t vocab_size() const override { return 64; }
  const Stream& stream() const override { return inner_.stream(); }
  Tensor logits(const CanvasBatch& c, const std::vector<int32_t>& rows) override {
    return keep(inner_.logits(c, rows), rows, c.seq, c.tokens);
  }
  bool supports_exact_cache() const override { return true; }
  void exact_cache_reset(int64_t batch, int64_t seq) override { inner_.exact_cache_reset(batch, seq); }
  Tensor exact_cache_logits(const CanvasBatch& w, int64_t col0, const std::vector<int32_t>& key_docs, bool causal,
                            const std::vector<int32_t>& rows) override {
    return keep(inner_.exact_cache_logits(w, col0, key_docs, causal, rows), rows, w.seq, w.tokens);
  }
  /// per_row[b]: the logits (64 a position) of batch row b's positions in the first forward.
  std::vector<std::vector<double>> per_row;

 private:
  /// The first decoding forward: the first that asks about masked positions (the prefill and
  /// the cache updates ask about one prompt or committed position, and a prompt alone may have
  /// no prefill where the batch has one).
  Tensor keep(Tensor logits, const std::vector<int32_t>& rows, int64_t seq, const std::vector<int32_t>& tokens) {
    if (!per_row.empty()) return logits;
    if (std::none_of(rows.begin(), rows.end(), [&](int32_t r) { return tokens[static_cast<size_t>(r)] == kMask; }))
      return logits;
    const std::vector<double> v = test::to_doubles(logits, inner_.stream());
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t b = static_cast<size_t>(rows[i] / seq);
      if (per_row.size() <= b) per_row.resize(b + 1);
      per_row[b].insert(per_row[b].end(), v.begin() + static_cast<std::ptrdiff_t>(i * 64),
                        v.begin() + static_cast<std::ptrdiff_t>((i + 1) * 64));
    }
    return logits;
  }
  Side& inner_;
};

std::vector<GenerationRequest> three_ragged() { return {{{5, 17, 33, 2, 40, 14, 61}, 0}, {{10, 3}, 1}, {{44, 45, 46, 47, 8}, 2}}; }

/// Decodes the three prompts alone and as one batch, with `decode` (nullptr: the full-sequence
/// sampler on a full-sequence model, rows compacted as InferenceModel does), and checks tokens
/// and first-forward logits bit for bit.
void expect_batch_invariant(const std::string& tag, bool block_diffusion, const BlockDecoding* decode,
                            const Stream& stream, DType dtype) {
  Side gpu(invariant_config(block_diffusion), stream, dtype);
  gpu.compact = true;
  const SamplerConfig sc = sampler(0.0);
  auto run = [&](const std::vector<GenerationRequest>& requests, FirstForward& model) {
    return decode ? generate_blocks(model, requests, sc, *decode) : generate(model, requests, sc);
  };
  FirstForward batched_model(gpu);
  const std::vector<GenerationResult> batched = run(three_ragged(), batched_model);
  ASSERT_EQ(batched.size(), 3u) << tag;
  ASSERT_EQ(batched_model.per_row.size(), 3u) << tag;
  for (size_t b = 0; b < 3; ++b) {
    FirstForward alone_model(gpu);
    const std::vector<GenerationResult> alone = run({three_ragged()[b]}, alone_model);
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(alone[0].tokens, batched[b].tokens) << tag << ": prompt " << b << " alone and in the batch";
    ASSERT_EQ(alone_model.per_row.size(), 1u) << tag;
    expect_identical(tag + ", prompt " + std::to_string(b) + " first forward", alone_model.per_row[0],
                     batched_model.per_row[b]);
  }
}

}  // namespace

TEST(BlockDecodingParity, BatchInvariantModeGivesEachPromptItsTokensAloneAndInABatch) {
  MDLM_REQUIRE_GPU();
  BatchInvariant on;
  BlockDecoding exact, none;
  none.exact_cache = false;
  expect_batch_invariant("full-sequence sampler", false, nullptr, gpu_stream(), DType::BF16);
  expect_batch_invariant("block decoding, exact cache", true, &exact, gpu_stream(), DType::BF16);
  expect_batch_invariant("block decoding, no cache", true, &none, gpu_stream(), DType::BF16);
}


// --cuda-graphs (model/exact_cache_graphs.h): the same decodings with and without CUDA graphs of
// the cached steps, on one GPU model, give the same tokens and every model call the same logits
// bit for bit (the graph runs the eager trunk's kernels on the same shapes; the head is eager).
// Several blocks are decoded, so the graph is rebuilt for each new cache column.
TEST(BlockDecodingParity, CudaGraphsGiveTheEagerTokensAndLogitsBitForBit) {
  MDLM_REQUIRE_GPU();
  for (const bool causal : {false, true})
    for (const double threshold : {0.0, 0.3})
      for (const size_t batch : {size_t{1}, size_t{4}}) {
        Side gpu(config(causal), gpu_stream(), DType::BF16);
        std::vector<GenerationRequest> req = prompts();  // lengths 7, 2, 4, 1
        req.resize(batch);
        const SamplerConfig sc = sampler(threshold);
        BlockDecoding dec;
        dec.causal_clean = causal;
        gpu.record = true;
        const std::vector<GenerationResult> eager = generate_blocks(gpu, req, sc, dec);
        const std::vector<std::vector<double>> eager_logits = gpu.recorded;
        gpu.recorded.clear();
        dec.cuda_graphs = true;
        const std::vector<GenerationResult> graphed = generate_blocks(gpu, req, sc, dec);
        const std::string tag = std::string(causal ? "causal clean" : "block-causal clean") + ", threshold " +
                                std::to_string(threshold) + ", batch " + std::to_string(batch);
        ASSERT_EQ(graphed.size(), eager.size()) << tag;
        size_t same = 0;
        for (size_t r = 0; r < eager.size(); ++r) {
          EXPECT_EQ(graphed[r].tokens, eager[r].tokens) << tag << ", prompt " << r;
          EXPECT_EQ(graphed[r].steps, eager[r].steps) << tag << ", prompt " << r;
          EXPECT_EQ(graphed[r].forwards, eager[r].forwards) << tag << ", prompt " << r;
          same += graphed[r].tokens == eager[r].tokens;
        }
        ASSERT_EQ(gpu.recorded.size(), eager_logits.size()) << tag << ": model calls";
        size_t calls_equal = 0;
        for (size_t k = 0; k < eager_logits.size(); ++k) {
          EXPECT_EQ(gpu.recorded[k], eager_logits[k]) << tag << ": call " << k << " logits differ";
          calls_equal += gpu.recorded[k] == eager_logits[k];
        }
        const GraphSchedule& g = gpu.graph_schedule();
        std::printf("%s: %zu/%zu prompts same tokens, %zu/%zu calls bitwise equal logits; %lld eager, %lld captures, "
                    "%lld replays\n",
                    tag.c_str(), same, eager.size(), calls_equal, eager_logits.size(), static_cast<long long>(g.eager()),
                    static_cast<long long>(g.captures()), static_cast<long long>(g.replays()));
        // Canvas of 20 columns (prompt 7 ends at 19; blocks of 4): prefill [0, 4) once, then
        // blocks at columns 4, 8, 12, 16, each captured once and replayed by its later steps.
        EXPECT_GE(g.captures(), 4) << tag << ": one capture per decoded block";
        if (!causal || threshold == 0) {  // (a threshold block may take one step)
          EXPECT_GT(g.replays(), 0) << tag;
        }
        if (!causal) {
          // Block-causal: the prefill is the only eager call, and each block's cache update
          // replays the block's graph (the same columns and shapes).
          EXPECT_EQ(g.eager(), 1) << tag;
          EXPECT_EQ(g.captures(), 4) << tag;
          EXPECT_EQ(g.eager() + g.captures() + g.replays(), static_cast<int64_t>(eager_logits.size())) << tag;
        }
      }
}

// One step's logits with a replay: the graph captured with one block's tokens, replayed with
// other tokens and other rows asked for, equals an eager model given those directly (the inputs
// are copied into the captured buffers, the head follows the rows).
TEST(BlockDecodingParity, CudaGraphsReplayWithNewTokensEqualsEagerBitForBit) {
  MDLM_REQUIRE_GPU();
  Side graphed(config(false), gpu_stream(), DType::BF16);
  Side eager(config(false), graphed.stream(), DType::BF16);
  for (size_t h = 0; h < graphed.store.descs().size(); ++h) {
    Tensor dst = eager.store.param(static_cast<int>(h));
    copy_tensor(graphed.store.param(static_cast<int>(h)), dst, graphed.stream());
  }
  graphed.set_exact_cache_graphs(true);
  // Batch 2, 12 columns: [0, 4) prefilled, the block [4, 8) stepped three times.
  auto window = [](int64_t c0, int salt) {
    CanvasBatch w;
    w.batch = 2;
    w.seq = 4;
    for (int b = 0; b < 2; ++b)
      for (int64_t c = c0; c < c0 + 4; ++c) {
        w.tokens.push_back(salt == 0 && c >= 4 ? kMask : 1 + static_cast<int32_t>((b * 13 + c * 7 + salt * 5) % 60));
        w.positions.push_back(static_cast<int32_t>(c));
        w.document_ids.push_back(1);
      }
    return w;
  };
  std::vector<int32_t> key_docs;
  for (int b = 0; b < 2; ++b)
    for (int c = 0; c < 12; ++c) key_docs.push_back(c < 8 ? 1 : 3);
  for (Side* s : {&graphed, &eager}) {
    s->exact_cache_reset(2, 12);
    s->exact_cache_logits(window(0, 0), 0, key_docs, false, {3});
  }
  const std::vector<std::vector<int32_t>> rows = {{0, 1, 2, 3, 4, 5, 6, 7}, {1, 6}, {7}, {0, 2, 5}};
  for (size_t step = 0; step < rows.size(); ++step) {
    const int salt = static_cast<int>(step % 3);  // step 3 repeats step 0's tokens
    const std::vector<double> got =
        test::to_doubles(graphed.exact_cache_logits(window(4, salt), 4, key_docs, false, rows[step]), graphed.stream());
    const std::vector<double> want =
        test::to_doubles(eager.exact_cache_logits(window(4, salt), 4, key_docs, false, rows[step]), eager.stream());
    ASSERT_EQ(got.size(), want.size());
    size_t diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
    std::printf("replay step %zu (%zu rows): %zu of %zu logits differ from eager\n", step, rows[step].size(), diff,
                got.size());
    EXPECT_EQ(diff, 0u) << "step " << step;
  }
  const GraphSchedule& g = graphed.graph_schedule();
  EXPECT_EQ(g.eager(), 1);     // the prefill (the shape's first run)
  EXPECT_EQ(g.captures(), 1);  // the block's first step
  EXPECT_EQ(g.replays(), 3);
}

TEST(BlockDecodingParity, CudaGraphsAreRefusedOnTheCpuNamingTheFlag) {
  Side cpu(config(false), Stream::cpu(), DType::F32);
  BlockDecoding dec;
  dec.cuda_graphs = true;
  try {
    generate_blocks(cpu, prompts(), sampler(0.0), dec);
    FAIL() << "--cuda-graphs on the CPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`--cuda-graphs`"), std::string::npos) << e.what();
  }
}
