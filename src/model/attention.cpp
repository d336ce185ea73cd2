#include "megadlm/model/attention.h"
#include <cmath>
#include "megadlm/ops/attention.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/rope.h"

namespace megadlm {

SelfAttention::SelfAttention(const TransformerConfig& config, int layer_number,
                             const std::string& prefix, ParameterStore& store,
                             const ModelParallel& mp)
    : cfg_(&config), mp_(mp), layer_(layer_number) {
  const int tp = mp.tp.size;
  MDLM_CHECK(config.num_attention_heads % tp == 0 && config.num_query_groups % tp == 0, "layer ",
             layer_number, ": heads ", config.num_attention_heads, " and query groups ",
             config.num_query_groups, " must divide by tensor-parallel size ", tp);
  if (mp.cp.enabled())
    cp_attention_ = cp::ContextParallelAttention(cp::comm_type_of_layer(mp.cp_comm_types, layer_number), mp);
  heads_ = config.num_attention_heads / tp;
  groups_ = config.num_query_groups / tp;
  const int64_t h = config.hidden_size;
  const ParamInit init{InitKind::Normal, config.init_method_std};
  // Megatron scales the init of the output projections by 1/sqrt(2 * num_layers).
  const ParamInit out_init{InitKind::Normal,
                           config.init_method_std / std::sqrt(2.0f * config.num_layers)};
  const std::string p = prefix + "self_attention.";
  qkv_ = tp::ColumnParallelLinear(store,
                                  {{p + "linear_q", config.query_projection_size()},
                                   {p + "linear_k", config.kv_projection_size()},
                                   {p + "linear_v", config.kv_projection_size()}},
                                  h, config.add_qkv_bias, init, mp);
  if (config.qk_layernorm) {
    // Each rank normalises only its own heads with the shared weights: partial gradients.
    const TpSlice qk{.split = TpSplit::Replicated, .rank = mp.tp.rank, .size = tp, .partial_grad = tp > 1};
    q_norm_ = NormLayer(config.normalization, config.norm_epsilon, p + "q_layernorm",
                        config.kv_channels, store, qk);
    k_norm_ = NormLayer(config.normalization, config.norm_epsilon, p + "k_layernorm",
                        config.kv_channels, store, qk);
  }
  proj_ = tp::RowParallelLinear(store, p + "linear_proj", h, config.query_projection_size(),
                                config.add_bias_linear, out_init, mp);
}

ops::AttentionArgs SelfAttention::core_args(const MicroBatch& mb, const ModelRuntime& rt) const {
  const TransformerConfig& c = *cfg_;
  ops::AttentionArgs a;
  a.batch = mb.batch;
  a.seq = mb.seq;
  a.num_heads = heads_;
  a.num_kv_heads = groups_;
  a.head_dim = c.kv_channels;
  a.mask = c.attention_mask == AttentionMaskType::Causal ? ops::AttentionMask::Causal
                                                          : ops::AttentionMask::None;
  if (c.attention_mask == AttentionMaskType::BlockCausal) {
    // The micro-batch is the doubled row [x_t | x_0] with its block ranges (forward_process.h).
    MDLM_CHECK(mb.block_ranges.defined(), "block diffusion attention: the micro-batch has no block "
               "ranges (built without --dlm-block-size?)");
    a.mask = c.block_diffusion_causal_clean ? ops::AttentionMask::BlockDiffusionCausal
                                            : ops::AttentionMask::BlockDiffusion;
    a.block_ranges = &mb.block_ranges;
    if (mb.cp == nullptr) a.block_diffusion_max_block = mb.block_diffusion_max_block;
  }
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.kv_channels));
  if (rt.training && c.attention_dropout > 0.0f) {
    a.dropout_p = c.attention_dropout;
    a.dropout_seed = rt.seed;
    a.dropout_site = static_cast<uint32_t>(layer_);
    a.sample_offset = mb.first_sample;
    a.head_offset = heads_ * mp_.tp.rank;  // global head numbers: TP shards drop what TP = 1 drops
  }
  if (mb.document_ids.defined()) a.document_ids = &mb.document_ids;  // packed documents
  if (mb.document_starts.defined()) a.document_starts = &mb.document_starts;
  if (mb.row_lengths.defined() && rt.forward_only) a.row_lengths = &mb.row_lengths;
  a.backend = c.attention_backend;
  a.deterministic = c.deterministic_mode;
  return a;
}

bool SelfAttention::fused_qk(const ModelRuntime& rt) const {
  const TransformerConfig& c = *cfg_;
  if (c.qk_layernorm && c.normalization != NormType::RMSNorm) return false;
  // The CUDA kernel keeps a head in the registers of one warp (head_dim / 32 elements a lane).
  return !rt.stream.is_cuda() || (c.kv_channels % 32 == 0 && c.kv_channels <= 256);
}

ops::QkNormRopeArgs SelfAttention::qk_args() const {
  const TransformerConfig& c = *cfg_;
  return {.heads = heads_, .kv_heads = groups_, .head_dim = c.kv_channels,
          .rotary_dim = c.position_embedding_type == PositionEmbeddingType::Rope ? c.rotary_dim() : 0,
          .base = c.rotary_base, .eps = c.norm_epsilon};
}

