// CPU reference AdamW step (Megatron / Apex FusedAdam adam_w_mode semantics, formula in
// include/megadlm/ops/optimizer.h): element math in fp32 as the header states; the bias
// corrections 1 - beta^step are formed in double (as the Python side of FusedAdam does) and
// rounded once. model_param, when defined, receives the updated master in its own dtype.
// The gradient read is grad * grad_scale in fp32 (bitwise a pre-scaled gradient).
#include <cmath>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                Tensor& model_param, const AdamWArgs& args, const Stream& stream) {
  const double step = static_cast<double>(args.step);
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(double{args.beta1}, step));
  const float bias_correction2 = static_cast<float>(1.0 - std::pow(double{args.beta2}, step));
  float* p = master.data<float>();
  const float* g = grad.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  for (int64_t i = 0; i < master.numel(); ++i) {
    const float gi = g[i] * args.grad_scale;  // rounded to fp32 as a scaled gradient in memory is
    m[i] = args.beta1 * m[i] + (1.0f - args.beta1) * gi;
    v[i] = args.beta2 * v[i] + (1.0f - args.beta2) * gi * gi;
    const float mhat = m[i] / bias_correction1;
    const float vhat = v[i] / bias_correction2;
    const float update = mhat / (std::sqrt(vhat) + args.eps) + args.weight_decay * p[i];
    p[i] -= args.lr * update;
  }
  if (model_param.defined() && model_param.data_ptr() != master.data_ptr()) {
    copy_tensor(master, model_param, stream);
  }
}

// The definition: one adamw_step per segment.
void adamw_step_multi(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                      Tensor& model_param, const std::vector<AdamWSegment>& segments,
                      const AdamWArgs& args, const Stream& stream) {
  for (const AdamWSegment& s : segments) {
    if (s.numel == 0) continue;
    AdamWArgs a = args;
    a.weight_decay = s.decay ? args.weight_decay : 0.0f;
    Tensor p = master.slice_flat(s.state_offset, {s.numel});
    Tensor g = grad.slice_flat(s.state_offset, {s.numel});
    Tensor m = exp_avg.slice_flat(s.state_offset, {s.numel});
    Tensor v = exp_avg_sq.slice_flat(s.state_offset, {s.numel});
    Tensor param = model_param.defined() ? model_param.slice_flat(s.param_offset, {s.numel}) : Tensor();
    cpu::adamw_step(p, g, m, v, param, a, stream);
  }
}

}  // namespace megadlm::ops::cpu
