// MLP activations on CUDA: SwiGLU ([gate | up] halves) and exact-erf GELU, forward and backward,
// bf16 (or f32) storage with fp32 math. Entry -> launch_* -> *_kernel.
// SwiGLU uses a 2-D grid (x: 16-byte column packs of one half, y: rows, grid-stride) so no
// thread divides a flat index by the row length; GELU is a flat map (flat_kernel).
// SwiGLU's arithmetic is swiglu_math.cuh's (shared with the FP8 fused backward in fp8.cu).
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"
#include "ops/cuda/swiglu_math.cuh"

namespace megadlm::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

dim3 swiglu_grid(int64_t rows, int64_t f, int vec) {
  return dim3(static_cast<unsigned>(ceil_div(f / vec, kThreads)),
              static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
}

/// y[r, j] = silu(x[r, j]) * x[r, f + j].
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
swiglu_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t f) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (j >= f) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * 2 * f;
    float g[kVec], u[kVec], out[kVec];
    load_vec<kVec>(xr + j, g);
    load_vec<kVec>(xr + f + j, u);
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = swiglu_math::value(g[i], u[i]);
    store_vec<kVec>(y + r * f + j, out);
  }
}

/// dgate = dy * up * silu'(gate), dup = dy * silu(gate), silu'(g) = s (1 + g (1 - s)).
/// With y (swiglu_backward_recompute) also y = silu(gate) * up, the forward's expression.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
swiglu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                       int64_t rows, int64_t f, T* __restrict__ y = nullptr) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (j >= f) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * 2 * f;
    float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
    load_vec<kVec>(xr + j, g);
    load_vec<kVec>(xr + f + j, u);
    load_vec<kVec>(dy + r * f + j, d);
#pragma unroll
    for (int i = 0; i < kVec; ++i) swiglu_math::grad(g[i], u[i], d[i], dg[i], du[i]);
    T* dxr = dx + r * 2 * f;
    store_vec<kVec>(dxr + j, dg);
    store_vec<kVec>(dxr + f + j, du);
    if (y != nullptr) {
      float out[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] = swiglu_math::value(g[i], u[i]);
      store_vec<kVec>(y + r * f + j, out);
    }
  }
}

template <typename T>
struct GeluForwardOp {
  const T* x;
  T* y;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float v[N];
    load_vec<N>(x + i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = 0.5f * v[k] * (1.0f + erff(v[k] * kInvSqrt2));
    store_vec<N>(y + i, v);
  }
};

/// gelu'(x) = Phi(x) + x * phi(x).
template <typename T>
struct GeluBackwardOp {
  const T* dy;
  const T* x;
  T* dx;
  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float v[N], d[N];
    load_vec<N>(x + i, v);
    load_vec<N>(dy + i, d);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float cdf = 0.5f * (1.0f + erff(v[k] * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * __expf(-0.5f * v[k] * v[k]);
      d[k] *= cdf + v[k] * pdf;
    }
    store_vec<N>(dx + i, d);
  }
};

}  // namespace

void swiglu_forward(const Tensor& x, Tensor& y, const Stream& stream) {
  NvtxRange range("swiglu_forward");
  const int64_t rows = x.rows(), f = y.cols();
  if (rows == 0 || f == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(x.dtype(), "swiglu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = kVec16<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    if (f % kVec == 0 && is_aligned(px, 16) && is_aligned(py, 16))
      swiglu_forward_kernel<T, kVec><<<swiglu_grid(rows, f, kVec), kThreads, 0, s>>>(px, py, rows, f);
    else
      swiglu_forward_kernel<T, 1><<<swiglu_grid(rows, f, 1), kThreads, 0, s>>>(px, py, rows, f);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

namespace {
void launch_swiglu_backward(const char* op, const Tensor& dy, const Tensor& x, Tensor& dx,
                            Tensor* y, const Stream& stream) {
  const int64_t rows = x.rows(), f = dy.cols();
  if (rows == 0 || f == 0) return;
  MDLM_CHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype() && (!y || y->dtype() == x.dtype()),
             op, ": dy ", dy.str(), " and dx ", dx.str(), " must have x's dtype ", x.str());
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = kVec16<T>;
    const T* pdy = static_cast<const T*>(dy.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    T* pdx = static_cast<T*>(dx.data_ptr());
    T* py = y ? static_cast<T*>(y->data_ptr()) : nullptr;
    if (f % kVec == 0 && is_aligned(pdy, 16) && is_aligned(px, 16) && is_aligned(pdx, 16) &&
        (!py || is_aligned(py, 16)))
      swiglu_backward_kernel<T, kVec><<<swiglu_grid(rows, f, kVec), kThreads, 0, s>>>(pdy, px, pdx,
                                                                                      rows, f, py);
    else
      swiglu_backward_kernel<T, 1><<<swiglu_grid(rows, f, 1), kThreads, 0, s>>>(pdy, px, pdx, rows,
                                                                                f, py);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}
}  // namespace

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream) {
  NvtxRange range("swiglu_backward");
  launch_swiglu_backward("swiglu_backward", dy, x, dx, nullptr, stream);
}

void swiglu_backward_recompute(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& y,
                               const Stream& stream) {
  NvtxRange range("swiglu_backward_recompute");
  launch_swiglu_backward("swiglu_backward_recompute", dy, x, dx, &y, stream);
}

void gelu_forward(const Tensor& x, Tensor& y, const Stream& stream) {
  NvtxRange range("gelu_forward");
  MDLM_CHECK(y.dtype() == x.dtype(), "gelu_forward: y ", y.str(), " must have x's dtype ", x.str());
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    launch_flat<kVec16<T>>(x.numel(), is_aligned(px, 16) && is_aligned(py, 16),
                           GeluForwardOp<T>{px, py}, s);
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream) {
  NvtxRange range("gelu_backward");
  MDLM_CHECK(dy.dtype() == x.dtype() && dx.dtype() == x.dtype(), "gelu_backward: dy ", dy.str(),
             " and dx ", dx.str(), " must have x's dtype ", x.str());
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pdy = static_cast<const T*>(dy.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    T* pdx = static_cast<T*>(dx.data_ptr());
    launch_flat<kVec16<T>>(x.numel(), is_aligned(pdy, 16) && is_aligned(px, 16) && is_aligned(pdx, 16),
                           GeluBackwardOp<T>{pdy, px, pdx}, s);
  });
}

}  // namespace megadlm::ops::cuda
