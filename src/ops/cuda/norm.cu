// RMSNorm and LayerNorm on CUDA: bf16 (or f32) storage, fp32 statistics and arithmetic; the
// fused residual forms (add_rms_norm_forward, rms_norm_backward_add) run the same kernels with
// the residual read (and the sum written) in the same pass.
// Entry (validates, picks the row layout) -> launch_* (grid, stream) -> *_kernel.
//
// A row is held in registers by a group of blockDim.x threads (1..512, see RowConfig), several
// rows per block when rows are short (QK-norm: C = 64/128 with very many rows), so x is read
// once. Backward writes dx per row and reduces dweight/dbias in two deterministic stages: each
// block sums its rows into one fp32 partial row (fixed row order, then fixed order across the
// block's row slots in shared memory); launch_add_partial_rows then adds the partial rows into
// dweight/dbias in increasing block order. No float atomics, so repeated runs are bitwise equal.
// The grid of the first stage depends on the shape only (not on the device).
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

/// Backward blocks: enough to fill an H200 (132 SMs) a few times over while keeping the partial
/// rows (blocks x C x 4 bytes; 4 MiB at C = 2048) small next to the tensors themselves.
constexpr int64_t kBackwardMaxBlocks = 512;

template <int N>
__device__ __forceinline__ void zero(float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = 0.0f;
}

// ---- kernels ------------------------------------------------------------------------------

/// One row per threadIdx.y slot. kLayer: LayerNorm (mean subtracted, optional bias), else RMSNorm.
/// With residual (add_rms_norm_forward): the row normalised is sum = T(x + residual), rounded to
/// T exactly as ops::add rounds it, and written to sum_out.
template <typename T, int kVec, int kPacks, bool kLayer>
__global__ void __launch_bounds__(kMaxRowBlockThreads)
norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                    const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ mean_out,
                    float* __restrict__ rstd_out, int64_t rows, int cols, float eps,
                    const T* __restrict__ residual = nullptr, T* __restrict__ sum_out = nullptr) {
  __shared__ float red[kMaxRowBlockWarps];
  const int npacks = cols / kVec;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool row_ok = row < rows;
  const T* xr = x + (row_ok ? row : 0) * cols;

  float v[kPacks][kVec];
  float acc[1] = {0.0f};
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int idx = p * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
    if (row_ok && idx < npacks) {
      load_vec<kVec>(xr + idx * kVec, v[p]);
      if (residual != nullptr) {
        float r[kVec];
        load_vec<kVec>(residual + (xr - x) + idx * kVec, r);
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[p][i] = to_float(from_float<T>(v[p][i] + r[i]));
        store_vec<kVec>(sum_out + (xr - x) + idx * kVec, v[p]);
      }
    } else {
      zero(v[p]);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[0] += kLayer ? v[p][i] : v[p][i] * v[p][i];
  }
  row_sum<1>(acc, red);

  float mu = 0.0f;
  if constexpr (kLayer) {
    // Two-pass variance from registers: sum((x - mean)^2) avoids E[x^2] - mean^2 cancellation.
    mu = acc[0] / static_cast<float>(cols);
    acc[0] = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int idx = p * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
      if (row_ok && idx < npacks) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[0] += (v[p][i] - mu) * (v[p][i] - mu);
      }
    }
    row_sum<1>(acc, red);
  }
  // IEEE sqrt and division (not rsqrtf) so the statistic matches the CPU reference's formula.
  const float rstd = 1.0f / sqrtf(acc[0] / static_cast<float>(cols) + eps);
  if (!row_ok) return;  // after the last block-wide synchronisation
  if (threadIdx.x == 0) {
    rstd_out[row] = rstd;
    if constexpr (kLayer) mean_out[row] = mu;
  }
  T* yr = y + row * cols;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int idx = p * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
    if (idx >= npacks) continue;
    float w[kVec], b[kVec], out[kVec];
    load_vec<kVec>(weight + idx * kVec, w);
    if (kLayer && bias != nullptr) load_vec<kVec>(bias + idx * kVec, b);
    else zero(b);
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = (v[p][i] - mu) * rstd * w[i] + b[i];
    store_vec<kVec>(yr + idx * kVec, out);
  }
}

