// Optimizer steps on flat fp32 buffers.
//
// AdamW as Megatron uses it (Apex/TE FusedAdam with adam_w_mode): with bias correction,
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//   mhat = m / (1 - b1^step);  vhat = v / (1 - b2^step)
//   p = p - lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p)
// All in fp32. `step` counts from 1.
#pragma once
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
};

/// master, exp_avg, exp_avg_sq: f32 [N], updated in place; grad: f32 [N], read.
/// model_param: [N] of the model dtype (bf16 on CUDA) written with the updated master, or
/// undefined when the master *is* the model parameter (CPU fp32 training).
void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                Tensor& model_param, const AdamWArgs& args, const Stream& stream);

}  // namespace megadlm::ops
