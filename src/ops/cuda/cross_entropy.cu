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

}  // namespace megadlm::ops::cuda
