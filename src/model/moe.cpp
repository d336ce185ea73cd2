#include "megadlm/model/moe.h"
#include <algorithm>
#include <cmath>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/fp8_gemm.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/expert_parallel/communication.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"

namespace megadlm {

namespace {

std::string expert_name(const std::string& prefix, int expert, const char* part) {
  return prefix + std::to_string(expert) + "." + part;
}

/// Rows of the micro-batch's T rows that TP rank r holds under SP (padding excluded).
int64_t valid_rows(int64_t tokens, int rank, int size, bool sp) {
  if (!sp) return tokens;
  const int64_t shard = shard_rows(tokens, size);
  return std::clamp<int64_t>(tokens - shard * rank, 0, shard);
}

/// Under CP with padded sequences (cp::padded_length): each of this rank's `local_rows` rows
/// (its SP shard of the B·S/cp CP-local rows, rows past them SP padding) mapped to its index
/// among the real tokens, or -1 for padding. Empty when the micro-batch has no CP padding: the
/// real rows are then the first valid_rows() rows.
std::vector<int32_t> cp_compaction(const MicroBatch& mb, int64_t local_rows, const ModelParallel& mp) {
  if (!mb.cp || mb.unpadded_seq <= 0 || mb.unpadded_seq >= mb.cp->seq()) return {};
  const cp::Split& split = mb.cp->split();
  const int64_t held = valid_rows(mb.tokens(), mp.tp.rank, mp.tp.size, mp.sequence_parallel);
  const int64_t first = mp.local_row_offset(mb.tokens());
  std::vector<int32_t> map(static_cast<size_t>(local_rows), -1);
  int32_t next = 0;
  for (int64_t j = 0; j < held; ++j)
    if (split.global((first + j) % mb.seq) < mb.unpadded_seq) map[static_cast<size_t>(j)] = next++;
  return map;
}

/// stats[layer, col .. col + n) += v (v: [n] or [1, n] of the stats dtype).
void add_stat(MoeStepState& st, int layer, int64_t col, const Tensor& v, const Stream& s) {
  const int64_t cols = st.stats.cols();
  Tensor slot = st.stats.slice_flat(layer * cols + col, {v.numel()});
  ops::add(slot, v.view({v.numel()}), slot, s);
}

}  // namespace

// ------------------------------------------------------------------------------ MoeStepState

MoeStepState::MoeStepState(const TransformerConfig& config, DType stat_dtype, const Stream& stream)
    : num_experts(config.moe.num_experts) {
  stats = Tensor::zeros({config.num_layers, stat_columns(num_experts)}, stat_dtype, stream);
  expert_bias.resize(static_cast<size_t>(config.num_layers));
  if (config.moe.expert_bias)
    for (int l = 0; l < config.num_layers; ++l)
      if (config.moe.is_moe_layer(l)) expert_bias[static_cast<size_t>(l)] = Tensor::zeros({num_experts}, DType::F32, stream);
}

void MoeStepState::begin_step(const Stream& stream) { ops::fill(stats, 0.0f, stream); }

// ------------------------------------------------------------------------------ MoeRouter

MoeRouter::MoeRouter(const TransformerConfig& config, int, const std::string& prefix,
                     ParameterStore& store, const ModelParallel& mp)
    : store_(&store) {
  // Replicated over TP; under SP each rank routes only its rows: partial gradients.
  const TpSlice slice{.split = TpSplit::Replicated, .rank = mp.tp.rank, .size = mp.tp.size,
                      .partial_grad = mp.sequence_parallel};
  weight_ = store.add(prefix + "weight", {config.moe.num_experts, config.hidden_size},
                      {.init = {InitKind::Normal, config.init_method_std}, .tp = slice});
}

// ------------------------------------------------------------------------------ MoeExperts

MoeExperts::MoeExperts(const TransformerConfig& config, const std::string& prefix, int first_expert,
                       int local_experts, ParameterStore& store, const ModelParallel& mp)
    : store_(&store), activation_(config.activation), grouped_(config.moe.grouped_gemm),
      local_(local_experts) {
  const int64_t f = config.moe.ffn_hidden_size, h = config.hidden_size;
  const ParallelGroup& etp = mp.expert_tp;
  MDLM_CHECK(f > 0 && f % etp.size == 0, prefix, ": the expert width ", f,
             " does not split over ", etp.size, " expert-tensor-parallel ranks");
  ffn_ = f / etp.size;
  fc2_bias_here_ = etp.rank == 0;
  const ParamInit init{InitKind::Normal, config.init_method_std};
  const ParamInit out_init{InitKind::Normal,
                           config.init_method_std / std::sqrt(2.0f * config.num_layers)};
  const ParamInit zero{InitKind::Zeros, 0.0f};
  const TpSlice column{.split = TpSplit::Rows, .rank = etp.rank, .size = etp.size};
  const TpSlice row{.split = TpSplit::Cols, .rank = etp.rank, .size = etp.size};
  const TpSlice replicated{.split = TpSplit::Replicated, .rank = etp.rank, .size = etp.size};
  const bool swiglu = activation_ == MlpActivation::SwiGLU;
  auto add = [&](const std::string& name, const Shape& shape, ParamSpec spec,
                 ParameterStore::Handle& first, ParameterStore::Handle& last) {
    spec.expert = true;
    const ParameterStore::Handle hd = store.add(name, shape, spec);
    if (first < 0) first = hd;
    last = hd;
  };
  // One fused matrix per kind over the local experts, in expert order.
  for (int e = 0; e < local_; ++e) {
    const int g = first_expert + e;
    if (swiglu) {
      add(expert_name(prefix, g, "linear_fc1_gate.weight"), {f, h},
          {.init = init, .fuse_with_previous = e > 0, .tp = column}, w1_first_, w1_last_);
      add(expert_name(prefix, g, "linear_fc1_up.weight"), {f, h},
          {.init = init, .fuse_with_previous = true, .tp = column}, w1_first_, w1_last_);
    } else {
      add(expert_name(prefix, g, "linear_fc1.weight"), {f, h},
          {.init = init, .fuse_with_previous = e > 0, .tp = column}, w1_first_, w1_last_);
    }
  }
  for (int e = 0; e < local_; ++e)
    add(expert_name(prefix, first_expert + e, "linear_fc2.weight"), {h, f},
        {.init = out_init, .fuse_with_previous = e > 0, .tp = row}, w2_first_, w2_last_);
  if (mp.fp8) {
    // FP8 expert GEMMs (docs/fp8.md, "MoE experts"). Scales: one per expert weight, and one
    // per layer for each operand of the fc1 / fc2 GEMMs over all experts' rows of a micro-batch.
    // Every rank registers every expert's weight under its global name, so each rank of a
    // stage holds the same list (the packed delayed-scaling reduction and the checkpoint need
    // that); a rank casts only its own experts, the others' amaxes arrive by the reduction.
    MDLM_CHECK(!mp.fp8->blockwise(), "MoE experts with --fp8-recipe blockwise are not built (their token "
               "counts per expert are not multiples of 128; rule FP8-7 refuses the combination)");
    fp8_ = mp.fp8;
    auto add_gemm = [&](Fp8Gemm& g, const std::string& part) {
      g.input = fp8_->add(prefix + part + ".input", Fp8State::Role::Input);
      g.grad_output = fp8_->add(prefix + part + ".grad_output", Fp8State::Role::GradOutput);
      for (int e = 0; e < config.moe.num_experts; ++e) {
        const int slot = fp8_->add(expert_name(prefix, e, part.c_str()) + ".weight", Fp8State::Role::Weight);
        if (e >= first_expert && e < first_expert + local_) {
          g.weight.push_back(slot);
          fp8_->add_cast_weight((part == "linear_fc2" ? 1 : swiglu ? 2 : 1) * ffn_ * h);
        }
      }
    };
    add_gemm(fc1_, swiglu ? "linear_fc1_gate" : "linear_fc1");
    add_gemm(fc2_, "linear_fc2");
    ep_ = mp.ep.get();
    etp_ = mp.expert_tp.get();
    tp_ = mp.tp.get();
    cp_ = mp.cp.get();
    sources_ = mp.expert_tp.size * mp.ep.size;
    self_source_ = mp.expert_tp.rank * mp.ep.size + mp.ep.rank;
  }
  if (config.add_bias_linear) {
    const ParamSpec bias{.init = zero, .weight_decay = false, .tp = column};
    auto fused = [](ParamSpec spec, bool fuse) {
      spec.fuse_with_previous = fuse;
      return spec;
    };
    for (int e = 0; e < local_; ++e) {
      const int g = first_expert + e;
      if (swiglu) {
        add(expert_name(prefix, g, "linear_fc1_gate.bias"), {f}, fused(bias, e > 0), b1_first_, b1_last_);
        add(expert_name(prefix, g, "linear_fc1_up.bias"), {f}, fused(bias, true), b1_first_, b1_last_);
      } else {
        add(expert_name(prefix, g, "linear_fc1.bias"), {f}, fused(bias, e > 0), b1_first_, b1_last_);
      }
    }
    for (int e = 0; e < local_; ++e)
      add(expert_name(prefix, first_expert + e, "linear_fc2.bias"), {h},
          {.init = zero, .weight_decay = false, .fuse_with_previous = e > 0, .tp = replicated}, b2_first_,
          b2_last_);
  }
}

void MoeExperts::gemm_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                              const std::vector<int64_t>& rows, const Stream& s) const {
  if (grouped_) {
    ops::grouped_gemm(x, w, y, rows, {.trans_b = true, .bias = bias}, s);
    return;
  }
  // One GEMM per expert (Megatron's SequentialMLP): the same products, the same order.
  const int64_t out = w.rows() / local_;
  int64_t r = 0;
  for (int e = 0; e < local_; ++e) {
    const int64_t n = rows[static_cast<size_t>(e)];
    if (n > 0) {
      Tensor ye = y.narrow(r, n);
      Tensor be;
      if (bias) be = bias->slice_flat(e * out, {out});
      ops::gemm(x.narrow(r, n), w.slice_flat(e * out * w.cols(), {out, w.cols()}), ye,
                {.trans_b = true, .bias = bias ? &be : nullptr}, s);
    }
    r += n;
  }
}

