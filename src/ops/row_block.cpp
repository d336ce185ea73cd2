// Dispatch and checks of ops/row_block.h.
#include "megadlm/ops/row_block.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

void copy_row_block(const Tensor& src, Tensor& dst, int64_t batch, int64_t row0, const Stream& stream) {
  const char* op = "copy_row_block";
  detail::check_device(op, stream, {&src, &dst});
  MDLM_CHECK(src.defined() && dst.defined() && src.dim() == 2 && dst.dim() == 2 && src.cols() == dst.cols() &&
                 src.dtype() == dst.dtype(),
             op, ": src ", src.str(), " and dst ", dst.str(), " must be 2-D of the same width and dtype");
  MDLM_CHECK(batch >= 1 && src.rows() % batch == 0 && dst.rows() % batch == 0, op, ": ", batch,
             " batch rows do not divide src ", src.str(), " and dst ", dst.str());
  const int64_t src_rows = src.rows() / batch, dst_rows = dst.rows() / batch;
  MDLM_CHECK(row0 >= 0 && row0 + src_rows <= dst_rows, op, ": rows [", row0, ", ", row0 + src_rows,
             ") of each batch row outside the ", dst_rows, " rows of dst");
  if (src.numel() == 0) return;
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::copy_row_block(src, dst, batch, row0, stream));
  else cpu::copy_row_block(src, dst, batch, row0, stream);
}

void read_row_block(const Tensor& src, Tensor& dst, int64_t batch, int64_t row0, const Stream& stream) {
  const char* op = "read_row_block";
  detail::check_device(op, stream, {&src, &dst});
  MDLM_CHECK(src.defined() && dst.defined() && src.dim() == 2 && dst.dim() == 2 && src.cols() == dst.cols() &&
                 src.dtype() == dst.dtype(),
             op, ": src ", src.str(), " and dst ", dst.str(), " must be 2-D of the same width and dtype");
  MDLM_CHECK(batch >= 1 && src.rows() % batch == 0 && dst.rows() % batch == 0, op, ": ", batch,
             " batch rows do not divide src ", src.str(), " and dst ", dst.str());
  const int64_t src_rows = src.rows() / batch, dst_rows = dst.rows() / batch;
  MDLM_CHECK(row0 >= 0 && row0 + dst_rows <= src_rows, op, ": rows [", row0, ", ", row0 + dst_rows,
             ") of each batch row outside the ", src_rows, " rows of src");
  if (dst.numel() == 0) return;
  if (stream.is_cuda()) MDLM_CUDA_BACKEND(cuda::read_row_block(src, dst, batch, row0, stream));
  else cpu::read_row_block(src, dst, batch, row0, stream);
}

}  // namespace megadlm::ops
