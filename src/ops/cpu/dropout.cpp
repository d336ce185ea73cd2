// CPU reference dropout on the residual path: out = residual + mask * x / (1 - p) and its
// backward, with the mask regenerated from global coordinates (ops/dropout_mask.h, the mapping
// shared with CUDA). p == 0 takes an exact path: a plain add / copy, no random numbers drawn.
#include <algorithm>
#include <type_traits>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dropout_mask.h"

namespace megadlm::ops::cpu {

namespace {

/// 1 / (1 - p): the fp32 factor shared with CUDA for f32 tensors, exact in double for f64.
template <typename T>
T keep_scale(const ops::detail::DropoutMask& mask) {
  if constexpr (std::is_same_v<T, float>) return mask.scale;
  else return 1.0 / (1.0 - static_cast<double>(mask.p));
}

template <typename T>
void dropout_add(const Tensor& x, const Tensor& residual, Tensor& out, const DropoutArgs& args) {
  const int64_t rows = x.rows(), cols = x.cols();
  const T* px = x.data<T>();
  const T* pr = residual.data<T>();
  T* po = out.data<T>();
  if (args.p == 0.0f) {
    for (int64_t i = 0; i < x.numel(); ++i) po[i] = pr[i] + px[i];
    return;
  }
  const auto mask = ops::detail::DropoutMask::from_args(args);
  const T scale = keep_scale<T>(mask);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      po[i] = mask.keep(r, c) ? pr[i] + px[i] * scale : pr[i];
    }
  }
}

template <typename T>
void dropout_bwd(const Tensor& dout, Tensor& dx, const DropoutArgs& args) {
  const int64_t rows = dout.rows(), cols = dout.cols();
  const T* pd = dout.data<T>();
  T* px = dx.data<T>();
  if (args.p == 0.0f) {
    std::copy(pd, pd + dout.numel(), px);
    return;
  }
  const auto mask = ops::detail::DropoutMask::from_args(args);
  const T scale = keep_scale<T>(mask);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      px[i] = mask.keep(r, c) ? pd[i] * scale : T(0);
    }
  }
}

}  // namespace

void dropout_add_forward(const Tensor& x, const Tensor& residual, Tensor& out,
                         const DropoutArgs& args, const Stream& stream) {
  detail::with_float_type("dropout_add_forward", x,
                          [&](auto t) { dropout_add<decltype(t)>(x, residual, out, args); });
}

void dropout_backward(const Tensor& dout, Tensor& dx, const DropoutArgs& args,
                      const Stream& stream) {
  detail::with_float_type("dropout_backward", dout,
                          [&](auto t) { dropout_bwd<decltype(t)>(dout, dx, args); });
}

}  // namespace megadlm::ops::cpu