void MoeExperts::gemm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw,
                               Tensor* db, Tensor& dx, const std::vector<int64_t>& rows,
                               const Stream& s) const {
  const int64_t out = w.rows() / local_;
  if (grouped_) {
    ops::grouped_gemm(dy, w, dx, rows, {}, s);
    ops::grouped_gemm(dy, x, dw, rows, {.trans_a = true, .beta = 1.0f}, s);
  } else {
    int64_t r = 0;
    for (int e = 0; e < local_; ++e) {
      const int64_t n = rows[static_cast<size_t>(e)];
      if (n > 0) {
        Tensor dxe = dx.narrow(r, n);
        Tensor dwe = dw.slice_flat(e * out * w.cols(), {out, w.cols()});
        ops::gemm(dy.narrow(r, n), w.slice_flat(e * out * w.cols(), {out, w.cols()}), dxe, {}, s);
        ops::gemm(dy.narrow(r, n), x.narrow(r, n), dwe, {.trans_a = true, .beta = 1.0f}, s);
      }
      r += n;
    }
  }
  if (db) bias_grad(dy, *db, rows, s);
}

void MoeExperts::bias_grad(const Tensor& dy, Tensor& db, const std::vector<int64_t>& rows, const Stream& s) const {
  const int64_t out = db.numel() / local_;
  int64_t r = 0;
  for (int e = 0; e < local_; ++e) {
    const int64_t n = rows[static_cast<size_t>(e)];
    if (n > 0) {
      Tensor dbe = db.slice_flat(e * out, {out});
      ops::sum_rows(dy.narrow(r, n), dbe, s);
    }
    r += n;
  }
}


