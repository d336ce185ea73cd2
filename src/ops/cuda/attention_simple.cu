// The simple CUDA attention path: one warp per query row (forward; dq) or per key row (dk, dv),
// fp32 arithmetic on CUDA cores, head_dim up to 256, same contract as the flash kernels. Used for
// head dims the flash kernels do not cover and as a second opinion in the GPU parity test; it
// favours being obviously right over speed (each q.k dot product is a warp reduction).
// Dropout (kDropout): lane l draws the keep bit of the l-th next key (or query) from the shared
// mapping (ops/attention_dropout_mask.h) and one ballot hands 32 bits to the whole warp.
#include <cmath>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/attention_common.cuh"

namespace megadlm::ops::cuda::attn {
namespace {

constexpr int kMaxPerLane = 8;  // a lane holds dims lane, lane + 32, ...: D <= 256
constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

/// Lane's elements of a D-long bf16 row (zeros past D).
__device__ __forceinline__ void load_row(float (&r)[kMaxPerLane], const bf16* row, int dim,
                                         int lane) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    r[i] = d < dim ? __bfloat162float(row[d]) : 0.0f;
  }
}

__device__ __forceinline__ float warp_dot(const float (&a)[kMaxPerLane], const bf16* row, int dim,
                                          int lane) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < dim) s += a[i] * __bfloat162float(row[d]);
  }
  return warp_sum(s);
}

__device__ __forceinline__ void store_row(bf16* row, const float (&r)[kMaxPerLane], float scale,
                                          int dim, int lane) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < dim) row[d] = __float2bfloat16_rn(r[i] * scale);
  }
}

// Per-document attention: documents are contiguous runs of equal ids along a row, so the keys a
// query may see (and the queries a key serves) are one range [lo, hi), found by binary search.
__device__ __forceinline__ int64_t doc_lo(const int32_t* row, int64_t i) {
  int64_t lo = 0, hi = i;  // first position in [0, i] holding row[i]'s id
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (row[mid] < row[i]) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

__device__ __forceinline__ int64_t doc_hi(const int32_t* row, int64_t i, int64_t seq) {
  int64_t lo = i + 1, hi = seq;  // one past the last position holding row[i]'s id
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (row[mid] <= row[i]) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Row index r = (b * Hq + h) * S + i (the lse order); single-pass online softmax. With dropout
// the row sum stays undropped (lse unchanged) and only the P V terms are masked.
template <bool kDropout>
__global__ void attention_forward_warp_per_row_kernel(ForwardPtrs p, Shape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  if (row >= s.batch * s.heads * s.seq) return;
  const int64_t i = row % s.seq, h = (row / s.seq) % s.heads, b = row / (s.seq * s.heads);
  const int64_t kh = h / (s.heads / s.kv_heads);
  float q[kMaxPerLane], acc[kMaxPerLane];
  load_row(q, p.q + ((b * s.seq + i) * s.heads + h) * s.dim, s.dim, lane);
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) acc[r] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int32_t* docs = s.docs ? s.docs + b * s.seq : nullptr;
  const int64_t first = docs ? doc_lo(docs, i) : 0;
  const int64_t n = s.causal ? i + 1 : (docs ? doc_hi(docs, i, s.seq) : s.seq);
  [[maybe_unused]] uint32_t keep_bits = 0;
  for (int64_t j = first; j < n; ++j) {
    if constexpr (kDropout) {
      if (((j - first) & 31) == 0)
        keep_bits = __ballot_sync(0xffffffffu, s.dropout.keep(b, h, i, j + lane));
    }
    const int64_t kv = ((b * s.seq + j) * s.kv_heads + kh) * s.dim;
    const float x = s.scale * warp_dot(q, p.k + kv, s.dim, lane);
    const float m_new = fmaxf(m, x);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float pj = expf(x - m_new);
    l = l * corr + pj;
    float pv = pj;
    if constexpr (kDropout) pv = (keep_bits >> ((j - first) & 31)) & 1u ? pj : 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxPerLane; ++r) {
      const int d = lane + 32 * r;
      const float vd = d < s.dim ? __bfloat162float(p.v[kv + d]) : 0.0f;
      acc[r] = acc[r] * corr + pv * vd;
    }
    m = m_new;
  }
  store_row(p.out + ((b * s.seq + i) * s.heads + h) * s.dim, acc,
            kDropout ? s.dropout.scale / l : 1.0f / l, s.dim, lane);
  if (lane == 0) p.lse[row] = m + logf(l);
}

// dq of one query row (same row order as the forward), delta already computed.
template <bool kDropout>
__global__ void attention_dq_warp_per_row_kernel(BackwardPtrs p, Shape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  if (row >= s.batch * s.heads * s.seq) return;
  const int64_t i = row % s.seq, h = (row / s.seq) % s.heads, b = row / (s.seq * s.heads);
  const int64_t kh = h / (s.heads / s.kv_heads);
  const int64_t qi = ((b * s.seq + i) * s.heads + h) * s.dim;
  float q[kMaxPerLane], dout[kMaxPerLane], dq[kMaxPerLane];
  load_row(q, p.q + qi, s.dim, lane);
  load_row(dout, p.dout + qi, s.dim, lane);
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) dq[r] = 0.0f;
  const float lse = p.lse[row], delta = p.delta[row];
  const int32_t* docs = s.docs ? s.docs + b * s.seq : nullptr;
  const int64_t first = docs ? doc_lo(docs, i) : 0;
  const int64_t n = s.causal ? i + 1 : (docs ? doc_hi(docs, i, s.seq) : s.seq);
  [[maybe_unused]] uint32_t keep_bits = 0;
  for (int64_t j = first; j < n; ++j) {
    if constexpr (kDropout) {
      if (((j - first) & 31) == 0)
        keep_bits = __ballot_sync(0xffffffffu, s.dropout.keep(b, h, i, j + lane));
    }
    const int64_t kv = ((b * s.seq + j) * s.kv_heads + kh) * s.dim;
    const float pij = expf(s.scale * warp_dot(q, p.k + kv, s.dim, lane) - lse);
    float dp = warp_dot(dout, p.v + kv, s.dim, lane);
    if constexpr (kDropout) dp = (keep_bits >> ((j - first) & 31)) & 1u ? dp * s.dropout.scale : 0.0f;
    const float ds = pij * (dp - delta);
#pragma unroll
    for (int r = 0; r < kMaxPerLane; ++r) {
      const int d = lane + 32 * r;
      if (d < s.dim) dq[r] += ds * __bfloat162float(p.k[kv + d]);
    }
  }
  store_row(p.dq + qi, dq, s.scale, s.dim, lane);
}

