#include "megadlm/model/gpt_model.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/reduce.h"

namespace megadlm {

namespace {
// Dropout site of the embedding output; layer sites are 2*layer+1 and 2*layer+2.
constexpr uint32_t kEmbeddingDropoutSite = 0xE0000000u;
}  // namespace

GptModel::GptModel(const TransformerConfig& config, ParameterStore& store)
    : cfg_(config), store_(store) {
  const ParamInit init{InitKind::Normal, config.init_method_std};
  word_embeddings_ = store.add("embedding.word_embeddings.weight",
                               {config.padded_vocab_size, config.hidden_size}, init, true);
  if (config.position_embedding_type == PositionEmbeddingType::LearnedAbsolute) {
    position_embeddings_ = store.add("embedding.position_embeddings.weight",
                                     {config.max_position_embeddings, config.hidden_size}, init, true);
  }
  for (int h = word_embeddings_; h < static_cast<int>(store.descs().size()); ++h)
    embedding_handles_.push_back(h);
  layers_.reserve(static_cast<size_t>(config.num_layers));
  for (int i = 0; i < config.num_layers; ++i) layers_.emplace_back(cfg_, i, store);
  const int head_first = static_cast<int>(store.descs().size());
  final_norm_ = NormLayer(config.normalization, config.norm_epsilon, "decoder.final_layernorm",
                          config.hidden_size, store);
  if (config.untie_embeddings_and_output_weights) {
    output_layer_ = store.add("output_layer.weight", {config.padded_vocab_size, config.hidden_size},
                              init, true);
  } else {
    output_layer_ = word_embeddings_;  // tied: logits = h * E^T, both gradients land in E
  }
  // A tied embedding's gradient is final only after the embedding's own backward.
  for (int h = head_first; h < static_cast<int>(store.descs().size()); ++h) head_handles_.push_back(h);
}

void GptModel::forward(const MicroBatch& mb, ModelRecord& rec, Tensor& loss_sum, float grad_scale,
                       const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  if (rt.hooks) rt.hooks->params_needed(embedding_handles_);
  Tensor x = Tensor::empty({t, cfg_.hidden_size}, rt.dtype, s);
  ops::embedding_forward(store_.param(word_embeddings_), mb.input_ids, x, 0, s);
  if (position_embeddings_ >= 0) {
    Tensor pos = Tensor::empty(x.shape(), rt.dtype, s);
    ops::embedding_forward(store_.param(position_embeddings_), mb.positions, pos, 0, s);
    ops::add(x, pos, x, s);
  }
  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (p > 0) {
    Tensor zeros = Tensor::zeros(x.shape(), x.dtype(), s);
    ops::DropoutArgs d{p, rt.seed, kEmbeddingDropoutSite, mb.seq, mb.first_sample, 0, 0};
    ops::dropout_add_forward(x, zeros, x, d, s);
  }

  rec.layers.assign(layers_.size(), LayerRecord{});
  for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i].forward(x, mb, rec.layers[i], rt);

  if (rt.hooks) rt.hooks->params_needed(head_handles_);
  rec.final_out = final_norm_.forward(x, rec.final_norm, s);
  x = Tensor();
  Tensor logits = Tensor::empty({t, cfg_.padded_vocab_size}, rt.dtype, s);
  ops::gemm(rec.final_out, store_.param(output_layer_), logits, {.trans_b = true}, s);
  rec.losses = Tensor::empty({t}, rt.stat_dtype(), s);
  if (grad_scale > 0) {
    ops::cross_entropy_forward_backward(logits, mb.labels, mb.loss_weights, rec.losses, grad_scale,
                                        s);
    rec.dlogits = logits;
  } else {
    ops::cross_entropy_forward(logits, mb.labels, rec.losses, s);
    rec.logits = logits;
  }
  ops::dot(rec.losses, mb.loss_weights, loss_sum, s);
}

void GptModel::backward(const MicroBatch& mb, ModelRecord& rec, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  MDLM_CHECK(rec.dlogits.defined(), "GptModel::backward without a training forward");
  // Output layer: dW_out [V, H] += dlogits^T * h ; dh = dlogits * W_out.
  Tensor dw = store_.grad(output_layer_);
  ops::gemm(rec.dlogits, rec.final_out, dw, {.trans_a = true, .beta = 1.0f}, s);
  Tensor dh = Tensor::empty(rec.final_out.shape(), rt.dtype, s);
  ops::gemm(rec.dlogits, store_.param(output_layer_), dh, {}, s);
  rec.dlogits = rec.final_out = Tensor();

  Tensor dx = final_norm_.backward(dh, rec.final_norm, s);
  dh = Tensor();
  if (rt.hooks) rt.hooks->grads_ready(head_handles_);
  for (size_t i = layers_.size(); i-- > 0;) dx = layers_[i].backward(dx, mb, rec.layers[i], rt);

  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (p > 0) {
    ops::DropoutArgs d{p, rt.seed, kEmbeddingDropoutSite, mb.seq, mb.first_sample, 0, 0};
    ops::dropout_backward(dx, dx, d, s);
  }
  Tensor dwe = store_.grad(word_embeddings_);
  ops::embedding_backward(mb.input_ids, dx, dwe, 0, s);
  if (position_embeddings_ >= 0) {
    Tensor dpe = store_.grad(position_embeddings_);
    ops::embedding_backward(mb.positions, dx, dpe, 0, s);
  }
  if (rt.hooks) rt.hooks->grads_ready(embedding_handles_);
  rec = ModelRecord{};
}

}  // namespace megadlm