/// Row groups (blockDim.y rows each) are visited in a grid-stride loop; every thread keeps the
/// dweight/dbias sums of its columns in registers across its rows, then the block writes one
/// partial row: partial_dw[blockIdx.x, :] (and partial_db when not null). With dresidual
/// (rms_norm_backward_add) the residual gradient is added to dx in fp32 before the rounding; dx
/// may alias dresidual (each element is read before it is written, by the same thread).
template <typename T, int kVec, int kPacks, bool kLayer>
__global__ void __launch_bounds__(kMaxRowBlockThreads)
norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                     const T* __restrict__ weight, const float* __restrict__ mean,
                     const float* __restrict__ rstd, T* dx,
                     float* __restrict__ partial_dw, float* __restrict__ partial_db, int64_t rows,
                     int cols, const T* dresidual = nullptr) {
  extern __shared__ float combine[];  // [quantities][blockDim.y][cols], only when blockDim.y > 1
  __shared__ float red[2 * kMaxRowBlockWarps];
  constexpr int kSums = kLayer ? 2 : 1;
  const int npacks = cols / kVec;
  const int tx = static_cast<int>(threadIdx.x);
  const int tpr = static_cast<int>(blockDim.x);
  const int rpb = static_cast<int>(blockDim.y);
  const float inv_cols = 1.0f / static_cast<float>(cols);

  float w[kPacks][kVec], dw[kPacks][kVec], db[kPacks][kVec];
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int idx = p * tpr + tx;
    if (idx < npacks) load_vec<kVec>(weight + idx * kVec, w[p]);
    else zero(w[p]);
    zero(dw[p]);
    zero(db[p]);
  }

  const int64_t groups = (rows + rpb - 1) / rpb;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {  // uniform over the block
    const int64_t row = g * rpb + threadIdx.y;
    const bool row_ok = row < rows;
    const int64_t base = (row_ok ? row : 0) * cols;
    const float r = row_ok ? rstd[row] : 0.0f;
    float mu = 0.0f;
    if constexpr (kLayer) mu = row_ok ? mean[row] : 0.0f;

    float xhat[kPacks][kVec], dyv[kPacks][kVec];
    float sums[kSums];  // [0] = sum(g * xhat), [1] = sum(g), with g = dy * weight
#pragma unroll
    for (int s = 0; s < kSums; ++s) sums[s] = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int idx = p * tpr + tx;
      if (row_ok && idx < npacks) {
        load_vec<kVec>(x + base + idx * kVec, xhat[p]);
        load_vec<kVec>(dy + base + idx * kVec, dyv[p]);
      } else {
        zero(xhat[p]);
        zero(dyv[p]);
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        xhat[p][i] = (xhat[p][i] - mu) * r;  // 0 for padding: x = mu = r = 0
        const float gi = dyv[p][i] * w[p][i];
        sums[0] += gi * xhat[p][i];
        if constexpr (kLayer) sums[kSums - 1] += gi;
        dw[p][i] += dyv[p][i] * xhat[p][i];
        db[p][i] += dyv[p][i];
      }
    }
    row_sum<kSums>(sums, red);
    const float mean_gx = sums[0] * inv_cols;
    const float mean_g = kLayer ? sums[kSums - 1] * inv_cols : 0.0f;
    if (row_ok) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int idx = p * tpr + tx;
        if (idx >= npacks) continue;
        float out[kVec], add[kVec];
        if (dresidual != nullptr) load_vec<kVec>(dresidual + base + idx * kVec, add);
        else zero(add);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          out[i] = r * (dyv[p][i] * w[p][i] - mean_g - xhat[p][i] * mean_gx) + add[i];
        store_vec<kVec>(dx + base + idx * kVec, out);
      }
    }
  }

  float* pdw = partial_dw + static_cast<int64_t>(blockIdx.x) * cols;
  float* pdb = partial_db ? partial_db + static_cast<int64_t>(blockIdx.x) * cols : nullptr;
  if (rpb == 1) {
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int idx = p * tpr + tx;
      if (idx >= npacks) continue;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        pdw[idx * kVec + i] = dw[p][i];
        if (pdb) pdb[idx * kVec + i] = db[p][i];
      }
    }
    return;
  }
  // Several rows per block: add the row slots in increasing threadIdx.y (a fixed order).
  float* cdw = combine;
  float* cdb = combine + rpb * cols;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const int idx = p * tpr + tx;
    if (idx >= npacks) continue;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      cdw[threadIdx.y * cols + idx * kVec + i] = dw[p][i];
      if (pdb) cdb[threadIdx.y * cols + idx * kVec + i] = db[p][i];
    }
  }
  __syncthreads();
  for (int c = static_cast<int>(threadIdx.y) * tpr + tx; c < cols; c += tpr * rpb) {
    float sw = 0.0f, sb = 0.0f;
    for (int s = 0; s < rpb; ++s) {
      sw += cdw[s * cols + c];
      if (pdb) sb += cdb[s * cols + c];
    }
    pdw[c] = sw;
    if (pdb) pdb[c] = sb;
  }
}

