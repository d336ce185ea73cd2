// Dispatch for the fused output layer + cross-entropy (include/megadlm/ops/linear_cross_entropy.h).
#include "megadlm/ops/linear_cross_entropy.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor* rows,
                          const Tensor& targets, const Tensor& loss_weights, Tensor& losses,
                          Tensor& dx, Tensor& dweight, const LinearCrossEntropyArgs& args,
                          const Stream& stream) {
  const char* op = "linear_cross_entropy";
  detail::check_device(op, stream, {&x, &weight, rows, &targets, &loss_weights, &losses, &dx, &dweight});
  detail::check_float_activation(op, x, "x");
  MDLM_CHECK(x.dim() == 2 && weight.dim() == 2 && weight.cols() == x.cols(), op,
             ": x must be [T, H] and weight [V, H], got ", x.str(), " and ", weight.str());
  MDLM_CHECK(weight.dtype() == x.dtype(), op, ": weight and x dtypes differ (", weight.str(), ", ",
             x.str(), ")");
  const int64_t t = x.rows();
  detail::check_dtype(op, targets, DType::I32, "targets");
  detail::check_numel(op, targets, t, "targets");
  detail::check_numel(op, loss_weights, t, "loss_weights");
  detail::check_aux_float(op, loss_weights, x, "loss_weights");
  detail::check_numel(op, losses, t, "losses");
  detail::check_aux_float(op, losses, x, "losses");
  if (rows != nullptr) {
    detail::check_dtype(op, *rows, DType::I32, "rows");
    MDLM_CHECK(rows->numel() <= t, op, ": ", rows->numel(), " selected rows for ", t, " rows");
  }
  MDLM_CHECK(args.chunk_rows >= 1, op, ": chunk_rows must be >= 1, got ", args.chunk_rows);
  MDLM_CHECK(args.grad_scale >= 0.0f, op, ": grad_scale must be >= 0, got ", args.grad_scale);
  if (args.grad_scale > 0.0f) {
    MDLM_CHECK(dx.defined() && dx.dtype() == x.dtype() && dx.numel() == x.numel(), op,
               ": dx must be ", x.str(), ", got ", dx.defined() ? dx.str() : std::string("undefined"));
    MDLM_CHECK(dweight.defined() && dweight.numel() == weight.numel() &&
                   (dweight.dtype() == DType::F32 || (x.is_cpu() && dweight.dtype() == x.dtype())),
               op, ": dweight must be an f32 main grad of ", weight.numel(), " elements, got ",
               dweight.defined() ? dweight.str() : std::string("undefined"));
  }
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::linear_cross_entropy(x, weight, rows, targets, loss_weights, losses, dx,
                                                 dweight, args, stream));
  else cpu::linear_cross_entropy(x, weight, rows, targets, loss_weights, losses, dx, dweight, args, stream);
}

}  // namespace megadlm::ops
