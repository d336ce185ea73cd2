// CUDA backend for ops/random.h: the same init_normal_value as the CPU, one thread per element.
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/cuda_ops.h"

namespace megadlm::ops::cuda {

namespace {
template <typename T>
__global__ void fill_normal_kernel(T* out, int64_t rows, int64_t cols, NormalInitArgs a) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float v = init_normal_value(a, (a.row_offset + r) * a.global_cols + a.col_offset + c);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) out[i] = __float2bfloat16_rn(v);
    else out[i] = static_cast<T>(v);
  }
}

template <typename T>
void launch(Tensor& x, const NormalInitArgs& a, cudaStream_t s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535 * 4));
  fill_normal_kernel<T><<<grid, 256, 0, s>>>(static_cast<T*>(x.data_ptr()), x.rows(), x.cols(), a);
  MDLM_CUDA_CHECK_LAUNCH();
}
}  // namespace

void fill_normal(Tensor& x, const NormalInitArgs& args, const Stream& stream) {
  cudaStream_t s = detail::native_stream(stream);
  switch (x.dtype()) {
    case DType::F32: return launch<float>(x, args, s);
    case DType::BF16: return launch<__nv_bfloat16>(x, args, s);
    default: MDLM_FAIL("fill_normal: CUDA supports f32 and bf16, got ", x.str());
  }
}

}  // namespace megadlm::ops::cuda
