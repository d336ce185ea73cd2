#include "megadlm/model/mlp.h"
#include <cmath>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/fp8_gemm.h"

namespace megadlm {

Mlp::Mlp(const TransformerConfig& config, const std::string& prefix, ParameterStore& store,
         const ModelParallel& mp)
    : Mlp(config, prefix + "mlp.", config.ffn_hidden_size, store, mp) {}

Mlp::Mlp(const TransformerConfig& config, const std::string& block_prefix, int64_t ffn,
         ParameterStore& store, const ModelParallel& mp)
    : activation_(config.activation) {
  MDLM_CHECK(ffn % mp.tp.size == 0, block_prefix, ": ffn ", ffn,
             " must divide by tensor-parallel size ", mp.tp.size);
  ffn_ = ffn / mp.tp.size;
  const int64_t h = config.hidden_size;
  const ParamInit init{InitKind::Normal, config.init_method_std};
  // Megatron scales the init of the output projections by 1/sqrt(2 * num_layers).
  const ParamInit out_init{InitKind::Normal,
                           config.init_method_std / std::sqrt(2.0f * config.num_layers)};
  const std::string& p = block_prefix;
  if (activation_ == MlpActivation::SwiGLU) {
    fc1_ = tp::ColumnParallelLinear(store, {{p + "linear_fc1_gate", ffn}, {p + "linear_fc1_up", ffn}},
                                    h, config.add_bias_linear, init, mp);
  } else {
    fc1_ = tp::ColumnParallelLinear(store, {{p + "linear_fc1", ffn}}, h, config.add_bias_linear,
                                    init, mp);
  }
  fc2_ = tp::RowParallelLinear(store, p + "linear_fc2", h, ffn, config.add_bias_linear, out_init, mp);
}

Tensor Mlp::forward(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  saved.fc1_out = fc1_.gather_and_forward(x, mb.tokens(), rt.forward_only ? nullptr : &saved.x_full, s);
  // The activation output is fc2's input; fc2's weight gradient needs it again in backward, which
  // recomputes it from fc1_out (one cheap pass) rather than keeping [rows, ffn] per layer.
  return fc2_.forward(activate(saved.fc1_out, s), s);
}

void Mlp::forward_add(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt,
                      const Tensor& residual, Tensor& out) const {
  const Stream& s = rt.stream;
  saved.fc1_out = fc1_.gather_and_forward(x, mb.tokens(), rt.forward_only ? nullptr : &saved.x_full, s);
  fc2_.forward_add(activate(saved.fc1_out, s), residual, out, s);
}

Tensor Mlp::activate(const Tensor& fc1_out, const Stream& s) const {
  Tensor act = Tensor::empty({fc1_out.rows(), ffn_}, fc1_out.dtype(), s);
  if (activation_ == MlpActivation::SwiGLU) ops::swiglu_forward(fc1_out, act, s);
  else ops::gelu_forward(fc1_out, act, s);
  return act;
}

Tensor Mlp::backward(const Tensor& dy, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const {
  const Stream& s = rt.stream;
  if (activation_ == MlpActivation::SwiGLU && fc1_.takes_grad_codes() && fc2_.fp8().takes_codes_from_producers()) {
    // FP8 with delayed scaling: the activation's backward pass writes fc1's output gradient and
    // fc2's recomputed input as the codes their GEMMs read (ops::fp8_swiglu_backward), with the
    // scales known before the values; neither is written in bf16.
    ops::Fp8Tensor dfc1_q;
    fc2_.backward(dy, [&](const Tensor& dact) {
      ops::Fp8Tensor act_q;
      ops::fp8_swiglu_backward(dact, saved.fc1_out, fc1_.fp8().grad_target(s), fc2_.fp8().input_target(s), dfc1_q,
                               act_q, s);
      return tp::LinearInput::fp8(std::move(act_q));
    }, mb.tokens(), s);
    saved.fc1_out = Tensor();
    Tensor dx = fc1_.backward(dfc1_q, saved.x_full, s);
    saved = Saved{};
    return dx;
  }
  Tensor dfc1 = Tensor::empty(saved.fc1_out.shape(), dy.dtype(), s);
  // fc2's data gradient first; then one pass over fc1_out gives both the activation's backward
  // and (SwiGLU) the recomputed activation output that fc2's weight gradient reads.
  fc2_.backward(dy, [&](const Tensor& dact) {
    if (activation_ != MlpActivation::SwiGLU) {
      ops::gelu_backward(dact, saved.fc1_out, dfc1, s);
      return tp::LinearInput::rows(activate(saved.fc1_out, s));
    }
    Tensor act = Tensor::empty({saved.fc1_out.rows(), ffn_}, saved.fc1_out.dtype(), s);
    ops::swiglu_backward_recompute(dact, saved.fc1_out, dfc1, act, s);
    return tp::LinearInput::rows(std::move(act));
  }, mb.tokens(), s);
  saved.fc1_out = Tensor();
  Tensor dx = fc1_.backward(dfc1, saved.x_full, s);
  saved = Saved{};
  return dx;
}

}  // namespace megadlm
