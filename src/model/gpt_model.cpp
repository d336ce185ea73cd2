#include "megadlm/model/gpt_model.h"
#include <algorithm>
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/linear_cross_entropy.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"
#include "megadlm/parallel/tensor_parallel/vocab_parallel.h"

namespace megadlm {

namespace {
// Dropout site of the embedding output; layer sites are 2*layer+1 and 2*layer+2.
constexpr uint32_t kEmbeddingDropoutSite = 0xE0000000u;
}  // namespace

GptModel::GptModel(const TransformerConfig& config, ParameterStore& store, const ModelParallel& mp,
                   ModelChunkSpec chunk)
    : cfg_(config), store_(store), mp_(mp), chunk_(chunk) {
  const ParallelGroup& tp = mp.tp;
  if (chunk_.num_layers < 0) chunk_.num_layers = config.num_layers - chunk_.first_layer;
  MDLM_CHECK(chunk_.first_layer >= 0 && chunk_.first_layer + chunk_.num_layers <= config.num_layers,
             "model chunk layers [", chunk_.first_layer, ", ", chunk_.first_layer + chunk_.num_layers,
             ") outside the ", config.num_layers, " layers");
  const ParamInit init{InitKind::Normal, config.init_method_std};
  const TpSlice vocab{.split = TpSplit::Rows, .rank = tp.rank, .size = tp.size};
  MDLM_CHECK(config.padded_vocab_size % tp.size == 0, "padded vocabulary ", config.padded_vocab_size,
             " does not split over ", tp.size, " tensor-parallel ranks");
  vocab_start_ = config.padded_vocab_size / tp.size * tp.rank;
  const bool tied = !config.untie_embeddings_and_output_weights;
  if (chunk_.embedding) {
    word_embeddings_ = store.add(
        "embedding.word_embeddings.weight", {config.padded_vocab_size, config.hidden_size},
        {.init = init,
         .tp = vocab,
         .pipeline_share = tied && !chunk_.head ? PipelineShare::Original : PipelineShare::None});
    if (config.position_embedding_type == PositionEmbeddingType::LearnedAbsolute) {
      // Under SP each rank adds positions to its own rows: partial gradients.
      const TpSlice pos{.split = TpSplit::Replicated, .rank = tp.rank, .size = tp.size,
                        .partial_grad = mp.sequence_parallel};
      position_embeddings_ = store.add("embedding.position_embeddings.weight",
                                       {config.max_position_embeddings, config.hidden_size},
                                       {.init = init, .tp = pos});
    }
    for (int h = word_embeddings_; h < static_cast<int>(store.descs().size()); ++h)
      embedding_handles_.push_back(h);
  }
  layers_.reserve(static_cast<size_t>(chunk_.num_layers));
  for (int i = 0; i < chunk_.num_layers; ++i) layers_.emplace_back(cfg_, chunk_.first_layer + i, store, mp);
  if (chunk_.head) {
    const int head_first = static_cast<int>(store.descs().size());
    final_norm_ = NormLayer(config.normalization, config.norm_epsilon, "decoder.final_layernorm",
                            config.hidden_size, store,
                            TpSlice{.split = TpSplit::Replicated, .rank = tp.rank, .size = tp.size,
                                    .partial_grad = mp.sequence_parallel});
    if (!tied) {
      output_layer_ = store.add("output_layer.weight", {config.padded_vocab_size, config.hidden_size},
                                {.init = init, .tp = vocab});
    } else if (chunk_.embedding) {
      output_layer_ = word_embeddings_;  // tied: logits = h * E^T, both gradients land in E
    } else {
      // The last stage's copy of the tied embedding: same name, so the same initial values.
      output_layer_ = store.add("embedding.word_embeddings.weight",
                                {config.padded_vocab_size, config.hidden_size},
                                {.init = init, .tp = vocab, .pipeline_share = PipelineShare::Copy});
    }
    // A tied embedding held by this chunk is final only after the embedding's own backward.
    for (int h = head_first; h < static_cast<int>(store.descs().size()); ++h) head_handles_.push_back(h);
    head_reads_ = head_handles_;
    if (output_layer_ == word_embeddings_) head_reads_.push_back(output_layer_);
  }
}

std::vector<std::vector<int>> GptModel::param_units() const {
  std::vector<std::vector<int>> out;
  if (chunk_.embedding) out.push_back(embedding_handles_);
  for (const TransformerLayer& l : layers_) out.push_back(l.param_handles());
  if (chunk_.head) out.push_back(head_handles_);
  return out;
}

int64_t GptModel::hidden_rows(int64_t tokens) const {
  return mp_.local_rows(tokens);
}

std::vector<std::pair<int, int>> GptModel::units() const {
  const int n = static_cast<int>(layers_.size());
  std::vector<std::pair<int, int>> out;
  const bool uniform = cfg_.recompute_granularity == RecomputeGranularity::Full &&
                       cfg_.recompute_method == RecomputeMethod::Uniform;
  const int size = uniform ? std::max(1, cfg_.recompute_num_layers) : 1;
  for (int i = 0; i < n; i += size) out.push_back({i, std::min(size, n - i)});
  return out;
}

bool GptModel::recomputed(size_t unit) const {
  if (cfg_.recompute_granularity != RecomputeGranularity::Full) return false;
  if (cfg_.recompute_method == RecomputeMethod::Uniform) return true;
  return static_cast<int>(unit) < cfg_.recompute_num_layers;  // block: the first N layers
}

Tensor GptModel::embed(const MicroBatch& mb, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  const bool sp = mp_.sequence_parallel;
  if (rt.hooks) rt.hooks->params_needed(embedding_handles_);
  Tensor x = tp::vocab_parallel_embedding(store_.param(word_embeddings_), mb.input_ids, vocab_start_, mp_, s);
  if (position_embeddings_ >= 0) {
    Tensor positions = sp ? tp::shard_of(mb.positions.view({t, 1}), mp_.tp.get(), s).view({x.rows()})
                          : mb.positions;
    Tensor pos = Tensor::empty(x.shape(), rt.dtype, s);
    ops::embedding_forward(store_.param(position_embeddings_), positions, pos, 0, s);
    ops::add(x, pos, x, s);
  }
  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (p > 0) {
    Tensor zeros = Tensor::zeros(x.shape(), x.dtype(), s);
    ops::DropoutArgs d{.p = p, .seed = rt.seed, .site = kEmbeddingDropoutSite, .seq_len = mb.seq,
                       .sample_offset = mb.first_sample, .row_offset = mp_.local_row_offset(t),
                       .chunks = mb.position_map()};
    ops::dropout_add_forward(x, zeros, x, d, s);
  }
  if (rt.hooks) rt.hooks->params_done(embedding_handles_);
  return x;
}

void GptModel::embed_backward(const MicroBatch& mb, Tensor dx, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  const bool sp = mp_.sequence_parallel;
  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (rt.hooks) rt.hooks->backward_needed(embedding_handles_);
  if (p > 0) {
    ops::DropoutArgs d{.p = p, .seed = rt.seed, .site = kEmbeddingDropoutSite, .seq_len = mb.seq,
                       .sample_offset = mb.first_sample, .row_offset = mp_.local_row_offset(t),
                       .chunks = mb.position_map()};
    ops::dropout_backward(dx, dx, d, s);
  }
  if (position_embeddings_ >= 0) {
    Tensor positions = sp ? tp::shard_of(mb.positions.view({t, 1}), mp_.tp.get(), s).view({dx.rows()})
                          : mb.positions;
    Tensor dpe = store_.grad(position_embeddings_);
    ops::embedding_backward(positions, dx, dpe, 0, s);
  }
  Tensor dwe = store_.grad(word_embeddings_);
  tp::vocab_parallel_embedding_backward(mb.input_ids, dx, dwe, vocab_start_, mp_, s);
  if (rt.hooks) {
    rt.hooks->grads_ready(embedding_handles_);
    rt.hooks->backward_done(embedding_handles_);
  }
}

void GptModel::head_forward(const MicroBatch& mb, const Tensor& x, ModelRecord& rec,
                            Tensor& loss_sum, float grad_scale, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  if (rt.hooks) rt.hooks->params_needed(head_reads_);
  Tensor h = final_norm_.forward(x, rec.final_norm, s);
  rec.final_out = mp_.sequence_parallel ? tp::gather_rows(h, t, mp_.tp.get(), s) : h;
  h = Tensor();
  rec.losses = Tensor::empty({t}, rt.stat_dtype(), s);
  if (!mp_.tp.enabled() && grad_scale > 0) {
    // Training without TP: the output layer and the loss fused over only the rows that carry
    // loss, in chunks (ops::linear_cross_entropy): no [T, V] logits; its gradients now (dW is
    // added to the main grad here, d final_out kept for head_backward). For the hooks this is
    // part of the head's backward: under FSDP its gradient slot is bound only around it.
    if (rt.hooks) rt.hooks->backward_needed(head_reads_);
    rec.dfinal = Tensor::empty(rec.final_out.shape(), rt.dtype, s);
    Tensor dw = store_.grad(output_layer_);
    // Without loss_rows (a micro-batch not built by MicroBatch::upload) every row counts.
    const Tensor* rows = mb.loss_rows.defined() ? &mb.loss_rows : nullptr;
    ops::linear_cross_entropy(rec.final_out, store_.param(output_layer_), rows, mb.labels,
                              mb.loss_weights, rec.losses, rec.dfinal, dw,
                              {.grad_scale = grad_scale}, s);
    rec.final_out = Tensor();
    ops::dot(rec.losses, mb.loss_weights, loss_sum, s);
    if (rt.hooks) {
      rt.hooks->backward_done(head_reads_);
      rt.hooks->params_done(head_reads_);
    }
    return;
  }
  const int64_t local_vocab = cfg_.padded_vocab_size / mp_.tp.size;
  Tensor logits = Tensor::empty({t, local_vocab}, rt.dtype, s);
  ops::gemm(rec.final_out, store_.param(output_layer_), logits, {.trans_b = true}, s);
  if (!mp_.tp.enabled()) {
    if (grad_scale > 0) {
      ops::cross_entropy_forward_backward(logits, mb.labels, mb.loss_weights, rec.losses,
                                          grad_scale, s);
    } else {
      ops::cross_entropy_forward(logits, mb.labels, rec.losses, s);
      rec.logits = logits;
    }
  } else {
    tp::vocab_parallel_cross_entropy(logits, mb.labels, mb.loss_weights, rec.losses,
                                     grad_scale > 0 ? grad_scale : 0.0f, vocab_start_, mp_, s);
  }
  if (grad_scale > 0) rec.dlogits = logits;
  ops::dot(rec.losses, mb.loss_weights, loss_sum, s);
  if (rt.hooks) rt.hooks->params_done(head_reads_);
}

Tensor GptModel::head_backward(const MicroBatch& mb, ModelRecord& rec, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  MDLM_CHECK(rec.dlogits.defined() || rec.dfinal.defined(), "GptModel::backward without a training forward");
  (void)mb;
  // The head's unit is gathered again for its backward (with the fused head, for the final
  // norm's: the output layer's gradients were written in the forward).
  if (rt.hooks) rt.hooks->backward_needed(head_reads_);
  Tensor dh = rec.dfinal;  // the fused head already computed it (and dW_out)
  if (!dh.defined()) {
    // Output layer (column-parallel over the vocabulary): dW_out += dlogits^T h; dh sums over TP.
    Tensor dw = store_.grad(output_layer_);
    ops::gemm(rec.dlogits, rec.final_out, dw, {.trans_a = true, .beta = 1.0f}, s);
    dh = Tensor::empty(rec.final_out.shape(), rt.dtype, s);
    ops::gemm(rec.dlogits, store_.param(output_layer_), dh, {}, s);
  }
  rec.dlogits = rec.final_out = rec.dfinal = Tensor();
  if (mp_.sequence_parallel) {
    dh = tp::scatter_rows(dh, mp_.tp.get(), s);
  } else {
    tp::all_reduce(dh, mp_.tp.get(), s);
  }
  Tensor dx = final_norm_.backward(dh, rec.final_norm, s);
  if (rt.hooks) {
    rt.hooks->grads_ready(head_handles_);
    rt.hooks->backward_done(head_reads_);
  }
  return dx;
}

Tensor GptModel::forward(const MicroBatch& mb, const Tensor& input, ModelRecord& rec,
                         Tensor& loss_sum, float grad_scale, const ModelRuntime& rt) const {
  Tensor x = chunk_.embedding ? embed(mb, rt) : input;
  MDLM_CHECK(x.defined(), "a model chunk without the embedding needs the previous stage's input");
  const auto us = units();
  rec.layers.assign(layers_.size(), LayerRecord{});
  rec.unit_inputs.assign(us.size(), Tensor());
  for (size_t u = 0; u < us.size(); ++u) {
    if (recomputed(u)) {
      // Keep only the unit's input; the layers' records are rebuilt in backward.
      rec.unit_inputs[u] = x;
      for (int i = us[u].first; i < us[u].first + us[u].second; ++i) {
        LayerRecord scratch;
        x = layers_[static_cast<size_t>(i)].forward(x, mb, scratch, rt);
      }
    } else {
      for (int i = us[u].first; i < us[u].first + us[u].second; ++i)
        x = layers_[static_cast<size_t>(i)].forward(x, mb, rec.layers[static_cast<size_t>(i)], rt);
    }
  }
  if (!chunk_.head) return x;
  head_forward(mb, x, rec, loss_sum, grad_scale, rt);
  return Tensor();
}

Tensor GptModel::logits_at(const MicroBatch& mb, const Tensor& rows, const ModelRuntime& rt,
                           int64_t vocab) const {
  // After the last layer's attention every op is per row, so its projection, its MLP and the
  // final norm run on the wanted rows alone (a dense MLP: an MoE layer's capacity drops depend
  // on all the tokens, so there the rows are picked after the layer).
  const bool split_last = splits_last_layer() && rows.numel() > 0;
  return inference_head(inference_trunk(mb, rt, split_last), mb, rows, rt, vocab);
}

bool GptModel::has_moe() const {
  for (const TransformerLayer& l : layers_)
    if (l.is_moe()) return true;
  return false;
}

namespace {
ModelRuntime inference_runtime(const ModelRuntime& rt) {
  ModelRuntime inference = rt;
  inference.forward_only = true;
  inference.training = false;
  return inference;
}
}  // namespace

GptModel::Trunk GptModel::inference_trunk(const MicroBatch& mb, const ModelRuntime& rt, bool split_last) const {
  MDLM_CHECK(chunk_.embedding && chunk_.head && !mp_.tp.enabled(),
             "GptModel::logits_at needs the whole model on one tensor-parallel rank");
  MDLM_CHECK(!split_last || splits_last_layer(), "GptModel::inference_trunk: the last layer does not split at "
             "its attention (an MoE layer or tensor parallelism)");
  const ModelRuntime inference = inference_runtime(rt);
  // Dense layers add their branches into the residual stream in their output GEMMs; an MoE (or
  // TP) layer's MLP output is added by the next layer's first norm (or the final one).
  Trunk t;
  t.residual = embed(mb, inference);
  const size_t full = split_last ? layers_.size() - 1 : layers_.size();
  for (size_t i = 0; i < full; ++i) t.branch = layers_[i].forward_inference(t.residual, t.branch, mb, inference);
  if (split_last) {
    t.context = layers_.back().attention_inference(t.residual, t.branch, mb, inference);
    t.branch = Tensor();
  }
  return t;
}

Tensor GptModel::inference_head(Trunk trunk, const MicroBatch& mb, const Tensor& rows, const ModelRuntime& rt,
                                int64_t vocab) const {
  if (vocab <= 0) vocab = cfg_.padded_vocab_size;
  MDLM_CHECK(vocab <= cfg_.padded_vocab_size, "GptModel::logits_at: ", vocab, " logits of a vocabulary of ",
             cfg_.padded_vocab_size);
  const Stream& s = rt.stream;
  Tensor residual = std::move(trunk.residual), branch = std::move(trunk.branch);
  if (trunk.context.defined()) {
    layers_.back().finish_inference(residual, std::move(trunk.context), mb, inference_runtime(rt), rows);
  } else {
    residual = ops::gather_rows(residual, rows, s);
    if (branch.defined()) branch = ops::gather_rows(branch, rows, s);
  }
  NormRecord norm;
  Tensor h;
  if (branch.defined()) {
    Tensor sum = Tensor::empty(residual.shape(), residual.dtype(), s);
    h = final_norm_.forward_add(branch, residual, sum, norm, s);
  } else {
    h = final_norm_.forward(residual, norm, s);
  }
  branch = residual = Tensor();
  // The first `vocab` rows of the output layer. A vocabulary that is not a multiple of 8 (GPT-2's
  // 50257) would make the logits' row stride unaligned, and cuBLASLt then falls back to a slow
  // sm75 kernel (8x slower, measured on the H200): compute every padded row's logit with
  // aligned strides and keep the first `vocab` columns (the same values; one cheap copy).
  const Tensor& weight = store_.param(output_layer_);
  Tensor logits = Tensor::empty({rows.numel(), vocab}, rt.dtype, s);
  if (vocab % 8 == 0 || rows.numel() == 0) {
    ops::gemm(h, weight.narrow(0, vocab), logits, {.trans_b = true}, s);
    return logits;
  }
  const int64_t aligned = std::min<int64_t>((vocab + 7) / 8 * 8, cfg_.padded_vocab_size);
  Tensor all = Tensor::empty({rows.numel(), aligned}, rt.dtype, s);
  ops::gemm(h, weight.narrow(0, aligned), all, {.trans_b = true}, s);
  if (aligned == vocab) return all;
  Tensor rest = Tensor::empty({rows.numel(), aligned - vocab}, rt.dtype, s);
  ops::split_columns(all, {&logits, &rest}, s);
  return logits;
}

Tensor GptModel::backward(const MicroBatch& mb, const Tensor& output_grad, ModelRecord& rec,
                          const ModelRuntime& rt) const {
  Tensor dx = chunk_.head ? head_backward(mb, rec, rt) : output_grad;
  MDLM_CHECK(dx.defined(), "a model chunk without the head needs the next stage's gradient");
  const auto us = units();
  for (size_t u = us.size(); u-- > 0;) {
    const int first = us[u].first, last = us[u].first + us[u].second;
    const bool recompute = recomputed(u);
    std::vector<int> unit_handles;
    if (recompute) {
      // Re-run the unit's forward from its saved input to rebuild the records; dropout and
      // attention dropout are keyed by coordinates, so the activations are the same. The re-run
      // is part of the unit's backward for the hooks: one announcement (one FSDP gather) serves
      // the recomputation and the backward, and no forward prefetch happens while recomputing.
      for (int i = first; i < last; ++i) {
        const auto& h = layers_[static_cast<size_t>(i)].param_handles();
        unit_handles.insert(unit_handles.end(), h.begin(), h.end());
      }
      if (rt.hooks) rt.hooks->backward_needed(unit_handles);
      Tensor x = rec.unit_inputs[u];
      rec.unit_inputs[u] = Tensor();
      ModelRuntime quiet = rt;
      quiet.hooks = nullptr;  // parameters are already in place; no second "needed" notice
      quiet.record_moe_stats = false;  // the first forward counted them
      for (int i = first; i < last; ++i)
        x = layers_[static_cast<size_t>(i)].forward(x, mb, rec.layers[static_cast<size_t>(i)], quiet);
    }
    for (int i = last; i-- > first;)
      dx = layers_[static_cast<size_t>(i)].backward(dx, mb, rec.layers[static_cast<size_t>(i)], rt);
    if (recompute && rt.hooks) rt.hooks->backward_done(unit_handles);
  }
  if (!chunk_.embedding) {
    rec = ModelRecord{};
    return dx;
  }
  embed_backward(mb, dx, rt);
  rec = ModelRecord{};
  return Tensor();
}

}  // namespace megadlm
