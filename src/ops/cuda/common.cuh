// Device helpers shared by the CUDA op families: fp32 conversions of the storage types,
// aligned vector loads/stores, warp and row reductions, and the dtype switch the entries use.
// Kernels themselves live in their family's .cu file; this header has no kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include "core/cuda/cuda_utils.h"
#include "megadlm/core/dtype.h"
#include "megadlm/core/error.h"

namespace megadlm::ops::cuda {

using bf16 = __nv_bfloat16;

inline constexpr int kWarpSize = 32;
/// Largest block the row kernels use (norm, embedding): 16 warps.
inline constexpr int kMaxRowBlockThreads = 512;
inline constexpr int kMaxRowBlockWarps = kMaxRowBlockThreads / kWarpSize;

// ---- storage type <-> fp32 (all arithmetic is fp32) ---------------------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(double v) { return static_cast<float>(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ double from_float<double>(float v) { return v; }

/// Elements of T in one 16-byte access.
template <typename T> inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

/// N consecutive elements as one aligned access (16 bytes for N = kVec16<T>: LDG.128/STG.128).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

/// Loads N elements at p (aligned to sizeof(T) * N) and widens them to fp32.
template <int N, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[N]) {
  const Vec<T, N> v = *reinterpret_cast<const Vec<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(v.v[i]);
}

/// Rounds N fp32 values to T and stores them at p (aligned to sizeof(T) * N).
template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[N]) {
  Vec<T, N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) v.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// ---- reductions ---------------------------------------------------------------------------

/// Sum over aligned groups of `width` lanes (a power of two <= 32). The xor butterfly leaves
/// the bitwise-same total in every lane of the group (float addition is commutative).
/// All 32 lanes of the warp must call it.
__device__ __forceinline__ float group_sum(float v, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// Row reduction for blocks laid out as blockDim.x threads per row (a power of two, <= 512) and
/// blockDim.y rows: afterwards every thread of a row holds the row's sums, in a fixed order.
/// Every thread of the block must call it (it synchronises when a row spans several warps).
/// `smem` holds N * kMaxRowBlockWarps floats.
template <int N>
__device__ __forceinline__ void row_sum(float (&v)[N], float* smem) {
  const int tpr = static_cast<int>(blockDim.x);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = group_sum(v[i], tpr < kWarpSize ? tpr : kWarpSize);
  if (tpr <= kWarpSize) return;  // uniform over the block
  const int warps_per_row = tpr / kWarpSize;
  const int warp = static_cast<int>(threadIdx.y) * warps_per_row + static_cast<int>(threadIdx.x) / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) smem[i * kMaxRowBlockWarps + warp] = v[i];
  }
  __syncthreads();
  const int first = static_cast<int>(threadIdx.y) * warps_per_row;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float s = 0.0f;
    for (int w = 0; w < warps_per_row; ++w) s += smem[i * kMaxRowBlockWarps + first + w];
    v[i] = s;
  }
  __syncthreads();  // smem may be reused by the next call
}

/// Sum over a 1-D block (blockDim.x a multiple of 32, <= 1024), in a fixed order; the result
/// is valid in thread 0 only. `smem` holds 32 floats. Every thread must call it.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  v = warp_sum(v);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) smem[warp] = v;
  __syncthreads();
  float s = 0.0f;
  if (threadIdx.x == 0) {
    const int warps = static_cast<int>(blockDim.x) / kWarpSize;
    for (int w = 0; w < warps; ++w) s += smem[w];
  }
  __syncthreads();
  return s;
}

// ---- flat elementwise kernels -------------------------------------------------------------

/// Threads per block of the flat kernels; their grid-stride loops cap the grid at kFlatMaxBlocks.
inline constexpr int kFlatThreads = 256;
inline constexpr int64_t kFlatMaxBlocks = 16384;

/// Applies op to n elements: op.template apply<N>(i) handles elements [i, i + N). With kVec > 1
/// the body uses N = kVec (the caller guarantees the alignment that needs) and the last n % kVec
/// elements use N = 1.
template <int kVec, typename Op>
__global__ void __launch_bounds__(kFlatThreads) flat_kernel(int64_t n, Op op) {
  const int64_t npacks = n / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t q = tid; q < npacks; q += stride) op.template apply<kVec>(q * kVec);
  if constexpr (kVec > 1) {
    const int64_t t = npacks * kVec + tid;
    if (t < n) op.template apply<1>(t);
  }
}

