#include "megadlm/model/transformer_layer.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"

namespace megadlm {

namespace {

std::string layer_prefix(int layer) { return "decoder.layers." + std::to_string(layer) + "."; }

// Hidden dropout of the two residual branches, keyed by global coordinates: sites 2·layer+1
// (attention) and 2·layer+2 (MLP); `row_offset` places this rank's SP shard in the sequence.
ops::DropoutArgs dropout_args(const MicroBatch& mb, const ModelRuntime& rt, float p, uint32_t site,
                              int64_t row_offset) {
  ops::DropoutArgs d;
  d.p = p;
  d.seed = rt.seed;
  d.site = site;
  d.seq_len = mb.seq;
  d.chunks = mb.position_map();  // CP shards keep the global positions' masks
  d.sample_offset = mb.first_sample;
  d.row_offset = row_offset;
  return d;
}

/// out = residual + dropout(branch) (written).
Tensor residual_add(const Tensor& branch, const Tensor& residual, const MicroBatch& mb,
                    const ModelRuntime& rt, float p, uint32_t site, int64_t row_offset) {
  Tensor out = Tensor::empty(residual.shape(), residual.dtype(), rt.stream);
  if (p > 0) {
    ops::dropout_add_forward(branch, residual, out, dropout_args(mb, rt, p, site, row_offset), rt.stream);
  } else {
    ops::add(branch, residual, out, rt.stream);
  }
  return out;
}

/// The branch's gradient: dropout's backward of the residual gradient (or the gradient itself).
Tensor branch_grad(const Tensor& dy, const MicroBatch& mb, const ModelRuntime& rt, float p,
                   uint32_t site, int64_t row_offset) {
  if (p <= 0) return dy;
  Tensor d = Tensor::empty(dy.shape(), dy.dtype(), rt.stream);
  ops::dropout_backward(dy, d, dropout_args(mb, rt, p, site, row_offset), rt.stream);
  return d;
}

}  // namespace

TransformerLayer::TransformerLayer(const TransformerConfig& config, int layer_number,
                                   ParameterStore& store, const ModelParallel& mp)
    : cfg_(config), layer_(layer_number), mp_(mp) {
  const int first_handle = static_cast<int>(store.descs().size());
  const std::string p = layer_prefix(layer_number);
  const int64_t h = config.hidden_size;
  // Under sequence parallelism each rank normalises only its rows: partial gradients.
  const TpSlice norm{.split = TpSplit::Replicated, .rank = mp.tp.rank, .size = mp.tp.size,
                     .partial_grad = mp.sequence_parallel};
  norm1_ = NormLayer(config.normalization, config.norm_epsilon, p + "input_layernorm", h, store, norm);
  // FP8 linears (docs/fp8.md): not in the bf16 first/last layers. MoE layers run their experts
  // and shared experts in FP8 too; the router stays in the activation dtype.
  ModelParallel fp8_mp = mp;
  if (mp.fp8 && !mp.fp8->fp8_layer(layer_number)) fp8_mp.fp8 = nullptr;
  attention_ = SelfAttention(config, layer_number, p, store, fp8_mp);
  norm2_ = NormLayer(config.normalization, config.norm_epsilon, p + "pre_mlp_layernorm", h, store, norm);
  if (config.moe.is_moe_layer(layer_number)) ffn_ = MoeLayer(config, layer_number, p, store, fp8_mp);
  else ffn_ = Mlp(config, p, store, fp8_mp);
  for (int i = first_handle; i < static_cast<int>(store.descs().size()); ++i) handles_.push_back(i);
}

Tensor TransformerLayer::ffn_forward(const Tensor& x, const MicroBatch& mb, LayerRecord& rec,
                                     const ModelRuntime& rt) const {
  if (const Mlp* mlp = std::get_if<Mlp>(&ffn_)) return mlp->forward(x, mb, rec.mlp, rt);
  return std::get<MoeLayer>(ffn_).forward(x, mb, rec.moe, rt);
}

Tensor TransformerLayer::forward(const Tensor& x, const MicroBatch& mb, LayerRecord& rec,
                                 const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t row_offset = mp_.local_row_offset(mb.tokens());
  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (rt.hooks) rt.hooks->params_needed(handles_);
  rec.x_in = x;
  // Without hidden dropout on one tensor-parallel rank, each branch is added to the residual
  // stream by its output projection's GEMM (beta = 1 with x as the addend: the sum rounded once,
  // no add pass); otherwise dropout's add, or the add fused into the next norm.
  const bool add_in_gemm = p <= 0 && !mp_.tp.enabled();
  Tensor normed = norm1_.forward(x, rec.norm1, s);
  Tensor norm2_out;
  if (add_in_gemm) {
    const Tensor context = attention_.context(normed, mb, rec.attention, rt);
    normed = Tensor();
    rec.x_mid = Tensor::empty(x.shape(), x.dtype(), s);
    attention_.project_add(context, x, rec.x_mid, s);
    norm2_out = norm2_.forward(rec.x_mid, rec.norm2, s);
  } else {
    Tensor attn = attention_.forward(normed, mb, rec.attention, rt);
    normed = Tensor();
    if (p > 0) {
      rec.x_mid = residual_add(attn, x, mb, rt, p, 2 * layer_ + 1, row_offset);
      norm2_out = norm2_.forward(rec.x_mid, rec.norm2, s);
    } else {  // no hidden dropout: the residual add fused into the next norm (one pass)
      rec.x_mid = Tensor::empty(x.shape(), x.dtype(), s);
      norm2_out = norm2_.forward_add(attn, x, rec.x_mid, rec.norm2, s);
    }
  }
  Tensor out, mlp;
  const Mlp* dense = std::get_if<Mlp>(&ffn_);
  if (add_in_gemm && dense != nullptr) {
    out = Tensor::empty(x.shape(), x.dtype(), s);
    dense->forward_add(norm2_out, mb, rec.mlp, rt, rec.x_mid, out);
  } else {
    mlp = ffn_forward(norm2_out, mb, rec, rt);
  }
  norm2_out = Tensor();
  if (cfg_.recompute_norms && !mp_.sequence_parallel) {
    // --recompute-modules layernorm: the norm outputs (the QKV and fc1 inputs their weight
    // gradients need) are recomputed in backward from the saved norm inputs (x_in, x_mid)
    // instead of kept. (Under sequence parallelism they are gathered over TP, which a
    // recomputation would repeat.) An MoE layer keeps its input in rec.moe (router and experts
    // read it). In FP8 this drops the inputs' column-wise codes, made in the forward's quantize
    // pass: backward quantizes the recomputed outputs again.
    rec.attention.x_full = rec.mlp.x_full = {};
  }
  if (mlp.defined()) out = residual_add(mlp, rec.x_mid, mb, rt, p, 2 * layer_ + 2, row_offset);
  if (rt.hooks) rt.hooks->params_done(handles_);
  return out;
}

Tensor TransformerLayer::forward_inference(Tensor& residual, const Tensor& branch, const MicroBatch& mb,
                                           const ModelRuntime& rt, const Tensor& keep_rows) const {
  MDLM_CHECK(rt.forward_only && !rt.training, "TransformerLayer::forward_inference is for inference only");
  MDLM_CHECK(!keep_rows.defined() || splits_inference(), "layer ", layer_,
             ": forward_inference keeps rows only for a dense MLP on one tensor-parallel rank");
  if (splits_inference()) {
    // Both branches are added into the residual stream by their output projections' GEMMs
    // (C += A B: the sum rounded once, no add pass; the norms then read one tensor). The last
    // layer projects only the kept rows.
    Tensor context = attention_inference(residual, branch, mb, rt);
    finish_inference(residual, std::move(context), mb, rt, keep_rows);
    return Tensor();  // everything is in the residual
  }
  const Stream& s = rt.stream;
  LayerRecord rec;  // what the sublayers save, dropped with this frame
  if (rt.hooks) rt.hooks->params_needed(handles_);
  Tensor x = residual;
  Tensor normed;
  if (branch.defined()) {
    x = Tensor::empty(residual.shape(), residual.dtype(), s);
    normed = norm1_.forward_add(branch, residual, x, rec.norm1, s);
  } else {
    normed = norm1_.forward(x, rec.norm1, s);
  }
  // MoE or TP (keep_rows is refused above): the MLP output goes back to the caller.
  Tensor attn = attention_.forward(normed, mb, rec.attention, rt);
  normed = Tensor();
  residual = Tensor::empty(x.shape(), x.dtype(), s);
  Tensor norm2_out = norm2_.forward_add(attn, x, residual, rec.norm2, s);
  attn = x = Tensor();
  Tensor mlp = ffn_forward(norm2_out, mb, rec, rt);
  if (rt.hooks) rt.hooks->params_done(handles_);
  return mlp;
}

bool TransformerLayer::splits_inference() const { return std::holds_alternative<Mlp>(ffn_) && !mp_.tp.enabled(); }

Tensor TransformerLayer::attention_inference(Tensor& residual, const Tensor& branch, const MicroBatch& mb,
                                             const ModelRuntime& rt) const {
  MDLM_CHECK(rt.forward_only && !rt.training && splits_inference(), "layer ", layer_,
             ": attention_inference is inference of a dense layer on one tensor-parallel rank");
  const Stream& s = rt.stream;
  LayerRecord rec;  // what the sublayers save, dropped with this frame
  if (rt.hooks) rt.hooks->params_needed(handles_);
  Tensor normed;
  if (branch.defined()) {
    Tensor x = Tensor::empty(residual.shape(), residual.dtype(), s);
    normed = norm1_.forward_add(branch, residual, x, rec.norm1, s);
    residual = x;
  } else {
    normed = norm1_.forward(residual, rec.norm1, s);
  }
  return attention_.context(normed, mb, rec.attention, rt);
}

void TransformerLayer::finish_inference(Tensor& residual, Tensor context, const MicroBatch& mb,
                                        const ModelRuntime& rt, const Tensor& keep_rows) const {
  MDLM_CHECK(rt.forward_only && !rt.training && splits_inference(), "layer ", layer_,
             ": finish_inference is inference of a dense layer on one tensor-parallel rank");
  const Stream& s = rt.stream;
  LayerRecord rec;
  Tensor x = residual;
  if (keep_rows.defined()) {
    context = ops::gather_rows(context, keep_rows, s);
    x = ops::gather_rows(x, keep_rows, s);
  }
  attention_.project_add(context, x, x, s);
  context = Tensor();
  const Tensor norm2_out = norm2_.forward(x, rec.norm2, s);
  std::get<Mlp>(ffn_).forward_add(norm2_out, mb, rec.mlp, rt, x, x);
  residual = x;
  if (rt.hooks) rt.hooks->params_done(handles_);
}

Tensor TransformerLayer::backward(const Tensor& dy, const MicroBatch& mb, LayerRecord& rec,
                                  const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t row_offset = mp_.local_row_offset(mb.tokens());
  const float p = rt.training ? cfg_.hidden_dropout : 0.0f;
  if (rt.hooks) rt.hooks->backward_needed(handles_);

  // MLP block: out = x_mid + dropout(mlp(norm2(x_mid))).
  Tensor dbranch = branch_grad(dy, mb, rt, p, 2 * layer_ + 2, row_offset);
  Tensor dnorm2;
  if (const Mlp* dense = std::get_if<Mlp>(&ffn_)) {
    if (!rec.mlp.x_full.defined()) rec.mlp.x_full.x = norm2_.forward(rec.x_mid, rec.norm2, s);
    dnorm2 = dense->backward(dbranch, mb, rec.mlp, rt);
  } else {
    dnorm2 = std::get<MoeLayer>(ffn_).backward(dbranch, mb, rec.moe, rt);
  }
  dbranch = Tensor();
  Tensor dx_mid = norm2_.backward_add(dnorm2, dy, rec.norm2, s);  // + the residual path
  dnorm2 = Tensor();

  // Attention block: x_mid = x + dropout(attention(norm1(x))).
  if (!rec.attention.x_full.defined()) rec.attention.x_full.x = norm1_.forward(rec.x_in, rec.norm1, s);
  Tensor dnorm1 = attention_.backward(branch_grad(dx_mid, mb, rt, p, 2 * layer_ + 1, row_offset), mb,
                                      rec.attention, rt);
  Tensor dx = norm1_.backward_add(dnorm1, dx_mid, rec.norm1, s);
  rec = LayerRecord{};
  if (rt.hooks) {
    rt.hooks->grads_ready(handles_);
    rt.hooks->backward_done(handles_);
  }
  return dx;
}

}  // namespace megadlm