// dk, dv of one key row r = (b * Hkv + kh) * S + j, summed over the query heads of the group.
template <bool kDropout>
__global__ void attention_dkdv_warp_per_row_kernel(BackwardPtrs p, Shape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  if (row >= s.batch * s.kv_heads * s.seq) return;
  const int64_t j = row % s.seq, kh = (row / s.seq) % s.kv_heads, b = row / (s.seq * s.kv_heads);
  const int64_t group = s.heads / s.kv_heads;
  const int64_t kv = ((b * s.seq + j) * s.kv_heads + kh) * s.dim;
  float k[kMaxPerLane], v[kMaxPerLane], dk[kMaxPerLane], dv[kMaxPerLane];
  load_row(k, p.k + kv, s.dim, lane);
  load_row(v, p.v + kv, s.dim, lane);
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) dk[r] = dv[r] = 0.0f;
  [[maybe_unused]] uint32_t keep_bits = 0;
  const int32_t* docs = s.docs ? s.docs + b * s.seq : nullptr;
  const int64_t q_first = s.causal ? j : (docs ? doc_lo(docs, j) : 0);
  const int64_t q_end = docs ? doc_hi(docs, j, s.seq) : s.seq;
  for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
    for (int64_t i = q_first; i < q_end; ++i) {
      [[maybe_unused]] const int64_t i_step = i - q_first;
      if constexpr (kDropout) {
        // Here the lanes draw the next 32 queries of this key.
        if ((i_step & 31) == 0)
          keep_bits = __ballot_sync(0xffffffffu, s.dropout.keep(b, h, i + lane, j));
      }
      const int64_t qi = ((b * s.seq + i) * s.heads + h) * s.dim;
      const int64_t stat = (b * s.heads + h) * s.seq + i;
      const float pij = expf(s.scale * warp_dot(k, p.q + qi, s.dim, lane) - p.lse[stat]);
      float dp = warp_dot(v, p.dout + qi, s.dim, lane);
      float pz = pij;  // P * Z; the 1/(1-p) of dv is applied once at the store
      if constexpr (kDropout) {
        const bool kept = (keep_bits >> (i_step & 31)) & 1u;
        dp = kept ? dp * s.dropout.scale : 0.0f;
        pz = kept ? pij : 0.0f;
      }
      const float ds = pij * (dp - p.delta[stat]);
#pragma unroll
      for (int r = 0; r < kMaxPerLane; ++r) {
        const int d = lane + 32 * r;
        if (d < s.dim) {
          dv[r] += pz * __bfloat162float(p.dout[qi + d]);
          dk[r] += ds * __bfloat162float(p.q[qi + d]);
        }
      }
    }
  }
  store_row(p.dk + kv, dk, s.scale, s.dim, lane);
  store_row(p.dv + kv, dv, kDropout ? s.dropout.scale : 1.0f, s.dim, lane);
}

template <bool kDropout>
void launch_simple_forward(const Shape& s, const ForwardPtrs& p, cudaStream_t stream) {
  const int64_t rows = s.batch * s.heads * s.seq;
  attention_forward_warp_per_row_kernel<kDropout><<<megadlm::detail::grid_for(rows, kWarpsPerBlock),
                                                    kWarpsPerBlock * 32, 0, stream>>>(p, s);
  MDLM_CUDA_CHECK_LAUNCH();
}

template <bool kDropout>
void launch_simple_backward(const Shape& s, const BackwardPtrs& p, cudaStream_t stream) {
  const int64_t q_rows = s.batch * s.heads * s.seq;
  attention_dq_warp_per_row_kernel<kDropout><<<megadlm::detail::grid_for(q_rows, kWarpsPerBlock),
                                               kWarpsPerBlock * 32, 0, stream>>>(p, s);
  MDLM_CUDA_CHECK_LAUNCH();
  const int64_t kv_rows = s.batch * s.kv_heads * s.seq;
  attention_dkdv_warp_per_row_kernel<kDropout><<<megadlm::detail::grid_for(kv_rows, kWarpsPerBlock),
                                                 kWarpsPerBlock * 32, 0, stream>>>(p, s);
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void simple_forward(const Shape& s, const ForwardPtrs& p, cudaStream_t stream) {
  if (s.dropout.p > 0.0f) launch_simple_forward<true>(s, p, stream);
  else launch_simple_forward<false>(s, p, stream);
}

void simple_backward(const Shape& s, const BackwardPtrs& p, cudaStream_t stream) {
  launch_attention_delta(s, p, stream);
  if (s.dropout.p > 0.0f) launch_simple_backward<true>(s, p, stream);
  else launch_simple_backward<false>(s, p, stream);
}

}  // namespace megadlm::ops::cuda::attn