/// Launches flat_kernel with kVec-wide accesses when `vectorizable`, single elements otherwise.
template <int kVec, typename Op>
void launch_flat(int64_t n, bool vectorizable, const Op& op, cudaStream_t stream) {
  if (n <= 0) return;
  const int vec = vectorizable ? kVec : 1;
  const int64_t work = std::max<int64_t>(n / vec, 1);
  const unsigned grid =
      static_cast<unsigned>(std::min(kFlatMaxBlocks, (work + kFlatThreads - 1) / kFlatThreads));
  if (vec == kVec) flat_kernel<kVec, Op><<<grid, kFlatThreads, 0, stream>>>(n, op);
  else flat_kernel<1, Op><<<grid, kFlatThreads, 0, stream>>>(n, op);
  MDLM_CUDA_CHECK_LAUNCH();
}

// ---- host helpers -------------------------------------------------------------------------

template <typename T> struct TypeTag { using type = T; };

/// Calls f(TypeTag<float>{}) or f(TypeTag<bf16>{}) for the activation dtypes of the CUDA backend.
template <typename F>
void dispatch_activation_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f(TypeTag<float>{}); return;
    case DType::BF16: f(TypeTag<bf16>{}); return;
    default: MDLM_FAIL(op, ": CUDA supports bf16 and f32 here, got ", dtype_name(dtype));
  }
}

inline bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

/// Smallest power of two >= n (n >= 1).
inline int64_t pow2_ceil(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- row kernels: a row of `cols` elements handled by a group of threads ------------------

/// Elements one thread keeps in registers per row (bounds registers under the 512-thread limit).
inline constexpr int kMaxRowElemsPerThread = 16;
/// Longest row the row kernels take: 512 threads x 16 elements.
inline constexpr int64_t kMaxRowCols = int64_t{kMaxRowBlockThreads} * kMaxRowElemsPerThread;

/// How a row kernel covers rows of `cols` elements: accesses of `vec` elements, `tpr` threads per
/// row (blockDim.x, a power of two), `rpb` rows per block (blockDim.y) and `packs` accesses per
/// thread. Short rows (QK-norm's 64/128) share a warp; long rows use up to 512 threads.
struct RowConfig {
  int vec = 1;
  int tpr = 1;
  int rpb = 1;
  int packs = 1;
};

/// 16-byte accesses when the caller's base pointers are 16-byte aligned and cols is a multiple of
/// kVec16<T> (then every row start is aligned too); single elements otherwise.
template <typename T>
RowConfig make_row_config(int64_t cols, bool pointers_aligned, const char* op) {
  MDLM_CHECK(cols >= 1 && cols <= kMaxRowCols, op, ": CUDA rows must have 1..", kMaxRowCols,
             " columns, got ", cols);
  RowConfig c;
  c.vec = pointers_aligned && cols % kVec16<T> == 0 ? kVec16<T> : 1;
  const int64_t npacks = cols / c.vec;
  c.tpr = static_cast<int>(std::min<int64_t>(pow2_ceil(npacks), kMaxRowBlockThreads));
  c.packs = static_cast<int>(pow2_ceil(ceil_div(npacks, c.tpr)));
  c.rpb = std::max(1, 256 / c.tpr);
  return c;
}

/// Calls f(std::integral_constant<int, vec>, std::integral_constant<int, packs>) for the
/// compile-time shape matching c (vec * packs <= kMaxRowElemsPerThread).
template <int kVec, typename F>
void with_packs(int packs, F&& f) {
  using std::integral_constant;
  switch (packs) {
    case 1: f(integral_constant<int, kVec>{}, integral_constant<int, 1>{}); return;
    case 2:
      if constexpr (kVec * 2 <= kMaxRowElemsPerThread) {
        f(integral_constant<int, kVec>{}, integral_constant<int, 2>{});
        return;
      }
      break;
    case 4:
      if constexpr (kVec * 4 <= kMaxRowElemsPerThread) {
        f(integral_constant<int, kVec>{}, integral_constant<int, 4>{});
        return;
      }
      break;
    case 8:
      if constexpr (kVec * 8 <= kMaxRowElemsPerThread) {
        f(integral_constant<int, kVec>{}, integral_constant<int, 8>{});
        return;
      }
      break;
    case 16:
      if constexpr (kVec * 16 <= kMaxRowElemsPerThread) {
        f(integral_constant<int, kVec>{}, integral_constant<int, 16>{});
        return;
      }
      break;
    default: break;
  }
  MDLM_FAIL("internal: no row kernel for ", kVec, "-element accesses x ", packs);
}

template <typename T, typename F>
void with_row_shape(const RowConfig& c, F&& f) {
  if (c.vec == 1) with_packs<1>(c.packs, f);
  else with_packs<kVec16<T>>(c.packs, f);
}

}  // namespace megadlm::ops::cuda
