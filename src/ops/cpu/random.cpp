// CPU reference for ops/random.h.
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {
template <typename T>
void fill(Tensor& x, const NormalInitArgs& a) {
  T* p = x.data<T>();
  const int64_t rows = x.rows(), cols = x.cols();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      p[r * cols + c] = static_cast<T>(init_normal_value(a, (a.row_offset + r) * a.global_cols + a.col_offset + c));
}
}  // namespace

void fill_normal(Tensor& x, const NormalInitArgs& args, const Stream&) {
  switch (x.dtype()) {
    case DType::F32: return fill<float>(x, args);
    case DType::F64: return fill<double>(x, args);
    default: MDLM_FAIL("fill_normal: CPU supports f32 and f64, got ", x.str());
  }
}

}  // namespace megadlm::ops::cpu
