// Dispatch for the rope family (see include/megadlm/ops/rope.h).
#include "megadlm/ops/rope.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

namespace {
void check_rope(const char* op, const Tensor& x, const Tensor& positions, const RopeArgs& args) {
  detail::check_float_activation(op, x, "x");
  MDLM_CHECK(args.heads > 0 && args.head_dim > 0, op, ": heads and head_dim must be positive");
  MDLM_CHECK(args.rotary_dim > 0 && args.rotary_dim <= args.head_dim && args.rotary_dim % 2 == 0,
             op, ": rotary_dim ", args.rotary_dim, " must be even and in (0, head_dim=",
             args.head_dim, "]");
  MDLM_CHECK(x.numel() % (args.heads * args.head_dim) == 0, op, ": x ", x.str(),
             " is not [T, ", args.heads, ", ", args.head_dim, "]");
  const int64_t tokens = x.numel() / (args.heads * args.head_dim);
  detail::check_numel(op, positions, tokens, "positions");
  detail::check_dtype(op, positions, DType::I32, "positions");
}
}  // namespace

void rope_forward(Tensor& x, const Tensor& positions, const RopeArgs& args, const Stream& stream) {
  detail::check_device("rope_forward", stream, {&x, &positions});
  check_rope("rope_forward", x, positions, args);
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::rope_forward(x, positions, args, stream));
  else cpu::rope_forward(x, positions, args, stream);
}

void rope_backward(Tensor& dx, const Tensor& positions, const RopeArgs& args, const Stream& stream) {
  detail::check_device("rope_backward", stream, {&dx, &positions});
  check_rope("rope_backward", dx, positions, args);
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::rope_backward(dx, positions, args, stream));
  else cpu::rope_backward(dx, positions, args, stream);
}

}  // namespace megadlm::ops
