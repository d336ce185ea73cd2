// CPU reference RMSNorm and LayerNorm, forward and backward, over the last dimension.
// Row statistics are computed in double; forward uses them unrounded and stores them rounded to
// the dtype of `rstd`/`mean` (f32, or f64 alongside f64 activations); backward reads the stored
// values. dweight/dbias may be f32 or the activation dtype and are accumulated (+=).
//
// Backward derivations (per row, C columns, g = dy * weight):
//   RMSNorm:   y = x * r * w, r = (mean(x^2) + eps)^(-1/2), dr/dx = -r^3 x / C
//              dx = r * g - x * r^3 * mean(g * x)
//   LayerNorm: xhat = (x - mean) * r, y = xhat * w + b
//              dx = r * (g - mean(g) - xhat * mean(g * xhat))
#include <cmath>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

using detail::FloatAccess;

template <typename T>
void rms_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps) {
  const int64_t rows = x.rows(), cols = x.cols();
  const T* px = x.data<T>();
  const T* pw = weight.data<T>();
  T* py = y.data<T>();
  const FloatAccess rs("rms_norm_forward", rstd, "rstd");
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * cols;
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(cols) + static_cast<double>(eps));
    T* yr = py + r * cols;
    for (int64_t c = 0; c < cols; ++c) yr[c] = static_cast<T>(xr[c] * inv * pw[c]);
    rs.set(r, inv);
  }
}

template <typename T>
void rms_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                  Tensor& dx, Tensor& dweight) {
  const int64_t rows = x.rows(), cols = x.cols();
  const T* px = x.data<T>();
  const T* pdy = dy.data<T>();
  const T* pw = weight.data<T>();
  T* pdx = dx.data<T>();
  const FloatAccess rs("rms_norm_backward", rstd, "rstd");
  const FloatAccess dw("rms_norm_backward", dweight, "dweight");
  std::vector<double> dw_acc(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * cols;
    const T* dyr = pdy + r * cols;
    const double inv = rs.get(r);
    double gx = 0;  // sum_c g * x
    for (int64_t c = 0; c < cols; ++c) gx += static_cast<double>(dyr[c]) * pw[c] * xr[c];
    const double coef = inv * inv * inv * gx / static_cast<double>(cols);
    T* dxr = pdx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      dxr[c] = static_cast<T>(inv * static_cast<double>(dyr[c]) * pw[c] - xr[c] * coef);
      dw_acc[static_cast<size_t>(c)] += static_cast<double>(dyr[c]) * xr[c] * inv;
    }
  }
  for (int64_t c = 0; c < cols; ++c) dw.add(c, dw_acc[static_cast<size_t>(c)]);
}

template <typename T>
void ln_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                Tensor& rstd, float eps) {
  const int64_t rows = x.rows(), cols = x.cols();
  const T* px = x.data<T>();
  const T* pw = weight.data<T>();
  const T* pb = bias.defined() ? bias.data<T>() : nullptr;
  T* py = y.data<T>();
  const FloatAccess mu_out("layer_norm_forward", mean, "mean");
  const FloatAccess rs_out("layer_norm_forward", rstd, "rstd");
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * cols;
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += xr[c];
    const double mu = sum / static_cast<double>(cols);
    double var = 0;  // two passes: no cancellation for rows with a large mean
    for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    var /= static_cast<double>(cols);
    const double inv = 1.0 / std::sqrt(var + static_cast<double>(eps));
    T* yr = py + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      double v = (xr[c] - mu) * inv * pw[c];
      if (pb != nullptr) v += pb[c];
      yr[c] = static_cast<T>(v);
    }
    mu_out.set(r, mu);
    rs_out.set(r, inv);
  }
}

template <typename T>
void ln_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                 const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const int64_t rows = x.rows(), cols = x.cols();
  const double n = static_cast<double>(cols);
  const T* px = x.data<T>();
  const T* pdy = dy.data<T>();
  const T* pw = weight.data<T>();
  T* pdx = dx.data<T>();
  const FloatAccess mu_in("layer_norm_backward", mean, "mean");
  const FloatAccess rs_in("layer_norm_backward", rstd, "rstd");
  const FloatAccess dw("layer_norm_backward", dweight, "dweight");
  std::vector<double> dw_acc(static_cast<size_t>(cols), 0.0);
  std::vector<double> db_acc(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * cols;
    const T* dyr = pdy + r * cols;
    const double mu = mu_in.get(r), inv = rs_in.get(r);
    double g_sum = 0, gxhat_sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = static_cast<double>(dyr[c]) * pw[c];
      g_sum += g;
      gxhat_sum += g * (xr[c] - mu) * inv;
    }
    const double g_mean = g_sum / n, gxhat_mean = gxhat_sum / n;
    T* dxr = pdx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (xr[c] - mu) * inv;
      const double g = static_cast<double>(dyr[c]) * pw[c];
      dxr[c] = static_cast<T>(inv * (g - g_mean - xhat * gxhat_mean));
      dw_acc[static_cast<size_t>(c)] += dyr[c] * xhat;
      db_acc[static_cast<size_t>(c)] += dyr[c];
    }
  }
  for (int64_t c = 0; c < cols; ++c) dw.add(c, dw_acc[static_cast<size_t>(c)]);
  if (dbias.defined()) {
    const FloatAccess db("layer_norm_backward", dbias, "dbias");
    for (int64_t c = 0; c < cols; ++c) db.add(c, db_acc[static_cast<size_t>(c)]);
  }
}

}  // namespace

void rms_norm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                      const Stream& stream) {
  detail::with_float_type("rms_norm_forward", x, [&](auto t) {
    rms_forward<decltype(t)>(x, weight, y, rstd, eps);
  });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       Tensor& dx, Tensor& dweight, const Stream& stream) {
  detail::with_float_type("rms_norm_backward", x, [&](auto t) {
    rms_backward<decltype(t)>(dy, x, weight, rstd, dx, dweight);
  });
}

// The fused residual forms are, on the CPU, exactly their definitions: add then normalise;
// normalise backward then add (through a temporary, so dx may be dresidual itself).
void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          Tensor& sum, Tensor& y, Tensor& rstd, float eps, const Stream& stream) {
  cpu::add(x, residual, sum, stream);
  cpu::rms_norm_forward(sum, weight, y, rstd, eps, stream);
}

void rms_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& weight,
                           const Tensor& rstd, const Tensor& dresidual, Tensor& dx,
                           Tensor& dweight, const Stream& stream) {
  Tensor norm_dx = Tensor::empty(dx.shape(), dx.dtype(), stream);
  cpu::rms_norm_backward(dy, x, weight, rstd, norm_dx, dweight, stream);
  cpu::add(norm_dx, dresidual, dx, stream);
}

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                        Tensor& mean, Tensor& rstd, float eps, const Stream& stream) {
  MDLM_CHECK(!bias.defined() || bias.dtype() == x.dtype(), "layer_norm_forward: bias ", bias.str(),
             " must have x's dtype ", x.str());
  detail::with_float_type("layer_norm_forward", x, [&](auto t) {
    ln_forward<decltype(t)>(x, weight, bias, y, mean, rstd, eps);
  });
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                         Tensor& dbias, const Stream& stream) {
  detail::with_float_type("layer_norm_backward", x, [&](auto t) {
    ln_backward<decltype(t)>(dy, x, weight, mean, rstd, dx, dweight, dbias);
  });
}

}  // namespace megadlm::ops::cpu
