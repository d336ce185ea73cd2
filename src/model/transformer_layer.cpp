#include "megadlm/model/transformer_layer.h"
#include <cmath>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/attention.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/ops/rope.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"

namespace megadlm {

namespace {

std::string layer_prefix(int layer) { return "decoder.layers." + std::to_string(layer) + "."; }

}  // namespace

TransformerLayer::TransformerLayer(const TransformerConfig& config, int layer_number,
                                   ParameterStore& store, TensorParallelLayout tp)
    : cfg_(config), store_(store), layer_(layer_number), tp_(tp) {
  const int first_handle = static_cast<int>(store.descs().size());
  const std::string p = layer_prefix(layer_number);
  const int64_t h = config.hidden_size;
  const int64_t qsize = config.query_projection_size();
  const int64_t kvsize = config.kv_projection_size();
  const int64_t ffn = config.ffn_hidden_size;
  MDLM_CHECK(config.num_attention_heads % tp.size == 0 && config.num_query_groups % tp.size == 0 &&
                 ffn % tp.size == 0,
             "layer ", layer_number, ": heads ", config.num_attention_heads, ", query groups ",
             config.num_query_groups, " and ffn ", ffn, " must divide by tensor-parallel size ", tp.size);
  heads_ = config.num_attention_heads / tp.size;
  groups_ = config.num_query_groups / tp.size;
  ffn_ = ffn / tp.size;
  const ParamInit init{InitKind::Normal, config.init_method_std};
  // Megatron scales the init of the two output projections by 1/sqrt(2 * num_layers).
  const ParamInit out_init{InitKind::Normal,
                           config.init_method_std / std::sqrt(2.0f * config.num_layers)};
  const ParamInit zero{InitKind::Zeros, 0.0f};
  const TpSlice column{TpSplit::Rows, tp.rank, tp.size};  // column-parallel: output rows split
  const TpSlice row{TpSplit::Cols, tp.rank, tp.size};     // row-parallel: input columns split
  const TpSlice replicated{TpSplit::Replicated, tp.rank, tp.size};
  // Under sequence parallelism each rank normalises only its rows: partial gradients.
  const TpSlice norm{TpSplit::Replicated, tp.rank, tp.size, tp.sequence_parallel && tp.size > 1};

  norm1_ = NormLayer(config.normalization, config.norm_epsilon, p + "input_layernorm", h, store, norm);
  qkv_.w_first = store.add(p + "self_attention.linear_q.weight", {qsize, h}, init, true, false, column);
  store.add(p + "self_attention.linear_k.weight", {kvsize, h}, init, true, true, column);
  qkv_.w_last = store.add(p + "self_attention.linear_v.weight", {kvsize, h}, init, true, true, column);
  if (config.add_qkv_bias) {
    qkv_.b_first = store.add(p + "self_attention.linear_q.bias", {qsize}, zero, false, false, column);
    store.add(p + "self_attention.linear_k.bias", {kvsize}, zero, false, true, column);
    qkv_.b_last = store.add(p + "self_attention.linear_v.bias", {kvsize}, zero, false, true, column);
  }
  if (config.qk_layernorm) {
    // Each rank normalises only its own heads with the shared weights: partial gradients.
    const TpSlice qk{TpSplit::Replicated, tp.rank, tp.size, tp.size > 1};
    q_norm_ = NormLayer(config.normalization, config.norm_epsilon, p + "self_attention.q_layernorm",
                        config.kv_channels, store, qk);
    k_norm_ = NormLayer(config.normalization, config.norm_epsilon, p + "self_attention.k_layernorm",
                        config.kv_channels, store, qk);
  }
  proj_.w_first = proj_.w_last =
      store.add(p + "self_attention.linear_proj.weight", {h, qsize}, out_init, true, false, row);
  if (config.add_bias_linear)
    proj_.b_first = proj_.b_last =
        store.add(p + "self_attention.linear_proj.bias", {h}, zero, false, false, replicated);

  norm2_ = NormLayer(config.normalization, config.norm_epsilon, p + "pre_mlp_layernorm", h, store, norm);
  if (config.activation == MlpActivation::SwiGLU) {
    fc1_.w_first = store.add(p + "mlp.linear_fc1_gate.weight", {ffn, h}, init, true, false, column);
    fc1_.w_last = store.add(p + "mlp.linear_fc1_up.weight", {ffn, h}, init, true, true, column);
    if (config.add_bias_linear) {
      fc1_.b_first = store.add(p + "mlp.linear_fc1_gate.bias", {ffn}, zero, false, false, column);
      fc1_.b_last = store.add(p + "mlp.linear_fc1_up.bias", {ffn}, zero, false, true, column);
    }
  } else {
    fc1_.w_first = fc1_.w_last = store.add(p + "mlp.linear_fc1.weight", {ffn, h}, init, true, false, column);
    if (config.add_bias_linear)
      fc1_.b_first = fc1_.b_last = store.add(p + "mlp.linear_fc1.bias", {ffn}, zero, false, false, column);
  }
  fc2_.w_first = fc2_.w_last = store.add(p + "mlp.linear_fc2.weight", {h, ffn}, out_init, true, false, row);
  if (config.add_bias_linear)
    fc2_.b_first = fc2_.b_last = store.add(p + "mlp.linear_fc2.bias", {h}, zero, false, false, replicated);
  for (int i = first_handle; i < static_cast<int>(store.descs().size()); ++i) handles_.push_back(i);
}

Tensor TransformerLayer::linear_forward(const Linear& l, const Tensor& x, int64_t out_features,
                                        bool with_bias, const ModelRuntime& rt) const {
  Tensor y = Tensor::empty({x.rows(), out_features}, x.dtype(), rt.stream);
  Tensor w = store_.param_span(l.w_first, l.w_last);
  Tensor bias;
  const bool b = with_bias && l.b_first >= 0;
  if (b) bias = store_.param_span(l.b_first, l.b_last);
  ops::gemm(x, w, y, {.trans_b = true, .bias = b ? &bias : nullptr}, rt.stream);
  return y;
}

Tensor TransformerLayer::linear_backward(const Linear& l, const Tensor& dy, const Tensor& x,
                                         bool bias_grad, const ModelRuntime& rt) const {
  Tensor w = store_.param_span(l.w_first, l.w_last);
  Tensor dw = store_.grad_span(l.w_first, l.w_last);
  // dW[out, in] += dy^T [out, T] * x [T, in]  (fp32 main grad, accumulated)
  ops::gemm(dy, x, dw, {.trans_a = true, .beta = 1.0f}, rt.stream);
  if (bias_grad && l.b_first >= 0) {
    Tensor db = store_.grad_span(l.b_first, l.b_last);
    ops::sum_rows(dy, db, rt.stream);
  }
  // dx[T, in] = dy [T, out] * W [out, in]
  Tensor dx = Tensor::empty({dy.rows(), w.cols()}, dy.dtype(), rt.stream);
  ops::gemm(dy, w, dx, {}, rt.stream);
  return dx;
}

Tensor TransformerLayer::region_input(const Tensor& x, const MicroBatch& mb,
                                      const ModelRuntime& rt) const {
  return tp_.sequence_parallel ? tp::gather_rows(x, mb.tokens(), rt.tp, rt.stream) : x;
}

Tensor TransformerLayer::region_output(const Tensor& partial, const ModelRuntime& rt) const {
  if (tp_.sequence_parallel) return tp::scatter_rows(partial, rt.tp, rt.stream);
  Tensor y = partial;
  tp::all_reduce(y, rt.tp, rt.stream);
  return y;
}

Tensor TransformerLayer::region_input_grad(const Tensor& partial, const ModelRuntime& rt) const {
  return region_output(partial, rt);  // conjugates: all-gather <-> reduce-scatter, identity <-> all-reduce
}

Tensor TransformerLayer::region_output_grad(const Tensor& dy, const MicroBatch& mb,
                                            const ModelRuntime& rt) const {
  return region_input(dy, mb, rt);
}

namespace {

ops::AttentionArgs attention_args(const TransformerConfig& c, const MicroBatch& mb,
                                  const ModelRuntime& rt, int64_t heads, int64_t groups,
                                  int64_t head_offset, int layer) {
  ops::AttentionArgs a;
  a.batch = mb.batch;
  a.seq = mb.seq;
  a.num_heads = heads;
  a.num_kv_heads = groups;
  a.head_dim = c.kv_channels;
  a.mask = c.attention_mask == AttentionMaskType::Causal ? ops::AttentionMask::Causal
                                                          : ops::AttentionMask::None;
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.kv_channels));
  if (rt.training && c.attention_dropout > 0.0f) {
    a.dropout_p = c.attention_dropout;
    a.dropout_seed = rt.seed;
    a.dropout_site = static_cast<uint32_t>(layer);
    a.sample_offset = mb.first_sample;
    a.head_offset = head_offset;  // global head numbers: TP shards drop what TP = 1 drops
  }
  if (mb.document_ids.defined()) a.document_ids = &mb.document_ids;  // packed documents
  return a;
}

