// What the sampler and likelihood tests share around diffusion's LogitsModel: the real model
// behind it (a canvas becomes a micro-batch of zero loss weights, as training::InferenceModel
// does for the programs), the tiny model those tests build, and the hash their fake models mix.
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/diffusion/sampler.h"
#include "megadlm/model/gpt_model.h"

namespace megadlm::test {

/// One step of the fake models' hash: deterministic, and every input bit moves the result.
inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

/// The estimator tests' model: 2 layers, hidden 16, 4 heads in 2 groups, RoPE, RMSNorm, SwiGLU,
/// vocabulary 30 padded to 32, 16 positions, init std 0.3 (logits spread out), no dropout.
inline TransformerConfig tiny_logits_config() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.seq_length = 8;
  c.max_position_embeddings = 16;
  c.position_embedding_type = PositionEmbeddingType::Rope;
  c.normalization = NormType::RMSNorm;
  c.activation = MlpActivation::SwiGLU;
  c.vocab_size = 30;
  c.padded_vocab_size = 32;
  c.init_method_std = 0.3f;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  return c;
}

/// A forward-only runtime on the CPU stream (what the estimator and sampler tests run the model with).
inline ModelRuntime cpu_eval_runtime() {
  ModelRuntime rt;
  rt.stream = Stream::cpu();
  rt.training = false;
  return rt;
}

/// The micro-batch a canvas is for the model: its tokens as inputs (and labels, with no loss
/// weight), positions, document ids and block ranges.
inline HostMicroBatch canvas_micro_batch(const CanvasBatch& c) {
  HostMicroBatch h;
  h.batch = c.batch;
  h.seq = c.seq;
  h.input_ids = h.labels = c.tokens;
  h.positions = c.positions;
  h.document_ids = c.document_ids;
  h.block_ranges = c.block_ranges;
  h.loss_weights.assign(c.tokens.size(), 0.0f);
  return h;
}

/// A GptModel behind the LogitsModel interface, on the runtime's stream (CPU in unit tests).
class GptLogits : public LogitsModel {
 public:
  GptLogits(const GptModel& m, const ModelRuntime& rt, int64_t vocab) : m_(m), rt_(rt), vocab_(vocab) {}
  int64_t vocab_size() const override { return vocab_; }
  const Stream& stream() const override { return rt_.stream; }
  Tensor logits(const CanvasBatch& c, const std::vector<int32_t>& rows) override {
    return m_.logits_at(MicroBatch::upload(canvas_micro_batch(c), rt_.stream),
                        Tensor::from_ints(rows, {static_cast<int64_t>(rows.size())}), rt_);
  }

 private:
  const GptModel& m_;
  ModelRuntime rt_;
  int64_t vocab_;
};

}  // namespace megadlm::test
