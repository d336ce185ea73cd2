#include "megadlm/parallel/tensor_parallel/layers.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/context_parallel/mappings.h"
#include "megadlm/parallel/tensor_parallel/comm_overlap.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"

namespace megadlm::tp {

namespace {

/// y = x W^T (+ b).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Stream& s) {
  Tensor y = Tensor::empty({x.rows(), w.rows()}, x.dtype(), s);
  ops::gemm(x, w, y, {.trans_b = true, .bias = bias}, s);
  return y;
}

/// dW += dy^T x; db += Σ_rows dy (when db is defined); returns dx = dy W.
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor dw, Tensor db,
                       const Stream& s) {
  ops::gemm(dy, x, dw, {.trans_a = true, .beta = 1.0f}, s);  // fp32 main grad, accumulated
  if (db.defined()) ops::sum_rows(dy, db, s);
  Tensor dx = Tensor::empty({dy.rows(), w.cols()}, dy.dtype(), s);
  ops::gemm(dy, w, dx, {}, s);
  return dx;
}

/// Sum of partial results over TP onto this rank's rows: reduce-scatter under SP, else all-reduce.
Tensor reduce_to_local_rows(Tensor partial, const ModelParallel& mp, const Stream& s) {
  if (mp.sequence_parallel) return scatter_rows(partial, mp.tp.get(), s);
  all_reduce(partial, mp.tp.get(), s);
  return partial;
}

/// --tp-comm-overlap in effect: the SP collectives run as rings chunked with the GEMMs.
/// FP8 linears run the plain collectives (the rings would cast every chunk: docs/fp8.md).
/// Blockwise FP8: the token rows of a GEMM operand padded with zero rows to a multiple of 128
/// (a varilen-truncated micro-batch; cuBLASLt's block modes need K = tokens in the weight
/// gradient, and M/N multiples of 128 in the measured support). Zero rows change no tile's amax
/// (a column-wise tile's scale is its real elements' one, as an unpadded partial tile's), get
/// zero codes and add nothing to a sum, so the result is the unpadded one. Returns x when no
/// padding is needed.
Tensor pad_token_rows(const Tensor& x, const Stream& s) {
  const int64_t rows = x.rows(), padded = (rows + ops::kFp8BlockSize - 1) / ops::kFp8BlockSize * ops::kFp8BlockSize;
  if (padded == rows) return x;
  Tensor p = Tensor::zeros({padded, x.cols()}, x.dtype(), s);
  Tensor head = p.narrow(0, rows);
  copy_tensor(x.view({rows, x.cols()}), head, s);
  return p;
}

bool overlapped(const ModelParallel& mp) {
  return mp.tp_comm_overlap && mp.sequence_parallel && mp.tp.size > 1 && !mp.fp8;
}

/// The stream the rings' transfers run on: CUDA's side stream, none on the CPU.
const Stream* side_stream(const ModelParallel& mp, const Stream& s) {
  return mp.tp_side_stream ? mp.tp_side_stream->for_compute(s) : nullptr;
}

}  // namespace

// ------------------------------------------------------------------------------ FP8 linears

Fp8Linear::Fp8Linear(std::shared_ptr<Fp8State> state, const std::string& name, const ModelParallel& mp,
                     int64_t weight_elements)
    : state_(std::move(state)), tp_(mp.tp.get()), cp_(mp.cp.get()) {
  if (!state_) return;
  x_ = state_->add(name + ".input", Fp8State::Role::Input);
  w_ = state_->add(name + ".weight", Fp8State::Role::Weight);
  state_->add_cast_weight(weight_elements);
  dy_ = state_->add(name + ".grad_output", Fp8State::Role::GradOutput);
}

