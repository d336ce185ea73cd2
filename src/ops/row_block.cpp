// Dispatch and checks of ops/row_block.h.
#include "megadlm/ops/row_block.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

namespace {

/// Checks a copy between `block` (its batch rows all of the block) and rows [row0, row0 + block
/// rows) of every batch row of `whole`, then runs it: into `whole` or out of it.
void block_copy(const char* op, const Tensor& src, Tensor& dst, const Tensor& block, const Tensor& whole,
                int64_t batch, int64_t row0, const Stream& stream) {
  detail::check_device(op, stream, {&src, &dst});
  MDLM_CHECK(src.defined() && dst.defined() && src.dim() == 2 && dst.dim() == 2 && src.cols() == dst.cols() &&
                 src.dtype() == dst.dtype(),
             op, ": src ", src.str(), " and dst ", dst.str(), " must be 2-D of the same width and dtype");
  MDLM_CHECK(batch >= 1 && src.rows() % batch == 0 && dst.rows() % batch == 0, op, ": ", batch,
             " batch rows do not divide src ", src.str(), " and dst ", dst.str());
  const int64_t block_rows = block.rows() / batch, whole_rows = whole.rows() / batch;
  MDLM_CHECK(row0 >= 0 && row0 + block_rows <= whole_rows, op, ": rows [", row0, ", ", row0 + block_rows,
             ") of each batch row outside the ", whole_rows, " rows of ", &whole == &src ? "src" : "dst");
  if (block.numel() == 0) return;
  const bool into_whole = &whole == &dst;
  const int64_t src_row0 = into_whole ? 0 : row0, dst_row0 = into_whole ? row0 : 0;
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::copy_rows_between_batch_rows(src, src_row0, dst, dst_row0, batch, block_rows, stream));
  else cpu::copy_rows_between_batch_rows(src, src_row0, dst, dst_row0, batch, block_rows, stream);
}

}  // namespace

void copy_row_block(const Tensor& src, Tensor& dst, int64_t batch, int64_t row0, const Stream& stream) {
  block_copy("copy_row_block", src, dst, src, dst, batch, row0, stream);
}

void read_row_block(const Tensor& src, Tensor& dst, int64_t batch, int64_t row0, const Stream& stream) {
  block_copy("read_row_block", src, dst, dst, src, batch, row0, stream);
}

void add_row_block(const Tensor& src, Tensor& dst, int64_t batch, int64_t row0, const Stream& stream) {
  const char* op = "add_row_block";
  detail::check_device(op, stream, {&src, &dst});
  MDLM_CHECK(src.defined() && dst.defined() && src.dim() == 2 && dst.dim() == 2 && src.cols() == dst.cols() &&
                 src.dtype() == dst.dtype(),
             op, ": src ", src.str(), " and dst ", dst.str(), " must be 2-D of the same width and dtype");
  MDLM_CHECK(dst.dtype() == DType::F32 || dst.dtype() == DType::BF16 || (!stream.is_cuda() && dst.dtype() == DType::F64),
             op, ": f32 or bf16 (f64 on the CPU) expected, got ", dst.str());
  MDLM_CHECK(batch >= 1 && src.rows() % batch == 0 && dst.rows() % batch == 0, op, ": ", batch,
             " batch rows do not divide src ", src.str(), " and dst ", dst.str());
  const int64_t rows = src.rows() / batch, dst_rows = dst.rows() / batch;
  MDLM_CHECK(row0 >= 0 && row0 + rows <= dst_rows, op, ": rows [", row0, ", ", row0 + rows,
             ") of each batch row outside the ", dst_rows, " rows of dst");
  if (src.numel() == 0) return;
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::add_rows_between_batch_rows(src, dst, row0, batch, rows, stream));
  else cpu::add_rows_between_batch_rows(src, dst, row0, batch, rows, stream);
}

}  // namespace megadlm::ops