Tensor SelfAttention::rotated_qkv(const Tensor& qkv, Tensor& rstd, const MicroBatch& mb,
                                  const Stream& s, RotateOptions options) const {
  Tensor out = options.in_place ? qkv : Tensor::empty(qkv.shape(), qkv.dtype(), s);
  const Tensor none;
  const bool norm = cfg_->qk_layernorm;
  ops::QkNormRopeArgs args = qk_args();
  args.copy_values = options.copy_values;
  ops::qk_norm_rope_forward(qkv, norm ? q_norm_.weight() : none, norm ? k_norm_.weight() : none,
                            mb.positions, out, rstd, args, s);
  return out;
}

bool SelfAttention::values_from_projection(const ops::AttentionArgs& a, const ModelRuntime& rt) const {
  return !rt.forward_only && !mp_.cp.enabled() && ops::attention_packed_reads_in_place(a, rt.stream);
}

SelfAttention::SplitRows SelfAttention::split_rows(const Tensor& rows, int64_t t,
                                                   const Stream& s) const {
  const int64_t hd = cfg_->kv_channels;
  SplitRows r{Tensor::empty({t, heads_ * hd}, rows.dtype(), s),
              Tensor::empty({t, groups_ * hd}, rows.dtype(), s),
              Tensor::empty({t, groups_ * hd}, rows.dtype(), s)};
  ops::split_columns(rows.view({t, rows.numel() / t}), {&r.q, &r.k, &r.v}, s);
  return r;
}

const cp::SequenceLayout& SelfAttention::cp_layout(const MicroBatch& mb) const {
  MDLM_CHECK(mb.cp != nullptr, "layer ", layer_, ": context parallelism needs a micro-batch "
             "uploaded for its CP rank (MicroBatch::upload with the CP rank and size)");
  return *mb.cp;
}

Tensor SelfAttention::forward(const Tensor& x, const MicroBatch& mb, Saved& saved,
                              const ModelRuntime& rt) const {
  return proj_.forward(context(x, mb, saved, rt), rt.stream);
}

void SelfAttention::project_add(const Tensor& context, const Tensor& residual, Tensor& out,
                                const Stream& s) const {
  proj_.forward_add(context, residual, out, s);
}

Tensor SelfAttention::context(const Tensor& x, const MicroBatch& mb, Saved& saved,
                              const ModelRuntime& rt) const {
  if (rt.kv_cache != nullptr) return context_cached(x, mb, rt);  // inference (attention_cached.cpp)
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  const int64_t hd = cfg_->kv_channels;
  Tensor qkv = qkv_.gather_and_forward(x, t, rt.forward_only ? nullptr : &saved.x_full, s);
  if (fused_qk(rt)) {
    if (!rt.forward_only) saved.qkv = qkv;
    if (cfg_->qk_layernorm)
      saved.qk_rstd = Tensor::empty({t * (heads_ + groups_)}, rt.stat_dtype(), s);
    const ops::AttentionArgs args = core_args(mb, rt);
    // Training keeps qkv for backward; the rotated q, k go to a buffer of their own and the
    // attention reads v from qkv where it reads the packed rows in place (no value copy).
    const bool values_in_qkv = values_from_projection(args, rt);
    const Tensor rows = rotated_qkv(qkv, saved.qk_rstd, mb, s,
                                    {.in_place = rt.forward_only, .copy_values = !values_in_qkv});
    if (mp_.cp.enabled()) {
      // The CP core takes q, k, v apart and keeps only its lse: backward recomputes the rows
      // from saved.qkv, as the unsplit fused path does.
      const SplitRows r = split_rows(rows, t, s);
      saved.out = cp_attention_.forward(r.q, r.k, r.v, args, cp_layout(mb), saved.cp, s);
      saved.cp.q = saved.cp.k = saved.cp.v = Tensor();
      return saved.out;
    }
    saved.out = Tensor::empty({t, heads_ * hd}, x.dtype(), s);
    saved.lse = Tensor::empty({mb.batch * heads_ * mb.seq}, rt.stat_dtype(), s);
    ops::attention_forward_packed(rows, values_in_qkv ? qkv : rows, saved.out, saved.lse, args, s);
    return saved.out;
  }
  Tensor q = Tensor::empty({t, heads_ * hd}, x.dtype(), s);
  Tensor k = Tensor::empty({t, groups_ * hd}, x.dtype(), s);
  Tensor v = Tensor::empty({t, groups_ * hd}, x.dtype(), s);
  ops::split_columns(qkv, {&q, &k, &v}, s);
  qkv = Tensor();
  if (cfg_->qk_layernorm) {
    q = q_norm_.forward(q.view({t * heads_, hd}), saved.q_norm, s).view({t, heads_ * hd});
    k = k_norm_.forward(k.view({t * groups_, hd}), saved.k_norm, s).view({t, groups_ * hd});
  }
  if (cfg_->position_embedding_type == PositionEmbeddingType::Rope) {
    ops::rope_forward(q, mb.positions, {heads_, hd, cfg_->rotary_dim(), cfg_->rotary_base}, s);
    ops::rope_forward(k, mb.positions, {groups_, hd, cfg_->rotary_dim(), cfg_->rotary_base}, s);
  }
  if (mp_.cp.enabled()) {
    saved.out = cp_attention_.forward(q, k, v, core_args(mb, rt), cp_layout(mb), saved.cp, s);
    return saved.out;
  }
  saved.q = q;
  saved.k = k;
  saved.v = v;
  saved.out = Tensor::empty({t, heads_ * hd}, x.dtype(), s);
  saved.lse = Tensor::empty({mb.batch * heads_ * mb.seq}, rt.stat_dtype(), s);
  ops::attention_forward(q, k, v, saved.out, saved.lse, core_args(mb, rt), s);
  return saved.out;
}

