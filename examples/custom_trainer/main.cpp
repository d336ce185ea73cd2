// A custom trainer on top of libmegadlm: build the configs in code instead of from flags,
// bring your own data source, and drive the Trainer step by step.
#include <cstdio>
#include <iostream>
#include <memory>
#include "megadlm/megadlm.h"

using namespace megadlm;

// Any SampleSource works: here every sample is a repeating ramp, offset by its index.
class RampData final : public SampleSource {
 public:
  RampData(int64_t seq, int32_t vocab) : seq_(seq), vocab_(vocab) {}
  std::vector<int32_t> sample(int64_t index) const override {
    std::vector<int32_t> s(static_cast<size_t>(seq_ + 1));
    for (int64_t i = 0; i <= seq_; ++i) s[static_cast<size_t>(i)] = 1 + static_cast<int32_t>((index + i) % (vocab_ - 2));
    return s;
  }
  int32_t eod_token() const override { return -1; }

 private:
  int64_t seq_;
  int32_t vocab_;
};

int main() {
  RunConfig cfg;
  TransformerConfig& m = cfg.model;
  m.num_layers = 2;
  m.hidden_size = 32;
  m.num_attention_heads = 2;
  m.num_query_groups = 2;
  m.kv_channels = 16;
  m.ffn_hidden_size = 64;
  m.seq_length = 32;
  m.max_position_embeddings = 32;
  m.position_embedding_type = PositionEmbeddingType::Rope;
  m.normalization = NormType::RMSNorm;
  m.activation = MlpActivation::SwiGLU;
  m.add_bias_linear = m.add_qkv_bias = false;
  m.untie_embeddings_and_output_weights = true;
  m.vocab_size = m.padded_vocab_size = 64;
  m.hidden_dropout = m.attention_dropout = 0;
  cfg.diffusion.mask_token = 63;
  cfg.optimizer.lr = 3e-3f;
  cfg.optimizer.lr_decay_iters = 30;
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 4;
  cfg.training.train_iters = 30;
  cfg.training.device = DeviceKind::Cpu;

  Trainer trainer(cfg, std::make_shared<RampData>(m.seq_length, 64), std::cout);
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    IterationMetrics it = trainer.step();
    if (i == 0) first = it.lm_loss;
    last = it.lm_loss;
  }
  std::printf("custom_trainer: loss %.4f -> %.4f after %lld iterations\n", first, last,
              static_cast<long long>(trainer.iteration()));
  return last < first ? 0 : 1;
}
