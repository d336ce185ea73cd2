// Elementwise and layout ops on CUDA: add, scale_inplace, fill, copy, split/concat_columns,
// gather_rows, and the row-bias adder gemm uses for f32 outputs. Entry -> launch_* -> *_kernel.
// add/scale/fill run through flat_kernel (16-byte accesses when every pointer allows it);
// split/concat and gather_rows move raw bytes in the widest unit (16/8/4/2/1 bytes) that every
// row, offset and pointer allows, so they serve every dtype; copy with dtype conversion is core's
// copy_tensor.
#include <cmath>
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

// ---- flat ops (see flat_kernel in common.cuh) ---------------------------------------------

/// out = a + b. No __restrict__: out may alias a or b (each element is read before it is written
/// by the same thread).
template <typename T>
struct AddOp {
  const T* a;
  const T* b;
  T* out;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float va[N], vb[N];
    load_vec<N>(a + i, va);
    load_vec<N>(b + i, vb);
#pragma unroll
    for (int k = 0; k < N; ++k) va[k] += vb[k];
    store_vec<N>(out + i, va);
  }
};

template <typename T>
struct ScaleOp {
  T* x;
  float s;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float v[N];
    load_vec<N>(x + i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] *= s;
    store_vec<N>(x + i, v);
  }
};

/// Stores a value already converted to T on the host (so integer and f64 fills are exact).
template <typename T>
struct FillOp {
  T* x;
  T value;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    Vec<T, N> v;
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = value;
    *reinterpret_cast<Vec<T, N>*>(x + i) = v;
  }
};

/// c[r, :] += bias[:]: the gemm bias for f32 outputs (cuBLASLt's bias epilogue is used for bf16).
template <typename T>
struct RowBiasOp {
  T* c;
  const T* bias;
  int64_t cols;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    // N == 1 or cols % N == 0, so the N elements share a row.
    float v[N], b[N];
    load_vec<N>(c + i, v);
    load_vec<N>(bias + i % cols, b);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += b[k];
    store_vec<N>(c + i, v);
  }
};

// ---- column copies ------------------------------------------------------------------------

/// dst[r, dst_off : dst_off + width] = src[r, src_off : src_off + width], in units of U
/// (all offsets and strides below are in units). grid.x covers a row, grid.y strides over rows.
template <typename U>
__global__ void copy_columns_kernel(const U* __restrict__ src, int64_t src_stride, int64_t src_off,
                                    U* __restrict__ dst, int64_t dst_stride, int64_t dst_off,
                                    int64_t rows, int64_t width) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    dst[r * dst_stride + dst_off + c] = src[r * src_stride + src_off + c];
}

/// Copies a column range between two row-major byte matrices, choosing the widest unit that
/// divides every pointer, stride, offset and width.
void copy_columns(const void* src, int64_t src_row_bytes, int64_t src_off_bytes, void* dst,
                  int64_t dst_row_bytes, int64_t dst_off_bytes, int64_t rows, int64_t width_bytes,
                  cudaStream_t stream) {
  if (rows == 0 || width_bytes == 0) return;
  const uint64_t bits = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                        static_cast<uint64_t>(src_row_bytes) | static_cast<uint64_t>(src_off_bytes) |
                        static_cast<uint64_t>(dst_row_bytes) | static_cast<uint64_t>(dst_off_bytes) |
                        static_cast<uint64_t>(width_bytes);
  int64_t unit = 16;
  while (bits % static_cast<uint64_t>(unit) != 0) unit /= 2;
  const int64_t width = width_bytes / unit;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>(ceil_div(width, kThreads)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  auto launch = [&](auto tag) {
    using U = typename decltype(tag)::type;
    copy_columns_kernel<U><<<grid, kThreads, 0, stream>>>(
        static_cast<const U*>(src), src_row_bytes / unit, src_off_bytes / unit,
        static_cast<U*>(dst), dst_row_bytes / unit, dst_off_bytes / unit, rows, width);
  };
  switch (unit) {
    case 16: launch(TypeTag<int4>{}); break;
    case 8: launch(TypeTag<int2>{}); break;
    case 4: launch(TypeTag<int32_t>{}); break;
    case 2: launch(TypeTag<int16_t>{}); break;
    default: launch(TypeTag<int8_t>{}); break;
  }
  MDLM_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_fill(Tensor& x, T value, cudaStream_t s) {
  T* p = static_cast<T*>(x.data_ptr());
  launch_flat<kVec16<T>>(x.numel(), is_aligned(p, 16), FillOp<T>{p, value}, s);
}

}  // namespace

void launch_add_row_bias(Tensor& c, const Tensor& bias, cudaStream_t stream) {
  const int64_t cols = c.cols();
  dispatch_activation_dtype(c.dtype(), "gemm bias", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pc = static_cast<T*>(c.data_ptr());
    const T* pb = static_cast<const T*>(bias.data_ptr());
    const bool vectorizable = is_aligned(pc, 16) && is_aligned(pb, 16) && cols % kVec16<T> == 0;
    launch_flat<kVec16<T>>(c.numel(), vectorizable, RowBiasOp<T>{pc, pb, cols}, stream);
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out, const Stream& stream) {
  NvtxRange range("add");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(a.dtype(), "add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const bool vectorizable = is_aligned(pa, 16) && is_aligned(pb, 16) && is_aligned(po, 16);
    launch_flat<kVec16<T>>(a.numel(), vectorizable, AddOp<T>{pa, pb, po}, s);
  });
}

void scale_inplace(Tensor& x, float s, const Stream& stream) {
  NvtxRange range("scale_inplace");
  cudaStream_t cs = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(x.dtype(), "scale_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(x.data_ptr());
    launch_flat<kVec16<T>>(x.numel(), is_aligned(p, 16), ScaleOp<T>{p, s}, cs);
  });
}

