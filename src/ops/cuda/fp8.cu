// CUDA FP8: the fused quantize kernels (cast + amax in one pass, optionally the transposed codes)
// and the cuBLASLt FP8 GEMM (src/ops/cuda/fp8_cuda.h). Entry → launcher → kernel, as elsewhere.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/fp8_cuda.h"
#include "ops/cuda/internal.h"
#include "ops/cuda/swiglu_math.cuh"
#include "ops/fp8_math.h"

namespace megadlm::ops::cuda {
namespace {

// The device's FP8 conversion: on sm_89 and later one cvt.rn.satfinite instruction (round to
// nearest even, saturating to the largest finite value, NaN to 0x7F): the same rule as
// fp8_math::encode, whose float arithmetic (a division and an ldexp per element) costs more than
// the quantizers' memory traffic by a count. fp8_encode_mismatches checks the two on every float
// bit pattern (Fp8Parity.DeviceConversionEqualsTheReferenceRuleOnEveryFloat).
__device__ __forceinline__ uint8_t hardware_encode(float v, fp8_math::Format f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f.exponent_bits == 4 ? __NV_E4M3 : __NV_E5M2));
#else
  return fp8_math::encode(v, f);
#endif
}
/// Two codes, a in the low byte.
__device__ __forceinline__ uint32_t hardware_encode2(float a, float b, fp8_math::Format f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, f.exponent_bits == 4 ? __NV_E4M3 : __NV_E5M2);
#else
  return hardware_encode(a, f) | (static_cast<uint32_t>(hardware_encode(b, f)) << 8);
#endif
}
// The kernels take the hardware conversion: it equals the reference rule on all 2^32 floats in
// both formats (Fp8Parity.DeviceConversionEqualsTheReferenceRuleOnEveryFloat, H100 2026-12-07),
// at about twice the quantizers' throughput. false: the reference rule's arithmetic instead.
constexpr bool kHardwareConversion = true;
__device__ __forceinline__ uint8_t device_encode(float v, fp8_math::Format f) {
  return kHardwareConversion ? hardware_encode(v, f) : fp8_math::encode(v, f);
}
__device__ __forceinline__ uint32_t device_encode2(float a, float b, fp8_math::Format f) {
  if (kHardwareConversion) return hardware_encode2(a, b, f);
  return device_encode(a, f) | (static_cast<uint32_t>(device_encode(b, f)) << 8);
}

constexpr int kTile = 32;      // transpose tile: 32 x 32 elements
constexpr int kTileRows = 8;   // threads per tile column: each thread handles 4 rows

__device__ __forceinline__ float load_f32(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

// Non-negative floats order like their bit patterns as signed ints, so atomicMax on the bits is
// a float max (amax >= 0; NaNs never reach it: fmaxf drops them).
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
}

__device__ __forceinline__ float block_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  __shared__ float warp_max[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x * blockDim.y + 31) / 32;
  const int linear = threadIdx.y * blockDim.x + threadIdx.x;
  if (linear % 32 == 0) warp_max[linear / 32] = v;
  __syncthreads();
  float m = 0.0f;
  if (linear == 0)
    for (int w = 0; w < warps; ++w) m = fmaxf(m, warp_max[w]);
  (void)lane;
  (void)warp;
  return m;  // valid in thread 0 only
}

template <typename T>
__global__ void fp8_quantize_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale,
                                    fp8_math::Format f, uint8_t* __restrict__ codes,
                                    float* __restrict__ amax) {
  const float s = *scale;
  float local = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = load_f32(x, i);
    local = fmaxf(local, fabsf(v));
    codes[i] = device_encode(__fmul_rn(v, s), f);
  }
  const float m = block_max(local);
  if (threadIdx.x == 0 && threadIdx.y == 0) atomic_max_nonneg(amax, m);
}

// One 32 x 32 tile per block: coalesced reads of x's rows, row-wise codes written in place,
// transposed codes written through shared memory so that their rows are coalesced too.
template <typename T>
__global__ void fp8_quantize_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                              const float* __restrict__ scale, fp8_math::Format f,
                                              uint8_t* __restrict__ codes, uint8_t* __restrict__ codes_t,
                                              float* __restrict__ amax) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = *scale;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile, r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  float local = 0.0f;
  for (int dy = threadIdx.y; dy < kTile; dy += kTileRows) {
    const int64_t r = r0 + dy, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = load_f32(x, r * cols + c);
      local = fmaxf(local, fabsf(v));
      const uint8_t q = device_encode(__fmul_rn(v, s), f);
      if (codes != nullptr) codes[r * cols + c] = q;
      tile[dy][threadIdx.x] = q;
    }
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < kTile; dy += kTileRows) {
    const int64_t c = c0 + dy, r = r0 + threadIdx.x;  // output row c, column r
    if (r < rows && c < cols) codes_t[c * rows + r] = tile[threadIdx.x][dy];
  }
  const float m = block_max(local);
  if (threadIdx.x == 0 && threadIdx.y == 0) atomic_max_nonneg(amax, m);
}

// The same two kernels, vectorised for the shapes training meets (every dimension a multiple of
// 64, aligned buffers): 8 elements a thread, one 16-byte load (bf16) or two (f32) and one 8-byte
// store of codes; each element goes through exactly the scalar kernels' operations, so the codes
// are the same bit for bit. The transposed kernel takes 64 x 64 tiles through shared memory.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
/// Codes of 8 values, element j in byte j (little-endian), and their largest magnitude.
__device__ __forceinline__ uint2 encode8(const float (&v)[8], float s, fp8_math::Format f, float& local) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    local = fmaxf(local, fmaxf(fabsf(v[j]), fabsf(v[j + 1])));
    w[j / 4] |= device_encode2(__fmul_rn(v[j], s), __fmul_rn(v[j + 1], s), f) << (8 * (j % 4));
  }
  return make_uint2(w[0], w[1]);
}

template <typename T>
__global__ void fp8_quantize_vec8_kernel(const T* __restrict__ x, int64_t n8, const float* __restrict__ scale,
                                         fp8_math::Format f, uint8_t* __restrict__ codes,
                                         float* __restrict__ amax) {
  const float s = *scale;
  float local = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[8];
    load8(x + i * 8, v);
    reinterpret_cast<uint2*>(codes)[i] = encode8(v, s, f, local);
  }
  const float m = block_max(local);
  if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
}

constexpr int kVecTile = 64;        // 64 x 64 elements a block
constexpr int kVecTilePitch = 68;   // bytes: 17 words, so that the column reads of the transposed
                                    // store spread over the banks (2-way at most)
constexpr int kVecThreads = 256;