ops::DropoutArgs dropout_args(const MicroBatch& mb, const ModelRuntime& rt, float p, uint32_t site,
                              int64_t row_offset) {
  ops::DropoutArgs d;
  d.p = p;
  d.seed = rt.seed;
  d.site = site;
  d.seq_len = mb.seq;
  d.sample_offset = mb.first_sample;
  d.row_offset = row_offset;
  return d;
}

}  // namespace

Tensor TransformerLayer::forward(const Tensor& x, const MicroBatch& mb, LayerRecord& rec,
                                 const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  const int64_t hd = cfg_.kv_channels;
  const int64_t shard_offset =
      tp_.sequence_parallel ? tp::shard_rows(t, tp_.size) * tp_.rank : 0;
  const bool bias_here = tp_.rank == 0;  // row-parallel bias: added once, before the reduction
  if (rt.hooks) rt.hooks->params_needed(handles_);
  rec.x_in = x;

  // --- attention block ---
  rec.norm1_out = region_input(norm1_.forward(x, rec.norm1, s), mb, rt);
  Tensor qkv = linear_forward(qkv_, rec.norm1_out, (heads_ + 2 * groups_) * hd, true, rt);
  Tensor q = Tensor::empty({t, heads_ * hd}, x.dtype(), s);
  Tensor k = Tensor::empty({t, groups_ * hd}, x.dtype(), s);
  Tensor v = Tensor::empty({t, groups_ * hd}, x.dtype(), s);
  ops::split_columns(qkv, {&q, &k, &v}, s);
  qkv = Tensor();
  if (cfg_.qk_layernorm) {
    q = q_norm_.forward(q.view({t * heads_, hd}), rec.q_norm, s).view({t, heads_ * hd});
    k = k_norm_.forward(k.view({t * groups_, hd}), rec.k_norm, s).view({t, groups_ * hd});
  }
  if (cfg_.position_embedding_type == PositionEmbeddingType::Rope) {
    ops::rope_forward(q, mb.positions, {heads_, hd, cfg_.rotary_dim(), cfg_.rotary_base}, s);
    ops::rope_forward(k, mb.positions, {groups_, hd, cfg_.rotary_dim(), cfg_.rotary_base}, s);
  }
  rec.q = q;
  rec.k = k;
  rec.v = v;
  const ops::AttentionArgs aa =
      attention_args(cfg_, mb, rt, heads_, groups_, heads_ * tp_.rank, layer_);
  rec.attn_out = Tensor::empty({t, heads_ * hd}, x.dtype(), s);
  rec.lse = Tensor::empty({mb.batch * heads_ * mb.seq}, rt.stat_dtype(), s);
  ops::attention_forward(q, k, v, rec.attn_out, rec.lse, aa, s);
  Tensor proj = region_output(linear_forward(proj_, rec.attn_out, cfg_.hidden_size, bias_here, rt), rt);
  rec.x_mid = Tensor::empty(x.shape(), x.dtype(), s);
  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (p > 0) {
    ops::dropout_add_forward(proj, x, rec.x_mid,
                             dropout_args(mb, rt, p, 2 * layer_ + 1, shard_offset), s);
  } else {
    ops::add(proj, x, rec.x_mid, s);
  }

  // --- MLP block ---
  rec.norm2_out = region_input(norm2_.forward(rec.x_mid, rec.norm2, s), mb, rt);
  const bool swiglu = cfg_.activation == MlpActivation::SwiGLU;
  rec.fc1_out = linear_forward(fc1_, rec.norm2_out, swiglu ? 2 * ffn_ : ffn_, true, rt);
  rec.act_out = Tensor::empty({t, ffn_}, x.dtype(), s);
  if (swiglu) ops::swiglu_forward(rec.fc1_out, rec.act_out, s);
  else ops::gelu_forward(rec.fc1_out, rec.act_out, s);
  Tensor fc2 = region_output(linear_forward(fc2_, rec.act_out, cfg_.hidden_size, bias_here, rt), rt);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), s);
  if (p > 0) {
    ops::dropout_add_forward(fc2, rec.x_mid, out,
                             dropout_args(mb, rt, p, 2 * layer_ + 2, shard_offset), s);
  } else {
    ops::add(fc2, rec.x_mid, out, s);
  }
  return out;
}

