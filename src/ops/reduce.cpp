// Dispatch for the reduce family (see include/megadlm/ops/reduce.h).
#include "megadlm/ops/reduce.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void sum_squares(const Tensor& x, Tensor& out, const Stream& stream) {
  detail::check_device("sum_squares", stream, {&x, &out});
  detail::check_numel("sum_squares", out, 1, "out");
  detail::check_aux_float("sum_squares", out, x, "out");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::sum_squares(x, out, stream));
  else cpu::sum_squares(x, out, stream);
}

void sum_rows(const Tensor& x, Tensor& out, const Stream& stream) {
  detail::check_device("sum_rows", stream, {&x, &out});
  detail::check_numel("sum_rows", out, x.cols(), "out");
  if (x.is_cuda()) detail::check_dtype("sum_rows", out, DType::F32, "out");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::sum_rows(x, out, stream));
  else cpu::sum_rows(x, out, stream);
}

void dot(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream) {
  detail::check_device("dot", stream, {&a, &b, &out});
  detail::check_numel("dot", b, a.numel(), "b");
  detail::check_aux_float("dot", a, a, "a");
  detail::check_dtype("dot", b, a.dtype(), "b");
  detail::check_numel("dot", out, 1, "out");
  detail::check_dtype("dot", out, a.dtype(), "out");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::dot(a, b, out, stream));
  else cpu::dot(a, b, out, stream);
}

}  // namespace megadlm::ops