/// Column cc of a 64 x 64 byte tile in shared memory (rows kVecTilePitch bytes apart), rows
/// group * 8 .. group * 8 + 7, as the 8 consecutive bytes of the transposed matrix they become:
/// the transposed stores of the kernels below, 8 bytes a thread.
__device__ __forceinline__ uint2 tile_column8(const uint32_t* tile_words, int cc, int group) {
  const uint8_t* tile = reinterpret_cast<const uint8_t*>(tile_words);
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j)
    w[j / 4] |= static_cast<uint32_t>(tile[(group * 8 + j) * kVecTilePitch + cc]) << (8 * (j % 4));
  return make_uint2(w[0], w[1]);
}

template <typename T>
__global__ void fp8_quantize_transpose_vec_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                                  const float* __restrict__ scale, fp8_math::Format f,
                                                  uint8_t* __restrict__ codes, uint8_t* __restrict__ codes_t,
                                                  float* __restrict__ amax) {
  __shared__ uint32_t tile_words[kVecTile * kVecTilePitch / 4];
  const float s = *scale;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kVecTile, r0 = static_cast<int64_t>(blockIdx.y) * kVecTile;
  const int group = threadIdx.x % 8;  // which 8 columns (load) or which 8 rows (transposed store)
  float local = 0.0f;
  for (int rr = threadIdx.x / 8; rr < kVecTile; rr += kVecThreads / 8) {
    float v[8];
    const int64_t at = (r0 + rr) * cols + c0 + group * 8;
    load8(x + at, v);
    const uint2 q = encode8(v, s, f, local);
    if (codes != nullptr) *reinterpret_cast<uint2*>(codes + at) = q;
    uint32_t* row = tile_words + (rr * kVecTilePitch + group * 8) / 4;
    row[0] = q.x;
    row[1] = q.y;
  }
  __syncthreads();
  for (int cc = threadIdx.x / 8; cc < kVecTile; cc += kVecThreads / 8)
    *reinterpret_cast<uint2*>(codes_t + (c0 + cc) * rows + r0 + group * 8) = tile_column8(tile_words, cc, group);
  const float m = block_max(local);
  if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
}

// The SwiGLU MLP's backward with its outputs quantized (ops::fp8_swiglu_backward), one 64 x 64 tile
// of the [rows, f] index space a block, 8 consecutive elements a thread. Each element goes through
// swiglu_math as activation.cu's backward does, is rounded to bf16 as that kernel's store rounds
// it, then scaled and encoded as the quantizer encodes the loaded bf16 value: the codes and
// amaxes are the unfused path's bit for bit, without the bf16 dfc1 and act written and read
// back. dfc1's row-wise codes are stored directly; the transposed dfc1 (gate and up halves) and
// act codes go through shared memory as in fp8_quantize_transpose_vec_kernel.
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__global__ void __launch_bounds__(kVecThreads)
fp8_swiglu_backward_kernel(const __nv_bfloat16* __restrict__ dact, const __nv_bfloat16* __restrict__ fc1,
                           int64_t rows, int64_t f, const float* __restrict__ dfc1_scale, fp8_math::Format dfc1_f,
                           uint8_t* __restrict__ dfc1_codes, uint8_t* __restrict__ dfc1_codes_t,
                           float* __restrict__ dfc1_amax, const float* __restrict__ act_scale,
                           fp8_math::Format act_f, uint8_t* __restrict__ act_codes_t, float* __restrict__ act_amax) {
  constexpr int kWords = kVecTile * kVecTilePitch / 4;
  __shared__ uint32_t tile_words[3][kWords];  // the codes of dgate, dup and act, [row][column]
  const float sd = *dfc1_scale, sa = *act_scale;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kVecTile, r0 = static_cast<int64_t>(blockIdx.y) * kVecTile;
  const int group = threadIdx.x % 8;
  float local_d = 0.0f, local_a = 0.0f;
  for (int rr = threadIdx.x / 8; rr < kVecTile; rr += kVecThreads / 8) {
    const int64_t r = r0 + rr, c = c0 + group * 8;
    float g[8], u[8], d[8], dg[8], du[8], a[8];
    load8(fc1 + r * 2 * f + c, g);
    load8(fc1 + r * 2 * f + f + c, u);
    load8(dact + r * f + c, d);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      swiglu_math::grad(g[j], u[j], d[j], dg[j], du[j]);
      a[j] = round_bf16(swiglu_math::value(g[j], u[j]));
      dg[j] = round_bf16(dg[j]);
      du[j] = round_bf16(du[j]);
    }
    const uint2 qg = encode8(dg, sd, dfc1_f, local_d);
    const uint2 qu = encode8(du, sd, dfc1_f, local_d);
    const uint2 qa = encode8(a, sa, act_f, local_a);
    *reinterpret_cast<uint2*>(dfc1_codes + r * 2 * f + c) = qg;
    *reinterpret_cast<uint2*>(dfc1_codes + r * 2 * f + f + c) = qu;
    const int at = (rr * kVecTilePitch + group * 8) / 4;
    tile_words[0][at] = qg.x;
    tile_words[0][at + 1] = qg.y;
    tile_words[1][at] = qu.x;
    tile_words[1][at + 1] = qu.y;
    tile_words[2][at] = qa.x;
    tile_words[2][at + 1] = qa.y;
  }
  __syncthreads();
  for (int cc = threadIdx.x / 8; cc < kVecTile; cc += kVecThreads / 8) {
    uint8_t* const dst[3] = {dfc1_codes_t + (c0 + cc) * rows, dfc1_codes_t + (f + c0 + cc) * rows,
                             act_codes_t + (c0 + cc) * rows};
#pragma unroll
    for (int t = 0; t < 3; ++t)
      *reinterpret_cast<uint2*>(dst[t] + r0 + group * 8) = tile_column8(tile_words[t], cc, group);
  }
  const float md = block_max(local_d);
  if (threadIdx.x == 0) atomic_max_nonneg(dfc1_amax, md);
  __syncthreads();  // block_max's shared slots are reused
  const float ma = block_max(local_a);
  if (threadIdx.x == 0) atomic_max_nonneg(act_amax, ma);
}

// Every float bit pattern through the device conversion and fp8_math::encode (both computed on
// the device): the count of differing codes and the smallest bit pattern that differs.
__global__ void fp8_encode_mismatch_kernel(fp8_math::Format f, unsigned long long* count, unsigned int* first) {
  unsigned long long local = 0;
  unsigned int first_local = 0xFFFFFFFFu;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (1ull << 32); i += stride) {
    const float v = fp8_math::bits_float(static_cast<uint32_t>(i));
    if (hardware_encode(v, f) != fp8_math::encode(v, f)) {
      ++local;
      first_local = min(first_local, static_cast<unsigned int>(i));
    }
  }
  if (local != 0) {
    atomicAdd(count, local);
    atomicMin(first, first_local);
  }
}

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