Tensor SelfAttention::backward(const Tensor& dy, const MicroBatch& mb, Saved& saved,
                               const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t t = mb.tokens();
  const int64_t hd = cfg_->kv_channels;
  Tensor dattn = proj_.backward(dy, saved.out, t, s);
  if (saved.qkv.defined()) {  // the fused path
    Tensor dqkv = Tensor::empty(saved.qkv.shape(), dy.dtype(), s);
    {
      // Recompute the rows attention read (rewrites the same statistics), then drop them.
      const ops::AttentionArgs args = core_args(mb, rt);
      const bool values_in_qkv = values_from_projection(args, rt);
      const Tensor rows = rotated_qkv(saved.qkv, saved.qk_rstd, mb, s, {.copy_values = !values_in_qkv});
      if (mp_.cp.enabled()) {
        const SplitRows r = split_rows(rows, t, s);
        cp_attention_.restore_inputs(r.q, r.k, r.v, cp_layout(mb), saved.cp, s);
        const cp::AttentionGrads g =
            cp_attention_.backward(dattn, saved.out, saved.cp, args, cp_layout(mb), s);
        Tensor dq_rows = dqkv.view({t, dqkv.numel() / t});
        ops::concat_columns({&g.dq, &g.dk, &g.dv}, dq_rows, s);
      } else {
        ops::attention_backward_packed(dattn, rows, values_in_qkv ? saved.qkv : rows, saved.out,
                                       saved.lse, dqkv, args, s);
      }
    }
    saved.out = saved.lse = dattn = Tensor();
    const Tensor none;
    Tensor no_grad_q, no_grad_k, dq_weight, dk_weight;
    const bool norm = cfg_->qk_layernorm;
    if (norm) {
      dq_weight = q_norm_.weight_grad();
      dk_weight = k_norm_.weight_grad();
    }
    ops::qk_norm_rope_backward(dqkv, saved.qkv, norm ? q_norm_.weight() : none,
                               norm ? k_norm_.weight() : none, saved.qk_rstd, mb.positions,
                               norm ? dq_weight : no_grad_q, norm ? dk_weight : no_grad_k,
                               qk_args(), s);
    saved.qkv = saved.qk_rstd = Tensor();
    Tensor dx = qkv_.backward(dqkv, saved.x_full, s);
    saved = Saved{};
    return dx;
  }
  Tensor dq, dk, dv;
  if (mp_.cp.enabled()) {
    cp::AttentionGrads g = cp_attention_.backward(dattn, saved.out, saved.cp, core_args(mb, rt), cp_layout(mb), s);
    dq = g.dq;
    dk = g.dk;
    dv = g.dv;
  } else {
    dq = Tensor::empty(saved.q.shape(), dy.dtype(), s);
    dk = Tensor::empty(saved.k.shape(), dy.dtype(), s);
    dv = Tensor::empty(saved.v.shape(), dy.dtype(), s);
    ops::attention_backward(dattn, saved.q, saved.k, saved.v, saved.out, saved.lse, dq, dk, dv,
                            core_args(mb, rt), s);
  }
  saved.q = saved.k = saved.v = saved.out = saved.lse = Tensor();
  dattn = Tensor();
  if (cfg_->position_embedding_type == PositionEmbeddingType::Rope) {
    ops::rope_backward(dq, mb.positions, {heads_, hd, cfg_->rotary_dim(), cfg_->rotary_base}, s);
    ops::rope_backward(dk, mb.positions, {groups_, hd, cfg_->rotary_dim(), cfg_->rotary_base}, s);
  }
  if (cfg_->qk_layernorm) {
    dq = q_norm_.backward(dq.view({t * heads_, hd}), saved.q_norm, s).view({t, heads_ * hd});
    dk = k_norm_.backward(dk.view({t * groups_, hd}), saved.k_norm, s).view({t, groups_ * hd});
  }
  Tensor dqkv = Tensor::empty({t, (heads_ + 2 * groups_) * hd}, dy.dtype(), s);
  ops::concat_columns({&dq, &dk, &dv}, dqkv, s);
  dq = dk = dv = Tensor();
  Tensor dx = qkv_.backward(dqkv, saved.x_full, s);
  saved = Saved{};
  return dx;
}

}  // namespace megadlm
