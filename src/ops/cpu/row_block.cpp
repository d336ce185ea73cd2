// CPU row-block copies (ops/row_block.h): one memcpy per batch row; the add: one loop, each
// element summed in f32 (f64) and rounded once, as the CUDA kernel does.
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

namespace {

template <typename T, typename Acc, typename Load, typename Store>
void add_rows(const Tensor& src, Tensor& dst, int64_t dst_row0, int64_t batch, int64_t rows, Load load,
              Store store) {
  const int64_t w = src.cols(), dst_rows = dst.rows() / batch;
  const T* s = static_cast<const T*>(src.data_ptr());
  T* d = static_cast<T*>(dst.data_ptr());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < rows; ++i) {
      const T* sr = s + (b * rows + i) * w;
      T* dr = d + (b * dst_rows + dst_row0 + i) * w;
      for (int64_t c = 0; c < w; ++c) dr[c] = store(static_cast<Acc>(load(dr[c])) + static_cast<Acc>(load(sr[c])));
    }
}

}  // namespace

void add_rows_between_batch_rows(const Tensor& src, Tensor& dst, int64_t dst_row0, int64_t batch,
                                 int64_t rows, const Stream& stream) {
  (void)stream;
  auto same = [](auto x) { return x; };
  switch (dst.dtype()) {
    case DType::F32: add_rows<float, float>(src, dst, dst_row0, batch, rows, same, same); break;
    case DType::F64: add_rows<double, double>(src, dst, dst_row0, batch, rows, same, same); break;
    case DType::BF16:
      add_rows<bf16_t, float>(src, dst, dst_row0, batch, rows, [](bf16_t x) { return x.to_float(); },
                              [](float x) { return bf16_t::from_float(x); });
      break;
    default: MDLM_FAIL("add_rows_between_batch_rows: unsupported dtype ", dst.str());
  }
}

}  // namespace megadlm::ops::cpu