fp8_math::Format format_of(Fp8Type t) { return t == Fp8Type::E4M3 ? fp8_math::e4m3() : fp8_math::e5m2(); }
cudaDataType_t cuda_type(Fp8Type t) { return t == Fp8Type::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
const char* type_name(Fp8Type t) { return t == Fp8Type::E4M3 ? "e4m3" : "e5m2"; }

template <typename T>
void launch_quantize(const T* x, int64_t rows, int64_t cols, const float* scale, fp8_math::Format f,
                     uint8_t* codes, uint8_t* codes_t, float* amax, cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  if (codes_t == nullptr && n % 8 == 0 && aligned_to(x, 16) && aligned_to(codes, 8)) {
    const int block = 256;
    const int64_t n8 = n / 8;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n8 + block - 1) / block, 65535));
    fp8_quantize_vec8_kernel<T><<<grid, block, 0, s>>>(x, n8, scale, f, codes, amax);
  } else if (codes_t != nullptr && rows % kVecTile == 0 && cols % kVecTile == 0 && aligned_to(x, 16) &&
             aligned_to(codes, 8) && aligned_to(codes_t, 8)) {
    const dim3 grid(static_cast<unsigned>(cols / kVecTile), static_cast<unsigned>(rows / kVecTile));
    fp8_quantize_transpose_vec_kernel<T><<<grid, kVecThreads, 0, s>>>(x, rows, cols, scale, f, codes,
                                                                      codes_t, amax);
  } else if (codes_t == nullptr) {
    const int block = 256;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n + block - 1) / block, 65535));
    fp8_quantize_kernel<T><<<grid, block, 0, s>>>(x, n, scale, f, codes, amax);
  } else {
    const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                    static_cast<unsigned>((rows + kTile - 1) / kTile));
    fp8_quantize_transpose_kernel<T><<<grid, dim3(kTile, kTileRows), 0, s>>>(x, rows, cols, scale, f,
                                                                             codes, codes_t, amax);
  }
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fp8_quantize(const Tensor& x, const float* scale, Fp8Type type, uint8_t* codes,
                  uint8_t* codes_t, float* amax, const Stream& stream) {
  MDLM_CHECK(x.is_cuda(), "fp8_quantize (CUDA): x must be a CUDA tensor");
  MDLM_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
             "fp8_quantize (CUDA): x must be f32 or bf16, got ", dtype_name(x.dtype()));
  MDLM_CHECK(scale != nullptr && amax != nullptr && (codes != nullptr || codes_t != nullptr),
             "fp8_quantize (CUDA): scale, amax and at least one output are required");
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  const int64_t rows = x.rows(), cols = x.cols();
  if (x.dtype() == DType::F32)
    launch_quantize(x.data<float>(), rows, cols, scale, format_of(type), codes, codes_t, amax, s);
  else
    launch_quantize(static_cast<const __nv_bfloat16*>(x.data_ptr()), rows, cols, scale,
                    format_of(type), codes, codes_t, amax, s);
}

int64_t fp8_encode_mismatches(Fp8Type type, uint32_t* first_bad_bits, const Stream& stream) {
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  // [count lo, count hi, first (no mismatch: all ones), pad]
  Tensor out = Tensor::from_ints({0, 0, -1, 0}, {4}).to(stream.device(), stream);
  auto* words = static_cast<unsigned int*>(out.data_ptr());
  fp8_encode_mismatch_kernel<<<132 * 16, 256, 0, s>>>(format_of(type), reinterpret_cast<unsigned long long*>(words),
                                                         words + 2);
  MDLM_CUDA_CHECK_LAUNCH();
  const std::vector<int32_t> host = out.to_ints(stream);
  uint64_t count = static_cast<uint32_t>(host[0]) | (static_cast<uint64_t>(static_cast<uint32_t>(host[1])) << 32);
  if (first_bad_bits != nullptr) *first_bad_bits = static_cast<uint32_t>(host[2]);
  return static_cast<int64_t>(count);
}

namespace {
struct LtDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  LtDesc() { MDLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
  ~LtDesc() { cublasLtMatmulDescDestroy(desc); }
  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& v) {
    MDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v)));
  }
};
struct LtLayout {
  cublasLtMatrixLayout_t layout = nullptr;
  LtLayout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
    MDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, t, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  }
  ~LtLayout() { cublasLtMatrixLayoutDestroy(layout); }
};
struct LtPref {
  cublasLtMatmulPreference_t pref = nullptr;
  LtPref() { MDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref)); }
  ~LtPref() { cublasLtMatmulPreferenceDestroy(pref); }
};
}  // namespace

