// The tiny model every CPU training test runs: one builder instead of a copy per test file.
// tiny_run() gives the shared architecture (Qwen-style: RoPE, RMSNorm, SwiGLU, QK-norm, no
// biases, untied embeddings, bidirectional attention, the diffusion objective) and a short
// cosine schedule with weight decay and clipping on the CPU; each test then states only what it
// is about (sizes, dropout, varilen, batch sizes, the parallel layout).
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/training/training_config.h"

namespace megadlm::test {

/// Sizes of the tiny model. Two presets: the default (hidden 64) and small() (hidden 32, seq 16,
/// vocabulary 64) for layouts with many layers or ranks.
struct TinyShape {
  int layers = 2;
  int64_t hidden = 64;
  int heads = 4;
  int query_groups = 2;
  int64_t kv_channels = 16;
  int64_t ffn = 128;
  int64_t seq = 32;
  int64_t vocab = 128;  ///< also the padded vocabulary; the mask token is vocab - 1

  static TinyShape small(int layers = 2) {
    return {.layers = layers, .hidden = 32, .heads = 4, .query_groups = 2, .kv_channels = 8,
            .ffn = 64, .seq = 16, .vocab = 64};
  }
};

/// A single-rank CPU run of the tiny model for `iters` iterations: lr 3e-3 (2 warm-up iterations,
/// cosine decay over `iters`), weight decay 0.1, clipping at 0.5, micro-batch 2, global batch 8,
/// no dropout, no varilen, no logging lines. Parallel fields are the single-rank defaults.
inline RunConfig tiny_run(const TinyShape& shape = {}, int64_t iters = 20) {
  RunConfig r;
  TransformerConfig& m = r.model;
  m.num_layers = shape.layers;
  m.hidden_size = shape.hidden;
  m.num_attention_heads = shape.heads;
  m.num_query_groups = shape.query_groups;
  m.kv_channels = shape.kv_channels;
  m.ffn_hidden_size = shape.ffn;
  m.seq_length = shape.seq;
  m.max_position_embeddings = shape.seq;
  m.position_embedding_type = PositionEmbeddingType::Rope;
  m.normalization = NormType::RMSNorm;
  m.activation = MlpActivation::SwiGLU;
  m.qk_layernorm = true;
  m.add_bias_linear = m.add_qkv_bias = false;
  m.untie_embeddings_and_output_weights = true;
  m.vocab_size = m.padded_vocab_size = shape.vocab;
  m.hidden_dropout = m.attention_dropout = 0.0f;
  m.attention_mask = AttentionMaskType::NoMask;
  r.diffusion.mask_token = static_cast<int>(shape.vocab - 1);
  r.diffusion.varilen_prob = 0.0f;
  r.optimizer.lr = 3e-3f;
  r.optimizer.lr_warmup_iters = 2;
  r.optimizer.lr_decay_iters = iters;
  r.optimizer.decay_style = LrDecayStyle::Cosine;
  r.optimizer.weight_decay = 0.1f;
  r.optimizer.clip_grad = 0.5f;
  r.training.micro_batch_size = 2;
  r.training.global_batch_size = 8;
  r.training.train_iters = iters;
  r.training.log_interval = 1000;
  r.training.device = DeviceKind::Cpu;
  return r;
}

/// Makes every layer (or the layers `pattern` marks) a mixture of `experts` experts, top-`topk`,
/// of width ffn / 2 (fine-grained), with aux and z losses: the tiny MoE of the EP suites.
inline void make_moe(RunConfig& r, int experts = 8, int topk = 2, std::vector<bool> pattern = {}) {
  MoeConfig& moe = r.model.moe;
  moe.num_experts = experts;
  moe.topk = topk;
  moe.ffn_hidden_size = r.model.ffn_hidden_size / 2;
  moe.aux_loss_coeff = 1e-2f;
  moe.z_loss_coeff = 1e-3f;
  moe.moe_layers = pattern.empty() ? std::vector<bool>(static_cast<size_t>(r.model.num_layers), true) : pattern;
}

/// The GPT-2-style variant of the architecture: learned positions, LayerNorm, GELU, biases,
/// causal attention, the autoregressive (vanilla) objective.
inline void make_gpt_style(RunConfig& r) {
  TransformerConfig& m = r.model;
  m.position_embedding_type = PositionEmbeddingType::LearnedAbsolute;
  m.normalization = NormType::LayerNorm;
  m.activation = MlpActivation::Gelu;
  m.qk_layernorm = false;
  m.add_bias_linear = m.add_qkv_bias = true;
  m.attention_mask = AttentionMaskType::Causal;
  r.diffusion.mode = RunningMode::Vanilla;
}

}  // namespace megadlm::test
