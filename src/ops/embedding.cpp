// Dispatch for the embedding family (see include/megadlm/ops/embedding.h).
#include "megadlm/ops/embedding.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out, int64_t vocab_start,
                       const Stream& stream) {
  detail::check_device("embedding_forward", stream, {&weight, &ids, &out});
  detail::check_float_activation("embedding_forward", weight, "weight");
  detail::check_dtype("embedding_forward", ids, DType::I32, "ids");
  MDLM_CHECK(weight.dim() == 2 && out.numel() == ids.numel() * weight.size(1) &&
                 out.dtype() == weight.dtype(),
             "embedding_forward: weight ", weight.str(), ", ids ", ids.str(), ", out ", out.str(),
             " must be [V, H], [T], [T, H]");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::embedding_forward(weight, ids, out, vocab_start, stream));
  else cpu::embedding_forward(weight, ids, out, vocab_start, stream);
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight,
                        int64_t vocab_start, const Stream& stream) {
  detail::check_device("embedding_backward", stream, {&ids, &dout, &dweight});
  detail::check_dtype("embedding_backward", ids, DType::I32, "ids");
  MDLM_CHECK(dweight.dim() == 2 && dout.numel() == ids.numel() * dweight.size(1),
             "embedding_backward: dweight ", dweight.str(), ", ids ", ids.str(), ", dout ",
             dout.str(), " must be [V, H], [T], [T, H]");
  if (dout.is_cuda()) detail::check_dtype("embedding_backward", dweight, DType::F32, "dweight");
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::embedding_backward(ids, dout, dweight, vocab_start, stream));
  else cpu::embedding_backward(ids, dout, dweight, vocab_start, stream);
}

}  // namespace megadlm::ops