namespace {

// The heuristic's choice per problem. One training step makes thousands of FP8 GEMM calls over a
// handful of shapes, and a heuristic query costs far more host time than the descriptors: the
// algorithm is chosen once per (device, types, shape, accumulate, pointer alignments) and reused.
struct Fp8AlgoKey {
  int device;
  int type_a, type_b, out;
  int64_t m, n, k;
  bool accumulate;
  uint32_t align_a, align_b, align_c, align_d;
  int mode_a, mode_b;  // cuBLASLt scale modes (0 scalar, 4 VEC128, 5 BLK128x128)
  bool operator==(const Fp8AlgoKey& o) const {
    return device == o.device && type_a == o.type_a && type_b == o.type_b && out == o.out &&
           m == o.m && n == o.n && k == o.k && accumulate == o.accumulate && align_a == o.align_a &&
           align_b == o.align_b && align_c == o.align_c && align_d == o.align_d && mode_a == o.mode_a && mode_b == o.mode_b;
  }
};
struct Fp8AlgoKeyHash {
  size_t operator()(const Fp8AlgoKey& key) const {
    KeyHasher hash;
    auto mix = [&hash](uint64_t v) { hash.mix(v); };
    mix(static_cast<uint64_t>(key.device) << 16 | static_cast<uint64_t>(key.type_a) << 8 |
        static_cast<uint64_t>(key.type_b) << 4 | static_cast<uint64_t>(key.out) << 1 |
        (key.accumulate ? 1u : 0u));
    mix(static_cast<uint64_t>(key.m));
    mix(static_cast<uint64_t>(key.n));
    mix(static_cast<uint64_t>(key.k));
    mix(static_cast<uint64_t>(key.align_a) << 32 | key.align_b);
    mix(static_cast<uint64_t>(key.align_c));
    mix(static_cast<uint64_t>(key.align_d) << 16 | static_cast<uint64_t>(key.mode_a) << 8 |
        static_cast<uint64_t>(key.mode_b));
    return hash.h;
  }
};
std::mutex g_fp8_algo_mutex;
std::unordered_map<Fp8AlgoKey, cublasLtMatmulAlgo_t, Fp8AlgoKeyHash> g_fp8_algos;
std::unordered_map<Fp8AlgoKey, bool, Fp8AlgoKeyHash> g_fp8_refused;  // keys cuBLASLt had no algorithm for

int32_t scale_mode(Fp8Granularity g) {
  switch (g) {
    case Fp8Granularity::Tile1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Granularity::Block128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}
const char* granularity_name(Fp8Granularity g) {
  return g == Fp8Granularity::Tile1x128 ? " VEC128" : g == Fp8Granularity::Block128x128 ? " BLK128x128" : "";
}

}  // namespace

bool fp8_gemm(const uint8_t* a, Fp8Type type_a, const float* scale_inv_a, const uint8_t* b,
              Fp8Type type_b, const float* scale_inv_b, int64_t m, int64_t n, int64_t k,
              float alpha, Tensor& d, const Stream& stream, float beta, Fp8Granularity granularity_a,
              Fp8Granularity granularity_b, bool may_refuse, const void* c_in) {
  if (c_in == nullptr) c_in = d.data_ptr();
  const std::string what = std::string("fp8_gemm (CUDA) ") + type_name(type_a) + granularity_name(granularity_a) +
                           " x " + type_name(type_b) + granularity_name(granularity_b) + " -> " +
                           dtype_name(d.dtype()) + ", m=" + std::to_string(m) + " n=" + std::to_string(n) +
                           " k=" + std::to_string(k) + (beta != 0.0f ? ", beta" : "");
  const bool block = granularity_a != Fp8Granularity::Tensor || granularity_b != Fp8Granularity::Tensor;
  if (block) {
    MDLM_CHECK(granularity_a != Fp8Granularity::Tensor && granularity_b != Fp8Granularity::Tensor, what,
               ": block scaling needs both operands block-scaled");
    MDLM_CHECK(!(granularity_a == Fp8Granularity::Block128x128 && granularity_b == Fp8Granularity::Block128x128),
               what, ": BLK128x128 x BLK128x128 has no cuBLASLt algorithm; one operand must be 1x128");
    MDLM_CHECK(k % 128 == 0, what, ": block-scaled FP8 GEMMs need k % 128 == 0");
  }
  MDLM_CHECK(!(type_a == Fp8Type::E5M2 && type_b == Fp8Type::E5M2), what,
             ": e5m2 x e5m2 has no Hopper GEMM; one operand must be e4m3");
  MDLM_CHECK(m > 0 && n > 0 && k > 0 && m % 16 == 0 && k % 16 == 0, what,
             ": m and k must be positive multiples of 16 (FP8 tensor-core leading dimensions)");
  MDLM_CHECK(d.is_cuda() && (d.dtype() == DType::F32 || d.dtype() == DType::BF16) &&
                 d.numel() == m * n,
             what, ": d must be a CUDA f32 or bf16 tensor of ", m * n, " elements");
  MDLM_CHECK(a != nullptr && b != nullptr && scale_inv_a != nullptr && scale_inv_b != nullptr, what,
             ": null operand or scale");
  const auto& res = stream.cuda_resources();
  MDLM_CHECK(res != nullptr, what, ": needs a CUDA stream");
  const cudaDataType_t out_type = d.dtype() == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;

  // TN: cuBLASLt's A is our a read transposed (column-major K x M, ld K), its B our b (K x N,
  // ld K); D is column-major M x N with ld M, i.e. our row-major [n, m]. With beta != 0, C (D's
  // type and layout: D itself, accumulating in place, or c_in) is added in cuBLASLt's epilogue.
  LtDesc op;
  op.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  op.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  op.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_inv_a);
  op.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_inv_b);
  const int32_t mode_a = scale_mode(granularity_a), mode_b = scale_mode(granularity_b);
  if (block) {  // (never fast accumulation: cuBLASLt refuses it with block scales)
    op.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_a);
    op.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_b);
  }
  LtLayout la(cuda_type(type_a), k, m, k), lb(cuda_type(type_b), k, n, k), lc(out_type, m, n, m),
      ld(out_type, m, n, m);
  int device = 0;
  MDLM_CUDA_CHECK(cudaGetDevice(&device));
  const Fp8AlgoKey key{device, static_cast<int>(type_a), static_cast<int>(type_b),
                       static_cast<int>(out_type), m, n, k, beta != 0.0f, pointer_alignment(a),
                       pointer_alignment(b), pointer_alignment(c_in), pointer_alignment(d.data_ptr()), mode_a,
                       mode_b};
  cublasLtMatmulAlgo_t algo{};
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(g_fp8_algo_mutex);
    if (may_refuse && g_fp8_refused.count(key) != 0) return false;
    auto it = g_fp8_algos.find(key);
    if (it != g_fp8_algos.end()) {
      algo = it->second;
      cached = true;
    }
  }
  if (!cached) {
    LtPref pref;
    const uint64_t ws = res->workspace_bytes;
    MDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // The heuristic assumes 256-byte aligned pointers unless told: tell it the real ones, so
    // that its choice also runs on views.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto& [attr, value] : aligns)
      MDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.pref, attr, &value, sizeof(value)));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(res->cublaslt, op.desc, la.layout, lb.layout,
                                                             lc.layout, ld.layout, pref.pref, 1,
                                                             &heuristic, &found);
    if (may_refuse && !(st == CUBLAS_STATUS_SUCCESS && found > 0)) {
      std::lock_guard<std::mutex> lock(g_fp8_algo_mutex);
      g_fp8_refused.emplace(key, true);
      return false;
    }
    MDLM_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, what,
               ": cuBLASLt offers no algorithm for this combination (status ", static_cast<int>(st), ")");
    algo = heuristic.algo;
    std::lock_guard<std::mutex> lock(g_fp8_algo_mutex);
    g_fp8_algos.emplace(key, algo);
  }
  MDLM_CUBLAS_CHECK(cublasLtMatmul(res->cublaslt, op.desc, &alpha, a, la.layout, b, lb.layout, &beta,
                                   c_in, lc.layout, d.data_ptr(), ld.layout, &algo,
                                   res->workspace, res->workspace_bytes,
                                   megadlm::detail::native_stream(stream)));
  return true;
}

}  // namespace megadlm::ops::cuda

// ---------------------------------------------------------------- Tensor-level entry points
namespace megadlm::ops::cuda {
namespace {

template <typename T>
__global__ void fp8_amax_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ amax) {
  float local = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    local = fmaxf(local, fabsf(load_f32(x, i)));  // fmaxf drops NaN
  const float m = block_max(local);
  if (threadIdx.x == 0) atomic_max_nonneg(amax, m);
}

// The host rule fp8_current_scale (ops/fp8.cpp) without power_of_2 / epsilon.
__global__ void fp8_scale_from_amax_kernel(const float* __restrict__ amax, float* __restrict__ scale,
                                           int64_t n, float fp8_max_value) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float a = amax[i];
  float s = 1.0f;
  if (a > 0.0f && isfinite(a)) {
    s = __fdiv_rn(fp8_max_value, a);
    if (isinf(s)) s = 3.402823466e+38f;
  }
  scale[i] = s;
}

__global__ void reciprocal_kernel(const float* __restrict__ x, float* __restrict__ y) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *y = __fdiv_rn(1.0f, *x);
}