// ------------------------------------------------------------------------------ FP8 experts

const std::vector<ops::Fp8Tensor>& MoeExperts::fp8_weights(const Fp8Gemm& g, const Tensor& w,
                                                           const Stream& s) const {
  if (g.generation == fp8_->generation() && g.cache.size() == static_cast<size_t>(local_)) return g.cache;
  // Row-wise codes only, kept through the step; fp8_backward transposes them for its data-gradient
  // GEMMs while they run (a byte a weight element kept, not two). The last step's go first.
  const int64_t out = w.rows() / local_;
  g.cache.clear();
  g.cache.assign(static_cast<size_t>(local_), ops::Fp8Tensor{});
  for (int e = 0; e < local_; ++e) {
    const int slot = g.weight[static_cast<size_t>(e)];
    const ops::Fp8Type type = fp8_->type(slot);
    const Tensor we = w.slice_flat(e * out * w.cols(), {out, w.cols()});
    ops::Fp8Tensor& q = g.cache[static_cast<size_t>(e)];
    if (fp8_->delayed()) {
      Tensor amax = fp8_->amax(slot, s);
      q = ops::fp8_quantize(we, fp8_->scale(slot, s), type, /*columnwise=*/false, &amax, s);
      continue;
    }
    // Tensorwise: the expert's whole weight, all its expert-TP pieces.
    Tensor amax = Tensor::zeros({1}, DType::F32, s);
    ops::fp8_amax(we, amax, s);
    if (etp_ != nullptr) etp_->all_reduce(amax, comm::ReduceOp::Max, s);
    Tensor scale = Tensor::empty({1}, DType::F32, s);
    ops::fp8_scale_from_amax(amax, scale, type, s);
    q = ops::fp8_quantize(we, scale, type, /*columnwise=*/false, nullptr, s);
  }
  g.generation = fp8_->generation();
  return g.cache;
}

Tensor MoeExperts::fp8_scales(int slot, const Tensor& x, const std::vector<int64_t>& source_rows,
                              const Stream& s) const {
  if (fp8_->delayed()) return fp8_->scale(slot, s);
  // 1. Each source's amax over this rank's rows of it, then over the expert-TP x EP grid: the
  //    source's rows go to that grid only, so v[src] is the amax of everything it sent.
  Tensor v = Tensor::zeros({sources_, 1}, DType::F32, s);
  int64_t r = 0;
  for (size_t i = 0; i < source_rows.size(); ++i) {
    const int64_t n = source_rows[i];
    if (n == 0) continue;
    Tensor a = v.narrow(static_cast<int64_t>(i % static_cast<size_t>(sources_)), 1);
    ops::fp8_amax(x.narrow(r, n), a, s);
    r += n;
  }
  for (comm::Communicator* g : {ep_, etp_})
    if (g != nullptr) g->all_reduce(v, comm::ReduceOp::Max, s);
  // 2. This rank's micro-batch is also held in pieces by its TP (SP) and CP peers: their sent
  //    rows join its amax, the amax of the logical tensor.
  Tensor mine = Tensor::zeros({1, 1}, DType::F32, s);
  Tensor own = v.narrow(self_source_, 1);
  ops::copy(own, mine, s);
  for (comm::Communicator* g : {tp_, cp_})
    if (g != nullptr) g->all_reduce(mine, comm::ReduceOp::Max, s);
  // 3. Every source's amax back to the grid (one non-zero entry per member, MAX-reduced).
  Tensor per_source = v;
  if (sources_ > 1) {
    per_source = Tensor::zeros({sources_, 1}, DType::F32, s);
    Tensor at = per_source.narrow(self_source_, 1);
    ops::copy(mine, at, s);
    for (comm::Communicator* g : {ep_, etp_})
      if (g != nullptr) g->all_reduce(per_source, comm::ReduceOp::Max, s);
  } else {
    per_source = mine;
  }
  Tensor scales = Tensor::empty({sources_, 1}, DType::F32, s);
  ops::fp8_scale_from_amax(per_source, scales, fp8_->type(slot), s);
  return scales;
}

ops::Fp8Tensor MoeExperts::fp8_cast(int slot, const Tensor& x, const Tensor& scale, bool columnwise,
                                    bool pad, bool record_amax, const Stream& s) const {
  Tensor src = x;
  if (pad && x.rows() % 16 != 0) {
    src = Tensor::zeros({(x.rows() + 15) / 16 * 16, x.cols()}, x.dtype(), s);
    Tensor head = src.narrow(0, x.rows());
    ops::copy(x, head, s);
  }
  Tensor amax;
  if (record_amax && fp8_->delayed()) amax = fp8_->amax(slot, s);
  return ops::fp8_quantize(src, scale, fp8_->type(slot), columnwise, amax.defined() ? &amax : nullptr, s);
}

namespace {
Tensor scale_of(const Tensor& scales, size_t chunk, int sources) {
  return scales.numel() == 1 ? scales : scales.narrow(static_cast<int64_t>(chunk % static_cast<size_t>(sources)), 1);
}
}  // namespace

