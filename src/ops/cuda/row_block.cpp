// CUDA row-block copies (ops/row_block.h): the batch rows are the "rows" of one pitched 2-D copy,
// so a cache update is one call however large the batch.
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {

void copy_rows_between_batch_rows(const Tensor& src, int64_t src_row0, Tensor& dst, int64_t dst_row0,
                                  int64_t batch, int64_t rows, const Stream& stream) {
  NvtxRange range("copy_rows_between_batch_rows");
  const size_t row_bytes = static_cast<size_t>(src.cols()) * dtype_size(src.dtype());
  const int64_t src_rows = src.rows() / batch, dst_rows = dst.rows() / batch;
  const auto* s = static_cast<const unsigned char*>(src.data_ptr()) + static_cast<size_t>(src_row0) * row_bytes;
  auto* d = static_cast<unsigned char*>(dst.data_ptr()) + static_cast<size_t>(dst_row0) * row_bytes;
  MDLM_CUDA_CHECK(cudaMemcpy2DAsync(d, static_cast<size_t>(dst_rows) * row_bytes, s,
                                    static_cast<size_t>(src_rows) * row_bytes, static_cast<size_t>(rows) * row_bytes,
                                    static_cast<size_t>(batch), cudaMemcpyDeviceToDevice,
                                    megadlm::detail::native_stream(stream)));
}

}  // namespace megadlm::ops::cuda
