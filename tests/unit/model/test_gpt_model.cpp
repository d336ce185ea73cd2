// Whole-model gradient checks: the explicit backward of the full GPT model (embedding, layers,
// final norm, output layer, fused cross-entropy) against central finite differences, with the
// whole model in f64 on the CPU.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/model/gpt_model.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

MicroBatch to_f64_batch(const HostMicroBatch& h) {
  MicroBatch mb;
  mb.batch = h.batch;
  mb.seq = h.seq;
  mb.first_sample = h.first_sample;
  mb.loss_tokens = h.loss_tokens;
  const int64_t t = h.batch * h.seq;
  mb.input_ids = Tensor::from_ints(h.input_ids, {t});
  mb.labels = Tensor::from_ints(h.labels, {t});
  mb.positions = Tensor::from_ints(h.positions, {t});
  mb.loss_weights = Tensor::from_floats(h.loss_weights, {t}, DType::F64);
  return mb;
}

double loss_of(const GptModel& model, const MicroBatch& mb, const ModelRuntime& rt) {
  Tensor sum = Tensor::zeros({1}, DType::F64, rt.stream);
  ModelRecord rec;
  model.forward(mb, rec, sum, /*grad_scale=*/0.0f, rt);
  return sum.data<double>()[0];
}

void check_model_gradients(TransformerConfig cfg, DiffusionConfig dcfg) {
  ParameterStore store;
  GptModel model(cfg, store);
  Stream cpu = Stream::cpu();
  store.materialize(DType::F64, 42, cpu);
  ModelRuntime rt;
  rt.stream = cpu;
  rt.dtype = DType::F64;
  rt.seed = 7;

  std::vector<std::vector<int32_t>> samples;
  for (int b = 0; b < 2; ++b) {
    std::vector<int32_t> s;
    for (int i = 0; i <= cfg.seq_length; ++i)
      s.push_back(static_cast<int32_t>(1 + (b * 37 + i * 11) % (cfg.vocab_size - 2)));
    samples.push_back(s);
  }
  BatchContext ctx;
  ctx.bidirectional = cfg.attention_mask == AttentionMaskType::NoMask;
  MicroBatch mb = to_f64_batch(build_micro_batch(samples, 3, dcfg, ctx));

  Tensor sum = Tensor::zeros({1}, DType::F64, cpu);
  ModelRecord rec;
  model.forward(mb, rec, sum, /*grad_scale=*/1.0f, rt);
  model.backward(mb, rec, rt);
  EXPECT_NEAR(sum.data<double>()[0], loss_of(model, mb, rt), 1e-12)
      << "training and eval forward disagree";

  std::vector<double> analytic, numeric;
  for (size_t i = 0; i < store.descs().size(); ++i) {
    const auto h = static_cast<ParameterStore::Handle>(i);
    Tensor p = store.param(h);
    Tensor g = store.grad(h);
    const double* gp = g.data<double>();
    // Check the element with the largest gradient and a few spread-out ones.
    std::vector<int64_t> picks{static_cast<int64_t>(
        std::max_element(gp, gp + g.numel(), [](double a, double b) { return std::fabs(a) < std::fabs(b); }) - gp)};
    for (int64_t k = 1; k <= 3; ++k) picks.push_back((k * 7919) % p.numel());
    for (int64_t e : picks) {
      double* w = p.data<double>() + e;
      const double orig = *w, hstep = 1e-6;
      *w = orig + hstep;
      const double up = loss_of(model, mb, rt);
      *w = orig - hstep;
      const double down = loss_of(model, mb, rt);
      *w = orig;
      analytic.push_back(gp[e]);
      numeric.push_back((up - down) / (2 * hstep));
      EXPECT_NEAR(gp[e], numeric.back(), 1e-6 * std::max(1.0, std::fabs(numeric.back())))
          << store.descs()[i].name << "[" << e << "]";
    }
  }
  EXPECT_LT(test::rel_l2(analytic, numeric), test::kFiniteDiffRelTolF64);
}

TransformerConfig tiny() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 4;
  c.ffn_hidden_size = 24;
  c.seq_length = 6;
  c.max_position_embeddings = 6;
  c.vocab_size = 30;
  c.padded_vocab_size = 32;
  c.init_method_std = 0.2f;  // large enough that every path carries a visible gradient
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  return c;
}

}  // namespace

TEST(GptModel, DiffusionModelGradientsMatchFiniteDifferences) {
  TransformerConfig c = tiny();
  c.position_embedding_type = PositionEmbeddingType::Rope;
  c.rotary_percent = 0.5f;
  c.normalization = NormType::RMSNorm;
  c.activation = MlpActivation::SwiGLU;
  c.qk_layernorm = true;
  c.add_bias_linear = false;
  c.add_qkv_bias = false;
  c.untie_embeddings_and_output_weights = true;
  c.attention_mask = AttentionMaskType::NoMask;
  c.hidden_dropout = 0.25f;  // masks are keyed by coordinates, so finite differences still apply
  c.attention_dropout = 0.2f;
  DiffusionConfig d;
  d.mask_token = 29;
  check_model_gradients(c, d);
}

TEST(GptModel, AutoregressiveModelWithBiasesTiedEmbeddingsAndLayerNormMatchesFiniteDifferences) {
  TransformerConfig c = tiny();
  c.num_query_groups = 4;
  c.position_embedding_type = PositionEmbeddingType::LearnedAbsolute;
  c.normalization = NormType::LayerNorm;
  c.activation = MlpActivation::Gelu;
  c.add_bias_linear = true;
  c.add_qkv_bias = true;
  c.untie_embeddings_and_output_weights = false;
  c.attention_mask = AttentionMaskType::Causal;
  DiffusionConfig d;
  d.mode = RunningMode::Vanilla;
  check_model_gradients(c, d);
}

TEST(GptModel, InitialLossOfTheDiffusionModelIsNearLnV) {
  // With near-uniform logits at initialisation the loss is ln|V|.
  TransformerConfig c = tiny();
  c.init_method_std = 0.002f;
  c.position_embedding_type = PositionEmbeddingType::Rope;
  c.normalization = NormType::RMSNorm;
  c.activation = MlpActivation::SwiGLU;
  c.untie_embeddings_and_output_weights = true;
  c.add_bias_linear = c.add_qkv_bias = false;
  ParameterStore store;
  GptModel model(c, store);
  store.materialize(DType::F64, 1, Stream::cpu());
  ModelRuntime rt;
  rt.dtype = DType::F64;
  DiffusionConfig d;
  d.mask_token = 29;
  std::vector<std::vector<int32_t>> samples(4, std::vector<int32_t>(7, 5));
  HostMicroBatch h = build_micro_batch(samples, 0, d, BatchContext{});
  MicroBatch mb = to_f64_batch(h);
  const double loss = loss_of(model, mb, rt);
  double wsum = 0;
  for (float w : h.loss_weights) wsum += w;
  // sum_t w_t CE_t / sum_t w_t = ln(32) up to the tiny logit spread.
  EXPECT_NEAR(loss / wsum, std::log(32.0), 0.01);
}
