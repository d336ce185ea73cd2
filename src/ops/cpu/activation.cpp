// CPU reference MLP activations: SwiGLU on [gate | up] rows and exact-erf GELU, forward and
// backward, computed in double and stored in the tensor's dtype (f32 or f64).
//   silu(g) = g * sigmoid(g);  d silu / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
//   gelu(x) = x * Phi(x);      d gelu / dx = Phi(x) + x * phi(x)
#include <cmath>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

constexpr double kInvSqrt2 = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)

/// Standard normal CDF and density.
double normal_cdf(double x) { return 0.5 * (1.0 + std::erf(x * kInvSqrt2)); }
double normal_pdf(double x) { return kInvSqrt2Pi * std::exp(-0.5 * x * x); }

template <typename T>
void swiglu_fwd(const Tensor& x, Tensor& y) {
  const int64_t rows = y.rows(), f = y.cols();
  const T* px = x.data<T>();
  T* py = y.data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = px + r * 2 * f;
    const T* up = gate + f;
    T* yr = py + r * f;
    for (int64_t j = 0; j < f; ++j) {
      const double g = gate[j];
      yr[j] = static_cast<T>(g * sigmoid(g) * up[j]);
    }
  }
}

template <typename T>
void swiglu_bwd(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const int64_t rows = x.rows(), f = x.cols() / 2;
  const T* pdy = dy.data<T>();
  const T* px = x.data<T>();
  T* pdx = dx.data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = px + r * 2 * f;
    const T* up = gate + f;
    const T* dyr = pdy + r * f;
    T* dgate = pdx + r * 2 * f;
    T* dup = dgate + f;
    for (int64_t j = 0; j < f; ++j) {
      const double g = gate[j], u = up[j], d = dyr[j];
      const double s = sigmoid(g);
      dgate[j] = static_cast<T>(d * u * s * (1.0 + g * (1.0 - s)));
      dup[j] = static_cast<T>(d * g * s);
    }
  }
}

template <typename T>
void gelu_fwd(const Tensor& x, Tensor& y) {
  const T* px = x.data<T>();
  T* py = y.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = px[i];
    py[i] = static_cast<T>(v * normal_cdf(v));
  }
}

template <typename T>
void gelu_bwd(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const T* pdy = dy.data<T>();
  const T* px = x.data<T>();
  T* pdx = dx.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = px[i];
    pdx[i] = static_cast<T>(pdy[i] * (normal_cdf(v) + v * normal_pdf(v)));
  }
}

}  // namespace

void swiglu_forward(const Tensor& x, Tensor& y, const Stream& stream) {
  detail::with_float_type("swiglu_forward", x, [&](auto t) { swiglu_fwd<decltype(t)>(x, y); });
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream) {
  detail::with_float_type("swiglu_backward", x,
                          [&](auto t) { swiglu_bwd<decltype(t)>(dy, x, dx); });
}

// The definition: the backward and the forward, from the same x.
void swiglu_backward_recompute(const Tensor& dy, const Tensor& x, Tensor& dx, Tensor& y,
                               const Stream& stream) {
  swiglu_backward(dy, x, dx, stream);
  swiglu_forward(x, y, stream);
}

void gelu_forward(const Tensor& x, Tensor& y, const Stream& stream) {
  detail::with_float_type("gelu_forward", x, [&](auto t) { gelu_fwd<decltype(t)>(x, y); });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, const Stream& stream) {
  detail::with_float_type("gelu_backward", x, [&](auto t) { gelu_bwd<decltype(t)>(dy, x, dx); });
}

}  // namespace megadlm::ops::cpu
