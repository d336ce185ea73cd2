// CPU reference of the fused output layer + cross-entropy (linear_cross_entropy.h): for each
// selected row the logits, the max-subtracted softmax and the loss, then the gradient rows.
// f64 (gradient checks) runs direct loops. f32 runs the three products through the CPU GEMM
// (OpenBLAS where built with it) on a fixed number of selected rows at a time: the naive loops
// made the output layer ~80% of a tiny model's step at GPT-2's 50k vocabulary. Each product is
// one BLAS call per chunk (gemm_f32_one_call; the GEMM's pairs of rows would repack the whole
// weight for every pair), so a row's loss may differ in the last bits with the rows selected
// beside it: the op serves training only (evaluation and generation take the logits GEMM, whose
// rows are independent). args.chunk_rows does not change the arithmetic here; it exists for the
// CUDA path.
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

/// f32 through the GEMM: kRowsPerChunk selected rows are gathered into xc; z = xc W^T; each row
/// turned into its loss and, for training, its logit gradient g (in place of z); dx rows = g W,
/// dweight += g^T xc (accumulated in f32 by the GEMM).
void run_f32_gemm(const Tensor& x, const Tensor& weight, const std::vector<int32_t>& selected,
                  const Tensor& targets, const Tensor& loss_weights, Tensor& losses, Tensor& dx,
                  Tensor& dweight, const LinearCrossEntropyArgs& args, const Stream& stream) {
  const char* op = "linear_cross_entropy";
  constexpr int64_t kRowsPerChunk = 64;
  const int64_t h = x.cols(), v = weight.rows();
  const float* X = x.data<float>();
  const int32_t* tg = targets.data<int32_t>();
  const detail::FloatAccess lw(op, loss_weights, "loss_weights"), loss(op, losses, "losses");
  const bool grad = args.grad_scale > 0.0f;
  float* dX = grad ? dx.data<float>() : nullptr;
  if (grad) std::fill(dX, dX + dx.numel(), 0.0f);
  const auto n = static_cast<int64_t>(selected.size());
  const int64_t cap = std::min(kRowsPerChunk, std::max<int64_t>(n, 1));
  Tensor xc_all = Tensor::empty({cap, h}, DType::F32, stream);
  Tensor z_all = Tensor::empty({cap, v}, DType::F32, stream);
  Tensor dxc_all = grad ? Tensor::empty({cap, h}, DType::F32, stream) : Tensor();
  Tensor gt_all = grad ? Tensor::empty({v, cap}, DType::F32, stream) : Tensor();
  for (int64_t begin = 0; begin < n; begin += kRowsPerChunk) {
    const int64_t c = std::min(kRowsPerChunk, n - begin);
    Tensor xc = xc_all.slice_flat(0, {c, h});
    Tensor z = z_all.slice_flat(0, {c, v});
    float* XC = xc.data<float>();
    for (int64_t i = 0; i < c; ++i) {
      const int32_t r = selected[static_cast<size_t>(begin + i)];
      const int32_t target = tg[r];
      MDLM_CHECK(target >= 0 && target < v, op, ": target ", target, " of row ", r, " outside [0, ", v, ")");
      std::copy(X + r * h, X + (r + 1) * h, XC + i * h);
    }
    gemm_f32_one_call(xc, weight, z, {.trans_b = true});
    float* Z = z.data<float>();
    for (int64_t i = 0; i < c; ++i) {
      const int32_t r = selected[static_cast<size_t>(begin + i)];
      const int32_t target = tg[r];
      float* zr = Z + i * v;
      float zmax = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < v; ++j) zmax = std::max(zmax, zr[j]);
      const float z_target = zr[target];
      float sum = 0;
      if (grad) {
        for (int64_t j = 0; j < v; ++j) sum += (zr[j] = std::exp(zr[j] - zmax));
      } else {
        for (int64_t j = 0; j < v; ++j) sum += std::exp(zr[j] - zmax);
      }
      loss.set(r, static_cast<double>(zmax + std::log(sum) - z_target));
      if (!grad) continue;
      // g = scale (softmax - one-hot), the softmax as exp(z - zmax) / sum.
      const float scale = args.grad_scale * static_cast<float>(lw.get(r));
      const float p_scale = scale / sum;
      for (int64_t j = 0; j < v; ++j) zr[j] *= p_scale;
      zr[target] -= scale;
    }
    if (!grad) continue;
    Tensor dxc = dxc_all.slice_flat(0, {c, h});
    gemm_f32_one_call(z, weight, dxc, {});
    const float* DXC = dxc.data<float>();
    for (int64_t i = 0; i < c; ++i) {
      const int32_t r = selected[static_cast<size_t>(begin + i)];
      std::copy(DXC + i * h, DXC + (i + 1) * h, dX + r * h);
    }
    // dweight += g^T xc with g transposed first: BLAS packing a transposed [c, v] operand reads
    // it down its columns, a page per element at a 50k vocabulary (measured 5x slower).
    Tensor gt = gt_all.slice_flat(0, {v, c});
    float* GT = gt.data<float>();
    constexpr int64_t kBlock = 256;
    for (int64_t j0 = 0; j0 < v; j0 += kBlock) {
      const int64_t j1 = std::min(v, j0 + kBlock);
      for (int64_t i = 0; i < c; ++i) {
        for (int64_t j = j0; j < j1; ++j) GT[j * c + i] = Z[i * v + j];
      }
    }
    gemm_f32_one_call(gt, xc, dweight, {.beta = 1.0f});
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
    run_f32_gemm(x, weight, selected_rows(rows, x.rows(), loss), targets, loss_weights, losses, dx, dweight, args,
                 stream);
    return;
  }
  detail::with_float_type("linear_cross_entropy", x, [&](auto tag) {
    run<decltype(tag)>(x, weight, rows, targets, loss_weights, losses, dx, dweight, args);
  });
}

}  // namespace megadlm::ops::cpu
