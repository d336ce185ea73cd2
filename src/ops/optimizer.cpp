// Dispatch for the optimizer family (see include/megadlm/ops/optimizer.h).
#include "megadlm/ops/optimizer.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                Tensor& model_param, const AdamWArgs& args, const Stream& stream) {
  detail::check_device("adamw_step", stream, {&master, &grad, &exp_avg, &exp_avg_sq, &model_param});
  const int64_t n = master.numel();
  for (const Tensor* t : std::initializer_list<const Tensor*>{&master, &grad, &exp_avg, &exp_avg_sq}) {
    detail::check_numel("adamw_step", *t, n, "master/grad/exp_avg/exp_avg_sq");
    detail::check_dtype("adamw_step", *t, DType::F32, "master/grad/exp_avg/exp_avg_sq");
  }
  if (model_param.defined()) detail::check_numel("adamw_step", model_param, n, "model_param");
  MDLM_CHECK(args.step >= 1, "adamw_step: step counts from 1, got ", args.step);
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::adamw_step(master, grad, exp_avg, exp_avg_sq, model_param, args, stream));
  else cpu::adamw_step(master, grad, exp_avg, exp_avg_sq, model_param, args, stream);
}

void adamw_step_multi(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                      Tensor& model_param, const std::vector<AdamWSegment>& segments,
                      const AdamWArgs& args, const Stream& stream) {
  const char* op = "adamw_step_multi";
  detail::check_device(op, stream, {&master, &grad, &exp_avg, &exp_avg_sq, &model_param});
  const int64_t n = master.numel();
  for (const Tensor* t : std::initializer_list<const Tensor*>{&master, &grad, &exp_avg, &exp_avg_sq}) {
    detail::check_numel(op, *t, n, "master/grad/exp_avg/exp_avg_sq");
    detail::check_dtype(op, *t, DType::F32, "master/grad/exp_avg/exp_avg_sq");
  }
  const int64_t np = model_param.defined() ? model_param.numel() : n;
  for (const AdamWSegment& s : segments) {
    MDLM_CHECK(s.numel >= 0 && s.state_offset >= 0 && s.state_offset + s.numel <= n &&
                   s.param_offset >= 0 && s.param_offset + s.numel <= np,
               op, ": segment [", s.state_offset, ", +", s.numel, ") / param offset ",
               s.param_offset, " outside the buffers (", n, " state, ", np, " param elements)");
  }
  MDLM_CHECK(args.step >= 1, op, ": step counts from 1, got ", args.step);
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::adamw_step_multi(master, grad, exp_avg, exp_avg_sq, model_param,
                                             segments, args, stream));
  else cpu::adamw_step_multi(master, grad, exp_avg, exp_avg_sq, model_param, segments, args, stream);
}

}  // namespace megadlm::ops