ops::Fp8Tensor Fp8Linear::cast(int slot, const Tensor& x, bool activation, bool columnwise,
                               const Stream& s, bool rowwise) const {
  const ops::Fp8Type type = state_->type(slot);
  if (state_->blockwise()) {
    // Each 1x128 tile (activations, gradients) or 128x128 block (weights) scaled by its own
    // amax: nothing to reduce over TP or CP, no state.
    return ops::fp8_quantize_blockwise(
        x, type, activation ? ops::Fp8Granularity::Tile1x128 : ops::Fp8Granularity::Block128x128, rowwise,
        columnwise, state_->settings().block_power_of_2, s);
  }
  if (state_->delayed()) {
    Tensor amax = state_->amax(slot, s);
    return ops::fp8_quantize(x, state_->scale(slot, s), type, columnwise, &amax, s, rowwise);
  }
  // Tensorwise: the amax of the whole logical tensor (all its TP / CP pieces), then its scale.
  Tensor amax = Tensor::zeros({1}, DType::F32, s);
  ops::fp8_amax(x, amax, s);
  if (tp_ != nullptr) tp_->all_reduce(amax, comm::ReduceOp::Max, s);
  if (activation && cp_ != nullptr) cp_->all_reduce(amax, comm::ReduceOp::Max, s);
  Tensor scale = Tensor::empty({1}, DType::F32, s);
  ops::fp8_scale_from_amax(amax, scale, type, s);
  return ops::fp8_quantize(x, scale, type, columnwise, nullptr, s, rowwise);
}

void Fp8Linear::gather_weight(int first, int last) const {
  if (state_ && state_->settings().param_gather) state_->add_gathered_weight(w_, first, last);
}

const ops::Fp8Tensor& Fp8Linear::weight(const Tensor& w, const Stream& s) const {
  // --fp8-param-gather: the codes the gather brought, cast by each weight shard's owner with
  // this step's scale (the same codes the cast below gives; docs/fp8.md).
  if (const ops::Fp8Tensor* g = state_->gathered_codes(w_)) {
    if (w_cache_.defined()) w_cache_ = {};  // the first step's cast is not needed any more
    return *g;
  }
  if (w_generation_ != state_->generation() || !w_cache_.defined()) {
    // The row-wise codes (the forward GEMM's), kept through the step; the data-gradient GEMM
    // transposes them while it runs (backward_data): a byte a weight element kept, not two.
    w_cache_ = {};  // the last step's codes go before this step's are cast
    w_cache_ = cast(w_, w, /*activation=*/false, /*columnwise=*/false, s);
    w_generation_ = state_->generation();
  }
  return w_cache_;
}

void Fp8Linear::forward(const Tensor& x, const Tensor& w, Tensor& y, const ops::GemmArgs& args,
                        const Stream& s, LinearInput* keep) const {
  if (keep != nullptr && !state_->settings().wgrad) {  // --no-fp8-wgrad: the weight gradient reads x
    forward(x, w, y, args, s);
    *keep = LinearInput::rows(x);
    return;
  }
  if (state_->blockwise() && x.rows() % ops::kFp8BlockSize != 0) {
    // Token rows padded to a multiple of 128 (pad_token_rows), the real rows copied back; the
    // kept codes are the padded rows' (the weight gradient reads them padded).
    const Tensor xp = pad_token_rows(x, s);
    Tensor yp = args.beta != 0.0f && args.addend == nullptr ? pad_token_rows(y, s)
                                                            : Tensor::empty({xp.rows(), y.cols()}, y.dtype(), s);
    Tensor addend;
    ops::GemmArgs a = args;
    if (args.addend != nullptr) {
      addend = pad_token_rows(*args.addend, s);
      a.addend = &addend;
    }
    forward(xp, w, yp, a, s, keep);
    Tensor head = yp.narrow(0, x.rows());
    copy_tensor(head, y, s);
    return;
  }
  const ops::Fp8Tensor& wq = weight(w, s);
  ops::Fp8Tensor xq = cast(x_, x, /*activation=*/true, /*columnwise=*/keep != nullptr, s);
  ops::GemmArgs a = args;
  a.trans_b = true;
  ops::fp8_gemm(xq, wq, y, a, s);
  if (keep == nullptr) return;
  // The weight gradient reads the column-wise codes alone; the row-wise ones go (the CPU's
  // per-tensor codes have one orientation, read either way: kept).
  if (xq.data_t.defined()) xq.data = Tensor();
  *keep = LinearInput::fp8(std::move(xq));
}