void fill(Tensor& x, float value, const Stream& stream) {
  NvtxRange range("fill");
  if (x.numel() == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  if (value == 0.0f && !std::signbit(value)) {  // +0 is all-zero bits in every dtype
    MDLM_CUDA_CHECK(cudaMemsetAsync(x.data_ptr(), 0, x.nbytes(), s));
    return;
  }
  switch (x.dtype()) {
    case DType::F32: launch_fill<float>(x, value, s); break;
    case DType::BF16: launch_fill<bf16>(x, __float2bfloat16_rn(value), s); break;
    case DType::F16: launch_fill<__half>(x, __float2half_rn(value), s); break;
    case DType::F64: launch_fill<double>(x, static_cast<double>(value), s); break;
    case DType::I32: launch_fill<int32_t>(x, static_cast<int32_t>(value), s); break;
    case DType::I64: launch_fill<int64_t>(x, static_cast<int64_t>(value), s); break;
  }
}

namespace {

/// dst[m, :] = src[index[m], :] in units of U (row_units per row): grid.x covers a row, grid.y
/// strides over the rows of dst.
template <typename U>
__global__ void gather_rows_kernel(const U* __restrict__ src, const int32_t* __restrict__ index,
                                   U* __restrict__ dst, int64_t rows, int64_t row_units) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= row_units) return;
  for (int64_t m = blockIdx.y; m < rows; m += gridDim.y)
    dst[m * row_units + c] = src[static_cast<int64_t>(index[m]) * row_units + c];
}

}  // namespace

void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst, const Stream& stream) {
  NvtxRange range("gather_rows");
  const int64_t rows = index.numel();
  const int64_t row_bytes = src.cols() * static_cast<int64_t>(dtype_size(src.dtype()));
  if (rows == 0 || row_bytes == 0) return;
  const uint64_t bits = reinterpret_cast<uintptr_t>(src.data_ptr()) |
                        reinterpret_cast<uintptr_t>(dst.data_ptr()) |
                        static_cast<uint64_t>(row_bytes);
  int64_t unit = 16;
  while (bits % static_cast<uint64_t>(unit) != 0) unit /= 2;
  const int64_t units = row_bytes / unit;
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>(ceil_div(units, kThreads)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const auto* idx = static_cast<const int32_t*>(index.data_ptr());
  auto launch = [&](auto tag) {
    using U = typename decltype(tag)::type;
    gather_rows_kernel<U><<<grid, kThreads, 0, s>>>(static_cast<const U*>(src.data_ptr()), idx,
                                                     static_cast<U*>(dst.data_ptr()), rows, units);
  };
  switch (unit) {
    case 16: launch(TypeTag<int4>{}); break;
    case 8: launch(TypeTag<int2>{}); break;
    case 4: launch(TypeTag<int32_t>{}); break;
    case 2: launch(TypeTag<int16_t>{}); break;
    default: launch(TypeTag<int8_t>{}); break;
  }
  MDLM_CUDA_CHECK_LAUNCH();
}

void copy(const Tensor& src, Tensor& dst, const Stream& stream) {
  NvtxRange range("copy");
  copy_tensor(src, dst, stream);
}

void split_columns(const Tensor& x, const std::vector<Tensor*>& outs, const Stream& stream) {
  NvtxRange range("split_columns");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const int64_t es = static_cast<int64_t>(dtype_size(x.dtype()));
  const int64_t rows = x.rows();
  int64_t offset = 0;
  for (Tensor* o : outs) {
    const int64_t w = o->cols();
    copy_columns(x.data_ptr(), x.cols() * es, offset * es, o->data_ptr(), w * es, 0, rows, w * es, s);
    offset += w;
  }
}

void concat_columns(const std::vector<const Tensor*>& parts, Tensor& out, const Stream& stream) {
  NvtxRange range("concat_columns");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const int64_t es = static_cast<int64_t>(dtype_size(out.dtype()));
  const int64_t rows = out.rows();
  int64_t offset = 0;
  for (const Tensor* p : parts) {
    const int64_t w = p->cols();
    copy_columns(p->data_ptr(), w * es, 0, out.data_ptr(), out.cols() * es, offset * es, rows,
                 w * es, s);
    offset += w;
  }
}

}  // namespace megadlm::ops::cuda