Tensor TransformerLayer::backward(const Tensor& dy, const MicroBatch& mb, LayerRecord& rec,
                                  const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  const int64_t hd = cfg_.kv_channels;
  const int64_t shard_offset =
      tp_.sequence_parallel ? tp::shard_rows(t, tp_.size) * tp_.rank : 0;
  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;

  // --- MLP block: out = x_mid + dropout(fc2(act(fc1(norm2(x_mid))))) ---
  Tensor dfc2 = dy;
  if (p > 0) {
    dfc2 = Tensor::empty(dy.shape(), dy.dtype(), s);
    ops::dropout_backward(dy, dfc2, dropout_args(mb, rt, p, 2 * layer_ + 2, shard_offset), s);
  }
  // Row-parallel: the gradient of the full rows; its bias gradient is the same on every rank.
  Tensor dact = linear_backward(fc2_, region_output_grad(dfc2, mb, rt), rec.act_out, true, rt);
  rec.act_out = Tensor();
  Tensor dfc1 = Tensor::empty(rec.fc1_out.shape(), dy.dtype(), s);
  if (cfg_.activation == MlpActivation::SwiGLU) ops::swiglu_backward(dact, rec.fc1_out, dfc1, s);
  else ops::gelu_backward(dact, rec.fc1_out, dfc1, s);
  rec.fc1_out = Tensor();
  dact = Tensor();
  Tensor dnorm2 = region_input_grad(linear_backward(fc1_, dfc1, rec.norm2_out, true, rt), rt);
  rec.norm2_out = Tensor();
  Tensor dx_mid = norm2_.backward(dnorm2, rec.norm2, s);
  ops::add(dx_mid, dy, dx_mid, s);  // the residual path

  // --- attention block: x_mid = x + dropout(proj(attention(...))) ---
  Tensor dproj = dx_mid;
  if (p > 0) {
    dproj = Tensor::empty(dx_mid.shape(), dx_mid.dtype(), s);
    ops::dropout_backward(dx_mid, dproj, dropout_args(mb, rt, p, 2 * layer_ + 1, shard_offset), s);
  }
  Tensor dattn = linear_backward(proj_, region_output_grad(dproj, mb, rt), rec.attn_out, true, rt);
  Tensor dq = Tensor::empty(rec.q.shape(), dy.dtype(), s);
  Tensor dk = Tensor::empty(rec.k.shape(), dy.dtype(), s);
  Tensor dv = Tensor::empty(rec.v.shape(), dy.dtype(), s);
  ops::attention_backward(dattn, rec.q, rec.k, rec.v, rec.attn_out, rec.lse, dq, dk, dv,
                          attention_args(cfg_, mb, rt, heads_, groups_, heads_ * tp_.rank, layer_), s);
  rec.q = rec.k = rec.v = rec.attn_out = rec.lse = Tensor();
  if (cfg_.position_embedding_type == PositionEmbeddingType::Rope) {
    ops::rope_backward(dq, mb.positions, {heads_, hd, cfg_.rotary_dim(), cfg_.rotary_base}, s);
    ops::rope_backward(dk, mb.positions, {groups_, hd, cfg_.rotary_dim(), cfg_.rotary_base}, s);
  }
  if (cfg_.qk_layernorm) {
    dq = q_norm_.backward(dq.view({t * heads_, hd}), rec.q_norm, s).view({t, heads_ * hd});
    dk = k_norm_.backward(dk.view({t * groups_, hd}), rec.k_norm, s).view({t, groups_ * hd});
  }
  Tensor dqkv = Tensor::empty({t, (heads_ + 2 * groups_) * hd}, dy.dtype(), s);
  ops::concat_columns({&dq, &dk, &dv}, dqkv, s);
  dq = dk = dv = Tensor();
  Tensor dnorm1 = region_input_grad(linear_backward(qkv_, dqkv, rec.norm1_out, true, rt), rt);
  rec.norm1_out = Tensor();
  Tensor dx = norm1_.backward(dnorm1, rec.norm1, s);
  ops::add(dx, dx_mid, dx, s);
  rec = LayerRecord{};
  if (rt.hooks) rt.hooks->grads_ready(handles_);
  return dx;
}

}  // namespace megadlm