// ---- launchers ----------------------------------------------------------------------------

template <typename T, bool kLayer>
void launch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y,
                         Tensor* mean, Tensor& rstd, float eps, const char* op,
                         cudaStream_t stream, const Tensor* residual = nullptr,
                         Tensor* sum = nullptr) {
  const int64_t rows = x.rows(), cols = x.cols();
  if (rows == 0) return;
  const bool aligned = is_aligned(x.data_ptr(), 16) && is_aligned(y.data_ptr(), 16) &&
                       is_aligned(weight.data_ptr(), 16) &&
                       (bias == nullptr || is_aligned(bias->data_ptr(), 16)) &&
                       (residual == nullptr || (is_aligned(residual->data_ptr(), 16) &&
                                                is_aligned(sum->data_ptr(), 16)));
  const RowConfig cfg = make_row_config<T>(cols, aligned, op);
  const dim3 block(cfg.tpr, cfg.rpb);
  const unsigned grid = static_cast<unsigned>(ceil_div(rows, cfg.rpb));
  with_row_shape<T>(cfg, [&](auto vec, auto packs) {
    norm_forward_kernel<T, decltype(vec)::value, decltype(packs)::value, kLayer>
        <<<grid, block, 0, stream>>>(
            static_cast<const T*>(x.data_ptr()), static_cast<const T*>(weight.data_ptr()),
            bias ? static_cast<const T*>(bias->data_ptr()) : nullptr, static_cast<T*>(y.data_ptr()),
            mean ? mean->data<float>() : nullptr, rstd.data<float>(), rows, static_cast<int>(cols),
            eps, residual ? static_cast<const T*>(residual->data_ptr()) : nullptr,
            sum ? static_cast<T*>(sum->data_ptr()) : nullptr);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

template <typename T, bool kLayer>
void launch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor* mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor* dbias, const char* op, const Stream& stream,
                          const Tensor* dresidual = nullptr) {
  const int64_t rows = x.rows(), cols = x.cols();
  if (rows == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const bool aligned = is_aligned(x.data_ptr(), 16) && is_aligned(dy.data_ptr(), 16) &&
                       is_aligned(dx.data_ptr(), 16) && is_aligned(weight.data_ptr(), 16) &&
                       (dresidual == nullptr || is_aligned(dresidual->data_ptr(), 16));
  const RowConfig cfg = make_row_config<T>(cols, aligned, op);
  const int64_t groups = ceil_div(rows, cfg.rpb);
  const int64_t blocks = std::min(groups, kBackwardMaxBlocks);
  const int quantities = dbias ? 2 : 1;
  // Fresh fp32 scratch from the stream-ordered pool; freed (stream-ordered) when it goes out of
  // scope after the second stage has been queued.
  Tensor partial = Tensor::empty({quantities, blocks, cols}, DType::F32, stream);
  float* partial_dw = partial.data<float>();
  float* partial_db = dbias ? partial_dw + blocks * cols : nullptr;
  const size_t smem = cfg.rpb > 1 ? sizeof(float) * quantities * cfg.rpb * cols : 0;
  const dim3 block(cfg.tpr, cfg.rpb);
  with_row_shape<T>(cfg, [&](auto vec, auto packs) {
    norm_backward_kernel<T, decltype(vec)::value, decltype(packs)::value, kLayer>
        <<<static_cast<unsigned>(blocks), block, smem, s>>>(
            static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
            static_cast<const T*>(weight.data_ptr()), mean ? mean->data<float>() : nullptr,
            rstd.data<float>(), static_cast<T*>(dx.data_ptr()), partial_dw, partial_db, rows,
            static_cast<int>(cols),
            dresidual ? static_cast<const T*>(dresidual->data_ptr()) : nullptr);
  });
  MDLM_CUDA_CHECK_LAUNCH();
  launch_add_partial_rows(partial_dw, blocks, cols, dweight.data<float>(), s);
  if (dbias) launch_add_partial_rows(partial_db, blocks, cols, dbias->data<float>(), s);
}

void check_f32_stat(const char* op, const Tensor& t, const char* what) {
  MDLM_CHECK(t.dtype() == DType::F32, op, ": ", what, " must be f32, got ", t.str());
}

}  // namespace

// ---- entries ------------------------------------------------------------------------------

void rms_norm_forward(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                      const Stream& stream) {
  NvtxRange range("rms_norm_forward");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(x.dtype(), "rms_norm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_norm_forward<T, false>(x, weight, nullptr, y, nullptr, rstd, eps, "rms_norm_forward", s);
  });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                       Tensor& dx, Tensor& dweight, const Stream& stream) {
  NvtxRange range("rms_norm_backward");
  dispatch_activation_dtype(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_norm_backward<T, false>(dy, x, weight, nullptr, rstd, dx, dweight, nullptr,
                                   "rms_norm_backward", stream);
  });
}

