// Cross-entropy over the vocabulary, fused with its gradient so that only one copy of the
// logits ever exists: the gradient overwrites the logits in place.
//
// Shapes: logits [T, V] (CPU f32/f64, CUDA bf16; softmax in fp32); targets i32 [T];
// weights f32 [T]; losses f32 [T]. Targets outside [0, V) are an error (checked on CPU;
// on CUDA they produce NaN losses).
//
// The cross_entropy_shard_* ops compute the same loss and gradient when the vocabulary is split
// over tensor-parallel ranks (Megatron's vocab-parallel cross-entropy), without gathering the
// logits; see the comment above them.
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

// ---- vocab-parallel cross-entropy ----------------------------------------------------------
//
// Each rank holds a shard logits [T, Vl] = columns [vocab_start, vocab_start + Vl) of the full
// [T, V] logits (CPU f32/f64, CUDA bf16 or f32; Vl >= 1). targets i32 [T] are global ids.
// Statistics (row_max, sum_exp, target_logit), weights and losses are f32 [T] (on CPU also the
// logits' dtype, for f64 gradient checks). The caller runs, on every rank:
//
//   cross_entropy_shard_max(logits, row_max)                      ; all-reduce row_max, MAX
//   cross_entropy_shard_stats(logits, targets, vocab_start, row_max, sum_exp, target_logit)
//                                                                 ; all-reduce sum_exp and
//                                                                 ;   target_logit, SUM
//   cross_entropy_shard_finish(logits, targets, vocab_start, row_max, sum_exp, target_logit,
//                              weights, losses, grad_scale)
//
// With one shard (vocab_start 0, Vl = V) and no all-reduce this gives the losses and gradient of
// cross_entropy_forward_backward up to rounding. Statistics and losses are accumulated in fp32
// (double on CPU) from exp(logit - global max), so nothing overflows.
//
// Targets are NOT validated: a shard cannot tell a target owned by another rank from one outside
// [0, V). The caller checks 0 <= targets < V before the first op (on the host, once per batch).
// A target outside [0, V) matches no column on any rank: its target_logit is 0, its loss is
// logsumexp of the row and its gradient is the plain softmax. A NaN logit reaches the loss
// through sum_exp (row_max ignores NaN, as MAX all-reduces may).

/// row_max[t] = max_j logits[t, j] over the shard's columns (written). Logits unchanged.
void cross_entropy_shard_max(const Tensor& logits, Tensor& row_max, const Stream& stream);

/// With row_max the all-reduced (global) row maximum, written:
///   sum_exp[t]      = sum_j exp(logits[t, j] - row_max[t]) over the shard's columns;
///   target_logit[t] = logits[t, targets[t] - vocab_start] if the target is in this shard, else 0.
/// Logits unchanged.
void cross_entropy_shard_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit,
                               const Stream& stream);

/// With the all-reduced row_max, sum_exp and target_logit:
///   losses[t] = log(sum_exp[t]) + row_max[t] - target_logit[t]  (written; bitwise the same on
///   every rank given the same statistics).
/// Then, when grad_scale > 0, the shard's logits are overwritten in place with the shard's
/// columns of d/dlogits of grad_scale * sum_t weights[t] * losses[t]:
///   grad_scale * weights[t] * (exp(logits[t, j] - row_max[t]) / sum_exp[t] - [j is the target]).
/// grad_scale == 0 is evaluation: logits unchanged, weights may be undefined. grad_scale < 0 is
/// an error.
void cross_entropy_shard_finish(Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, const Tensor& weights, Tensor& losses,
                                float grad_scale, const Stream& stream);

}  // namespace megadlm::ops
