// Dispatch for the attention-merge family (see include/megadlm/ops/attention_merge.h).
#include "megadlm/ops/attention_merge.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                     const AttentionMergeArgs& a, const Stream& stream) {
  const char* op = "attention_merge";
  detail::check_device(op, stream, {&out, &lse, &block_out, &block_lse});
  MDLM_CHECK(a.batch > 0 && a.seq > 0 && a.num_heads > 0 && a.head_dim > 0, op,
             ": batch, seq, heads and head_dim must be positive");
  MDLM_CHECK(a.out_seq >= 0 && a.out_row0 >= 0 && a.out_row0 + a.seq <= a.out_rows(), op, ": rows [",
             a.out_row0, ", ", a.out_row0 + a.seq, ") outside the ", a.out_rows(), " rows of out");
  const int64_t rows = a.batch * a.seq * a.num_heads, out_rows = a.batch * a.out_rows() * a.num_heads;
  detail::check_numel(op, out, out_rows * a.head_dim, "out");
  detail::check_numel(op, block_out, rows * a.head_dim, "block_out");
  detail::check_numel(op, lse, out_rows, "lse");
  detail::check_numel(op, block_lse, rows, "block_lse");
  if (stream.is_cuda()) {
    MDLM_CHECK((out.dtype() == DType::F32 || out.dtype() == DType::BF16) && lse.dtype() == DType::F32 &&
                   block_lse.dtype() == DType::F32 &&
                   (block_out.dtype() == DType::BF16 || block_out.dtype() == DType::F32),
               op, ": CUDA merges into f32 or bf16 out and f32 lse from a bf16 or f32 block (f32 lse), got out ",
               out.str(), ", lse ", lse.str(), ", block ", block_out.str(), ", ", block_lse.str());
    MDLM_CUDA_BACKEND(cuda::attention_merge(out, lse, block_out, block_lse, a, stream));
  } else {
    MDLM_CHECK((out.dtype() == DType::F32 || out.dtype() == DType::F64) &&
                   block_out.dtype() == out.dtype(),
               op, ": CPU out and block_out must share an f32 or f64 dtype, got ", out.str(),
               " and ", block_out.str());
    detail::check_aux_float(op, lse, out, "lse");
    detail::check_aux_float(op, block_lse, out, "block_lse");
    cpu::attention_merge(out, lse, block_out, block_lse, a, stream);
  }
}

}  // namespace megadlm::ops