void MoeExperts::fp8_forward(const Fp8Gemm& g, const Tensor& x, const Tensor& scales, const Tensor& w,
                             const Tensor* bias, Tensor& y, const std::vector<int64_t>& source_rows,
                             const Stream& s) const {
  const std::vector<ops::Fp8Tensor>& wq = fp8_weights(g, w, s);
  const int64_t out = w.rows() / local_;
  int64_t r = 0;
  for (size_t i = 0; i < source_rows.size(); ++i) {
    const int64_t n = source_rows[i];
    if (n == 0) continue;  // an empty expert or source: no GEMM
    const size_t e = i / static_cast<size_t>(sources_);
    const ops::Fp8Tensor xq = fp8_cast(g.input, x.narrow(r, n), scale_of(scales, i, sources_),
                                       /*columnwise=*/false, /*pad=*/false, /*record_amax=*/true, s);
    Tensor yc = y.narrow(r, n);
    Tensor be;
    if (bias) be = bias->slice_flat(static_cast<int64_t>(e) * out, {out});
    ops::fp8_gemm(xq, wq[e], yc, {.trans_b = true, .bias = bias ? &be : nullptr}, s);
    r += n;
  }
}

void MoeExperts::fp8_backward(const Fp8Gemm& g, const Tensor& dy, const Tensor& x, const Tensor& x_scales,
                              const Tensor& w, Tensor& dw, Tensor& dx, const std::vector<int64_t>& source_rows,
                              const Stream& s) const {
  const std::vector<ops::Fp8Tensor>& wq = fp8_weights(g, w, s);
  const Tensor dy_scales = fp8_scales(g.grad_output, dy, source_rows, s);
  const bool wgrad = fp8_->settings().wgrad;
  const int64_t out = w.rows() / local_;
  // The transposed codes of the expert whose chunks are running (an expert's chunks are
  // consecutive): one expert's at a time.
  ops::Fp8Tensor wt;
  size_t wt_expert = static_cast<size_t>(local_);
  int64_t r = 0;
  for (size_t i = 0; i < source_rows.size(); ++i) {
    const int64_t n = source_rows[i];
    if (n == 0) continue;
    const size_t e = i / static_cast<size_t>(sources_);
    if (wt_expert != e) {
      wt = {};  // the last expert's go first
      wt = ops::fp8_columnwise(wq[e], s);
      wt_expert = e;
    }
    const Tensor dyc = dy.narrow(r, n), xc = x.narrow(r, n);
    const Tensor dy_scale = scale_of(dy_scales, i, sources_);
    // On CUDA the weight-gradient GEMM's K is the chunk's rows: a multiple of 16, else its
    // operands are quantized again with zero rows appended (the same codes, padding adds 0).
    const bool aligned = !s.is_cuda() || n % 16 == 0;
    const ops::Fp8Tensor dq = fp8_cast(g.grad_output, dyc, dy_scale, /*columnwise=*/wgrad && aligned,
                                       /*pad=*/false, /*record_amax=*/true, s);
    Tensor dxc = dx.narrow(r, n);
    ops::fp8_gemm(dq, wt, dxc, {}, s);
    Tensor dwe = dw.slice_flat(static_cast<int64_t>(e) * out * w.cols(), {out, w.cols()});
    if (!wgrad) {  // --no-fp8-wgrad
      ops::gemm(dyc, xc, dwe, {.trans_a = true, .beta = 1.0f}, s);
    } else {
      const ops::Fp8Tensor dqt =
          aligned ? dq : fp8_cast(g.grad_output, dyc, dy_scale, true, /*pad=*/true, false, s);
      const ops::Fp8Tensor xq =
          fp8_cast(g.input, xc, scale_of(x_scales, i, sources_), true, /*pad=*/!aligned, false, s);
      ops::fp8_gemm(dqt, xq, dwe, {.trans_a = true, .beta = 1.0f}, s);  // fp32 main grad, accumulated
    }
    r += n;
  }
}

// ------------------------------------------------------------------------------ MoeExperts forward
Tensor MoeExperts::forward(const Tensor& x, const std::vector<int64_t>& rows, Saved& saved,
                           const Stream& s) const {
  saved.x = x;
  saved.rows = rows;
  const int64_t n = x.rows();
  Tensor y = Tensor::empty({n, x.cols()}, x.dtype(), s);
  if (fp8()) {
    MDLM_CHECK(saved.source_rows.size() == static_cast<size_t>(local_) * static_cast<size_t>(sources_),
               "MoE experts (FP8): ", saved.source_rows.size(), " source chunks for ", local_,
               " experts x ", sources_, " sources");
    int64_t chunk_rows = 0;
    for (const int64_t c : saved.source_rows) chunk_rows += c;
    MDLM_CHECK(chunk_rows == n, "MoE experts (FP8): the source chunks hold ", chunk_rows, " rows, the input ", n);
    if (n == 0) {
      // Still a member of the tensorwise reductions, in the same order as with rows, and the
      // weights are cast (their delayed amaxes recorded) as on a rank with rows.
      saved.fc1_scales = fp8_scales(fc1_.input, x, saved.source_rows, s);
      fp8_weights(fc1_, store_->param_span(w1_first_, w1_last_), s);
      saved.fc2_scales = fp8_scales(fc2_.input, x, saved.source_rows, s);
      fp8_weights(fc2_, store_->param_span(w2_first_, w2_last_), s);
      return y;
    }
  } else if (n == 0) {
    return y;  // no rows for this rank's experts (kernels need work)
  }
  Tensor w1 = store_->param_span(w1_first_, w1_last_);
  Tensor b1, b2;
  if (b1_first_ >= 0) b1 = store_->param_span(b1_first_, b1_last_);
  if (b2_first_ >= 0 && fc2_bias_here_) b2 = store_->param_span(b2_first_, b2_last_);
  saved.fc1_out = Tensor::empty({n, w1.rows() / local_}, x.dtype(), s);
  if (fp8()) {
    saved.fc1_scales = fp8_scales(fc1_.input, x, saved.source_rows, s);
    fp8_forward(fc1_, x, saved.fc1_scales, w1, b1.defined() ? &b1 : nullptr, saved.fc1_out, saved.source_rows, s);
  } else {
    gemm_forward(x, w1, b1.defined() ? &b1 : nullptr, saved.fc1_out, rows, s);
  }
  saved.act_out = Tensor::empty({n, ffn_}, x.dtype(), s);
  if (activation_ == MlpActivation::SwiGLU) ops::swiglu_forward(saved.fc1_out, saved.act_out, s);
  else ops::gelu_forward(saved.fc1_out, saved.act_out, s);
  const Tensor w2 = store_->param_span(w2_first_, w2_last_);
  if (fp8()) {
    saved.fc2_scales = fp8_scales(fc2_.input, saved.act_out, saved.source_rows, s);
    fp8_forward(fc2_, saved.act_out, saved.fc2_scales, w2, b2.defined() ? &b2 : nullptr, y, saved.source_rows, s);
  } else {
    gemm_forward(saved.act_out, w2, b2.defined() ? &b2 : nullptr, y, rows, s);
  }
  return y;
}

