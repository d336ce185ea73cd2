// Cross-entropy over the vocabulary on CUDA, optionally fused with its gradient written in place
// over the logits. Entry -> launch_cross_entropy -> cross_entropy_kernel.
//
// One 1024-thread block per row. Pass 1 reads the row once and keeps an online (max, sum-exp)
// pair per thread in fp32, merged by a fixed-order warp/block tree; loss = log(sum) + max - x_t.
// Pass 2 (forward_backward) reads the row again and overwrites it with
// grad_scale * w_t * softmax; afterwards thread 0 rewrites the target entry as
// grad_scale * w_t * (softmax_t - 1) from the logit it saved before pass 2. 1024-thread blocks
// keep at most ~2 rows per SM in flight, so at V = 50304 (100 KB bf16 rows) the second read is
// served from L2. Rows of any length and alignment: a scalar head up to the first 16-byte
// boundary, 16-byte packs, a scalar tail.
// A target outside [0, V) makes that row's loss NaN and its gradient NaN (the header's "error":
// visible in the loss, never silently ignored). exp is __expf (~2 ulp; arguments are <= 0).
//
// Vocab-parallel shard ops (cross_entropy_shard_*): one block per row of the shard, each a single
// pass over the row (max; sum-exp against the given global max; or the in-place gradient), in
// batches of kUnroll 16-byte packs per thread whose loads are all issued before any is used.
// Blocks are small (256 threads, 512 for rows of more than one batch of 256 threads: a TP-2 shard
// of 50304 is 3144 bf16 packs). At <= 58 registers (ptxas) 1024-1280 threads stay resident per
// SM: several rows in flight, so one row's block reduction overlaps the others' loads.
// Block reductions are fixed-order (warp butterfly, then thread 0 over the warps): the statistics
// are deterministic. Losses come from one device function in both finish paths, so training and
// evaluation report the same loss. The one-hot column is compared per element (no saved logit,
// no second barrier).
#include <cmath>
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kUnroll = 4;  // packs in flight per thread in the body loops

/// Online softmax statistics: max m and sum of exp(x - m).
struct MaxSum {
  float m;
  float s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return MaxSum{m, a.s + b.s};  // both empty: 0, or NaN carried along
  return MaxSum{m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

template <int N>
__device__ __forceinline__ void accumulate(MaxSum& acc, const float (&v)[N]) {
  float pm = v[0];
#pragma unroll
  for (int k = 1; k < N; ++k) pm = fmaxf(pm, v[k]);
  if (pm > acc.m) {  // also false for NaN, which then reaches s through the exp below
    acc.s *= __expf(acc.m - pm);
    acc.m = pm;
  }
  if (acc.m == -INFINITY) {  // nothing finite yet: nothing to add, but a NaN must reach the loss
    if (pm != pm) acc.s = NAN;
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) acc.s += __expf(v[k] - acc.m);
}

template <typename T, int kVec>
__device__ __forceinline__ void to_floats(const Vec<T, kVec>& raw, float (&v)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = to_float(raw.v[k]);
}

template <typename T, bool kBackward>
__global__ void __launch_bounds__(kThreads)
cross_entropy_kernel(T* logits, const int32_t* __restrict__ targets,
                     const float* __restrict__ weights, float* __restrict__ losses, int64_t vocab,
                     float grad_scale) {
  constexpr int kVec = kVec16<T>;
  using Pack = Vec<T, kVec>;
  __shared__ MaxSum warp_stats[kThreads / kWarpSize];
  __shared__ MaxSum row_stats;
  const int tid = static_cast<int>(threadIdx.x);
  T* x = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const int32_t target = targets[blockIdx.x];
  const bool valid = target >= 0 && target < vocab;
  float x_target = 0.0f;
  if (tid == 0 && valid) x_target = to_float(x[target]);  // before pass 2 overwrites it

  // Split: [0, head) scalar, [head, tail) 16-byte packs, [tail, vocab) scalar.
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16) / sizeof(T);
  const int64_t head = misalign == 0 ? 0 : (kVec - misalign < vocab ? kVec - misalign : vocab);
  const int64_t packs = (vocab - head) / kVec;
  const int64_t tail = head + packs * kVec;
  const Pack* body = reinterpret_cast<const Pack*>(x + head);

  // ---- pass 1: (max, sum-exp) ----
  MaxSum acc{-INFINITY, 0.0f};
  if (tid < head) {
    const float v[1] = {to_float(x[tid])};
    accumulate(acc, v);
  }
  if (tail + tid < vocab) {
    const float v[1] = {to_float(x[tail + tid])};
    accumulate(acc, v);
  }
  int64_t q = tid;
  for (; q + (kUnroll - 1) * kThreads < packs; q += kUnroll * kThreads) {
    Pack raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = body[q + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float v[kVec];
      to_floats(raw[u], v);
      accumulate(acc, v);
    }
  }
  for (; q < packs; q += kThreads) {
    float v[kVec];
    to_floats(body[q], v);
    accumulate(acc, v);
  }

  // Fixed-order tree: xor butterfly in each warp, then warp 0 merges the warps in order.
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)};
    acc = merge(acc, other);
  }
  if (tid % kWarpSize == 0) warp_stats[tid / kWarpSize] = acc;
  __syncthreads();
  if (tid == 0) {
    MaxSum total = warp_stats[0];
    for (int w = 1; w < kThreads / kWarpSize; ++w) total = merge(total, warp_stats[w]);
    row_stats = total;
    losses[blockIdx.x] = valid ? logf(total.s) + total.m - x_target : NAN;
  }
  if constexpr (!kBackward) return;
  __syncthreads();

  // ---- pass 2: logits <- scale * softmax (the target entry is fixed up below) ----
  const float m = row_stats.m;
  const float inv_s = 1.0f / row_stats.s;
  const float scale = valid ? grad_scale * weights[blockIdx.x] : NAN;
  if (tid < head) x[tid] = from_float<T>(scale * __expf(to_float(x[tid]) - m) * inv_s);
  if (tail + tid < vocab)
    x[tail + tid] = from_float<T>(scale * __expf(to_float(x[tail + tid]) - m) * inv_s);
  Pack* out = reinterpret_cast<Pack*>(x + head);
  q = tid;
  for (; q + (kUnroll - 1) * kThreads < packs; q += kUnroll * kThreads) {
    Pack raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = out[q + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      Pack g;
#pragma unroll
      for (int k = 0; k < kVec; ++k) g.v[k] = from_float<T>(scale * __expf(to_float(raw[u].v[k]) - m) * inv_s);
      out[q + u * kThreads] = g;
    }
  }
  for (; q < packs; q += kThreads) {
    const Pack raw = out[q];
    Pack g;
#pragma unroll
    for (int k = 0; k < kVec; ++k) g.v[k] = from_float<T>(scale * __expf(to_float(raw.v[k]) - m) * inv_s);
    out[q] = g;
  }
  __syncthreads();  // the owner of the target entry has written it; thread 0 overwrites it last
  if (tid == 0 && valid) x[target] = from_float<T>(scale * (__expf(x_target - m) * inv_s - 1.0f));
}