/// A per-tensor cast's scale_inv (cuBLASLt's dequantization factor): 1 / scale[0] on the device,
/// rounded as the host's 1.0f / scale.
Tensor scale_inverse(const Tensor& scale, const Stream& stream) {
  Tensor inv = Tensor::empty({1}, DType::F32, stream);
  reciprocal_kernel<<<1, 32, 0, megadlm::detail::native_stream(stream)>>>(scale.data<float>(), inv.data<float>());
  MDLM_CUDA_CHECK_LAUNCH();
  return inv;
}

__device__ __forceinline__ void store_out(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

/// c = prod + beta · c_in + bias (bias [n], beta 0: c_in not read).
template <typename TC>
__global__ void fp8_epilogue_kernel(const float* __restrict__ prod, const TC* c_in, const TC* bias,
                                    TC* c, int64_t m, int64_t n, float beta) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = prod[i];
    if (beta != 0.0f) v += beta * load_f32(c_in, i);
    if (bias != nullptr) v += load_f32(bias, i % n);
    store_out(c, i, v);
  }
}

unsigned grid_for(int64_t n, int block) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + block - 1) / block, 65535)));
}

Tensor byte_tensor(int64_t bytes, const Stream& stream) {
  return Tensor::empty({std::max<int64_t>(1, (bytes + 3) / 4)}, DType::I32, stream);
}

const uint8_t* codes_of(const Tensor& t) { return static_cast<const uint8_t*>(t.data_ptr()); }

/// [rows, k] codes (k contiguous) as [rows, kp] with zero codes (+0) in the added columns.
Tensor codes_padded_along_k(const Tensor& codes, int64_t rows, int64_t k, int64_t kp, const Stream& stream) {
  Tensor p = byte_tensor(rows * kp, stream);
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  MDLM_CUDA_CHECK(cudaMemsetAsync(p.data_ptr(), 0, static_cast<size_t>(rows * kp), s));
  MDLM_CUDA_CHECK(cudaMemcpy2DAsync(p.data_ptr(), static_cast<size_t>(kp), codes.data_ptr(), static_cast<size_t>(k),
                                    static_cast<size_t>(k), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, s));
  return p;
}

}  // namespace

void fp8_amax(const Tensor& x, float* amax, const Stream& stream) {
  MDLM_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
             "fp8_amax (CUDA): x must be f32 or bf16, got ", dtype_name(x.dtype()));
  const int64_t n = x.numel();
  if (n == 0) return;
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  const int block = 256;
  if (x.dtype() == DType::F32)
    fp8_amax_kernel<float><<<grid_for(n, block), block, 0, s>>>(x.data<float>(), n, amax);
  else
    fp8_amax_kernel<__nv_bfloat16><<<grid_for(n, block), block, 0, s>>>(
        static_cast<const __nv_bfloat16*>(x.data_ptr()), n, amax);
  MDLM_CUDA_CHECK_LAUNCH();
}

void fp8_scale_from_amax(const float* amax, float* scale, int64_t n, float fp8_max_value,
                         const Stream& stream) {
  if (n == 0) return;
  fp8_scale_from_amax_kernel<<<grid_for(n, 256), 256, 0, megadlm::detail::native_stream(stream)>>>(
      amax, scale, n, fp8_max_value);
  MDLM_CUDA_CHECK_LAUNCH();
}

Fp8Tensor fp8_quantize_tensor(const Tensor& x, const Tensor& scale, Fp8Type type, bool columnwise,
                              Tensor* amax, const Stream& stream, bool rowwise) {
  MDLM_CHECK(rowwise || columnwise, "fp8_quantize (CUDA): neither row-wise nor column-wise codes asked for");
  Fp8Tensor q;
  q.type = type;
  q.rows = x.rows();
  q.cols = x.cols();
  const int64_t n = x.numel();
  if (rowwise) q.data = byte_tensor(n, stream);
  if (columnwise) q.data_t = byte_tensor(n, stream);
  Tensor scratch;
  float* amax_ptr = nullptr;
  if (amax != nullptr) {
    amax_ptr = amax->data<float>();
  } else {
    scratch = Tensor::zeros({1}, DType::F32, stream);
    amax_ptr = scratch.data<float>();
  }
  fp8_quantize(x, scale.data<float>(), type, rowwise ? static_cast<uint8_t*>(q.data.data_ptr()) : nullptr,
               columnwise ? static_cast<uint8_t*>(q.data_t.data_ptr()) : nullptr, amax_ptr, stream);
  q.scale_inv = scale_inverse(scale, stream);
  return q;
}

bool fp8_swiglu_backward_fused(const Tensor& dact, const Tensor& fc1_out, const Fp8CastTarget& dfc1_target,
                               const Fp8CastTarget& act_target, Fp8Tensor& dfc1, Fp8Tensor& act, const Stream& stream) {
  const int64_t rows = dact.rows(), f = dact.cols();
  if (dact.dtype() != DType::BF16 || rows % kVecTile != 0 || f % kVecTile != 0 || rows == 0 || f == 0 ||
      !aligned_to(dact.data_ptr(), 16) || !aligned_to(fc1_out.data_ptr(), 16))
    return false;
  NvtxRange range("fp8_swiglu_backward");
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  dfc1 = Fp8Tensor{};
  dfc1.type = dfc1_target.type;
  dfc1.rows = rows;
  dfc1.cols = 2 * f;
  dfc1.data = byte_tensor(rows * 2 * f, stream);
  dfc1.data_t = byte_tensor(rows * 2 * f, stream);
  act = Fp8Tensor{};
  act.type = act_target.type;
  act.rows = rows;
  act.cols = f;
  act.data_t = byte_tensor(rows * f, stream);
  const dim3 grid(static_cast<unsigned>(f / kVecTile), static_cast<unsigned>(rows / kVecTile));
  fp8_swiglu_backward_kernel<<<grid, kVecThreads, 0, s>>>(
      static_cast<const __nv_bfloat16*>(dact.data_ptr()), static_cast<const __nv_bfloat16*>(fc1_out.data_ptr()),
      rows, f, dfc1_target.scale.data<float>(), format_of(dfc1_target.type),
      static_cast<uint8_t*>(dfc1.data.data_ptr()), static_cast<uint8_t*>(dfc1.data_t.data_ptr()),
      dfc1_target.amax.data<float>(), act_target.scale.data<float>(), format_of(act_target.type),
      static_cast<uint8_t*>(act.data_t.data_ptr()), act_target.amax.data<float>());
  MDLM_CUDA_CHECK_LAUNCH();
  dfc1.scale_inv = scale_inverse(dfc1_target.scale, stream);
  act.scale_inv = scale_inverse(act_target.scale, stream);
  return true;
}

