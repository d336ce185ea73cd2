// SelfAttention::context_cached (include/megadlm/model/attention.h): inference with Fast-dLLM's
// approximate key/value cache (model/kv_cache.h). A refresh keeps this layer's keys and values
// of every column (the tensors themselves: no copy) and attends as forward() does; a later call
// computes only its columns, writes their keys and values over the cached ones
// (ops::copy_row_block, one call for the whole batch) and lets their queries attend to every
// cached column (ops::attention_forward with kv_seq = the canvas length and the keys' own
// document ids, so padding stays invisible). Block decoding's exact cache (cache.exact) writes
// the call's columns into storage allocated once and attends by the call's key documents
// (exact_cached below).
#include "megadlm/model/attention.h"
#include <cmath>
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
                 (cache.exact || !cache.refresh || (cache.column0 == 0 && mb.seq == cache.seq)),
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
  if (cache.exact) {
    // Block decoding: the training mask type (block_causal over [x_t | x_0]) does not apply to
    // one stream; the key documents and the causal flag say what each query sees.
    MDLM_CHECK(mb.document_ids.defined() && cache.key_document_ids.defined(), "layer ", layer_,
               ": the exact cache needs the queries' and the keys' document ids");
    // Causal: query i is column column0 + i. From column 0 the identity maps say so; a window of
    // one column needs no mask (the key documents hide the columns after it); otherwise a
    // two-chunk query map (ops/chunk_map.h) of the window's halves.
    const bool chunked = cache.causal && cache.column0 > 0 && mb.seq > 1;
    MDLM_CHECK(!chunked || (mb.seq % 2 == 0 && cache.column0 % (mb.seq / 2) == 0), "layer ", layer_,
               ": a causal cached call of ", mb.seq, " columns from column ", cache.column0,
               " (needs column 0, one column, or an even width whose half divides the first column)");
    if (!cache.k[layer].defined()) {
      cache.k[layer] = Tensor::zeros({cache.batch * cache.seq, groups_ * hd}, x.dtype(), s);
      cache.v[layer] = Tensor::zeros({cache.batch * cache.seq, groups_ * hd}, x.dtype(), s);
    }
    ops::copy_row_block(k, cache.k[layer], mb.batch, cache.column0, s);
    ops::copy_row_block(v, cache.v[layer], mb.batch, cache.column0, s);
    ops::AttentionArgs a;
    a.batch = mb.batch;
    a.seq = mb.seq;
    a.num_heads = heads_;
    a.num_kv_heads = groups_;
    a.head_dim = hd;
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(hd));
    a.kv_seq = cache.seq;
    a.document_ids = &mb.document_ids;
    a.key_document_ids = &cache.key_document_ids;
    if (cache.causal && (cache.column0 == 0 || chunked)) a.mask = ops::AttentionMask::Causal;
    if (chunked) {
      const int64_t half = mb.seq / 2, chunk = cache.column0 / half;
      a.query_chunks = ops::ChunkMap{half, chunk, chunk + 1};  // local i -> column column0 + i
    }
    a.backend = cfg_->attention_backend;
    a.deterministic = cfg_->deterministic_mode;
    ops::attention_forward(q, cache.k[layer], cache.v[layer], out, lse, a, s);
    return out;
  }
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
