// Dispatch for the sampling family (see include/megadlm/ops/sampling.h).
#include "megadlm/ops/sampling.h"
#include <cmath>
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void sample_proposals(const Tensor& logits, const Tensor& uncond_logits, const Tensor& keys,
                      const ProposalArgs& args, Tensor& tokens, Tensor& confidence,
                      const Stream& stream) {
  const char* op = "sample_proposals";
  detail::check_device(op, stream, {&logits, &uncond_logits, &keys, &tokens, &confidence});
  detail::check_float_activation(op, logits, "logits");
  MDLM_CHECK(logits.dim() == 2 && logits.cols() >= 1, op, ": logits must be [rows, vocab], got ", logits.str());
  if (uncond_logits.defined()) {
    MDLM_CHECK(uncond_logits.shape() == logits.shape() && uncond_logits.dtype() == logits.dtype(), op,
               ": uncond_logits ", uncond_logits.str(), " must match logits ", logits.str());
  }
  detail::check_dtype(op, keys, DType::I32, "keys");
  detail::check_numel(op, keys, 2 * logits.rows(), "keys");
  detail::check_dtype(op, tokens, DType::I32, "tokens");
  detail::check_numel(op, tokens, logits.rows(), "tokens");
  detail::check_dtype(op, confidence, DType::F64, "confidence");
  detail::check_numel(op, confidence, logits.rows(), "confidence");
  MDLM_CHECK(std::isfinite(args.temperature) && args.temperature >= 0, op, ": temperature must be >= 0, got ",
             args.temperature);
  if (logits.rows() == 0) return;
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::sample_proposals(logits, uncond_logits, keys, args, tokens, confidence, stream));
  else cpu::sample_proposals(logits, uncond_logits, keys, args, tokens, confidence, stream);
}

}  // namespace megadlm::ops