template <bool kBackward>
void launch_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor* weights,
                          Tensor& losses, float grad_scale, const char* op, const Stream& stream) {
  const int64_t rows = logits.rows(), vocab = logits.cols();
  if (rows == 0) return;
  MDLM_CHECK(vocab >= 1 && vocab <= INT32_MAX, op, ": vocabulary size ", vocab, " out of range");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_kernel<T, kBackward><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
        static_cast<T*>(logits.data_ptr()), targets.data<int32_t>(),
        weights ? weights->data<float>() : nullptr, losses.data<float>(), vocab, grad_scale);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

// ---- vocab-parallel shard ops ------------------------------------------------------------

/// A row split as [0, head) scalar, [head, tail) 16-byte packs, [tail, cols) scalar; head and
/// cols - tail are both < kVec16<T> (rows of odd length start at any alignment). 32-bit: the
/// entries check cols <= INT32_MAX / 2, and 64-bit indices would cost registers in the batch loops.
struct RowSplit {
  int head;
  int packs;
  int tail;
};

template <typename T>
__device__ __forceinline__ RowSplit split_row(const T* x, int cols) {
  constexpr int kVec = kVec16<T>;
  const int misalign = static_cast<int>(reinterpret_cast<uintptr_t>(x) % 16 / sizeof(T));
  RowSplit r;
  r.head = misalign == 0 ? 0 : (kVec - misalign < cols ? kVec - misalign : cols);
  r.packs = (cols - r.head) / kVec;
  r.tail = r.head + r.packs * kVec;
  return r;
}

/// Calls f(v) for every element of the row, v a float[1] (head, tail) or float[kVec] (a pack),
/// each element exactly once over the block. The per-thread order is fixed.
template <int kBlock, typename T, typename F>
__device__ __forceinline__ void read_row(const T* __restrict__ x, int cols, F&& f) {
  constexpr int kVec = kVec16<T>;
  using Pack = Vec<T, kVec>;
  const int tid = static_cast<int>(threadIdx.x);
  const RowSplit r = split_row(x, cols);
  if (tid < r.head) {
    const float v[1] = {to_float(x[tid])};
    f(v);
  }
  if (r.tail + tid < cols) {
    const float v[1] = {to_float(x[r.tail + tid])};
    f(v);
  }
  const Pack* body = reinterpret_cast<const Pack*>(x + r.head);
  // Not unrolled further: one batch per thread with several blocks per SM is enough bytes in
  // flight, and more registers would cost resident blocks.
#pragma unroll 1
  for (int q = tid; q < r.packs; q += kUnroll * kBlock) {
    Pack raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (q + u * kBlock < r.packs) raw[u] = body[q + u * kBlock];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (q + u * kBlock < r.packs) {
        float v[kVec];
        to_floats(raw[u], v);
        f(v);
      }
    }
  }
}

