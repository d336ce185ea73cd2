// CPU reference elementwise and column-layout ops. add/scale/fill compute on f32 or f64 (fill also
// writes bf16, f16 and integer tensors); copy converts between any dtypes (core's copy_tensor);
// split/concat and gather_rows move whole row segments and so work for every dtype.
#include <algorithm>
#include <cstring>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

template <typename T>
void add_typed(const Tensor& a, const Tensor& b, Tensor& out) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  for (int64_t i = 0; i < out.numel(); ++i) po[i] = pa[i] + pb[i];
}

template <typename T>
void scale_typed(Tensor& x, float s) {
  T* px = x.data<T>();
  const T st = static_cast<T>(s);
  for (int64_t i = 0; i < x.numel(); ++i) px[i] *= st;
}

template <typename T>
void fill_typed(Tensor& x, T value) {
  T* px = x.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) px[i] = value;
}

/// Bytes of one row segment of `cols` columns.
size_t row_bytes(const Tensor& t, int64_t cols) {
  return static_cast<size_t>(cols) * dtype_size(t.dtype());
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream) {
  detail::with_float_type("add", a, [&](auto t) { add_typed<decltype(t)>(a, b, out); });
}

void scale_inplace(Tensor& x, float s, const Stream& stream) {
  detail::with_float_type("scale_inplace", x, [&](auto t) { scale_typed<decltype(t)>(x, s); });
}

void fill(Tensor& x, float value, const Stream& stream) {
  switch (x.dtype()) {
    case DType::F32: fill_typed<float>(x, value); break;
    case DType::F64: fill_typed<double>(x, static_cast<double>(value)); break;
    case DType::BF16: fill_typed<bf16_t>(x, bf16_t::from_float(value)); break;
    case DType::F16: fill_typed<f16_t>(x, f16_t::from_float(value)); break;
    case DType::I32: fill_typed<int32_t>(x, static_cast<int32_t>(value)); break;
    case DType::I64: fill_typed<int64_t>(x, static_cast<int64_t>(value)); break;
  }
}

void copy(const Tensor& src, Tensor& dst, const Stream& stream) { copy_tensor(src, dst, stream); }

void split_columns(const Tensor& x, const std::vector<Tensor*>& outs, const Stream& stream) {
  const int64_t rows = x.rows();
  const size_t x_row = row_bytes(x, x.cols());
  const char* px = static_cast<const char*>(x.data_ptr());
  size_t col_byte = 0;  // byte offset of the current part within a row of x
  for (Tensor* o : outs) {
    const size_t part = row_bytes(*o, o->cols());
    if (part == 0) continue;
    char* po = static_cast<char*>(o->data_ptr());
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(po + static_cast<size_t>(r) * part, px + static_cast<size_t>(r) * x_row + col_byte,
                  part);
    }
    col_byte += part;
  }
}

void concat_columns(const std::vector<const Tensor*>& parts, Tensor& out, const Stream& stream) {
  const int64_t rows = out.rows();
  const size_t out_row = row_bytes(out, out.cols());
  char* po = static_cast<char*>(out.data_ptr());
  size_t col_byte = 0;
  for (const Tensor* p : parts) {
    const size_t part = row_bytes(*p, p->cols());
    if (part == 0) continue;
    const char* pp = static_cast<const char*>(p->data_ptr());
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(po + static_cast<size_t>(r) * out_row + col_byte,
                  pp + static_cast<size_t>(r) * part, part);
    }
    col_byte += part;
  }
}

void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst, const Stream& stream) {
  const size_t bytes = row_bytes(src, src.cols());
  const int64_t rows = src.numel() / std::max<int64_t>(src.cols(), 1);
  const int32_t* idx = index.data<int32_t>();
  const auto* from = static_cast<const unsigned char*>(src.data_ptr());
  auto* to = static_cast<unsigned char*>(dst.data_ptr());
  for (int64_t m = 0; m < index.numel(); ++m) {
    MDLM_CHECK(idx[m] >= 0 && idx[m] < rows, "gather_rows: index ", idx[m], " at ", m,
               " outside the ", rows, " rows of src");
    std::memcpy(to + static_cast<size_t>(m) * bytes, from + static_cast<size_t>(idx[m]) * bytes,
                bytes);
  }
}

}  // namespace megadlm::ops::cpu
