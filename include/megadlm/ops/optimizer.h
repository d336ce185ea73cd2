// Optimizer steps on flat fp32 buffers.
//
// AdamW as Megatron uses it (Apex/TE FusedAdam with adam_w_mode): with bias correction,
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//   mhat = m / (1 - b1^step);  vhat = v / (1 - b2^step)
//   p = p - lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)
// All in fp32. `step` counts from 1. Each gradient is read as g = grad * grad_scale (one fp32
// multiply, so the step is bitwise the one after ops::scale_inplace(grad, grad_scale)): the
// trainer's clip coefficient, without a pass over the gradients of its own.
#pragma once
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

struct AdamWArgs {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;
  float grad_scale = 1.0f;  ///< multiplies every gradient as it is read (gradient clipping)
};

/// master, exp_avg, exp_avg_sq: f32 [N], updated in place; grad: f32 [N], read (never written:
/// args.grad_scale applies to the value read).
/// model_param: [N] of the model dtype (bf16 on CUDA) written with the updated master, or
/// undefined when the master *is* the model parameter (CPU fp32 training).
void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                Tensor& model_param, const AdamWArgs& args, const Stream& stream);

/// One parameter of adamw_step_multi: elements [state_offset, state_offset + numel) of master,
/// grad, exp_avg and exp_avg_sq, and [param_offset, param_offset + numel) of model_param.
struct AdamWSegment {
  int64_t state_offset = 0;
  int64_t param_offset = 0;
  int64_t numel = 0;
  bool decay = true;  ///< false: weight decay 0 for this parameter (norms, biases)
};

/// adamw_step over every segment in one launch (multi-tensor AdamW): each segment with
/// args.weight_decay when it decays and 0 otherwise, bitwise the same as one adamw_step per
/// segment. Segments must not overlap; the buffers are as in adamw_step (model_param undefined
/// when the master is the model parameter).
void adamw_step_multi(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                      Tensor& model_param, const std::vector<AdamWSegment>& segments,
                      const AdamWArgs& args, const Stream& stream);

}  // namespace megadlm::ops
