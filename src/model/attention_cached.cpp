// SelfAttention::context_cached (include/megadlm/model/attention.h): inference with Fast-dLLM's
// approximate key/value cache (model/kv_cache.h). A refresh keeps this layer's keys and values
// of every column (the tensors themselves: no copy) and attends as forward() does; a later call
// computes only its columns, writes their keys and values over the cached ones
// (ops::copy_row_block, one call for the whole batch) and lets their queries attend to every
// cached column (ops::attention_forward with kv_seq = the canvas length and the keys' own
// document ids, so padding stays invisible).
#include "megadlm/model/attention.h"
#include "megadlm/model/kv_cache.h"
#include "megadlm/ops/attention.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/rope.h"
#include "megadlm/ops/row_block.h"

namespace megadlm {

Tensor SelfAttention::context_cached(const Tensor& x, const MicroBatch& mb, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  KvCache& cache = *rt.kv_cache;
  MDLM_CHECK(!mp_.tp.enabled() && !mp_.cp.enabled() && !mp_.sequence_parallel, "layer ", layer_,
             ": the key/value cache is for inference on one rank (no tensor or context parallelism)");
  MDLM_CHECK(mb.batch == cache.batch && cache.column0 >= 0 && cache.column0 + mb.seq <= cache.seq &&
                 (!cache.refresh || (cache.column0 == 0 && mb.seq == cache.seq)),
             "layer ", layer_, ": a micro-batch of ", mb.batch, " x ", mb.seq, " columns from ", cache.column0,
             " does not fit the cached canvases ", cache.batch, " x ", cache.seq, cache.refresh ? " (refresh)" : "");
  const int64_t t = mb.tokens();
  const int64_t hd = cfg_->kv_channels;
  Tensor qkv = qkv_.forward(x, s);
  Tensor q, k, v;
  if (fused_qk(rt)) {
    Tensor rstd = cfg_->qk_layernorm ? Tensor::empty({t * (heads_ + groups_)}, rt.stat_dtype(), s) : Tensor();
    SplitRows r = split_rows(rotated_qkv(qkv, rstd, mb, s, {.in_place = true}), t, s);
    q = r.q;
    k = r.k;
    v = r.v;
  } else {
    q = Tensor::empty({t, heads_ * hd}, x.dtype(), s);
    k = Tensor::empty({t, groups_ * hd}, x.dtype(), s);
    v = Tensor::empty({t, groups_ * hd}, x.dtype(), s);
    ops::split_columns(qkv, {&q, &k, &v}, s);
    if (cfg_->qk_layernorm) {
      NormRecord qn, kn;
      q = q_norm_.forward(q.view({t * heads_, hd}), qn, s).view({t, heads_ * hd});
      k = k_norm_.forward(k.view({t * groups_, hd}), kn, s).view({t, groups_ * hd});
    }
    if (cfg_->position_embedding_type == PositionEmbeddingType::Rope) {
      ops::rope_forward(q, mb.positions, {heads_, hd, cfg_->rotary_dim(), cfg_->rotary_base}, s);
      ops::rope_forward(k, mb.positions, {groups_, hd, cfg_->rotary_dim(), cfg_->rotary_base}, s);
    }
  }
  qkv = Tensor();
  const size_t layer = static_cast<size_t>(layer_);
  if (cache.k.size() <= layer) {
    cache.k.resize(layer + 1);
    cache.v.resize(layer + 1);
  }
  Tensor out = Tensor::empty({t, heads_ * hd}, x.dtype(), s);
  Tensor lse = Tensor::empty({mb.batch * heads_ * mb.seq}, rt.stat_dtype(), s);
  ops::AttentionArgs a = core_args(mb, rt);
  a.row_lengths = nullptr;  // the cache keeps the canvas's own layout (InferenceModel::cached_logits)
  if (cache.refresh) {
    cache.k[layer] = k;
    cache.v[layer] = v;
    ops::attention_forward(q, k, v, out, lse, a, s);
  } else {
    MDLM_CHECK(cache.k[layer].defined(), "layer ", layer_, ": a cached forward before any refresh");
    ops::copy_row_block(k, cache.k[layer], mb.batch, cache.column0, s);
    ops::copy_row_block(v, cache.v[layer], mb.batch, cache.column0, s);
    a.kv_seq = cache.seq;
    a.document_starts = nullptr;  // the queries' documents are not the keys' (CUDA: the key-block kernels)
    if (mb.document_ids.defined()) a.key_document_ids = &cache.document_ids;
    ops::attention_forward(q, cache.k[layer], cache.v[layer], out, lse, a, s);
  }
  return out;
}

}  // namespace megadlm
