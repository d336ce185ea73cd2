// CUDA FP8: the fused quantize kernels (cast + amax in one pass, optionally the transposed codes)
// and the cuBLASLt FP8 GEMM (src/ops/cuda/fp8_cuda.h). Entry → launcher → kernel, as elsewhere.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <string>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/fp8_cuda.h"
#include "ops/fp8_math.h"

namespace megadlm::ops::cuda {
namespace {

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
    codes[i] = fp8_math::encode(__fmul_rn(v, s), f);
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
      const uint8_t q = fp8_math::encode(__fmul_rn(v, s), f);
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

fp8_math::Format format_of(Fp8Type t) { return t == Fp8Type::E4M3 ? fp8_math::e4m3() : fp8_math::e5m2(); }
cudaDataType_t cuda_type(Fp8Type t) { return t == Fp8Type::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
const char* type_name(Fp8Type t) { return t == Fp8Type::E4M3 ? "e4m3" : "e5m2"; }

template <typename T>
void launch_quantize(const T* x, int64_t rows, int64_t cols, const float* scale, fp8_math::Format f,
                     uint8_t* codes, uint8_t* codes_t, float* amax, cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  if (codes_t == nullptr) {
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

void fp8_gemm(const uint8_t* a, Fp8Type type_a, const float* scale_inv_a, const uint8_t* b,
              Fp8Type type_b, const float* scale_inv_b, int64_t m, int64_t n, int64_t k,
              float alpha, Tensor& d, const Stream& stream) {
  const std::string what = std::string("fp8_gemm (CUDA) ") + type_name(type_a) + " x " +
                           type_name(type_b) + " -> " + dtype_name(d.dtype()) + ", m=" +
                           std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
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
  // ld K); D is column-major M x N with ld M, i.e. our row-major [n, m].
  LtDesc op;
  op.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  op.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  op.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_inv_a);
  op.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_inv_b);
  LtLayout la(cuda_type(type_a), k, m, k), lb(cuda_type(type_b), k, n, k), lc(out_type, m, n, m),
      ld(out_type, m, n, m);
  LtPref pref;
  const uint64_t ws = res->workspace_bytes;
  MDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(res->cublaslt, op.desc, la.layout, lb.layout,
                                                           lc.layout, ld.layout, pref.pref, 1,
                                                           &heuristic, &found);
  MDLM_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, what,
             ": cuBLASLt offers no algorithm for this combination (status ", static_cast<int>(st), ")");
  const float beta = 0.0f;
  MDLM_CUBLAS_CHECK(cublasLtMatmul(res->cublaslt, op.desc, &alpha, a, la.layout, b, lb.layout, &beta,
                                   d.data_ptr(), lc.layout, d.data_ptr(), ld.layout, &heuristic.algo,
                                   res->workspace, res->workspace_bytes,
                                   megadlm::detail::native_stream(stream)));
}

}  // namespace megadlm::ops::cuda
