// Dispatch for the cross-entropy family (see include/megadlm/ops/cross_entropy.h).
#include "megadlm/ops/cross_entropy.h"
#include <cstdint>
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

namespace {
void check_ce(const char* op, const Tensor& logits, const Tensor& targets, const Tensor& losses) {
  detail::check_float_activation(op, logits, "logits");
  detail::check_dtype(op, targets, DType::I32, "targets");
  detail::check_numel(op, targets, logits.rows(), "targets");
  detail::check_numel(op, losses, logits.rows(), "losses");
  detail::check_aux_float(op, losses, logits, "losses");
}

/// A vocabulary shard: logits [T, Vl >= 1] whose global column ids [vocab_start, vocab_start + Vl)
/// are representable as i32 targets.
void check_shard(const char* op, const Tensor& logits, int64_t vocab_start) {
  detail::check_float_activation(op, logits, "logits");
  MDLM_CHECK(logits.dim() >= 1 && logits.cols() >= 1, op,
             ": a vocabulary shard needs at least one column, got logits ", logits.str());
  MDLM_CHECK(vocab_start >= 0 && vocab_start <= int64_t{INT32_MAX} + 1 - logits.cols(), op,
             ": vocab_start ", vocab_start, " with ", logits.cols(),
             " columns is outside the i32 target ids [0, 2^31)");
}

/// A per-row statistic (or loss, or weight): T elements of f32 (or the CPU logits' dtype).
void check_row_stat(const char* op, const Tensor& t, const Tensor& logits, const char* what) {
  detail::check_numel(op, t, logits.rows(), what);
  detail::check_aux_float(op, t, logits, what);
}

void check_targets_shape(const char* op, const Tensor& targets, const Tensor& logits) {
  detail::check_dtype(op, targets, DType::I32, "targets");
  detail::check_numel(op, targets, logits.rows(), "targets");
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                           const Stream& stream) {
  detail::check_device("cross_entropy_forward", stream, {&logits, &targets, &losses});
  check_ce("cross_entropy_forward", logits, targets, losses);
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::cross_entropy_forward(logits, targets, losses, stream));
  else cpu::cross_entropy_forward(logits, targets, losses, stream);
}

void cross_entropy_forward_backward(Tensor& logits, const Tensor& targets, const Tensor& weights,
                                    Tensor& losses, float grad_scale, const Stream& stream) {
  detail::check_device("cross_entropy_forward_backward", stream, {&logits, &targets, &weights, &losses});
  check_ce("cross_entropy_forward_backward", logits, targets, losses);
  detail::check_numel("cross_entropy_forward_backward", weights, logits.rows(), "weights");
  detail::check_aux_float("cross_entropy_forward_backward", weights, logits, "weights");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::cross_entropy_forward_backward(logits, targets, weights, losses,
                                                           grad_scale, stream));
  else cpu::cross_entropy_forward_backward(logits, targets, weights, losses, grad_scale, stream);
}

void cross_entropy_shard_max(const Tensor& logits, Tensor& row_max, const Stream& stream) {
  const char* op = "cross_entropy_shard_max";
  detail::check_device(op, stream, {&logits, &row_max});
  check_shard(op, logits, 0);
  check_row_stat(op, row_max, logits, "row_max");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::cross_entropy_shard_max(logits, row_max, stream));
  else cpu::cross_entropy_shard_max(logits, row_max, stream);
}

void cross_entropy_shard_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit,
                               const Stream& stream) {
  const char* op = "cross_entropy_shard_stats";
  detail::check_device(op, stream, {&logits, &targets, &row_max, &sum_exp, &target_logit});
  check_shard(op, logits, vocab_start);
  check_targets_shape(op, targets, logits);
  check_row_stat(op, row_max, logits, "row_max");
  check_row_stat(op, sum_exp, logits, "sum_exp");
  check_row_stat(op, target_logit, logits, "target_logit");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::cross_entropy_shard_stats(logits, targets, vocab_start, row_max,
                                                      sum_exp, target_logit, stream));
  else cpu::cross_entropy_shard_stats(logits, targets, vocab_start, row_max, sum_exp, target_logit,
                                      stream);
}

void cross_entropy_shard_finish(Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, const Tensor& weights, Tensor& losses,
                                float grad_scale, const Stream& stream) {
  const char* op = "cross_entropy_shard_finish";
  detail::check_device(op, stream,
                       {&logits, &targets, &row_max, &sum_exp, &target_logit, &weights, &losses});
  check_shard(op, logits, vocab_start);
  check_targets_shape(op, targets, logits);
  check_row_stat(op, row_max, logits, "row_max");
  check_row_stat(op, sum_exp, logits, "sum_exp");
  check_row_stat(op, target_logit, logits, "target_logit");
  check_row_stat(op, losses, logits, "losses");
  MDLM_CHECK(grad_scale >= 0.0f, op,
             ": grad_scale must be >= 0 (0: evaluation, logits unchanged), got ", grad_scale);
  if (grad_scale > 0.0f || weights.defined()) check_row_stat(op, weights, logits, "weights");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::cross_entropy_shard_finish(logits, targets, vocab_start, row_max,
                                                       sum_exp, target_logit, weights, losses,
                                                       grad_scale, stream));
  else cpu::cross_entropy_shard_finish(logits, targets, vocab_start, row_max, sum_exp,
                                       target_logit, weights, losses, grad_scale, stream);
}

}  // namespace megadlm::ops