Tensor MoeExperts::backward(const Tensor& dy, Saved& saved, const Stream& s) const {
  const int64_t n = dy.rows();
  Tensor dx = Tensor::empty({n, dy.cols()}, dy.dtype(), s);
  if (n == 0) {
    if (fp8() && !fp8_->delayed()) {  // the tensorwise reductions of the two gradients
      fp8_scales(fc2_.grad_output, dy, saved.source_rows, s);
      fp8_scales(fc1_.grad_output, dy, saved.source_rows, s);
    }
    saved = Saved{};
    return dx;
  }
  Tensor db1, db2;
  if (b1_first_ >= 0) db1 = store_->grad_span(b1_first_, b1_last_);
  if (b2_first_ >= 0) db2 = store_->grad_span(b2_first_, b2_last_);
  Tensor dw2 = store_->grad_span(w2_first_, w2_last_);
  Tensor dact = Tensor::empty(saved.act_out.shape(), dy.dtype(), s);
  if (fp8()) {
    fp8_backward(fc2_, dy, saved.act_out, saved.fc2_scales, store_->param_span(w2_first_, w2_last_), dw2,
                 dact, saved.source_rows, s);
    if (db2.defined()) bias_grad(dy, db2, saved.rows, s);
  } else {
    gemm_backward(dy, saved.act_out, store_->param_span(w2_first_, w2_last_), dw2,
                  db2.defined() ? &db2 : nullptr, dact, saved.rows, s);
  }
  saved.act_out = Tensor();
  Tensor dfc1 = Tensor::empty(saved.fc1_out.shape(), dy.dtype(), s);
  if (activation_ == MlpActivation::SwiGLU) ops::swiglu_backward(dact, saved.fc1_out, dfc1, s);
  else ops::gelu_backward(dact, saved.fc1_out, dfc1, s);
  saved.fc1_out = Tensor();
  dact = Tensor();
  Tensor dw1 = store_->grad_span(w1_first_, w1_last_);
  if (fp8()) {
    fp8_backward(fc1_, dfc1, saved.x, saved.fc1_scales, store_->param_span(w1_first_, w1_last_), dw1, dx,
                 saved.source_rows, s);
    if (db1.defined()) bias_grad(dfc1, db1, saved.rows, s);
  } else {
    gemm_backward(dfc1, saved.x, store_->param_span(w1_first_, w1_last_), dw1,
                  db1.defined() ? &db1 : nullptr, dx, saved.rows, s);
  }
  saved = Saved{};
  return dx;
}

// ------------------------------------------------------------------------------ MoeLayer

MoeLayer::MoeLayer(const TransformerConfig& config, int layer, const std::string& prefix,
                   ParameterStore& store, const ModelParallel& mp)
    : cfg_(config.moe), layer_(layer), hidden_(config.hidden_size), mp_(mp), store_(&store) {
  MDLM_CHECK(cfg_.num_experts > 0, "MoeLayer without experts");
  router_ = MoeRouter(config, layer, prefix + "mlp.router.", store, mp);
  const auto kind = cfg_.dispatcher == MoeDispatcher::AllToAll ? ep::DispatcherKind::AllToAll
                                                               : ep::DispatcherKind::AllGather;
  dispatcher_ = std::make_shared<const ep::TokenDispatcher>(kind, cfg_.num_experts, mp, /*source_chunks=*/mp.fp8 != nullptr);
  experts_ = MoeExperts(config, prefix + "mlp.experts.", dispatcher_->first_expert(),
                        dispatcher_->local_experts(), store, mp);
  shared_ = cfg_.shared_expert_size > 0;
  if (shared_) shared_mlp_ = Mlp(config, prefix + "mlp.shared_experts.", cfg_.shared_expert_size, store, mp);
}

ops::RouterTopkArgs MoeLayer::topk_args(bool training) const {
  ops::RouterTopkArgs a;
  a.topk = cfg_.topk;
  a.score = cfg_.score == MoeScoreFunction::Sigmoid ? ops::RouterScore::Sigmoid : ops::RouterScore::Softmax;
  a.pre_softmax = cfg_.pre_softmax;
  a.scaling = cfg_.topk_scaling_factor.value_or(1.0f);
  if (cfg_.num_groups > 0) {
    a.num_groups = cfg_.num_groups;
    a.group_topk = cfg_.group_topk;
  } else if (cfg_.topk_limited_devices > 0) {
    a.num_groups = mp_.ep.size;  // one group per EP rank: its experts
    a.group_topk = cfg_.topk_limited_devices;
    a.group_score = ops::RouterGroupScore::Max;
  }
  if (cfg_.load_balancing == MoeLoadBalancing::Sinkhorn) {
    // Megatron: the selection is Sinkhorn's (training), the probs the plain scores of the
    // selected experts: sigmoid for k = 1, else the softmax over all experts.
    a.selection = training ? ops::RouterSelection::Sinkhorn : ops::RouterSelection::TopK;
    a.pre_softmax = true;
    a.score = cfg_.topk == 1 ? ops::RouterScore::Sigmoid : ops::RouterScore::Softmax;
  }
  return a;
}