ops::Fp8CastTarget Fp8Linear::target(int slot, const Stream& s) const {
  MDLM_CHECK(takes_codes_from_producers(), "Fp8Linear: a producer's cast needs delayed scaling and the FP8 weight gradient");
  return {.scale = state_->scale(slot, s), .amax = state_->amax(slot, s), .type = state_->type(slot)};
}

ops::Fp8Tensor Fp8Linear::quantize_grad(const Tensor& dy, const Stream& s) const {
  // Blockwise: row-wise tiles for dgrad, column-wise (along tokens) for wgrad; token rows padded
  // to a multiple of 128 (backward_data returns the real rows only).
  if (state_->blockwise()) return cast(dy_, pad_token_rows(dy, s), /*activation=*/true, /*columnwise=*/true, s);
  return cast(dy_, dy, /*activation=*/true, /*columnwise=*/true, s);
}

Tensor Fp8Linear::backward_data(const ops::Fp8Tensor& dy_q, const Tensor& w, const Stream& s, int64_t rows) const {
  Tensor dx = Tensor::empty({dy_q.rows, w.cols()}, w.dtype(), s);
  ops::fp8_gemm(dy_q, ops::fp8_columnwise(weight(w, s), s), dx, {}, s);  // the transposed codes live for this GEMM
  if (rows >= 0 && rows != dy_q.rows) return dx.narrow(0, rows);  // blockwise token padding
  return dx;
}

void Fp8Linear::backward_weight(const ops::Fp8Tensor& dy_q, const Tensor& dy, const LinearInput& input, Tensor& dw,
                                const Stream& s) const {
  if (!state_->settings().wgrad) {  // --no-fp8-wgrad
    ops::gemm(dy, input.x, dw, {.trans_a = true, .beta = 1.0f}, s);
    return;
  }
  // The codes the forward kept, or x quantized again with the forward's scale (the same codes),
  // column-wise only: the GEMM reads the transposed codes alone (blockwise: tiles of 128 tokens
  // of one feature, along K = tokens).
  const ops::Fp8Tensor xq =
      input.codes.defined() ? input.codes
                            : cast(x_, state_->blockwise() ? pad_token_rows(input.x, s) : input.x,
                                   /*activation=*/true, /*columnwise=*/true, s, /*rowwise=*/false);
  ops::fp8_gemm(dy_q, xq, dw, {.trans_a = true, .beta = 1.0f}, s);  // fp32 main grad, accumulated
}

Tensor Fp8Linear::backward(const Tensor& dy, const LinearInput& input, const Tensor& w, Tensor& dw,
                           const Stream& s) const {
  const ops::Fp8Tensor dy_q = quantize_grad(dy, s);
  Tensor dx = backward_data(dy_q, w, s, dy.rows());
  backward_weight(dy_q, dy, input, dw, s);
  return dx;
}

// ---------------------------------------------------------------------------------- TP linears