void fp8_gemm_tensor(const Fp8Tensor& a, const Fp8Tensor& b, Tensor& c, const GemmArgs& args,
                     const Stream& stream) {
  // C[M, N] row-major = d[n = M, m = N] of fp8_gemm: its A operand is op(B) as [N, K] codes, its
  // B operand op(A) as [M, K] codes (both K contiguous: the TN layout).
  const Tensor& op_a = args.trans_a ? a.data_t : a.data;  // [M, K]
  const Tensor& op_b = args.trans_b ? b.data : b.data_t;  // [N, K]
  MDLM_CHECK(op_a.defined(), "fp8_gemm (CUDA): op(A) needs the ", args.trans_a ? "column" : "row",
             "-wise codes of A (quantize with columnwise = true for a transposed use)");
  MDLM_CHECK(op_b.defined(), "fp8_gemm (CUDA): op(B) needs the ", args.trans_b ? "row" : "column",
             "-wise codes of B (quantize with columnwise = true for an untransposed use)");
  const int64_t m = c.rows(), n = c.cols(), k = args.trans_a ? a.rows : a.cols;
  MDLM_CHECK(c.dtype() == DType::F32 || c.dtype() == DType::BF16, "fp8_gemm (CUDA): C ", c.str(),
             " must be f32 or bf16");
  // cuBLASLt's FP8 GEMMs need K % 16 == 0. K is the token count in a weight gradient, and a
  // varilen-truncated micro-batch (--difflm-varilen-prob) has any count: per-tensor codes padded
  // along K with zero codes, which add nothing (blockwise linears pad their token rows to 128).
  if (!a.blockwise() && k % 16 != 0) {
    const int64_t kp = (k + 15) / 16 * 16;
    Fp8Tensor pa = a, pb = b;
    Tensor& pa_codes = args.trans_a ? pa.data_t : pa.data;
    Tensor& pb_codes = args.trans_b ? pb.data : pb.data_t;
    pa_codes = codes_padded_along_k(op_a, m, k, kp, stream);
    pb_codes = codes_padded_along_k(op_b, n, k, kp, stream);
    (args.trans_a ? pa.rows : pa.cols) = kp;
    (args.trans_b ? pb.cols : pb.rows) = kp;
    fp8_gemm_tensor(pa, pb, c, args, stream);
    return;
  }
  // Without a bias, cuBLASLt adds beta · C in its own epilogue: C = D accumulates in place (the
  // wgrad into the fp32 main grad), a separate addend is read as C (the residual stream: no fp32
  // product written, read back and summed in a second pass).
  const bool separate_addend = args.addend != nullptr && args.addend->data_ptr() != c.data_ptr();
  const bool direct = args.bias == nullptr;
  // Blockwise: each operand's grid for the orientation read (per-tensor: the one scalar).
  MDLM_CHECK(a.blockwise() == b.blockwise(), "fp8_gemm (CUDA): both operands per-tensor scaled, or both blockwise");
  const Tensor& sa = a.blockwise() && args.trans_a ? a.scale_inv_t : a.scale_inv;
  const Tensor& sb = b.blockwise() && !args.trans_b ? b.scale_inv_t : b.scale_inv;
  MDLM_CHECK(sa.defined() && sb.defined(), "fp8_gemm (CUDA): an operand lacks the scale grid of the orientation read");
  if (direct) {
    // Block-scaled GEMMs accumulating into C (beta), and any GEMM reading a separate C, were
    // not all measured on the device's cuBLAS: where cuBLASLt offers no algorithm, the product
    // goes through f32 below.
    const bool reads_other_c = separate_addend && args.beta != 0.0f;
    if (fp8_gemm(codes_of(op_b), b.type, sb.data<float>(), codes_of(op_a), a.type, sa.data<float>(), n, m, k,
                 args.alpha, c, stream, args.beta, b.granularity, a.granularity,
                 /*may_refuse=*/(a.blockwise() && args.beta != 0.0f) || reads_other_c,
                 reads_other_c ? args.addend->data_ptr() : nullptr))
      return;
  }
  Tensor prod = Tensor::empty({m, n}, DType::F32, stream);
  fp8_gemm(codes_of(op_b), b.type, sb.data<float>(), codes_of(op_a), a.type, sa.data<float>(), n, m, k, args.alpha,
           prod, stream, 0.0f, b.granularity, a.granularity);
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  const Tensor& c_in = args.addend != nullptr ? *args.addend : c;
  const int64_t total = m * n;
  if (c.dtype() == DType::F32)
    fp8_epilogue_kernel<float><<<grid_for(total, 256), 256, 0, s>>>(
        prod.data<float>(), c_in.data<float>(), args.bias ? args.bias->data<float>() : nullptr,
        c.data<float>(), m, n, args.beta);
  else
    fp8_epilogue_kernel<__nv_bfloat16><<<grid_for(total, 256), 256, 0, s>>>(
        prod.data<float>(), static_cast<const __nv_bfloat16*>(c_in.data_ptr()),
        args.bias ? static_cast<const __nv_bfloat16*>(args.bias->data_ptr()) : nullptr,
        static_cast<__nv_bfloat16*>(c.data_ptr()), m, n, args.beta);
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace megadlm::ops::cuda

// ---------------------------------------------------------------- blockwise quantization
// One scale per 1x128 tile or 128x128 block, each from its own amax (fp8_math::current_scale,
// the host rule bit for bit); the grids in cuBLASLt's layouts (ops/fp8.h):
//   VEC128 of an [R, K] operand: (r, kb) at kb * pad4(R) + r
//   BLK128x128 of an [R, K] operand: (rb, kb) at rb * pad4(KB) + kb
namespace megadlm::ops::cuda {
namespace {

constexpr int kBlk = 128;
__host__ __device__ __forceinline__ int64_t pad4(int64_t n) { return (n + 3) / 4 * 4; }
__host__ __device__ __forceinline__ int64_t blocks_of(int64_t n) { return (n + kBlk - 1) / kBlk; }

__device__ __forceinline__ float warp_reduce_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Row-wise 1x128 tiles: one warp per tile (row r, K-block kb), 4 elements a lane.
template <typename T>
__global__ void block_quantize_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, fp8_math::Format f,
                                           bool power_of_2, uint8_t* __restrict__ codes, float* __restrict__ grid) {
  const int lane = threadIdx.x % 32;
  const int64_t kb_count = blocks_of(cols), tiles = rows * kb_count;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; t < tiles; t += warps) {
    const int64_t r = t / kb_count, kb = t % kb_count, c0 = kb * kBlk;
    float v[4];
    float local = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + lane + 32 * j;
      v[j] = c < cols ? load_f32(x, r * cols + c) : 0.0f;
      local = fmaxf(local, fabsf(v[j]));  // fmaxf drops NaN, as the host's fmax
    }
    const float s = fp8_math::current_scale(warp_reduce_max(local), f.max_finite, power_of_2);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + lane + 32 * j;
      if (c < cols) codes[r * cols + c] = device_encode(__fmul_rn(v[j], s), f);
    }
    if (lane == 0) grid[kb * pad4(rows) + r] = fp8_math::reciprocal(s);
  }
}

