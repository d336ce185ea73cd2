// CPU reference of the fused output layer + cross-entropy (linear_cross_entropy.h): for each
// selected row the logits, the max-subtracted softmax and the loss, then the gradient rows, as
// direct loops in the activation type (f32, or f64 for gradient checks). chunk_rows does not
// change the arithmetic here; it exists for the CUDA path.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {
namespace {

template <typename T>
void run(const Tensor& x, const Tensor& weight, const Tensor* rows, const Tensor& targets,
         const Tensor& loss_weights, Tensor& losses, Tensor& dx, Tensor& dweight,
         const LinearCrossEntropyArgs& args) {
  const char* op = "linear_cross_entropy";
  const int64_t t = x.rows(), h = x.cols(), v = weight.rows();
  const T* X = x.data<T>();
  const T* W = weight.data<T>();
  const int32_t* tg = targets.data<int32_t>();
  const detail::FloatAccess lw(op, loss_weights, "loss_weights"), loss(op, losses, "losses");
  const bool grad = args.grad_scale > 0.0f;
  std::vector<int32_t> selected;
  if (rows != nullptr) {
    const int32_t* r = rows->data<int32_t>();
    selected.assign(r, r + rows->numel());
  } else {
    for (int64_t i = 0; i < t; ++i) selected.push_back(static_cast<int32_t>(i));
  }
  std::vector<char> seen(static_cast<size_t>(t), 0);
  for (int32_t r : selected) {
    MDLM_CHECK(r >= 0 && r < t && !seen[static_cast<size_t>(r)], op, ": row ", r,
               " is outside [0, ", t, ") or selected twice");
    seen[static_cast<size_t>(r)] = 1;
  }
  for (int64_t i = 0; i < t; ++i) loss.set(i, 0.0);
  T* dX = grad ? dx.data<T>() : nullptr;
  std::unique_ptr<detail::FloatAccess> dw;
  if (grad) {
    for (int64_t i = 0; i < dx.numel(); ++i) dX[i] = 0;
    dw = std::make_unique<detail::FloatAccess>(op, dweight, "dweight");
  }
  std::vector<T> z(static_cast<size_t>(v));
  for (int32_t r : selected) {
    const int32_t target = tg[r];
    MDLM_CHECK(target >= 0 && target < v, op, ": target ", target, " of row ", r, " outside [0, ", v, ")");
    const T* xr = X + r * h;
    T zmax = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < v; ++j) {
      T s = 0;
      for (int64_t k = 0; k < h; ++k) s += W[j * h + k] * xr[k];
      z[static_cast<size_t>(j)] = s;
      zmax = std::max(zmax, s);
    }
    T sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(z[static_cast<size_t>(j)] - zmax);
    const T lse = zmax + std::log(sum);
    loss.set(r, static_cast<double>(lse - z[static_cast<size_t>(target)]));
    if (!grad) continue;
    const T scale = static_cast<T>(args.grad_scale) * static_cast<T>(lw.get(r));
    for (int64_t j = 0; j < v; ++j) {
      const T g = scale * (std::exp(z[static_cast<size_t>(j)] - lse) - (j == target ? T(1) : T(0)));
      if (g == T(0)) continue;
      for (int64_t k = 0; k < h; ++k) {
        dX[r * h + k] += g * W[j * h + k];
        dw->add(j * h + k, static_cast<double>(g * xr[k]));
      }
    }
  }
}

}  // namespace

void linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor* rows,
                          const Tensor& targets, const Tensor& loss_weights, Tensor& losses,
                          Tensor& dx, Tensor& dweight, const LinearCrossEntropyArgs& args,
                          const Stream& stream) {
  detail::with_float_type("linear_cross_entropy", x, [&](auto tag) {
    run<decltype(tag)>(x, weight, rows, targets, loss_weights, losses, dx, dweight, args);
  });
}

}  // namespace megadlm::ops::cpu
