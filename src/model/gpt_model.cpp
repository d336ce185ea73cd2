#include "megadlm/model/gpt_model.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"

namespace megadlm {

namespace {
// Dropout site of the embedding output; layer sites are 2*layer+1 and 2*layer+2.
constexpr uint32_t kEmbeddingDropoutSite = 0xE0000000u;
}  // namespace

GptModel::GptModel(const TransformerConfig& config, ParameterStore& store, TensorParallelLayout tp)
    : cfg_(config), store_(store), tp_(tp) {
  const ParamInit init{InitKind::Normal, config.init_method_std};
  const TpSlice vocab{TpSplit::Rows, tp.rank, tp.size};
  MDLM_CHECK(config.padded_vocab_size % tp.size == 0, "padded vocabulary ", config.padded_vocab_size,
             " does not split over ", tp.size, " tensor-parallel ranks");
  vocab_start_ = config.padded_vocab_size / tp.size * tp.rank;
  word_embeddings_ = store.add("embedding.word_embeddings.weight",
                               {config.padded_vocab_size, config.hidden_size}, init, true, false, vocab);
  if (config.position_embedding_type == PositionEmbeddingType::LearnedAbsolute) {
    // Under SP each rank adds positions to its own rows: partial gradients.
    const TpSlice pos{TpSplit::Replicated, tp.rank, tp.size, tp.sequence_parallel && tp.size > 1};
    position_embeddings_ = store.add("embedding.position_embeddings.weight",
                                     {config.max_position_embeddings, config.hidden_size}, init,
                                     true, false, pos);
  }
  for (int h = word_embeddings_; h < static_cast<int>(store.descs().size()); ++h)
    embedding_handles_.push_back(h);
  layers_.reserve(static_cast<size_t>(config.num_layers));
  for (int i = 0; i < config.num_layers; ++i) layers_.emplace_back(cfg_, i, store, tp);
  const int head_first = static_cast<int>(store.descs().size());
  final_norm_ = NormLayer(config.normalization, config.norm_epsilon, "decoder.final_layernorm",
                          config.hidden_size, store,
                          TpSlice{TpSplit::Replicated, tp.rank, tp.size, tp.sequence_parallel && tp.size > 1});
  if (config.untie_embeddings_and_output_weights) {
    output_layer_ = store.add("output_layer.weight", {config.padded_vocab_size, config.hidden_size},
                              init, true, false, vocab);
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
  const bool sp = tp_.sequence_parallel && tp_.size > 1;
  const int64_t shard_offset = sp ? tp::shard_rows(t, tp_.size) * tp_.rank : 0;
  if (rt.hooks) rt.hooks->params_needed(embedding_handles_);
  // Vocab-parallel lookup: ids outside this rank's rows give zero rows; the sum over TP is the
  // embedding (reduce-scattered to this rank's rows under SP).
  Tensor x = Tensor::empty({t, cfg_.hidden_size}, rt.dtype, s);
  ops::embedding_forward(store_.param(word_embeddings_), mb.input_ids, x, vocab_start_, s);
  x = sp ? tp::scatter_rows(x, rt.tp, s) : x;
  if (!sp) tp::all_reduce(x, rt.tp, s);
  if (position_embeddings_ >= 0) {
    Tensor positions = sp ? tp::shard_of(mb.positions.view({t, 1}), rt.tp, s).view({x.rows()})
                          : mb.positions;
    Tensor pos = Tensor::empty(x.shape(), rt.dtype, s);
    ops::embedding_forward(store_.param(position_embeddings_), positions, pos, 0, s);
    ops::add(x, pos, x, s);
  }
  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (p > 0) {
    Tensor zeros = Tensor::zeros(x.shape(), x.dtype(), s);
    ops::DropoutArgs d{.p = p, .seed = rt.seed, .site = kEmbeddingDropoutSite, .seq_len = mb.seq,
                       .sample_offset = mb.first_sample, .row_offset = shard_offset};
    ops::dropout_add_forward(x, zeros, x, d, s);
  }

  rec.layers.assign(layers_.size(), LayerRecord{});
  for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i].forward(x, mb, rec.layers[i], rt);

  if (rt.hooks) rt.hooks->params_needed(head_handles_);
  Tensor h = final_norm_.forward(x, rec.final_norm, s);
  rec.final_out = sp ? tp::gather_rows(h, t, rt.tp, s) : h;
  x = h = Tensor();
  const int64_t local_vocab = cfg_.padded_vocab_size / tp_.size;
  Tensor logits = Tensor::empty({t, local_vocab}, rt.dtype, s);
  ops::gemm(rec.final_out, store_.param(output_layer_), logits, {.trans_b = true}, s);
  rec.losses = Tensor::empty({t}, rt.stat_dtype(), s);
  if (tp_.size == 1) {
    if (grad_scale > 0) {
      ops::cross_entropy_forward_backward(logits, mb.labels, mb.loss_weights, rec.losses,
                                          grad_scale, s);
    } else {
      ops::cross_entropy_forward(logits, mb.labels, rec.losses, s);
    }
  } else {
    // Vocab-parallel cross-entropy: global row max, then the global sum of exponentials and the
    // target's logit, each an all-reduce of one number per token.
    Tensor row_max = Tensor::empty({t}, rt.stat_dtype(), s);
    Tensor sum_exp = Tensor::empty({t}, rt.stat_dtype(), s);
    Tensor target_logit = Tensor::empty({t}, rt.stat_dtype(), s);
    ops::cross_entropy_shard_max(logits, row_max, s);
    rt.tp->all_reduce(row_max, comm::ReduceOp::Max, s);
    ops::cross_entropy_shard_stats(logits, mb.labels, vocab_start_, row_max, sum_exp, target_logit, s);
    rt.tp->all_reduce(sum_exp, comm::ReduceOp::Sum, s);
    rt.tp->all_reduce(target_logit, comm::ReduceOp::Sum, s);
    ops::cross_entropy_shard_finish(logits, mb.labels, vocab_start_, row_max, sum_exp, target_logit,
                                    mb.loss_weights, rec.losses, grad_scale > 0 ? grad_scale : 0.0f, s);
  }
  if (grad_scale > 0) rec.dlogits = logits;
  ops::dot(rec.losses, mb.loss_weights, loss_sum, s);
}

void GptModel::backward(const MicroBatch& mb, ModelRecord& rec, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  const bool sp = tp_.sequence_parallel && tp_.size > 1;
  const int64_t shard_offset = sp ? tp::shard_rows(t, tp_.size) * tp_.rank : 0;
  MDLM_CHECK(rec.dlogits.defined(), "GptModel::backward without a training forward");
  // Output layer (column-parallel over the vocabulary): dW_out += dlogits^T h; dh sums over TP.
  Tensor dw = store_.grad(output_layer_);
  ops::gemm(rec.dlogits, rec.final_out, dw, {.trans_a = true, .beta = 1.0f}, s);
  Tensor dh = Tensor::empty(rec.final_out.shape(), rt.dtype, s);
  ops::gemm(rec.dlogits, store_.param(output_layer_), dh, {}, s);
  rec.dlogits = rec.final_out = Tensor();
  if (sp) {
    dh = tp::scatter_rows(dh, rt.tp, s);
  } else {
    tp::all_reduce(dh, rt.tp, s);
  }

  Tensor dx = final_norm_.backward(dh, rec.final_norm, s);
  dh = Tensor();
  if (rt.hooks) rt.hooks->grads_ready(head_handles_);
  for (size_t i = layers_.size(); i-- > 0;) dx = layers_[i].backward(dx, mb, rec.layers[i], rt);

  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (p > 0) {
    ops::DropoutArgs d{.p = p, .seed = rt.seed, .site = kEmbeddingDropoutSite, .seq_len = mb.seq,
                       .sample_offset = mb.first_sample, .row_offset = shard_offset};
    ops::dropout_backward(dx, dx, d, s);
  }
  if (position_embeddings_ >= 0) {
    Tensor positions = sp ? tp::shard_of(mb.positions.view({t, 1}), rt.tp, s).view({dx.rows()})
                          : mb.positions;
    Tensor dpe = store_.grad(position_embeddings_);
    ops::embedding_backward(positions, dx, dpe, 0, s);
  }
  // The vocab-parallel lookup's backward needs every row's gradient on every rank.
  Tensor dx_full = sp ? tp::gather_rows(dx, t, rt.tp, s) : dx;
  Tensor dwe = store_.grad(word_embeddings_);
  ops::embedding_backward(mb.input_ids, dx_full, dwe, vocab_start_, s);
  if (rt.hooks) rt.hooks->grads_ready(embedding_handles_);
  rec = ModelRecord{};
}

}  // namespace megadlm
