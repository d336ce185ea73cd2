// Dispatch for the dropout family (see include/megadlm/ops/dropout.h).
#include "megadlm/ops/dropout.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

namespace {
void check_dropout(const char* op, const DropoutArgs& a) {
  MDLM_CHECK(a.p >= 0.0f && a.p < 1.0f, op, ": dropout probability ", a.p, " must be in [0, 1)");
  MDLM_CHECK(a.seq_len > 0, op, ": seq_len must be positive");
}
}  // namespace

void dropout_add_forward(const Tensor& x, const Tensor& residual, Tensor& out,
                         const DropoutArgs& args, const Stream& stream) {
  detail::check_device("dropout_add_forward", stream, {&x, &residual, &out});
  check_dropout("dropout_add_forward", args);
  MDLM_CHECK(x.numel() == residual.numel() && x.numel() == out.numel() &&
                 x.dtype() == residual.dtype() && x.dtype() == out.dtype(),
             "dropout_add_forward: x ", x.str(), ", residual ", residual.str(), ", out ", out.str(),
             " must match");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::dropout_add_forward(x, residual, out, args, stream));
  else cpu::dropout_add_forward(x, residual, out, args, stream);
}

void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutArgs& args, const Stream& stream) {
  detail::check_device("dropout_backward", stream, {&dout, &dx});
  check_dropout("dropout_backward", args);
  MDLM_CHECK(dout.numel() == dx.numel() && dout.dtype() == dx.dtype(), "dropout_backward: dout ",
             dout.str(), " and dx ", dx.str(), " must match");
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::dropout_backward(dout, dx, args, stream));
  else cpu::dropout_backward(dout, dx, args, stream);
}

}  // namespace megadlm::ops
