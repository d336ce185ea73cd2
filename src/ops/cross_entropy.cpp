// Dispatch for the cross-entropy family (see include/megadlm/ops/cross_entropy.h).
#include "megadlm/ops/cross_entropy.h"
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

}  // namespace megadlm::ops