// Column-wise 1x128 tiles (128 consecutive rows of one column), written transposed:
// codes_t [cols, rows], grid_t the VEC128 grid of that [cols, rows] operand. A block of 256
// threads takes 128 rows x 32 columns through shared memory: coalesced reads along the row,
// each warp then owns 4 columns (amax over the 128 rows, codes written along codes_t's row).
constexpr int kColTileCols = 32;
template <typename T>
__global__ void block_quantize_cols_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, fp8_math::Format f,
                                           bool power_of_2, uint8_t* __restrict__ codes_t, float* __restrict__ grid_t) {
  __shared__ float tile[kBlk][kColTileCols + 1];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;  // 8 warps
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kColTileCols, r0 = static_cast<int64_t>(blockIdx.y) * kBlk;
  for (int rr = warp; rr < kBlk; rr += 8) {
    const int64_t r = r0 + rr, c = c0 + lane;
    tile[rr][lane] = r < rows && c < cols ? load_f32(x, r * cols + c) : 0.0f;
  }
  __syncthreads();
  for (int j = warp * 4; j < warp * 4 + 4; ++j) {
    const int64_t c = c0 + j;
    if (c >= cols) break;
    float local = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) local = fmaxf(local, fabsf(tile[lane + 32 * i][j]));
    const float s = fp8_math::current_scale(warp_reduce_max(local), f.max_finite, power_of_2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = r0 + lane + 32 * i;
      if (r < rows) codes_t[c * rows + r] = device_encode(__fmul_rn(tile[lane + 32 * i][j], s), f);
    }
    if (lane == 0) grid_t[blockIdx.y * pad4(cols) + c] = fp8_math::reciprocal(s);
  }
}

// 128x128 blocks: one block of 256 threads per weight block. Pass 1: the block's amax; pass 2:
// row-wise codes (coalesced) and, through shared memory, the transposed codes; both grids.
template <typename T>
__global__ void block_quantize_2d_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, fp8_math::Format f,
                                         bool power_of_2, uint8_t* __restrict__ codes, float* __restrict__ grid,
                                         uint8_t* __restrict__ codes_t, float* __restrict__ grid_t) {
  constexpr int kPitch = kBlk + 4;  // 33 words: the transposed reads spread over the banks
  __shared__ uint8_t tile[kBlk * kPitch];
  __shared__ float scale_shared;
  const int64_t cb = blockIdx.x, rb = blockIdx.y, r0 = rb * kBlk, c0 = cb * kBlk;
  float local = 0.0f;
  for (int i = threadIdx.x; i < kBlk * kBlk; i += blockDim.x) {
    const int64_t r = r0 + i / kBlk, c = c0 + i % kBlk;
    if (r < rows && c < cols) local = fmaxf(local, fabsf(load_f32(x, r * cols + c)));
  }
  const float m = block_max(local);
  if (threadIdx.x == 0) scale_shared = fp8_math::current_scale(m, f.max_finite, power_of_2);
  __syncthreads();
  const float s = scale_shared;
  for (int i = threadIdx.x; i < kBlk * kBlk; i += blockDim.x) {
    const int rr = i / kBlk, cc = i % kBlk;
    const int64_t r = r0 + rr, c = c0 + cc;
    if (r < rows && c < cols) {
      const uint8_t q = device_encode(__fmul_rn(load_f32(x, r * cols + c), s), f);
      if (codes != nullptr) codes[r * cols + c] = q;
      tile[rr * kPitch + cc] = q;
    }
  }
  if (threadIdx.x == 0) {
    const float inv = fp8_math::reciprocal(s);
    if (codes != nullptr) grid[rb * pad4(blocks_of(cols)) + cb] = inv;
    if (codes_t != nullptr) grid_t[cb * pad4(blocks_of(rows)) + rb] = inv;
  }
  if (codes_t == nullptr) return;
  __syncthreads();
  for (int i = threadIdx.x; i < kBlk * kBlk; i += blockDim.x) {
    const int cc = i / kBlk, rr = i % kBlk;  // output row c, column r: coalesced along r
    const int64_t r = r0 + rr, c = c0 + cc;
    if (r < rows && c < cols) codes_t[c * rows + r] = tile[rr * kPitch + cc];
  }
}

template <typename T>
void launch_block_quantize(const T* x, int64_t rows, int64_t cols, Fp8Granularity g, fp8_math::Format f,
                           bool power_of_2, uint8_t* codes, float* grid, uint8_t* codes_t, float* grid_t,
                           cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  if (g == Fp8Granularity::Block128x128) {
    const dim3 blocks(static_cast<unsigned>(blocks_of(cols)), static_cast<unsigned>(blocks_of(rows)));
    block_quantize_2d_kernel<T><<<blocks, 256, 0, s>>>(x, rows, cols, f, power_of_2, codes, grid, codes_t, grid_t);
    MDLM_CUDA_CHECK_LAUNCH();
    return;
  }
  if (codes != nullptr) {
    const int64_t tiles = rows * blocks_of(cols);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((tiles + 7) / 8, 1 << 20));
    block_quantize_rows_kernel<T><<<blocks, 256, 0, s>>>(x, rows, cols, f, power_of_2, codes, grid);
    MDLM_CUDA_CHECK_LAUNCH();
  }
  if (codes_t != nullptr) {
    const dim3 blocks(static_cast<unsigned>((cols + kColTileCols - 1) / kColTileCols),
                      static_cast<unsigned>(blocks_of(rows)));
    block_quantize_cols_kernel<T><<<blocks, 256, 0, s>>>(x, rows, cols, f, power_of_2, codes_t, grid_t);
    MDLM_CUDA_CHECK_LAUNCH();
  }
}

