// Dispatch for the activation family (see include/megadlm/ops/activation.h).
#include "megadlm/ops/activation.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void swiglu_forward(const Tensor& x, Tensor& y, const Stream& stream) {
  detail::check_device("swiglu_forward", stream, {&x, &y});
  detail::check_float_activation("swiglu_forward", x, "x");
  MDLM_CHECK(x.cols() % 2 == 0 && y.rows() == x.rows() && y.cols() * 2 == x.cols() &&
                 y.dtype() == x.dtype(),
             "swiglu_forward: x ", x.str(), " must be [R, 2F] and y ", y.str(), " [R, F]");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::swiglu_forward(x, y, stream));
  else cpu::swiglu_forward(x, y, stream);
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream) {
  detail::check_device("swiglu_backward", stream, {&dy, &x, &dx});
  detail::check_float_activation("swiglu_backward", x, "x");
  MDLM_CHECK(dy.rows() == x.rows() && dy.cols() * 2 == x.cols() && dx.numel() == x.numel(),
             "swiglu_backward: dy ", dy.str(), ", x ", x.str(), ", dx ", dx.str(),
             " must be [R, F], [R, 2F], [R, 2F]");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::swiglu_backward(dy, x, dx, stream));
  else cpu::swiglu_backward(dy, x, dx, stream);
}

void swiglu_backward_recompute(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& y,
                               const Stream& stream) {
  const char* op = "swiglu_backward_recompute";
  detail::check_device(op, stream, {&dy, &x, &dx, &y});
  detail::check_float_activation(op, x, "x");
  MDLM_CHECK(dy.rows() == x.rows() && dy.cols() * 2 == x.cols() && dx.numel() == x.numel() &&
                 y.numel() == dy.numel() && y.dtype() == x.dtype(),
             op, ": dy ", dy.str(), ", x ", x.str(), ", dx ", dx.str(), ", y ", y.str(),
             " must be [R, F], [R, 2F], [R, 2F], [R, F]");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::swiglu_backward_recompute(dy, x, dx, y, stream));
  else cpu::swiglu_backward_recompute(dy, x, dx, y, stream);
}

void gelu_forward(const Tensor& x, Tensor& y, const Stream& stream) {
  detail::check_device("gelu_forward", stream, {&x, &y});
  detail::check_float_activation("gelu_forward", x, "x");
  detail::check_numel("gelu_forward", y, x.numel(), "y");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::gelu_forward(x, y, stream));
  else cpu::gelu_forward(x, y, stream);
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream) {
  detail::check_device("gelu_backward", stream, {&dy, &x, &dx});
  detail::check_float_activation("gelu_backward", x, "x");
  detail::check_numel("gelu_backward", dy, x.numel(), "dy");
  detail::check_numel("gelu_backward", dx, x.numel(), "dx");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::gelu_backward(dy, x, dx, stream));
  else cpu::gelu_backward(dy, x, dx, stream);
}

}  // namespace megadlm::ops