void MoeLayer::route(const MicroBatch& mb, Saved& saved, Tensor& probs, Tensor& dispatched,
                     const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t experts = cfg_.num_experts, k = cfg_.topk;
  const bool expert_choice = cfg_.load_balancing == MoeLoadBalancing::ExpertChoice;
  const bool capacity = cfg_.capacity_factor.has_value() && !expert_choice;
  // Choices across rows are made on the whole micro-batch, identically on every TP rank.
  const bool gathered = (expert_choice || capacity) && mp_.sequence_parallel;
  MDLM_CHECK(!(expert_choice || capacity) || !saved.compact.defined(), "MoE layer ", layer_,
             ": expert choice and capacity dropping cannot run on a CP shard with padding");
  Tensor logits = saved.logits;
  int64_t row0 = 0;
  if (gathered) {
    std::vector<int64_t> rows_of(static_cast<size_t>(mp_.tp.size));
    for (int r = 0; r < mp_.tp.size; ++r) rows_of[static_cast<size_t>(r)] = valid_rows(mb.tokens(), r, mp_.tp.size, true);
    logits = ep::all_gather_rows_uneven(saved.logits, rows_of, mp_.tp.get(), s);
    row0 = mp_.local_row_offset(mb.tokens());
  }
  const int64_t rows = logits.rows();
  const DType stat = logits.dtype();
  Tensor p_all, idx_all, kept_all;
  if (expert_choice) {
    p_all = Tensor::empty({rows, experts}, stat, s);
    idx_all = Tensor::empty({rows, experts}, DType::I32, s);
    const int64_t seq = cfg_.batch_level_expert_choice ? rows : mb.seq;
    const ops::ExpertChoiceArgs ec{.capacity = std::max<int64_t>(seq * k / experts, 1), .seq = seq,
                                   .score = cfg_.score == MoeScoreFunction::Sigmoid ? ops::RouterScore::Sigmoid
                                                                                     : ops::RouterScore::Softmax};
    ops::moe_expert_choice_forward(logits, p_all, idx_all, ec, s);
    if (rt.training) {
      // Its balancing loss: sum_t (sum_e softmax_over_rows(logits)_te) n_t / (E k), n_t the
      // experts that chose row t; gradient now (it needs every row), kept for these rows.
      Tensor per_row = Tensor::zeros({rows, experts}, stat, s);
      ops::moe_count_tokens(idx_all, per_row, {.rows_per_group = 1}, s);
      Tensor ones = Tensor::empty({experts, 1}, stat, s);
      ops::fill(ones, 1.0f, s);
      Tensor n = Tensor::empty({rows, 1}, stat, s);
      ops::gemm(per_row, ones, n, {}, s);
      Tensor value = Tensor::zeros({1}, stat, s);
      Tensor dl = Tensor::zeros({rows, experts}, stat, s);
      const float scale = rt.moe ? rt.moe->aux_grad_scale : 1.0f;
      const float grad = scale * cfg_.aux_loss_coeff / static_cast<float>(experts * k);
      ops::moe_expert_choice_aux(logits, n.view({rows}), value, dl, grad, s);
      saved.ec_dlogits = cfg_.aux_loss_coeff != 0.0f ? dl.narrow(row0, saved.rows) : Tensor();
      // Every TP rank holds the whole value; TP rank 0 reports it.
      if (rt.moe && rt.record_moe_stats && (!gathered || mp_.tp.rank == 0)) {
        ops::scale_inplace(value, 1.0f / static_cast<float>(experts * k), s);
        add_stat(*rt.moe, layer_, 2 * experts, value, s);
      }
    }
  } else {
    p_all = Tensor::empty({rows, k}, stat, s);
    idx_all = Tensor::empty({rows, k}, DType::I32, s);
    Tensor bias;
    if (rt.moe) bias = rt.moe->expert_bias[static_cast<size_t>(layer_)];
    ops::moe_router_topk_forward(logits, bias, p_all, idx_all, topk_args(rt.training), s);
    if (capacity) {
      // Megatron's get_capacity over the micro-batch's T·k slots.
      const auto cap = static_cast<int64_t>(std::ceil(static_cast<double>(rows * k) / static_cast<double>(experts) *
                                                      static_cast<double>(*cfg_.capacity_factor)));
      kept_all = Tensor::empty(idx_all.shape(), DType::I32, s);
      ops::moe_capacity_drop(p_all, idx_all, kept_all, cap, cfg_.num_experts,
                             cfg_.drop_policy == MoeDropPolicy::Position ? ops::CapacityDropPolicy::Position
                                                                         : ops::CapacityDropPolicy::Probs,
                             s);
    }
  }
  auto local = [&](const Tensor& t) { return gathered ? t.narrow(row0, saved.rows) : t; };
  probs = local(p_all);
  saved.indices = local(idx_all);
  dispatched = kept_all.defined() ? local(kept_all) : saved.indices;
}