/// Max over a block of kBlock; valid in thread 0. fmaxf drops NaN (see the header).
/// `smem` holds kBlock / 32 floats. Every thread must call it.
template <int kBlock>
__device__ __forceinline__ float block_max(float v, float* smem) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int tid = static_cast<int>(threadIdx.x);
  if (tid % kWarpSize == 0) smem[tid / kWarpSize] = v;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < kBlock / kWarpSize; ++w) v = fmaxf(v, smem[w]);
  }
  return v;
}

/// The loss of one row from its all-reduced statistics (shared by both finish kernels).
__device__ __forceinline__ float shard_loss(float row_max, float sum_exp, float target_logit) {
  return logf(sum_exp) + row_max - target_logit;
}

template <typename T, int kBlock>
__global__ void __launch_bounds__(kBlock)
shard_max_kernel(const T* __restrict__ logits, float* __restrict__ row_max, int cols) {
  __shared__ float smem[kBlock / kWarpSize];
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * cols;
  float m = -INFINITY;
  read_row<kBlock>(x, cols, [&](const auto& v) {
    for (float e : v) m = fmaxf(m, e);
  });
  m = block_max<kBlock>(m, smem);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <typename T, int kBlock>
__global__ void __launch_bounds__(kBlock)
shard_stats_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                   int64_t vocab_start, const float* __restrict__ row_max,
                   float* __restrict__ sum_exp, float* __restrict__ target_logit, int cols) {
  __shared__ float smem[kWarpSize];
  const T* x = logits + static_cast<int64_t>(blockIdx.x) * cols;
  const float m = row_max[blockIdx.x];  // the global max: every argument of exp is <= 0
  float s = 0.0f;
  read_row<kBlock>(x, cols, [&](const auto& v) {
    for (float e : v) s += __expf(e - m);
  });
  s = block_sum(s, smem);  // fixed order
  if (threadIdx.x == 0) {
    sum_exp[blockIdx.x] = s;
    const int64_t j = static_cast<int64_t>(targets[blockIdx.x]) - vocab_start;
    target_logit[blockIdx.x] = j >= 0 && j < cols ? to_float(x[j]) : 0.0f;
  }
}

/// Evaluation (grad_scale == 0): losses only, logits untouched.
__global__ void __launch_bounds__(256)
shard_losses_kernel(const float* __restrict__ row_max, const float* __restrict__ sum_exp,
                    const float* __restrict__ target_logit, float* __restrict__ losses,
                    int64_t rows) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < rows) losses[t] = shard_loss(row_max[t], sum_exp[t], target_logit[t]);
}

/// Loss, and the row overwritten with scale * (exp(x - m) / s - onehot). The one-hot column is
/// compared per element (no saved logit and no second barrier, unlike the fused kernel above).
template <typename T, int kBlock>
__global__ void __launch_bounds__(kBlock)
shard_grad_kernel(T* __restrict__ logits, const int32_t* __restrict__ targets, int64_t vocab_start,
                  const float* __restrict__ row_max, const float* __restrict__ sum_exp,
                  const float* __restrict__ target_logit, const float* __restrict__ weights,
                  float* __restrict__ losses, int cols, float grad_scale) {
  constexpr int kVec = kVec16<T>;
  using Pack = Vec<T, kVec>;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t row = blockIdx.x;
  const float m = row_max[row];
  const float s = sum_exp[row];
  if (tid == 0) losses[row] = shard_loss(m, s, target_logit[row]);
  const float inv_s = 1.0f / s;
  const float scale = grad_scale * weights[row];
  // -1 when another shard (or no shard) owns the target: then it matches no column.
  const int64_t j = static_cast<int64_t>(targets[row]) - vocab_start;
  const int target = j >= 0 && j < cols ? static_cast<int>(j) : -1;
  T* x = logits + row * cols;
  const RowSplit r = split_row(x, cols);
  auto grad = [&](float v, bool is_target) {
    return from_float<T>(scale * (__expf(v - m) * inv_s - (is_target ? 1.0f : 0.0f)));
  };
  if (tid < r.head) x[tid] = grad(to_float(x[tid]), tid == target);
  const int c = r.tail + tid;
  if (c < cols) x[c] = grad(to_float(x[c]), c == target);
  Pack* body = reinterpret_cast<Pack*>(x + r.head);
  const int body_target = target - r.head;  // element index within the body; < 0 if none
#pragma unroll 1
  for (int q = tid; q < r.packs; q += kUnroll * kBlock) {
    Pack raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (q + u * kBlock < r.packs) raw[u] = body[q + u * kBlock];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int p = q + u * kBlock;
      if (p < r.packs) {
        const int k_target = body_target - p * kVec;  // in [0, kVec) in the target's pack only
        Pack g;
#pragma unroll
        for (int k = 0; k < kVec; ++k) g.v[k] = grad(to_float(raw[u].v[k]), k == k_target);
        body[p] = g;
      }
    }
  }
}

