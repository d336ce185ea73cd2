// Device-side dtype conversion (used by Tensor::to and copy_tensor).
#include <cuda_fp16.h>
#include "core/cuda/cuda_utils.h"
#include "core/cuda_bridge.h"

namespace megadlm::detail {
namespace {

template <typename T> __device__ __forceinline__ double load_d(const T* p, int64_t i) {
  return static_cast<double>(p[i]);
}
template <> __device__ __forceinline__ double load_d(const __nv_bfloat16* p, int64_t i) {
  return static_cast<double>(__bfloat162float(p[i]));
}
template <> __device__ __forceinline__ double load_d(const __half* p, int64_t i) {
  return static_cast<double>(__half2float(p[i]));
}
template <typename T> __device__ __forceinline__ void store_d(T* p, int64_t i, double v) {
  p[i] = static_cast<T>(v);
}
template <> __device__ __forceinline__ void store_d(__nv_bfloat16* p, int64_t i, double v) {
  p[i] = __float2bfloat16_rn(static_cast<float>(v));
}
template <> __device__ __forceinline__ void store_d(__half* p, int64_t i, double v) {
  p[i] = __float2half_rn(static_cast<float>(v));
}

template <typename S, typename D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    store_d(dst, i, load_d(src, i));
  }
}

template <typename S, typename D>
void launch(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  unsigned grid = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535));
  convert_kernel<S, D><<<grid, 256, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
  MDLM_CUDA_CHECK_LAUNCH();
}

template <typename S>
void launch_dst(const void* src, DType ddt, void* dst, int64_t n, cudaStream_t s) {
  switch (ddt) {
    case DType::F32: return launch<S, float>(src, dst, n, s);
    case DType::F64: return launch<S, double>(src, dst, n, s);
    case DType::BF16: return launch<S, __nv_bfloat16>(src, dst, n, s);
    case DType::F16: return launch<S, __half>(src, dst, n, s);
    case DType::I32: return launch<S, int32_t>(src, dst, n, s);
    case DType::I64: return launch<S, int64_t>(src, dst, n, s);
  }
}

}  // namespace

void cuda_convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n,
                  const CudaStreamResources* res) {
  if (n == 0) return;
  cudaStream_t s = res->stream;
  switch (sdt) {
    case DType::F32: return launch_dst<float>(src, ddt, dst, n, s);
    case DType::F64: return launch_dst<double>(src, ddt, dst, n, s);
    case DType::BF16: return launch_dst<__nv_bfloat16>(src, ddt, dst, n, s);
    case DType::F16: return launch_dst<__half>(src, ddt, dst, n, s);
    case DType::I32: return launch_dst<int32_t>(src, ddt, dst, n, s);
    case DType::I64: return launch_dst<int64_t>(src, ddt, dst, n, s);
  }
}

}  // namespace megadlm::detail