void MoeLayer::balance(const MicroBatch& mb, Saved& saved, const Tensor& dispatched,
                       const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t experts = cfg_.num_experts, k = cfg_.topk;
  const DType stat = saved.logits.dtype();
  const bool record = rt.moe && rt.record_moe_stats;
  const float scale = rt.moe ? rt.moe->aux_grad_scale : 1.0f;
  const double tokens = micro_batch_tokens(mb);
  auto sum_over_sequence_groups = [&](Tensor& t) {
    if (mp_.sequence_parallel) tp::all_reduce(t, mp_.tp.get(), s);
    if (mp_.cp.enabled()) mp_.cp.comm->all_reduce(t, comm::ReduceOp::Sum, s);
  };
  Tensor routed = Tensor::zeros({1, experts}, stat, s);
  ops::moe_count_tokens(saved.indices, routed, {}, s);
  if (record) {
    add_stat(*rt.moe, layer_, 0, routed, s);
    const bool dropping = cfg_.capacity_factor.has_value() && cfg_.load_balancing != MoeLoadBalancing::ExpertChoice;
    if (!dropping) {
      add_stat(*rt.moe, layer_, experts, routed, s);
    } else {
      Tensor kept = Tensor::zeros({1, experts}, stat, s);
      ops::moe_count_tokens(dispatched, kept, {}, s);
      add_stat(*rt.moe, layer_, experts, kept, s);
    }
  }
  Tensor value = Tensor::zeros({1}, stat, s);
  bool has_value = false;
  if (cfg_.load_balancing == MoeLoadBalancing::AuxLoss) {
    // aux = E / (T^2 k) sum_e (sum_t s_te) f_e, f the routed counts of the whole micro-batch.
    Tensor f = routed;
    sum_over_sequence_groups(f);
    Tensor score_sums = Tensor::zeros({1, experts}, stat, s);
    Tensor none;
    ops::moe_router_stats(saved.logits, score_sums, none, {}, s);
    const double c = static_cast<double>(experts) / (tokens * tokens * static_cast<double>(k));
    ops::dot(score_sums.view({experts}), f.view({experts}), value, s);
    ops::scale_inplace(value, static_cast<float>(c), s);
    has_value = true;
    if (cfg_.aux_loss_coeff != 0.0f) {
      saved.aux_weights = f;
      saved.loss.aux_coeff = static_cast<float>(scale * cfg_.aux_loss_coeff * c);
    }
  } else if (cfg_.load_balancing == MoeLoadBalancing::SeqAuxLoss) {
    // Per sequence b: c_be = (slots of b routed to e) / (S k / E), and
    // aux = mean_b sum_e c_be mean_s s_sbe.
    const int64_t seq = mb.seq, batch = mb.batch;
    const ops::RowGroups groups{.rows_per_group = seq, .row_offset = mp_.local_row_offset(mb.tokens())};
    Tensor c = Tensor::zeros({batch, experts}, stat, s);
    ops::moe_count_tokens(saved.indices, c, groups, s);
    sum_over_sequence_groups(c);
    ops::scale_inplace(c, static_cast<float>(static_cast<double>(experts) / static_cast<double>(seq * k)), s);
    Tensor score_sums = Tensor::zeros({batch, experts}, stat, s);
    Tensor none;
    ops::moe_router_stats(saved.logits, score_sums, none, groups, s);
    ops::dot(score_sums.view({batch * experts}), c.view({batch * experts}), value, s);
    const double norm = 1.0 / static_cast<double>(batch * seq);
    ops::scale_inplace(value, static_cast<float>(norm), s);
    has_value = true;
    if (cfg_.aux_loss_coeff != 0.0f) {
      saved.aux_weights = c;
      saved.loss.aux_coeff = static_cast<float>(scale * cfg_.aux_loss_coeff * norm);
      saved.loss.groups = groups;
    }
  }
  if (record && has_value) add_stat(*rt.moe, layer_, 2 * experts, value, s);
  if (cfg_.z_loss_coeff != 0.0f) {
    // z = mean over the micro-batch's tokens of logsumexp(logits)^2.
    Tensor lse_sq = Tensor::zeros({1}, stat, s);
    Tensor none;
    ops::moe_router_stats(saved.logits, none, lse_sq, {}, s);
    ops::scale_inplace(lse_sq, static_cast<float>(1.0 / tokens), s);
    if (record) add_stat(*rt.moe, layer_, 2 * experts + 1, lse_sq, s);
    saved.loss.z_coeff = static_cast<float>(scale * cfg_.z_loss_coeff / tokens);
  }
}

double MoeLayer::micro_batch_tokens(const MicroBatch& mb) const {
  if (mb.cp && mb.unpadded_seq > 0) return static_cast<double>(mb.batch * mb.unpadded_seq);
  return static_cast<double>(mb.tokens()) * mp_.cp.size;
}

