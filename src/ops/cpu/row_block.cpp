// CPU row-block copies (ops/row_block.h): one memcpy per batch row.
#include <cstring>
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

void copy_rows_between_batch_rows(const Tensor& src, int64_t src_row0, Tensor& dst, int64_t dst_row0,
                                  int64_t batch, int64_t rows, const Stream& stream) {
  (void)stream;
  const size_t row_bytes = static_cast<size_t>(src.cols()) * dtype_size(src.dtype());
  const int64_t src_rows = src.rows() / batch, dst_rows = dst.rows() / batch;
  const auto* s = static_cast<const unsigned char*>(src.data_ptr());
  auto* d = static_cast<unsigned char*>(dst.data_ptr());
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(d + static_cast<size_t>(b * dst_rows + dst_row0) * row_bytes,
                s + static_cast<size_t>(b * src_rows + src_row0) * row_bytes, static_cast<size_t>(rows) * row_bytes);
}

}  // namespace megadlm::ops::cpu
