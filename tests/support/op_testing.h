// Shared helpers for op tests: deterministic random tensors, relative errors, finite-difference
// gradient checks and GPU-availability skips. Header-only; used by tests/unit and tests/gpu.
#pragma once
#include <gtest/gtest.h>
#include <cmath>
#include <functional>
#include <vector>
#include "megadlm/core/philox.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::test {

/// Deterministic uniform values in [lo, hi) keyed by (seed, index).
inline std::vector<float> random_floats(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  PhiloxKey key = PhiloxKey::make(seed, RngPurpose::MockData);
  for (int64_t i = 0; i < n; ++i) {
    float u = uniform_from_u32(philox(key, static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), 7, 7).w[0]);
    v[static_cast<size_t>(i)] = lo + (hi - lo) * u;
  }
  return v;
}

/// Host tensor of the given dtype (F32 or F64) filled with random_floats.
inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::F32,
                            float lo = -1.0f, float hi = 1.0f) {
  return Tensor::from_floats(random_floats(shape_numel(shape), seed, lo, hi), shape, dtype);
}

/// Host vector of doubles from any tensor (synchronises).
inline std::vector<double> to_doubles(const Tensor& t, const Stream& stream = Stream::cpu()) {
  Tensor h = t.to(Device::cpu(), DType::F64, stream);
  const double* p = h.data<double>();
  return std::vector<double>(p, p + h.numel());
}

/// ||a - b|| / max(||b||, tiny).
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

/// Central finite-difference gradient of a scalar function of one f64 host tensor, element by
/// element (x is perturbed in place and restored). Use on small tensors only.
inline std::vector<double> finite_difference(Tensor& x, const std::function<double()>& f,
                                             double h = 1e-6) {
  double* p = x.data<double>();
  std::vector<double> g(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    double orig = p[i];
    p[i] = orig + h;
    double fp = f();
    p[i] = orig - h;
    double fm = f();
    p[i] = orig;
    g[static_cast<size_t>(i)] = (fp - fm) / (2 * h);
  }
  return g;
}

/// sum_i a[i] * b[i] over two host f64 tensors: the scalar "loss" L = <dy, y> whose gradient
/// with respect to y is dy, used to turn a backward pass into something finite differences check.
inline double inner(const Tensor& a, const Tensor& b) {
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += pa[i] * pb[i];
  return s;
}

inline bool gpu_available() { return cuda_device_count() > 0; }

}  // namespace megadlm::test

/// First line of every GPU test: skips with the reason when no GPU can run it.
#define MDLM_REQUIRE_GPU()                                                                      \
  do {                                                                                          \
    if (!::megadlm::cuda_compiled()) GTEST_SKIP() << "libmegadlm built without CUDA";           \
    if (!::megadlm::test::gpu_available())                                                      \
      GTEST_SKIP() << "no CUDA device visible; this test runs on the device machine";          \
  } while (0)