Tensor MoeLayer::forward(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  saved = Saved{};
  const int64_t local_rows = x.rows();
  saved.rows = valid_rows(mb.tokens(), mp_.tp.rank, mp_.tp.size, mp_.sequence_parallel);
  MDLM_CHECK(saved.rows <= local_rows, "MoE layer ", layer_, ": ", local_rows, " rows for ",
             saved.rows, " tokens");
  const std::vector<int32_t> compact = cp_compaction(mb, local_rows, mp_);
  if (!compact.empty()) {
    // CP padding rows are not tokens: they are neither routed nor counted (the rules refuse
    // the routings that compare rows across the shard under CP, so the gathered path below
    // never meets a compacted shard).
    saved.rows = static_cast<int64_t>(std::count_if(compact.begin(), compact.end(), [](int32_t v) { return v >= 0; }));
    saved.compact = Tensor::from_ints(compact, {local_rows, 1}).to(s.device(), s);
    saved.x = Tensor::empty({saved.rows, x.cols()}, x.dtype(), s);
    ops::moe_permute(x, saved.compact, saved.x, s);
  } else {
    saved.x = x.narrow(0, saved.rows);
  }
  saved.logits = Tensor::empty({saved.rows, cfg_.num_experts}, rt.stat_dtype(), s);
  ops::gemm(saved.x, store_->param(router_.weight()), saved.logits, {.trans_b = true}, s);
  if (cfg_.force_load_balancing) {
    // Benchmark routing: random logits replace the router's (the backward treats them as the
    // router's output, Megatron's straight-through estimator). Drawn for every local row, then
    // compacted as x is under CP.
    const ops::RandomLogitsArgs ra{.seed = rt.seed, .layer = static_cast<uint32_t>(layer_), .seq_len = mb.seq,
                                   .sample_offset = mb.first_sample,
                                   .row_offset = mp_.local_row_offset(mb.tokens()), .chunks = mb.position_map()};
    if (saved.compact.defined()) {
      Tensor all = Tensor::empty({local_rows, cfg_.num_experts}, saved.logits.dtype(), s);
      ops::moe_random_logits(all, ra, s);
      ops::moe_permute(all, saved.compact, saved.logits, s);
    } else {
      ops::moe_random_logits(saved.logits, ra, s);
    }
  }
  Tensor probs, dispatched;
  route(mb, saved, probs, dispatched, rt);
  if (rt.training) balance(mb, saved, dispatched, rt);
  Tensor xe = dispatcher_->dispatch(saved.x, dispatched, probs, saved.dispatch, s);
  saved.experts.source_rows = saved.dispatch.source_rows;
  Tensor ye = experts_.forward(xe, saved.dispatch.rows_per_expert, saved.experts, s);
  xe = Tensor();
  // Without EP and expert TP the expert input is only a permutation of saved.x: it is rebuilt
  // in the backward (one permute) instead of kept, [T·k, H] less per layer until then.
  if (!mp_.ep.enabled() && !mp_.expert_tp.enabled()) saved.experts.x = Tensor();
  Tensor routed = dispatcher_->combine(ye, saved.dispatch, s);
  if (saved.compact.defined()) {  // back to the local rows, zeros on the padding
    Tensor full = Tensor::empty({local_rows, x.cols()}, x.dtype(), s);
    ops::moe_unpermute(routed, saved.compact, Tensor(), full, s);
    routed = full;
  }
  const int64_t out_rows = routed.rows();
  Tensor y;
  if (shared_) {
    y = shared_mlp_.forward(x, mb, saved.shared, rt);
  } else if (out_rows == local_rows) {
    return routed;
  } else {
    y = Tensor::zeros({local_rows, x.cols()}, x.dtype(), s);
  }
  if (out_rows > 0) {
    Tensor head = y.narrow(0, out_rows);
    ops::add(head, routed, head, s);
  }
  return y;
}

Tensor MoeLayer::backward(const Tensor& dy, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  const int64_t n = saved.rows;
  Tensor dx = shared_ ? shared_mlp_.backward(dy, mb, saved.shared, rt) : Tensor();
  Tensor dyv;
  if (saved.compact.defined()) {
    dyv = Tensor::empty({n, dy.cols()}, dy.dtype(), s);
    ops::moe_permute(dy, saved.compact, dyv, s);
  } else {
    dyv = dy.narrow(0, n);
  }
  Tensor dprobs;
  Tensor d_out = dispatcher_->combine_backward(dyv, saved.dispatch, dprobs, s);
  if (!saved.experts.x.defined()) {  // the same rows the dispatch wrote in the forward
    saved.experts.x = Tensor::empty({d_out.rows(), saved.x.cols()}, saved.x.dtype(), s);
    if (d_out.rows() > 0) ops::moe_permute(saved.x, saved.dispatch.dest, saved.experts.x, s);
  }
  Tensor dxe = experts_.backward(d_out, saved.experts, s);
  d_out = Tensor();
  Tensor d_routed = dispatcher_->dispatch_backward(dxe, saved.dispatch, s);
  dxe = Tensor();

  // Router: through the probs, plus the aux / z losses.
  Tensor dlogits = Tensor::empty(saved.logits.shape(), saved.logits.dtype(), s);
  ops::RouterTopkArgs a = topk_args(rt.training);
  if (cfg_.load_balancing == MoeLoadBalancing::ExpertChoice) {
    a = ops::RouterTopkArgs{};
    a.topk = cfg_.num_experts;
    a.score = cfg_.score == MoeScoreFunction::Sigmoid ? ops::RouterScore::Sigmoid : ops::RouterScore::Softmax;
  }
  ops::moe_router_topk_backward(dprobs, saved.logits, saved.indices, dlogits, a, s);
  if (saved.aux_weights.defined() || saved.loss.z_coeff != 0.0f)
    ops::moe_router_loss_backward(saved.logits, saved.aux_weights, dlogits, saved.loss, s);
  if (saved.ec_dlogits.defined()) ops::add(dlogits, saved.ec_dlogits, dlogits, s);
  Tensor dl = dlogits;
  if (dl.dtype() != saved.x.dtype()) {  // bf16 activations: the GEMMs take bf16 operands
    dl = Tensor::empty(dlogits.shape(), saved.x.dtype(), s);
    ops::copy(dlogits, dl, s);
  }
  Tensor dw = store_->grad(router_.weight());
  ops::gemm(dl, saved.x, dw, {.trans_a = true, .beta = 1.0f}, s);
  Tensor d_router = Tensor::empty({n, hidden_}, saved.x.dtype(), s);
  ops::gemm(dl, store_->param(router_.weight()), d_router, {}, s);
  ops::add(d_routed, d_router, d_routed, s);
  if (saved.compact.defined()) {  // the padding rows get no gradient
    Tensor full = Tensor::empty(dy.shape(), dy.dtype(), s);
    ops::moe_unpermute(d_routed, saved.compact, Tensor(), full, s);
    d_routed = full;
  }
  const int64_t out_rows = d_routed.rows();

  if (!dx.defined()) {
    if (out_rows == dy.rows()) {
      saved = Saved{};
      return d_routed;
    }
    dx = Tensor::zeros(dy.shape(), dy.dtype(), s);
  }
  if (out_rows > 0) {
    Tensor head = dx.narrow(0, out_rows);
    ops::add(head, d_routed, head, s);
  }
  saved = Saved{};
  return dx;
}

}  // namespace megadlm