ColumnParallelLinear::ColumnParallelLinear(ParameterStore& store, const std::vector<LinearPart>& parts,
                                           int64_t in_features, bool bias, ParamInit init,
                                           const ModelParallel& mp)
    : store_(&store), mp_(mp) {
  MDLM_CHECK(!parts.empty(), "ColumnParallelLinear needs at least one part");
  const TpSlice column{.split = TpSplit::Rows, .rank = mp.tp.rank, .size = mp.tp.size};  // output rows split
  for (size_t i = 0; i < parts.size(); ++i) {
    MDLM_CHECK(parts[i].out_features % mp.tp.size == 0, parts[i].name, ": ", parts[i].out_features,
               " output features do not split over ", mp.tp.size, " tensor-parallel ranks");
    const ParameterStore::Handle h = store.add(parts[i].name + ".weight", {parts[i].out_features, in_features},
                                               {.init = init, .fuse_with_previous = i > 0, .tp = column});
    if (i == 0) w_first_ = h;
    w_last_ = h;
    local_out_ += parts[i].out_features / mp.tp.size;
  }
  fp8_ = Fp8Linear(mp.fp8, parts[0].name, mp, local_out_ * in_features);
  fp8_.gather_weight(w_first_, w_last_);
  if (bias) {
    const ParamInit zero{InitKind::Zeros, 0.0f};
    for (size_t i = 0; i < parts.size(); ++i) {
      const ParameterStore::Handle h =
          store.add(parts[i].name + ".bias", {parts[i].out_features},
                    {.init = zero, .weight_decay = false, .fuse_with_previous = i > 0, .tp = column});
      if (i == 0) b_first_ = h;
      b_last_ = h;
    }
  }
}

Tensor ColumnParallelLinear::gather_input(const Tensor& x, int64_t rows, const Stream& s) const {
  return mp_.sequence_parallel ? gather_rows(x, rows, mp_.tp.get(), s) : x;
}

Tensor ColumnParallelLinear::gather_and_forward(const Tensor& x, int64_t rows, LinearInput* keep,
                                                const Stream& s) const {
  if (!overlapped(mp_)) return forward(gather_input(x, rows, s), s, keep);
  Tensor b;
  if (b_first_ >= 0) b = store_->param_span(b_first_, b_last_);
  const Tensor w = store_->param_span(w_first_, w_last_);
  Tensor y = Tensor::empty({rows, w.rows()}, x.dtype(), s);
  // Each gathered shard's rows of y as soon as the shard is here (row-wise: the same numbers).
  Tensor x_full = gather_rows_overlapped(x, rows, *mp_.tp.comm, s, side_stream(mp_, s),
                                         [&](int64_t first, const Tensor& x_rows) {
                                           Tensor y_rows = y.narrow(first, x_rows.rows());
                                           ops::gemm(x_rows, w, y_rows,
                                                     {.trans_b = true, .bias = b_first_ >= 0 ? &b : nullptr}, s);
                                         });
  if (keep != nullptr) *keep = LinearInput::rows(x_full);
  return y;
}

Tensor ColumnParallelLinear::forward(const Tensor& x_full, const Stream& s, LinearInput* keep) const {
  Tensor b;
  if (b_first_ >= 0) b = store_->param_span(b_first_, b_last_);
  if (fp8_.active()) {
    const Tensor w = store_->param_span(w_first_, w_last_);
    Tensor y = Tensor::empty({x_full.rows(), w.rows()}, x_full.dtype(), s);
    fp8_.forward(x_full, w, y, {.bias = b_first_ >= 0 ? &b : nullptr}, s, keep);
    return y;
  }
  if (keep != nullptr) *keep = LinearInput::rows(x_full);
  return linear(x_full, store_->param_span(w_first_, w_last_), b_first_ >= 0 ? &b : nullptr, s);
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, const LinearInput& input, const Stream& s) const {
  Tensor db;
  if (b_first_ >= 0) db = store_->grad_span(b_first_, b_last_);
  if (overlapped(mp_)) {
    // dx = dy W chunk by chunk into the reduce-scatter ring; the weight gradient (which needs
    // all of dy) overlaps the ring's first transfer.
    const Tensor w = store_->param_span(w_first_, w_last_);
    Tensor dw = store_->grad_span(w_first_, w_last_);
    return scatter_rows_overlapped(
        dy.rows(), w.cols(), dy.dtype(), *mp_.tp.comm, s, side_stream(mp_, s),
        [&](int64_t first, Tensor& dx_rows) { ops::gemm(dy.narrow(first, dx_rows.rows()), w, dx_rows, {}, s); },
        [&] {
          ops::gemm(dy, input.x, dw, {.trans_a = true, .beta = 1.0f}, s);
          if (db.defined()) ops::sum_rows(dy, db, s);
        });
  }
  if (fp8_.active()) {
    Tensor dw = store_->grad_span(w_first_, w_last_);
    Tensor dx = fp8_.backward(dy, input, store_->param_span(w_first_, w_last_), dw, s);
    if (db.defined()) ops::sum_rows(dy, db, s);
    return reduce_to_local_rows(dx, mp_, s);
  }
  Tensor dx = linear_backward(dy, input.x, store_->param_span(w_first_, w_last_),
                              store_->grad_span(w_first_, w_last_), db, s);
  return reduce_to_local_rows(dx, mp_, s);
}

