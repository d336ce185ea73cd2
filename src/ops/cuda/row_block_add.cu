// CUDA row-block add (ops/row_block.h, add_row_block): dst's rows [row0, row0 + rows) of each
// batch row += src's rows, one fused pass. One thread per 16 bytes of a row when the width and
// the pointers allow it (LDG.128 of both, STG.128 of dst), else one per element; each element is
// summed in f32 and rounded once to dst's dtype (round to nearest even), as the CPU does.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kThreads = 256;

/// n = batch * rows * (width / N) groups of N elements; group g is row g / per_row of the block.
template <typename T, int N>
__global__ void add_rows_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t n, int64_t per_row,
                                int64_t rows, int64_t dst_rows, int64_t dst_row0) {
  const int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (g >= n) return;
  const int64_t row = g / per_row, c = (g % per_row) * N;
  const int64_t b = row / rows, i = row % rows, width = per_row * N;
  const T* s = src + row * width + c;
  T* d = dst + (b * dst_rows + dst_row0 + i) * width + c;
  float x[N], y[N];
  load_vec<N>(s, x);
  load_vec<N>(d, y);
#pragma unroll
  for (int k = 0; k < N; ++k) y[k] += x[k];
  store_vec<N>(d, y);
}

template <typename T>
void launch(const Tensor& src, Tensor& dst, int64_t dst_row0, int64_t batch, int64_t rows, cudaStream_t st) {
  constexpr int V = kVec16<T>;
  const int64_t width = src.cols(), dst_rows = dst.rows() / batch;
  const T* s = static_cast<const T*>(src.data_ptr());
  T* d = static_cast<T*>(dst.data_ptr());
  const bool vec = width % V == 0 && reinterpret_cast<uintptr_t>(s) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(d) % 16 == 0;
  const int64_t per_row = vec ? width / V : width, n = batch * rows * per_row;
  if (vec)
    add_rows_kernel<T, V><<<megadlm::detail::grid_for(n, kThreads), kThreads, 0, st>>>(s, d, n, per_row, rows,
                                                                                     dst_rows, dst_row0);
  else
    add_rows_kernel<T, 1><<<megadlm::detail::grid_for(n, kThreads), kThreads, 0, st>>>(s, d, n, per_row, rows,
                                                                                     dst_rows, dst_row0);
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_rows_between_batch_rows(const Tensor& src, Tensor& dst, int64_t dst_row0, int64_t batch,
                                 int64_t rows, const Stream& stream) {
  NvtxRange range("add_rows_between_batch_rows");
  const cudaStream_t st = megadlm::detail::native_stream(stream);
  if (dst.dtype() == DType::BF16) launch<bf16>(src, dst, dst_row0, batch, rows, st);
  else launch<float>(src, dst, dst_row0, batch, rows, st);
}

}  // namespace megadlm::ops::cuda
