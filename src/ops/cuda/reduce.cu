// Reductions on CUDA (sum_squares, sum_rows, dot) and the partial-row adder that every two-stage
// reduction of the backend ends with. Entry -> launch_* -> *_kernel.
//
// Deterministic by construction: stage 1 runs a grid whose size depends only on the shape and
// sums a fixed subset of elements per thread in a fixed order (then a fixed-order block tree);
// stage 2 (add_partial_rows_kernel) adds the per-block partials in increasing block order into
// the f32 output. No float atomics, so repeated runs give bitwise-equal results.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kReduceThreads = 256;
/// Stage-1 blocks of the full reductions: enough to saturate the memory system; stage 2 then
/// sums at most this many partials.
constexpr int64_t kReduceMaxBlocks = 1024;

// Stage 2, shared: blockDim (32, 16). Thread (tx, ty) sums partial rows ty, ty + 16, ... of
// column blockIdx.x * 32 + tx; the 16 slot sums are then added in increasing ty.
constexpr int kPartialCols = 32;
constexpr int kPartialSlots = 16;

__global__ void __launch_bounds__(kPartialCols* kPartialSlots)
add_partial_rows_kernel(const float* __restrict__ partials, int64_t num_partials, int64_t cols,
                        float* __restrict__ dst) {
  __shared__ float slots[kPartialSlots][kPartialCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kPartialCols + threadIdx.x;
  float acc = 0.0f;
  if (c < cols) {
#pragma unroll 4
    for (int64_t p = threadIdx.y; p < num_partials; p += kPartialSlots) acc += partials[p * cols + c];
  }
  slots[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
#pragma unroll
    for (int s = 0; s < kPartialSlots; ++s) total += slots[s][threadIdx.x];
    dst[c] += total;
  }
}

/// kDot: sum a[i] * b[i]; otherwise sum a[i]^2. Elements are visited in kVec-wide packs
/// (grid-stride, fixed assignment), the n % kVec tail by block 0.
template <typename T, int kVec, bool kDot>
__global__ void __launch_bounds__(kReduceThreads)
sum_products_kernel(const T* __restrict__ a, const T* __restrict__ b, int64_t n,
                    float* __restrict__ partials) {
  __shared__ float red[kWarpSize];
  const int64_t npacks = n / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float acc = 0.0f;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < npacks;
       q += stride) {
    float va[kVec], vb[kVec];
    load_vec<kVec>(a + q * kVec, va);
    if constexpr (kDot) load_vec<kVec>(b + q * kVec, vb);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc += kDot ? va[i] * vb[i] : va[i] * va[i];
  }
  if (blockIdx.x == 0) {
    const int64_t t = npacks * kVec + threadIdx.x;
    if (t < n) {
      const float va = to_float(a[t]);
      acc += kDot ? va * to_float(b[t]) : va * va;
    }
  }
  const float total = block_sum(acc, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

/// Stage 1 of sum_rows: blockDim (32, 8); block (bx, by) sums columns bx*32 .. bx*32+31 over the
/// rows of split by ([by * rows_per_split, ...)), slot ty taking every 8th row, slots added in order.
constexpr int kRowsCols = 32;
constexpr int kRowsSlots = 8;

template <typename T>
__global__ void __launch_bounds__(kRowsCols* kRowsSlots)
sum_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t rows_per_split,
                float* __restrict__ partials) {
  __shared__ float slots[kRowsSlots][kRowsCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kRowsCols + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
  float acc = 0.0f;
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsSlots) acc += to_float(x[r * cols + c]);
  }
  slots[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
#pragma unroll
    for (int s = 0; s < kRowsSlots; ++s) total += slots[s][threadIdx.x];
    partials[static_cast<int64_t>(blockIdx.y) * cols + c] = total;
  }
}

/// Calls f(TypeTag<T>{}) for every floating dtype (reductions read any of them).
template <typename F>
void dispatch_float_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f(TypeTag<float>{}); return;
    case DType::BF16: f(TypeTag<bf16>{}); return;
    case DType::F16: f(TypeTag<__half>{}); return;
    case DType::F64: f(TypeTag<double>{}); return;
    default: MDLM_FAIL(op, ": expects a floating-point tensor, got ", dtype_name(dtype));
  }
}

template <typename T, bool kDot>
void launch_sum_products(const Tensor& a, const Tensor* b, Tensor& out, const Stream& stream) {
  const int64_t n = a.numel();
  if (n == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  constexpr int kVec = kVec16<T>;
  const bool vectorizable =
      is_aligned(a.data_ptr(), 16) && (b == nullptr || is_aligned(b->data_ptr(), 16));
  const int vec = vectorizable ? kVec : 1;
  const int64_t blocks =
      std::min(kReduceMaxBlocks, std::max<int64_t>(1, ceil_div(n / vec, kReduceThreads)));
  Tensor partials = Tensor::empty({blocks}, DType::F32, stream);
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = b ? static_cast<const T*>(b->data_ptr()) : nullptr;
  if (vec == kVec)
    sum_products_kernel<T, kVec, kDot><<<static_cast<unsigned>(blocks), kReduceThreads, 0, s>>>(
        pa, pb, n, partials.data<float>());
  else
    sum_products_kernel<T, 1, kDot><<<static_cast<unsigned>(blocks), kReduceThreads, 0, s>>>(
        pa, pb, n, partials.data<float>());
  MDLM_CUDA_CHECK_LAUNCH();
  launch_add_partial_rows(partials.data<float>(), blocks, 1, out.data<float>(), s);
}

}  // namespace

void launch_add_partial_rows(const float* partials, int64_t num_partials, int64_t cols, float* dst,
                             cudaStream_t stream) {
  if (cols == 0) return;
  const dim3 block(kPartialCols, kPartialSlots);
  add_partial_rows_kernel<<<static_cast<unsigned>(ceil_div(cols, kPartialCols)), block, 0, stream>>>(
      partials, num_partials, cols, dst);
  MDLM_CUDA_CHECK_LAUNCH();
}

void sum_squares(const Tensor& x, Tensor& out, const Stream& stream) {
  NvtxRange range("sum_squares");
  dispatch_float_dtype(x.dtype(), "sum_squares", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_sum_products<T, false>(x, nullptr, out, stream);
  });
}

void dot(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream) {
  NvtxRange range("dot");
  launch_sum_products<float, true>(a, &b, out, stream);
}

void sum_rows(const Tensor& x, Tensor& out, const Stream& stream) {
  NvtxRange range("sum_rows");
  const int64_t rows = x.rows(), cols = x.cols();
  if (rows == 0 || cols == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  // Splits of at least 256 rows, at most 64 of them: a function of the shape only.
  const int64_t splits = std::min<int64_t>(64, ceil_div(rows, 256));
  const int64_t rows_per_split = ceil_div(rows, splits);
  Tensor partials = Tensor::empty({splits, cols}, DType::F32, stream);
  const dim3 block(kRowsCols, kRowsSlots);
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kRowsCols)), static_cast<unsigned>(splits));
  dispatch_float_dtype(x.dtype(), "sum_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    sum_rows_kernel<T><<<grid, block, 0, s>>>(static_cast<const T*>(x.data_ptr()), rows, cols,
                                              rows_per_split, partials.data<float>());
  });
  MDLM_CUDA_CHECK_LAUNCH();
  launch_add_partial_rows(partials.data<float>(), splits, cols, out.data<float>(), s);
}

}  // namespace megadlm::ops::cuda