bool ColumnParallelLinear::takes_grad_codes() const {
  // FP8 linears never run the TP overlap rings (overlapped() is false with FP8).
  return fp8_.takes_codes_from_producers() && b_first_ < 0;
}

Tensor ColumnParallelLinear::backward(const ops::Fp8Tensor& dy_q, const LinearInput& input, const Stream& s) const {
  MDLM_CHECK(takes_grad_codes(), "ColumnParallelLinear::backward from FP8 codes: delayed scaling, no bias");
  Tensor dw = store_->grad_span(w_first_, w_last_);
  const Tensor w = store_->param_span(w_first_, w_last_);
  Tensor dx = fp8_.backward_data(dy_q, w, s);
  fp8_.backward_weight(dy_q, Tensor(), input, dw, s);
  return reduce_to_local_rows(dx, mp_, s);
}

RowParallelLinear::RowParallelLinear(ParameterStore& store, const std::string& name,
                                     int64_t out_features, int64_t in_features, bool bias,
                                     ParamInit init, const ModelParallel& mp)
    : store_(&store), mp_(mp) {
  MDLM_CHECK(in_features % mp.tp.size == 0, name, ": ", in_features,
             " input features do not split over ", mp.tp.size, " tensor-parallel ranks");
  const TpSlice row{.split = TpSplit::Cols, .rank = mp.tp.rank, .size = mp.tp.size};  // input columns split
  weight_ = store.add(name + ".weight", {out_features, in_features}, {.init = init, .tp = row});
  if (bias)
    bias_ = store.add(name + ".bias", {out_features},
                      {.init = {InitKind::Zeros, 0.0f},
                       .weight_decay = false,
                       .tp = {.split = TpSplit::Replicated, .rank = mp.tp.rank, .size = mp.tp.size}});
  fp8_ = Fp8Linear(mp.fp8, name, mp, out_features * (in_features / mp.tp.size));
  fp8_.gather_weight(weight_, weight_);
}

Tensor RowParallelLinear::forward(const Tensor& x, const Stream& s) const {
  // The bias is added once, on TP rank 0, so that the reduction sums it exactly once.
  Tensor b;
  const bool with_bias = bias_ >= 0 && mp_.tp.rank == 0;
  if (with_bias) b = store_->param(bias_);
  if (overlapped(mp_)) {
    // The partial output is computed chunk by chunk into the reduce-scatter ring.
    const Tensor w = store_->param(weight_);
    return scatter_rows_overlapped(x.rows(), w.rows(), x.dtype(), *mp_.tp.comm, s, side_stream(mp_, s),
                                   [&](int64_t first, Tensor& y_rows) {
                                     ops::gemm(x.narrow(first, y_rows.rows()), w, y_rows,
                                               {.trans_b = true, .bias = with_bias ? &b : nullptr}, s);
                                   });
  }
  if (fp8_.active()) {
    const Tensor w = store_->param(weight_);
    Tensor y = Tensor::empty({x.rows(), w.rows()}, x.dtype(), s);
    fp8_.forward(x, w, y, {.bias = with_bias ? &b : nullptr}, s);
    return reduce_to_local_rows(y, mp_, s);
  }
  return reduce_to_local_rows(linear(x, store_->param(weight_), with_bias ? &b : nullptr, s), mp_, s);
}

