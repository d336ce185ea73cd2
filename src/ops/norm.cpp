// Dispatch for the norm family (see include/megadlm/ops/norm.h).
#include "megadlm/ops/norm.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

namespace {
void check_common(const char* op, const Tensor& x, const Tensor& weight, const Tensor& other,
                  const Tensor& rstd) {
  detail::check_float_activation(op, x, "x");
  detail::check_numel(op, weight, x.cols(), "weight");
  MDLM_CHECK(weight.dtype() == x.dtype(), op, ": weight ", weight.str(), " must have x's dtype ",
             x.str());
  MDLM_CHECK(other.numel() == x.numel() && other.dtype() == x.dtype(), op, ": ", other.str(),
             " must match x ", x.str());
  detail::check_numel(op, rstd, x.rows(), "rstd");
  detail::check_aux_float(op, rstd, x, "rstd");
}
}  // namespace

void rms_norm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                      const Stream& stream) {
  detail::check_device("rms_norm_forward", stream, {&x, &weight, &y, &rstd});
  check_common("rms_norm_forward", x, weight, y, rstd);
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::rms_norm_forward(x, weight, y, rstd, eps, stream));
  else cpu::rms_norm_forward(x, weight, y, rstd, eps, stream);
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       Tensor& dx, Tensor& dweight, const Stream& stream) {
  detail::check_device("rms_norm_backward", stream, {&dy, &x, &weight, &rstd, &dx, &dweight});
  check_common("rms_norm_backward", x, weight, dy, rstd);
  check_common("rms_norm_backward", x, weight, dx, rstd);
  detail::check_numel("rms_norm_backward", dweight, x.cols(), "dweight");
  if (x.is_cuda()) detail::check_dtype("rms_norm_backward", dweight, DType::F32, "dweight");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::rms_norm_backward(dy, x, weight, rstd, dx, dweight, stream));
  else cpu::rms_norm_backward(dy, x, weight, rstd, dx, dweight, stream);
}

void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          Tensor& sum, Tensor& y, Tensor& rstd, float eps, const Stream& stream) {
  const char* op = "add_rms_norm_forward";
  detail::check_device(op, stream, {&x, &residual, &weight, &sum, &y, &rstd});
  check_common(op, x, weight, y, rstd);
  check_common(op, x, weight, residual, rstd);
  check_common(op, x, weight, sum, rstd);
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::add_rms_norm_forward(x, residual, weight, sum, y, rstd, eps, stream));
  else cpu::add_rms_norm_forward(x, residual, weight, sum, y, rstd, eps, stream);
}

void rms_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& weight,
                           const Tensor& rstd, const Tensor& dresidual, Tensor& dx,
                           Tensor& dweight, const Stream& stream) {
  const char* op = "rms_norm_backward_add";
  detail::check_device(op, stream, {&dy, &x, &weight, &rstd, &dresidual, &dx, &dweight});
  check_common(op, x, weight, dy, rstd);
  check_common(op, x, weight, dx, rstd);
  check_common(op, x, weight, dresidual, rstd);
  detail::check_numel(op, dweight, x.cols(), "dweight");
  if (x.is_cuda()) detail::check_dtype(op, dweight, DType::F32, "dweight");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::rms_norm_backward_add(dy, x, weight, rstd, dresidual, dx, dweight, stream));
  else cpu::rms_norm_backward_add(dy, x, weight, rstd, dresidual, dx, dweight, stream);
}

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                        Tensor& mean, Tensor& rstd, float eps, const Stream& stream) {
  detail::check_device("layer_norm_forward", stream, {&x, &weight, &bias, &y, &mean, &rstd});
  check_common("layer_norm_forward", x, weight, y, rstd);
  detail::check_numel("layer_norm_forward", mean, x.rows(), "mean");
  if (bias.defined()) detail::check_numel("layer_norm_forward", bias, x.cols(), "bias");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::layer_norm_forward(x, weight, bias, y, mean, rstd, eps, stream));
  else cpu::layer_norm_forward(x, weight, bias, y, mean, rstd, eps, stream);
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                         Tensor& dbias, const Stream& stream) {
  detail::check_device("layer_norm_backward", stream,
                       {&dy, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
  check_common("layer_norm_backward", x, weight, dy, rstd);
  check_common("layer_norm_backward", x, weight, dx, rstd);
  detail::check_numel("layer_norm_backward", dweight, x.cols(), "dweight");
  if (dbias.defined()) detail::check_numel("layer_norm_backward", dbias, x.cols(), "dbias");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(
        cuda::layer_norm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias, stream));
  else cpu::layer_norm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias, stream);
}

}  // namespace megadlm::ops