// The transpose of a [rows, cols] byte matrix (FP8 codes) through 64x64 tiles in shared memory:
// coalesced reads along cols, coalesced writes along rows. A row pitch of 68 bytes (17 words) puts
// a warp's column reads on 32 different banks.
constexpr int kByteTile = 64;
static_assert(kByteTile == kVecTile, "fp8_columnwise_tensor's launch grid serves both transpose kernels");
__global__ void transpose_codes_kernel(const uint8_t* __restrict__ in, int64_t rows, int64_t cols,
                                       uint8_t* __restrict__ out) {
  __shared__ uint8_t tile[kByteTile][kByteTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kByteTile, c0 = static_cast<int64_t>(blockIdx.x) * kByteTile;
  const int lane = threadIdx.x % kByteTile, step = blockDim.x / kByteTile;
  for (int i = threadIdx.x / kByteTile; i < kByteTile; i += step) {
    const int64_t r = r0 + i, c = c0 + lane;
    if (r < rows && c < cols) tile[i][lane] = in[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.x / kByteTile; i < kByteTile; i += step) {
    const int64_t c = c0 + i, r = r0 + lane;
    if (r < rows && c < cols) out[c * rows + r] = tile[lane][i];
  }
}

// transpose_codes_kernel for matrices of whole 64 x 64 tiles (every weight of the models we
// train): 8 bytes a thread each way, loads along the rows, stores through tile_column8 (the
// byte-a-thread kernel above ran at ~0.7 TB/s on the 1.7B's weights).
__global__ void __launch_bounds__(kVecThreads)
transpose_codes_vec_kernel(const uint8_t* __restrict__ in, int64_t rows, int64_t cols, uint8_t* __restrict__ out) {
  __shared__ uint32_t tile_words[kVecTile * kVecTilePitch / 4];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kVecTile, r0 = static_cast<int64_t>(blockIdx.y) * kVecTile;
  const int group = threadIdx.x % 8;
  for (int rr = threadIdx.x / 8; rr < kVecTile; rr += kVecThreads / 8) {
    const uint2 q = *reinterpret_cast<const uint2*>(in + (r0 + rr) * cols + c0 + group * 8);
    uint32_t* row = tile_words + (rr * kVecTilePitch + group * 8) / 4;
    row[0] = q.x;
    row[1] = q.y;
  }
  __syncthreads();
  for (int cc = threadIdx.x / 8; cc < kVecTile; cc += kVecThreads / 8)
    *reinterpret_cast<uint2*>(out + (c0 + cc) * rows + r0 + group * 8) = tile_column8(tile_words, cc, group);
}

// The BLK128x128 grid of the transposed operand: block (rb, cb) of [rows, cols] is block (cb, rb)
// of [cols, rows] (the padding entries stay as allocated, zero).
__global__ void transpose_block_grid_kernel(const float* __restrict__ grid, int64_t row_blocks, int64_t col_blocks,
                                            float* __restrict__ grid_t) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= row_blocks * col_blocks) return;
  const int64_t rb = i / col_blocks, cb = i % col_blocks;
  grid_t[cb * pad4(row_blocks) + rb] = grid[rb * pad4(col_blocks) + cb];
}

int64_t grid_floats(Fp8Granularity g, int64_t rows, int64_t k) {
  return g == Fp8Granularity::Tile1x128 ? blocks_of(k) * pad4(rows) : blocks_of(rows) * pad4(blocks_of(k));
}

}  // namespace

void fp8_quantize_blockwise(const Tensor& x, Fp8Type type, Fp8Granularity granularity, bool power_of_2,
                            uint8_t* codes, float* grid, uint8_t* codes_t, float* grid_t, const Stream& stream) {
  MDLM_CHECK(x.is_cuda(), "fp8_quantize_blockwise (CUDA): x must be a CUDA tensor");
  MDLM_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
             "fp8_quantize_blockwise (CUDA): x must be f32 or bf16, got ", dtype_name(x.dtype()));
  MDLM_CHECK(granularity != Fp8Granularity::Tensor, "fp8_quantize_blockwise (CUDA): needs a block granularity");
  MDLM_CHECK((codes == nullptr || grid != nullptr) && (codes_t == nullptr || grid_t != nullptr),
             "fp8_quantize_blockwise (CUDA): codes without their scale grid");
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  const int64_t rows = x.rows(), cols = x.cols();
  MDLM_CHECK(blocks_of(rows) < 65536, "fp8_quantize_blockwise (CUDA): ", rows, " rows exceed the launch grid");
  if (x.dtype() == DType::F32)
    launch_block_quantize(x.data<float>(), rows, cols, granularity, format_of(type), power_of_2, codes, grid,
                          codes_t, grid_t, s);
  else
    launch_block_quantize(static_cast<const __nv_bfloat16*>(x.data_ptr()), rows, cols, granularity,
                          format_of(type), power_of_2, codes, grid, codes_t, grid_t, s);
}

Fp8Tensor fp8_quantize_blockwise_tensor(const Tensor& x, Fp8Type type, Fp8Granularity granularity, bool rowwise,
                                        bool columnwise, bool power_of_2, const Stream& stream) {
  Fp8Tensor q;
  q.type = type;
  q.granularity = granularity;
  q.rows = x.rows();
  q.cols = x.cols();
  const int64_t n = x.numel();
  if (rowwise) {
    q.data = byte_tensor(n, stream);
    q.scale_inv = Tensor::zeros({grid_floats(granularity, q.rows, q.cols)}, DType::F32, stream);
  }
  if (columnwise) {
    q.data_t = byte_tensor(n, stream);
    q.scale_inv_t = Tensor::zeros({grid_floats(granularity, q.cols, q.rows)}, DType::F32, stream);
  }
  fp8_quantize_blockwise(x, type, granularity, power_of_2,
                         rowwise ? static_cast<uint8_t*>(q.data.data_ptr()) : nullptr,
                         rowwise ? q.scale_inv.data<float>() : nullptr,
                         columnwise ? static_cast<uint8_t*>(q.data_t.data_ptr()) : nullptr,
                         columnwise ? q.scale_inv_t.data<float>() : nullptr, stream);
  return q;
}

Fp8Tensor fp8_columnwise_tensor(const Fp8Tensor& q, const Stream& stream) {
  Fp8Tensor t = q;  // ops::fp8_columnwise checked q: row-wise codes only, per-tensor or 128x128
  const cudaStream_t s = megadlm::detail::native_stream(stream);
  t.data_t = byte_tensor(q.rows * q.cols, stream);
  if (q.rows > 0 && q.cols > 0) {
    const int64_t row_tiles = (q.rows + kByteTile - 1) / kByteTile;
    MDLM_CHECK(row_tiles < 65536, "fp8_columnwise (CUDA): ", q.rows, " rows exceed the launch grid");
    const dim3 blocks(static_cast<unsigned>((q.cols + kByteTile - 1) / kByteTile), static_cast<unsigned>(row_tiles));
    uint8_t* out = static_cast<uint8_t*>(t.data_t.data_ptr());
    if (q.rows % kVecTile == 0 && q.cols % kVecTile == 0 && aligned_to(codes_of(q.data), 8) && aligned_to(out, 8))
      transpose_codes_vec_kernel<<<blocks, kVecThreads, 0, s>>>(codes_of(q.data), q.rows, q.cols, out);
    else
      transpose_codes_kernel<<<blocks, 256, 0, s>>>(codes_of(q.data), q.rows, q.cols, out);
    MDLM_CUDA_CHECK_LAUNCH();
  }
  if (q.granularity == Fp8Granularity::Block128x128) {
    const int64_t rb = blocks_of(q.rows), cb = blocks_of(q.cols);
    t.scale_inv_t = Tensor::zeros({grid_floats(q.granularity, q.cols, q.rows)}, DType::F32, stream);
    if (rb * cb > 0) {
      transpose_block_grid_kernel<<<static_cast<unsigned>((rb * cb + 255) / 256), 256, 0, s>>>(
          q.scale_inv.data<float>(), rb, cb, t.scale_inv_t.data<float>());
      MDLM_CUDA_CHECK_LAUNCH();
    }
  }
  return t;
}

}  // namespace megadlm::ops::cuda