void RowParallelLinear::forward_add(const Tensor& x, const Tensor& residual, Tensor& y,
                                    const Stream& s) const {
  MDLM_CHECK(!mp_.tp.enabled(), "RowParallelLinear::forward_add runs on one tensor-parallel rank");
  MDLM_CHECK(y.rows() == x.rows() && y.cols() == store_->param(weight_).rows() && y.dtype() == x.dtype(),
             "RowParallelLinear::forward_add: y ", y.str(), " for x ", x.str());
  const Tensor b = bias_ >= 0 ? store_->param(bias_) : Tensor();
  if (fp8_.active()) {
    fp8_.forward(x, store_->param(weight_), y,
                 {.beta = 1.0f, .bias = b.defined() ? &b : nullptr, .addend = &residual}, s);
    return;
  }
  ops::gemm(x, store_->param(weight_), y,
            {.trans_b = true, .beta = 1.0f, .bias = b.defined() ? &b : nullptr, .addend = &residual}, s);
}

Tensor RowParallelLinear::backward(const Tensor& dy, const Tensor& x, int64_t rows,
                                   const Stream& s) const {
  return backward(dy, [&x](const Tensor&) { return LinearInput::rows(x); }, rows, s);
}

Tensor RowParallelLinear::backward(const Tensor& dy, const std::function<LinearInput(const Tensor& dx)>& input,
                                   int64_t rows, const Stream& s) const {
  const Tensor w = store_->param(weight_);
  Tensor dx, dy_full;  // dy_full: the gradient of the full rows (SP's reduce-scatter -> all-gather)
  if (fp8_.active()) {
    dy_full = mp_.sequence_parallel ? gather_rows(dy, rows, mp_.tp.get(), s) : dy;
    const ops::Fp8Tensor dy_q = fp8_.quantize_grad(dy_full, s);
    dx = fp8_.backward_data(dy_q, w, s, dy_full.rows());
    Tensor dw = store_->grad(weight_);
    fp8_.backward_weight(dy_q, dy_full, input(dx), dw, s);
    if (bias_ >= 0) {
      Tensor db = store_->grad(bias_);
      ops::sum_rows(dy_full, db, s);
    }
    return dx;
  }
  if (overlapped(mp_)) {
    // dx = dy W for each gathered shard as it arrives; the weight gradient needs all of dy.
    dx = Tensor::empty({rows, w.cols()}, dy.dtype(), s);
    dy_full = gather_rows_overlapped(dy, rows, *mp_.tp.comm, s, side_stream(mp_, s),
                                     [&](int64_t first, const Tensor& dy_rows) {
                                       Tensor dx_rows = dx.narrow(first, dy_rows.rows());
                                       ops::gemm(dy_rows, w, dx_rows, {}, s);
                                     });
  } else {
    dy_full = mp_.sequence_parallel ? gather_rows(dy, rows, mp_.tp.get(), s) : dy;
    dx = Tensor::empty({dy_full.rows(), w.cols()}, dy.dtype(), s);
    ops::gemm(dy_full, w, dx, {}, s);
  }
  const LinearInput x = input(dx);
  MDLM_CHECK(x.x.defined(), "RowParallelLinear::backward: the input of a bf16 weight gradient came as FP8 codes");
  Tensor dw = store_->grad(weight_);
  ops::gemm(dy_full, x.x, dw, {.trans_a = true, .beta = 1.0f}, s);  // fp32 main grad, accumulated
  if (bias_ >= 0) {
    Tensor db = store_->grad(bias_);
    ops::sum_rows(dy_full, db, s);
  }
  return dx;
}

}  // namespace megadlm::tp
