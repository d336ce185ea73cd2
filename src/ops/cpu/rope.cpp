// CPU reference rotary position embedding (rotate-half), in place; the formula is in
// include/megadlm/ops/rope.h. For f32 tensors the angle theta = p * inv_freq is formed in fp32 as
// Megatron does (its cos/sin are then taken of that fp32 angle); for f64 tensors everything is
// double. Backward is the same rotation by -theta (a rotation's transpose is its inverse).
#include <cmath>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

/// inv_freq[i] = 1 / base^(2i / rotary_dim), in the precision of T (fp32 for f32, as Megatron).
template <typename T>
std::vector<T> inverse_frequencies(const RopeArgs& args) {
  const int64_t half = args.rotary_dim / 2;
  std::vector<T> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const T exponent = static_cast<T>(2 * i) / static_cast<T>(args.rotary_dim);
    inv[static_cast<size_t>(i)] = T(1) / std::pow(static_cast<T>(args.base), exponent);
  }
  return inv;
}

/// Rotates the first rotary_dim elements of every head vector by sign * theta.
template <typename T>
void rotate(Tensor& x, const Tensor& positions, const RopeArgs& args, double sign) {
  const int64_t half = args.rotary_dim / 2;
  const int64_t tokens = x.numel() / (args.heads * args.head_dim);
  const std::vector<T> inv_freq = inverse_frequencies<T>(args);
  const int32_t* pos = positions.data<int32_t>();
  T* px = x.data<T>();
  std::vector<double> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const T theta = static_cast<T>(pos[t]) * inv_freq[static_cast<size_t>(i)];
      cos_t[static_cast<size_t>(i)] = std::cos(static_cast<double>(theta));
      sin_t[static_cast<size_t>(i)] = sign * std::sin(static_cast<double>(theta));
    }
    for (int64_t h = 0; h < args.heads; ++h) {
      T* v = px + (t * args.heads + h) * args.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double x1 = v[i], x2 = v[i + half];
        const double c = cos_t[static_cast<size_t>(i)], s = sin_t[static_cast<size_t>(i)];
        v[i] = static_cast<T>(x1 * c - x2 * s);
        v[i + half] = static_cast<T>(x2 * c + x1 * s);
      }
    }
  }
}

}  // namespace

void rope_forward(Tensor& x, const Tensor& positions, const RopeArgs& args, const Stream& stream) {
  detail::with_float_type("rope_forward", x,
                          [&](auto t) { rotate<decltype(t)>(x, positions, args, +1.0); });
}

void rope_backward(Tensor& dx, const Tensor& positions, const RopeArgs& args,
                   const Stream& stream) {
  detail::with_float_type("rope_backward", dx,
                          [&](auto t) { rotate<decltype(t)>(dx, positions, args, -1.0); });
}

}  // namespace megadlm::ops::cpu