/// Threads per block: 256 when one batch of kUnroll packs per thread covers the row, else 512.
template <typename T>
int shard_threads(int64_t cols) {
  return cols <= 256 * kUnroll * static_cast<int64_t>(kVec16<T>) ? 256 : 512;
}

/// Calls f(TypeTag<T>{}, std::integral_constant<int, threads>{}) for logits' dtype and the
/// block size of its rows.
template <typename F>
void dispatch_shard(const Tensor& logits, const char* op, F&& f) {
  // 32-bit column indices in the kernels, with room for a block of offsets past the end.
  MDLM_CHECK(logits.cols() <= INT32_MAX / 2, op, ": shard of ", logits.cols(),
             " columns is too wide");
  dispatch_activation_dtype(logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (shard_threads<T>(logits.cols()) == 256) f(tag, std::integral_constant<int, 256>{});
    else f(tag, std::integral_constant<int, 512>{});
  });
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                           const Stream& stream) {
  NvtxRange range("cross_entropy_forward");
  launch_cross_entropy<false>(logits, targets, nullptr, losses, 0.0f, "cross_entropy_forward",
                              stream);
}

void cross_entropy_forward_backward(Tensor& logits, const Tensor& targets, const Tensor& weights,
                                    Tensor& losses, float grad_scale, const Stream& stream) {
  NvtxRange range("cross_entropy_forward_backward");
  launch_cross_entropy<true>(logits, targets, &weights, losses, grad_scale,
                             "cross_entropy_forward_backward", stream);
}

void cross_entropy_shard_max(const Tensor& logits, Tensor& row_max, const Stream& stream) {
  NvtxRange range("cross_entropy_shard_max");
  const int64_t rows = logits.rows(), cols = logits.cols();
  if (rows == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_shard(logits, "cross_entropy_shard_max", [&](auto tag, auto threads) {
    using T = typename decltype(tag)::type;
    constexpr int kT = decltype(threads)::value;
    shard_max_kernel<T, kT><<<static_cast<unsigned>(rows), kT, 0, s>>>(
        static_cast<const T*>(logits.data_ptr()), row_max.data<float>(), static_cast<int>(cols));
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

void cross_entropy_shard_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit,
                               const Stream& stream) {
  NvtxRange range("cross_entropy_shard_stats");
  const int64_t rows = logits.rows(), cols = logits.cols();
  if (rows == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_shard(logits, "cross_entropy_shard_stats", [&](auto tag, auto threads) {
    using T = typename decltype(tag)::type;
    constexpr int kT = decltype(threads)::value;
    shard_stats_kernel<T, kT><<<static_cast<unsigned>(rows), kT, 0, s>>>(
        static_cast<const T*>(logits.data_ptr()), targets.data<int32_t>(), vocab_start,
        row_max.data<float>(), sum_exp.data<float>(), target_logit.data<float>(),
        static_cast<int>(cols));
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

void cross_entropy_shard_finish(Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, const Tensor& weights, Tensor& losses,
                                float grad_scale, const Stream& stream) {
  NvtxRange range("cross_entropy_shard_finish");
  const int64_t rows = logits.rows(), cols = logits.cols();
  if (rows == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  if (!(grad_scale > 0.0f)) {  // evaluation: T losses, the logits are not touched
    shard_losses_kernel<<<static_cast<unsigned>(ceil_div(rows, 256)), 256, 0, s>>>(
        row_max.data<float>(), sum_exp.data<float>(), target_logit.data<float>(),
        losses.data<float>(), rows);
    MDLM_CUDA_CHECK_LAUNCH();
    return;
  }
  dispatch_shard(logits, "cross_entropy_shard_finish", [&](auto tag, auto threads) {
    using T = typename decltype(tag)::type;
    constexpr int kT = decltype(threads)::value;
    shard_grad_kernel<T, kT><<<static_cast<unsigned>(rows), kT, 0, s>>>(
        static_cast<T*>(logits.data_ptr()), targets.data<int32_t>(), vocab_start,
        row_max.data<float>(), sum_exp.data<float>(), target_logit.data<float>(),
        weights.data<float>(), losses.data<float>(), static_cast<int>(cols), grad_scale);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace megadlm::ops::cuda
