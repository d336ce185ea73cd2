// Cross-entropy over the vocabulary, fused with its gradient so that only one copy of the
// logits ever exists: the gradient overwrites the logits in place.
//
// Shapes: logits [T, V] (CPU f32/f64, CUDA bf16; softmax in fp32); targets i32 [T];
// weights f32 [T]; losses f32 [T]. Targets outside [0, V) are an error (checked on CPU;
// on CUDA they produce NaN losses).
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

/// losses[t] = logsumexp(logits[t]) - logits[t, targets[t]]  (written). Logits unchanged.
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                           const Stream& stream);

/// As cross_entropy_forward, and then logits[t, :] is overwritten with
///   d/dlogits of  grad_scale * sum_t weights[t] * losses[t]
///   = grad_scale * weights[t] * (softmax(logits[t]) - onehot(targets[t])).
void cross_entropy_forward_backward(Tensor& logits, const Tensor& targets, const Tensor& weights,
                                    Tensor& losses, float grad_scale, const Stream& stream);

}  // namespace megadlm::ops
