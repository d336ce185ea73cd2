// CPU reference of the fused output layer + cross-entropy (linear_cross_entropy.h): for each
// selected row the logits, the max-subtracted softmax and the loss, then the gradient rows, as
// direct loops in the activation type (f32, or f64 for gradient checks); f32 runs the same
// arithmetic in a cache-blocked order (run_f32_blocked). chunk_rows does not change the
// arithmetic here; it exists for the CUDA path.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {
namespace {

/// The rows that carry loss (all without `rows`), checked; every loss zeroed first (the rows not
/// selected keep 0).
std::vector<int32_t> selected_rows(const Tensor* rows, int64_t t, const detail::FloatAccess& loss) {
  std::vector<int32_t> selected;
  if (rows != nullptr) {
    const int32_t* r = rows->data<int32_t>();
    selected.assign(r, r + rows->numel());
  } else {
    for (int64_t i = 0; i < t; ++i) selected.push_back(static_cast<int32_t>(i));
  }
  std::vector<char> seen(static_cast<size_t>(t), 0);
  for (int32_t r : selected) {
    MDLM_CHECK(r >= 0 && r < t && !seen[static_cast<size_t>(r)], "linear_cross_entropy: row ", r,
               " is outside [0, ", t, ") or selected twice");
    seen[static_cast<size_t>(r)] = 1;
  }
  for (int64_t i = 0; i < t; ++i) loss.set(i, 0.0);
  return selected;
}

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
  const std::vector<int32_t> selected = selected_rows(rows, t, loss);
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

/// f32: the loops of run<float> above, reordered for the cache and the vector unit, with every
/// element computed by the same operations in the same order (so the results are the same bits):
/// a logit sums its h products in order of k; a row's softmax and loss are the same expressions;
/// an element of dx sums over the vocabulary in order, an element of dweight over the selected
/// rows in order (each product added in f64 and rounded into the f32 main grad, as
/// FloatAccess::add does). Work goes in chunks of kRows selected rows; the logits run over W^T
/// (copied once) a block of kCols vocabulary entries at a time for kRowBlock rows, and the
/// gradients a block of kCols vocabulary rows of W and dweight at a time for all rows of the
/// chunk. The reference loops took ~80% of a tiny model's step at GPT-2's 50k vocabulary.
void run_f32_blocked(const Tensor& x, const Tensor& weight, const std::vector<int32_t>& selected,
                     const Tensor& targets, const Tensor& loss_weights, Tensor& losses, Tensor& dx,
                     Tensor& dweight, const LinearCrossEntropyArgs& args) {
  const char* op = "linear_cross_entropy";
  constexpr int64_t kRows = 64, kRowBlock = 4, kCols = 256;
  const int64_t h = x.cols(), v = weight.rows();
  const float* X = x.data<float>();
  const float* W = weight.data<float>();
  const int32_t* tg = targets.data<int32_t>();
  const detail::FloatAccess lw(op, loss_weights, "loss_weights"), loss(op, losses, "losses");
  const bool grad = args.grad_scale > 0.0f;
  float* dX = grad ? dx.data<float>() : nullptr;
  float* DW = grad ? dweight.data<float>() : nullptr;
  if (grad) std::fill(dX, dX + dx.numel(), 0.0f);
  std::vector<float> wt(static_cast<size_t>(h * v));  // W^T [h, v]
  for (int64_t j = 0; j < v; ++j)
    for (int64_t k = 0; k < h; ++k) wt[static_cast<size_t>(k * v + j)] = W[j * h + k];
  const auto n = static_cast<int64_t>(selected.size());
  std::vector<float> z(static_cast<size_t>(std::min(kRows, n) * v));
  for (int64_t begin = 0; begin < n; begin += kRows) {
    const int64_t c = std::min(kRows, n - begin);
    const int32_t* rows = selected.data() + begin;
    for (int64_t i = 0; i < c; ++i) {
      const int32_t target = tg[rows[i]];
      MDLM_CHECK(target >= 0 && target < v, op, ": target ", target, " of row ", rows[i], " outside [0, ", v, ")");
    }
    // z[i][j] = sum over k in order of W[j][k] x[i][k].
    for (int64_t i0 = 0; i0 < c; i0 += kRowBlock) {
      const int64_t i1 = std::min(c, i0 + kRowBlock);
      for (int64_t j0 = 0; j0 < v; j0 += kCols) {
        const int64_t nj = std::min(v, j0 + kCols) - j0;
        for (int64_t i = i0; i < i1; ++i) std::fill_n(z.data() + i * v + j0, nj, 0.0f);
        for (int64_t k = 0; k < h; ++k) {
          const float* wk = wt.data() + k * v + j0;
          for (int64_t i = i0; i < i1; ++i) {
            const float xk = X[rows[i] * h + k];
            float* zi = z.data() + i * v + j0;
            for (int64_t j = 0; j < nj; ++j) zi[j] += wk[j] * xk;
          }
        }
      }
    }
    // Loss, and the logit gradient g in place of z.
    for (int64_t i = 0; i < c; ++i) {
      const int32_t r = rows[i], target = tg[r];
      float* zi = z.data() + i * v;
      float zmax = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < v; ++j) zmax = std::max(zmax, zi[j]);
      float sum = 0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(zi[j] - zmax);
      const float lse = zmax + std::log(sum);
      loss.set(r, static_cast<double>(lse - zi[target]));
      if (!grad) continue;
      const float scale = static_cast<float>(args.grad_scale) * static_cast<float>(lw.get(r));
      for (int64_t j = 0; j < v; ++j) zi[j] = scale * (std::exp(zi[j] - lse) - (j == target ? 1.0f : 0.0f));
    }
    if (!grad) continue;
    // dx[i] += g[i][j] W[j], dweight[j] += g[i][j] x[i] (f64 add, f32 store), vocabulary rows in order.
    for (int64_t j0 = 0; j0 < v; j0 += kCols) {
      const int64_t j1 = std::min(v, j0 + kCols);
      for (int64_t i = 0; i < c; ++i) {
        const float* xi = X + rows[i] * h;
        float* dxi = dX + rows[i] * h;
        const float* gi = z.data() + i * v;
        for (int64_t j = j0; j < j1; ++j) {
          const float g = gi[j];
          if (g == 0.0f) continue;
          const float* wj = W + j * h;
          float* dwj = DW + j * h;
          for (int64_t k = 0; k < h; ++k) dxi[k] += g * wj[k];
          for (int64_t k = 0; k < h; ++k) dwj[k] = static_cast<float>(static_cast<double>(dwj[k]) + static_cast<double>(g * xi[k]));
        }
      }
    }
  }
}

}  // namespace

void linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor* rows,
                          const Tensor& targets, const Tensor& loss_weights, Tensor& losses,
                          Tensor& dx, Tensor& dweight, const LinearCrossEntropyArgs& args,
                          const Stream& stream) {
  const bool grad = args.grad_scale > 0.0f;
  if (x.dtype() == DType::F32 && weight.dtype() == DType::F32 &&
      (!grad || (dx.dtype() == DType::F32 && dweight.dtype() == DType::F32))) {
    const detail::FloatAccess loss("linear_cross_entropy", losses, "losses");
    run_f32_blocked(x, weight, selected_rows(rows, x.rows(), loss), targets, loss_weights, losses, dx, dweight, args);
    return;
  }
  detail::with_float_type("linear_cross_entropy", x, [&](auto tag) {
    run<decltype(tag)>(x, weight, rows, targets, loss_weights, losses, dx, dweight, args);
  });
}

}  // namespace megadlm::ops::cpu
