// CPU reference reductions, summed in double and added once into their output (+=).
// sum_squares reads any float dtype (f32, f64, bf16, f16); sum_rows reads f32/f64 and adds into an
// f32 or same-dtype output; dot is f32 (the dispatch enforces it).
#include <type_traits>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

template <typename T>
double sum_of_squares(const Tensor& x) {
  const T* p = x.data<T>();
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double v;
    if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) v = p[i].to_float();
    else v = static_cast<double>(p[i]);
    s += v * v;
  }
  return s;
}

template <typename T>
void sum_rows_typed(const Tensor& x, Tensor& out) {
  const int64_t rows = x.rows(), cols = x.cols();
  const T* p = x.data<T>();
  std::vector<double> acc(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) acc[static_cast<size_t>(c)] += p[r * cols + c];
  const detail::FloatAccess o("sum_rows", out, "out");
  for (int64_t c = 0; c < cols; ++c) o.add(c, acc[static_cast<size_t>(c)]);
}

}  // namespace

void sum_squares(const Tensor& x, Tensor& out, const Stream& stream) {
  double s = 0;
  switch (x.dtype()) {
    case DType::F32: s = sum_of_squares<float>(x); break;
    case DType::F64: s = sum_of_squares<double>(x); break;
    case DType::BF16: s = sum_of_squares<bf16_t>(x); break;
    case DType::F16: s = sum_of_squares<f16_t>(x); break;
    default: MDLM_FAIL("sum_squares: x must be a float tensor, got ", x.str());
  }
  out.data<float>()[0] = static_cast<float>(out.data<float>()[0] + s);
}

void sum_rows(const Tensor& x, Tensor& out, const Stream& stream) {
  detail::with_float_type("sum_rows", x, [&](auto t) { sum_rows_typed<decltype(t)>(x, out); });
}

void dot(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(pa[i]) * pb[i];
  out.data<float>()[0] = static_cast<float>(out.data<float>()[0] + s);
}

}  // namespace megadlm::ops::cpu