void add_rms_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                          Tensor& sum, Tensor& y, Tensor& rstd, float eps, const Stream& stream) {
  NvtxRange range("add_rms_norm_forward");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(x.dtype(), "add_rms_norm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_norm_forward<T, false>(x, weight, nullptr, y, nullptr, rstd, eps,
                                  "add_rms_norm_forward", s, &residual, &sum);
  });
}

void rms_norm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& weight,
                           const Tensor& rstd, const Tensor& dresidual, Tensor& dx,
                           Tensor& dweight, const Stream& stream) {
  NvtxRange range("rms_norm_backward_add");
  dispatch_activation_dtype(x.dtype(), "rms_norm_backward_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_norm_backward<T, false>(dy, x, weight, nullptr, rstd, dx, dweight, nullptr,
                                   "rms_norm_backward_add", stream, &dresidual);
  });
}

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                        Tensor& mean, Tensor& rstd, float eps, const Stream& stream) {
  NvtxRange range("layer_norm_forward");
  check_f32_stat("layer_norm_forward", mean, "mean");
  if (bias.defined())
    MDLM_CHECK(bias.dtype() == x.dtype(), "layer_norm_forward: bias ", bias.str(),
               " must have x's dtype ", x.str());
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(x.dtype(), "layer_norm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_norm_forward<T, true>(x, weight, bias.defined() ? &bias : nullptr, y, &mean, rstd, eps,
                                 "layer_norm_forward", s);
  });
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                         const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                         Tensor& dbias, const Stream& stream) {
  NvtxRange range("layer_norm_backward");
  check_f32_stat("layer_norm_backward", mean, "mean");
  check_f32_stat("layer_norm_backward", dweight, "dweight");
  if (dbias.defined()) check_f32_stat("layer_norm_backward", dbias, "dbias");
  dispatch_activation_dtype(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_norm_backward<T, true>(dy, x, weight, &mean, rstd, dx, dweight,
                                  dbias.defined() ? &dbias : nullptr, "layer_norm_backward",
                                  stream);
  });
}

}  // namespace megadlm::ops::cuda
