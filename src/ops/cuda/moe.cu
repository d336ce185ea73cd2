// The moe family on CUDA (include/megadlm/ops/moe.h). Entry -> launch -> *_kernel.
//
//   router kernels (top-k forward/backward, stats, loss backward): one warp per row of logits,
//     the row staged in shared memory; f32 throughout; selection ties to the lower expert
//     (the warp argmax compares (value, -index)).
//   dispatch plan: slots in chunks of kPlanChunk; per-chunk expert counts, one block scans them
//     (expert offsets, chunk offsets), then each chunk ranks its slots among the earlier slots of
//     the same expert: expert-major, tokens ascending, no host loop.
//   permute: a gather, one warp per output row, through the inverse of dest (see the section);
//   unpermute / unpermute backward: one block per token row, 16-byte vectors over the hidden
//     size, a chunk of slots' rows loaded together, fp32 accumulation in slot order
//     (deterministic).
// (The grouped GEMM is host code next to the plain GEMM, in gemm.cpp.)
// Statistics (moe_router_stats, moe_count_tokens) add with float atomics: counts are exact
// integers; score sums and logsumexp² only feed logged values.
// Expert choice, capacity dropping, the expert-choice aux loss and Sinkhorn selection run the
// CPU reference on a host copy (small [T, E] tensors; not on the dropless top-k path).
#include <cfloat>
#include <climits>
#include <type_traits>
#include "core/cuda/cuda_utils.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kRowWarps = 8;  // rows per block of the router kernels
constexpr int kRowThreads = kRowWarps * kWarpSize;
constexpr float kSigmoidEps = 1e-20f;
constexpr int kPlanChunk = 256;  // slots per chunk of the dispatch plan
constexpr int kTokenThreads = 256;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Warp argmax: the largest value, ties to the lower index (every lane gets the winner).
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
}

/// Log-sum-exp of a row of n values (every lane gets it).
__device__ __forceinline__ float row_lse(const float* l, int n, int lane) {
  float m = -INFINITY;
  for (int e = lane; e < n; e += kWarpSize) m = fmaxf(m, l[e]);
  m = warp_max(m);
  float z = 0.0f;
  for (int e = lane; e < n; e += kWarpSize) z += expf(l[e] - m);
  z = warp_sum(z);
  return m + logf(z);
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(rows, kRowWarps), 65535)));
}

// ---- top-k forward ------------------------------------------------------------------------

/// Per warp in shared memory: sel[E] selection keys, score[E], group scores[G], chosen[k].
__global__ void __launch_bounds__(kRowThreads)
router_topk_forward_kernel(const float* __restrict__ logits, const float* __restrict__ bias,
                           float* __restrict__ probs, int32_t* __restrict__ indices, int64_t rows,
                           int experts, RouterTopkArgs a) {
  extern __shared__ float smem[];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int groups = a.num_groups;
  const int per_warp = 2 * experts + groups + a.topk;
  float* sel = smem + warp * per_warp;
  float* score = sel + experts;
  float* gscore = score + experts;
  int* chosen = reinterpret_cast<int*>(gscore + groups);
  const bool softmax = a.score == RouterScore::Softmax;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    const float* l = logits + row * experts;
    const float lse = softmax ? row_lse(l, experts, lane) : 0.0f;
    for (int e = lane; e < experts; e += kWarpSize) {
      const float s = softmax ? expf(l[e] - lse) : sigmoid(l[e]);
      score[e] = s;
      const float key = softmax && !a.pre_softmax ? l[e] : s;
      sel[e] = key + (bias ? bias[e] : 0.0f);
    }
    __syncwarp();
    if (groups > 0) {
      // Each group's score: its best member (Max) or the sum of its best topk / group_topk.
      const int size = experts / groups;
      const int best = a.group_score == RouterGroupScore::Max ? 1 : max(1, a.topk / a.group_topk);
      for (int g = lane; g < groups; g += kWarpSize) {
        float total = 0.0f, last = INFINITY;
        int last_idx = -1;
        for (int i = 0; i < best; ++i) {  // the i-th best member, by repeated selection
          float v = -INFINITY;
          int vi = size;
          for (int m = 0; m < size; ++m) {
            const float x = sel[g * size + m];
            const bool after = x < last || (x == last && m > last_idx);
            if (after && (x > v || (x == v && m < vi))) {
              v = x;
              vi = m;
            }
          }
          total += v;
          last = v;
          last_idx = vi;
        }
        gscore[g] = total;
      }
      __syncwarp();
      if (lane == 0) {  // keep the best group_topk groups (ties to the lower group)
        for (int i = 0; i < a.group_topk; ++i) {
          int bg = -1;
          float bv = -INFINITY;
          for (int g = 0; g < groups; ++g)
            if (!isnan(gscore[g]) && (bg < 0 || gscore[g] > bv)) {
              bv = gscore[g];
              bg = g;
            }
          if (bg >= 0) gscore[bg] = NAN;  // NaN marks a kept group
        }
      }
      __syncwarp();
      for (int e = lane; e < experts; e += kWarpSize)
        if (!isnan(gscore[e / size])) sel[e] = -INFINITY;
      __syncwarp();
    }
    for (int j = 0; j < a.topk; ++j) {
      float v = -INFINITY;
      int vi = INT_MAX;
      for (int e = lane; e < experts; e += kWarpSize)
        if (sel[e] > v || (sel[e] == v && e < vi)) {
          v = sel[e];
          vi = e;
        }
      warp_argmax(v, vi);
      if (vi == INT_MAX) vi = j;  // unreachable with finite keys
      __syncwarp();
      if (lane == 0) {
        chosen[j] = vi;
        sel[vi] = -INFINITY;
      }
      __syncwarp();
    }
    // Probabilities of the chosen experts (lanes over slots).
    float norm = 0.0f, m = -INFINITY;
    if (softmax && !a.pre_softmax) {
      for (int j = lane; j < a.topk; j += kWarpSize) m = fmaxf(m, l[chosen[j]]);
      m = warp_max(m);
      for (int j = lane; j < a.topk; j += kWarpSize) norm += expf(l[chosen[j]] - m);
      norm = warp_sum(norm);
    } else if (!softmax) {
      for (int j = lane; j < a.topk; j += kWarpSize) norm += score[chosen[j]];
      norm = warp_sum(norm);
    }
    for (int j = lane; j < a.topk; j += kWarpSize) {
      const int e = chosen[j];
      float p;
      if (softmax && a.pre_softmax) p = score[e];
      else if (softmax) p = expf(l[e] - m) / norm;
      else p = a.topk > 1 ? score[e] / (norm + kSigmoidEps) : score[e];
      probs[row * a.topk + j] = p * a.scaling;
      indices[row * a.topk + j] = e;
    }
    __syncwarp();
  }
}

// ---- top-k backward -----------------------------------------------------------------------

__global__ void __launch_bounds__(kRowThreads)
router_topk_backward_kernel(const float* __restrict__ dprobs, const float* __restrict__ logits,
                            const int32_t* __restrict__ indices, float* __restrict__ dlogits,
                            int64_t rows, int experts, int slots, RouterTopkArgs a) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const bool softmax = a.score == RouterScore::Softmax;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    const float* l = logits + row * experts;
    const int32_t* idx = indices + row * slots;
    const float* dp = dprobs + row * slots;
    float* dl = dlogits + row * experts;
    if (softmax && a.pre_softmax) {
      const float lse = row_lse(l, experts, lane);
      float dot = 0.0f;
      for (int j = lane; j < slots; j += kWarpSize)
        if (idx[j] >= 0) dot += dp[j] * expf(l[idx[j]] - lse);
      dot = warp_sum(dot);
      for (int e = lane; e < experts; e += kWarpSize) dl[e] = -a.scaling * expf(l[e] - lse) * dot;
      __syncwarp();
      for (int j = lane; j < slots; j += kWarpSize)
        if (idx[j] >= 0) dl[idx[j]] += a.scaling * expf(l[idx[j]] - lse) * dp[j];
    } else if (softmax) {
      float m = -INFINITY;
      for (int j = lane; j < slots; j += kWarpSize)
        if (idx[j] >= 0) m = fmaxf(m, l[idx[j]]);
      m = warp_max(m);
      float z = 0.0f;
      for (int j = lane; j < slots; j += kWarpSize)
        if (idx[j] >= 0) z += expf(l[idx[j]] - m);
      z = warp_sum(z);
      float dot = 0.0f;
      for (int j = lane; j < slots; j += kWarpSize)
        if (idx[j] >= 0) dot += dp[j] * expf(l[idx[j]] - m) / z;
      dot = warp_sum(dot);
      for (int e = lane; e < experts; e += kWarpSize) dl[e] = 0.0f;
      __syncwarp();
      for (int j = lane; j < slots; j += kWarpSize)
        if (idx[j] >= 0) {
          const float q = expf(l[idx[j]] - m) / z;
          dl[idx[j]] = a.scaling * q * (dp[j] - dot);
        }
    } else {
      float d = 0.0f, dot = 0.0f;
      for (int j = lane; j < slots; j += kWarpSize)
        if (idx[j] >= 0) {
          const float s = sigmoid(l[idx[j]]);
          d += s;
          dot += dp[j] * s;
        }
      d = warp_sum(d) + kSigmoidEps;
      dot = warp_sum(dot);
      for (int e = lane; e < experts; e += kWarpSize) dl[e] = 0.0f;
      __syncwarp();
      for (int j = lane; j < slots; j += kWarpSize)
        if (idx[j] >= 0) {
          const float s = sigmoid(l[idx[j]]);
          const float ds = a.topk > 1 ? a.scaling * (dp[j] / d - dot / (d * d)) : a.scaling * dp[j];
          dl[idx[j]] = ds * s * (1.0f - s);
        }
    }
    __syncwarp();
  }
}

// ---- statistics and the aux / z gradients -------------------------------------------------

__device__ __forceinline__ int64_t group_of(const RowGroups& g, int64_t row) {
  return g.rows_per_group > 0 ? (g.row_offset + row) / g.rows_per_group : 0;
}

__global__ void __launch_bounds__(kRowThreads)
router_stats_kernel(const float* __restrict__ logits, float* __restrict__ score_sums,
                    float* __restrict__ lse_sq, int64_t rows, int experts, RowGroups groups) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  float acc = 0.0f;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    const float* l = logits + row * experts;
    const float lse = row_lse(l, experts, lane);
    acc += lse * lse;
    if (score_sums) {
      float* out = score_sums + group_of(groups, row) * experts;
      for (int e = lane; e < experts; e += kWarpSize) atomicAdd(out + e, expf(l[e] - lse));
    }
  }
  if (lse_sq && lane == 0) atomicAdd(lse_sq, acc);
}

__global__ void count_tokens_kernel(const int32_t* __restrict__ indices, float* __restrict__ counts,
                                    int64_t rows, int slots, int experts, RowGroups groups) {
  const int64_t n = rows * slots;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = indices[i];
    if (e >= 0) atomicAdd(counts + group_of(groups, i / slots) * experts + e, 1.0f);
  }
}

__global__ void __launch_bounds__(kRowThreads)
router_loss_backward_kernel(const float* __restrict__ logits, const float* __restrict__ w,
                            float* __restrict__ dlogits, int64_t rows, int experts, RouterLossArgs a) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    const float* l = logits + row * experts;
    float* dl = dlogits + row * experts;
    const float lse = row_lse(l, experts, lane);
    const float* wr = w ? w + group_of(a.groups, row) * experts : nullptr;
    float ws = 0.0f;
    if (wr) {
      for (int e = lane; e < experts; e += kWarpSize) ws += wr[e] * expf(l[e] - lse);
      ws = warp_sum(ws);
    }
    for (int e = lane; e < experts; e += kWarpSize) {
      const float s = expf(l[e] - lse);
      float g = a.z_coeff * 2.0f * lse * s;
      if (wr) g += a.aux_coeff * s * (wr[e] - ws);
      dl[e] += g;
    }
  }
}

// ---- dispatch plan ------------------------------------------------------------------------

/// chunk_counts[c, e] = slots of chunk c routed to local expert e.
__global__ void plan_count_kernel(const int32_t* __restrict__ indices, int64_t n, int first, int local,
                                  int32_t* __restrict__ chunk_counts) {
  extern __shared__ int32_t counts[];
  for (int e = threadIdx.x; e < local; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kPlanChunk;
  for (int i = threadIdx.x; i < kPlanChunk; i += blockDim.x) {
    if (base + i >= n) break;
    const int32_t e = indices[base + i] - first;
    if (indices[base + i] >= 0 && e >= 0 && e < local) atomicAdd(counts + e, 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < local; e += blockDim.x) chunk_counts[blockIdx.x * local + e] = counts[e];
}

/// One block: chunk_counts -> exclusive offsets (expert offset + earlier chunks); counts[e].
__global__ void plan_scan_kernel(int32_t* __restrict__ chunk_counts, int64_t chunks, int local,
                                 int32_t* __restrict__ counts) {
  extern __shared__ int32_t totals[];
  for (int e = threadIdx.x; e < local; e += blockDim.x) {
    int32_t running = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t v = chunk_counts[c * local + e];
      chunk_counts[c * local + e] = running;
      running += v;
    }
    totals[e] = running;
    counts[e] = running;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t offset = 0;
    for (int e = 0; e < local; ++e) {
      const int32_t t = totals[e];
      totals[e] = offset;
      offset += t;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < local; e += blockDim.x)
    for (int64_t c = 0; c < chunks; ++c) chunk_counts[c * local + e] += totals[e];
}

/// dest of each slot: its chunk's offset for its expert plus its rank among the chunk's
/// earlier slots of the same expert.
__global__ void plan_dest_kernel(const int32_t* __restrict__ indices, int64_t n, int first, int local,
                                 const int32_t* __restrict__ chunk_offsets, int32_t* __restrict__ dest) {
  __shared__ int32_t experts[kPlanChunk];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kPlanChunk;
  const int i = static_cast<int>(threadIdx.x);  // blockDim.x == kPlanChunk
  int32_t e = -1;
  if (base + i < n) {
    const int32_t g = indices[base + i];
    e = g >= 0 && g - first >= 0 && g - first < local ? g - first : -1;
  }
  experts[i] = e;
  __syncthreads();
  if (base + i >= n) return;
  if (e < 0) {
    dest[base + i] = -1;
    return;
  }
  int32_t rank = 0;
  for (int j = 0; j < i; ++j) rank += experts[j] == e ? 1 : 0;
  dest[base + i] = chunk_offsets[blockIdx.x * local + e] + rank;
}

// ---- permute / unpermute ------------------------------------------------------------------
//
// moe_permute is a gather: src[r] = the token whose slot points at output row r (one small
// scatter of i32 from dest), then one warp per output row copies x[src[r]]. The scatter form
// it replaces (one block per token, each thread loading 16 bytes once and storing them to the
// token's k rows, a dest load between stores) ran at ~0.5 TB/s on the H200 for 8192 tokens x
// 8 slots x 2048 bf16 (573 us, ncu), a ninth of the copy rate. The gather writes the output in
// order (each expert's rows are consecutive tokens), keeps kCopyUnroll 16-byte loads in flight
// per lane, and reads x (T rows: fits in L2) k times; megadlm_bench ops --op moe_permute says
// what it reaches.
// unpermute / unpermute backward read the k slots' rows of a token: their dest and probs, and
// then all kSlotChunk rows, are loaded before the first use, so one token costs about one
// memory latency instead of k; the fp32 sums keep slot order (deterministic, as before).

constexpr int kCopyUnroll = 4;  // 16-byte loads in flight per lane of the permute gather
constexpr int kSlotChunk = 8;   // slots of a token whose rows are loaded together

/// src[dest[i]] = i / slots for every slot i with dest[i] >= 0 (src was set to -1).
__global__ void permute_sources_kernel(const int32_t* __restrict__ dest, int64_t n, int slots,
                                       int32_t* __restrict__ src) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t r = dest[i];
  if (r >= 0) src[r] = static_cast<int32_t>(i / slots);
}

/// One warp per output row: out[r] = x[src[r]], copied as raw kVec-element vectors (bitwise).
/// A row no slot points at (src -1) is left as it is, as the scatter left it.
template <typename T, int kVec>
__global__ void __launch_bounds__(kTokenThreads)
permute_gather_kernel(const T* __restrict__ x, const int32_t* __restrict__ src, T* __restrict__ out,
                      int64_t rows, int64_t h) {
  using V = Vec<T, kVec>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t packs = h / kVec;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
       r < rows; r += warps) {
    const int32_t t = src[r];  // uniform over the warp
    if (t < 0) continue;
    const V* from = reinterpret_cast<const V*>(x + static_cast<int64_t>(t) * h);
    V* to = reinterpret_cast<V*>(out + r * h);
    for (int64_t p0 = lane; p0 < packs; p0 += int64_t{kWarpSize} * kCopyUnroll) {
      V v[kCopyUnroll];
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int64_t p = p0 + int64_t{u} * kWarpSize;
        if (p < packs) v[u] = from[p];
      }
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int64_t p = p0 + int64_t{u} * kWarpSize;
        if (p < packs) to[p] = v[u];
      }
    }
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kTokenThreads)
unpermute_kernel(const T* __restrict__ y, const int32_t* __restrict__ dest, const float* __restrict__ probs,
                 T* __restrict__ out, int64_t tokens, int slots, int64_t h) {
  using V = Vec<T, kVec>;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < h; c += static_cast<int64_t>(blockDim.x) * kVec) {
      float acc[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
      for (int j0 = 0; j0 < slots; j0 += kSlotChunk) {
        int32_t r[kSlotChunk];
        float w[kSlotChunk];
        V v[kSlotChunk];
#pragma unroll
        for (int u = 0; u < kSlotChunk; ++u) {
          const int j = j0 + u;
          r[u] = j < slots ? dest[t * slots + j] : -1;  // uniform over the block
          w[u] = probs && r[u] >= 0 ? probs[t * slots + j] : 1.0f;
        }
#pragma unroll
        for (int u = 0; u < kSlotChunk; ++u)
          if (r[u] >= 0) v[u] = *reinterpret_cast<const V*>(y + static_cast<int64_t>(r[u]) * h + c);
#pragma unroll
        for (int u = 0; u < kSlotChunk; ++u) {
          if (r[u] < 0) continue;
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc[i] += w[u] * to_float(v[u].v[i]);
        }
      }
      store_vec<kVec>(out + t * h + c, acc);
    }
  }
}

/// Per token and chunk of kSlotChunk slots: dy of every slot's row in one pass over the hidden
/// size, and the slots' dot products reduced together (one block reduction per chunk, each
/// slot's sum in block_sum's order: per thread over its columns, warp butterfly, warps in order).
template <typename T, int kVec>
__global__ void __launch_bounds__(kTokenThreads)
unpermute_backward_kernel(const T* __restrict__ dout, const T* __restrict__ y, const int32_t* __restrict__ dest,
                          const float* __restrict__ probs, T* __restrict__ dy, float* __restrict__ dprobs,
                          int64_t tokens, int slots, int64_t h) {
  using V = Vec<T, kVec>;
  __shared__ float smem[kSlotChunk][kTokenThreads / kWarpSize];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int j0 = 0; j0 < slots; j0 += kSlotChunk) {
      int32_t r[kSlotChunk];
      float w[kSlotChunk], dot[kSlotChunk];
#pragma unroll
      for (int u = 0; u < kSlotChunk; ++u) {
        const int j = j0 + u;
        r[u] = j < slots ? dest[t * slots + j] : -1;  // uniform over the block
        w[u] = r[u] >= 0 ? probs[t * slots + j] : 0.0f;
        dot[u] = 0.0f;
      }
      for (int64_t c = static_cast<int64_t>(threadIdx.x) * kVec; c < h; c += static_cast<int64_t>(blockDim.x) * kVec) {
        float g[kVec];
        load_vec<kVec>(dout + t * h + c, g);
        V v[kSlotChunk];
#pragma unroll
        for (int u = 0; u < kSlotChunk; ++u)
          if (r[u] >= 0) v[u] = *reinterpret_cast<const V*>(y + static_cast<int64_t>(r[u]) * h + c);
#pragma unroll
        for (int u = 0; u < kSlotChunk; ++u) {
          if (r[u] < 0) continue;
          float o[kVec];
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            dot[u] += g[i] * to_float(v[u].v[i]);
            o[i] = w[u] * g[i];
          }
          store_vec<kVec>(dy + static_cast<int64_t>(r[u]) * h + c, o);
        }
      }
#pragma unroll
      for (int u = 0; u < kSlotChunk; ++u) {
        const float d = warp_sum(dot[u]);
        if (threadIdx.x % kWarpSize == 0) smem[u][warp] = d;
      }
      __syncthreads();
      if (threadIdx.x < kSlotChunk && j0 + static_cast<int>(threadIdx.x) < slots) {
        const int u = static_cast<int>(threadIdx.x);
        float sum = 0.0f;
        for (int k = 0; k < static_cast<int>(blockDim.x) / kWarpSize; ++k) sum += smem[u][k];
        // (dest again: r[u] with a per-thread u would put r in local memory)
        dprobs[t * slots + j0 + u] = dest[t * slots + j0 + u] >= 0 ? sum : 0.0f;
      }
      __syncthreads();  // smem is reused by the next chunk
    }
  }
}

unsigned token_blocks(int64_t tokens) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(tokens, 65535)));
}

/// Calls f(tag, kVec) with the widest vector the hidden size and pointers allow.
template <typename F>
void with_row_vector(DType dtype, int64_t h, std::initializer_list<const void*> ptrs, const char* op, F&& f) {
  dispatch_activation_dtype(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = kVec16<T>;
    bool aligned = h % kVec == 0;
    for (const void* p : ptrs) aligned = aligned && (p == nullptr || is_aligned(p, 16));
    if (aligned) f(tag, std::integral_constant<int, kVec>{});
    else f(tag, std::integral_constant<int, 1>{});
  });
}

/// Runs the CPU reference `fn` on host copies of `inputs` and writes `outputs` back (their
/// current contents are copied in first: some outputs accumulate).
template <typename Fn>
void on_host(const Stream& stream, std::initializer_list<const Tensor*> inputs,
             std::initializer_list<Tensor*> outputs, Fn&& fn) {
  std::vector<Tensor> in, out;
  for (const Tensor* t : inputs) in.push_back(t->defined() ? t->to(Device::cpu(), stream) : Tensor());
  for (Tensor* t : outputs) out.push_back(t->defined() ? t->to(Device::cpu(), stream) : Tensor());
  const Stream host = Stream::cpu();
  fn(in, out, host);
  size_t i = 0;
  for (Tensor* t : outputs) {
    if (t->defined()) copy_tensor(out[i], *t, stream);
    ++i;
  }
  stream.synchronize();  // the host buffers go out of scope
}

// One thread per (row, pair of experts): a Philox call gives the values of experts 2q and 2q+1.
__global__ void random_logits_kernel(float* __restrict__ logits, int64_t rows, int64_t experts,
                                     RandomLogitsArgs a, PhiloxKey key) {
  const int64_t pairs = (experts + 1) / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * pairs) return;
  const int64_t r = i / pairs, e0 = (i % pairs) * 2;
  const int64_t g = a.row_offset + r;
  const int64_t sample = a.sample_offset + g / a.seq_len, position = a.chunks.global(g % a.seq_len);
  for (int64_t e = e0; e < e0 + 2 && e < experts; ++e)
    logits[r * experts + e] = static_cast<float>(random_logit_value(key, a.layer, sample, position, e));
}

}  // namespace

void moe_router_topk_forward(const Tensor& logits, const Tensor& expert_bias, Tensor& probs,
                             Tensor& indices, const RouterTopkArgs& args, const Stream& stream) {
  NvtxRange range("moe_router_topk_forward");
  const int64_t rows = logits.rows();
  const int experts = static_cast<int>(logits.cols());
  if (rows == 0) return;
  if (args.selection == RouterSelection::Sinkhorn) {  // whole-matrix iterations: the CPU reference
    on_host(stream, {&logits, &expert_bias}, {&probs, &indices}, [&](auto& in, auto& out, const Stream& h) {
      cpu::moe_router_topk_forward(in[0], in[1], out[0], out[1], args, h);
    });
    return;
  }
  const size_t smem = static_cast<size_t>(kRowWarps) * (2 * experts + args.num_groups + args.topk) * sizeof(float);
  MDLM_CHECK(smem <= 48 * 1024, "moe_router_topk_forward: ", experts, " experts need ", smem,
             " bytes of shared memory per block (at most 48 KiB)");
  router_topk_forward_kernel<<<row_blocks(rows), kRowThreads, smem, megadlm::detail::native_stream(stream)>>>(
      logits.data<float>(), expert_bias.defined() ? expert_bias.data<float>() : nullptr,
      probs.data<float>(), indices.data<int32_t>(), rows, experts, args);
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_router_topk_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices,
                              Tensor& dlogits, const RouterTopkArgs& args, const Stream& stream) {
  NvtxRange range("moe_router_topk_backward");
  const int64_t rows = logits.rows();
  if (rows == 0) return;
  router_topk_backward_kernel<<<row_blocks(rows), kRowThreads, 0, megadlm::detail::native_stream(stream)>>>(
      dprobs.data<float>(), logits.data<float>(), indices.data<int32_t>(), dlogits.data<float>(), rows,
      static_cast<int>(logits.cols()), static_cast<int>(indices.cols()), args);
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_expert_choice_forward(const Tensor& logits, Tensor& probs, Tensor& indices,
                               const ExpertChoiceArgs& args, const Stream& stream) {
  NvtxRange range("moe_expert_choice_forward");
  on_host(stream, {&logits}, {&probs, &indices}, [&](auto& in, auto& out, const Stream& h) {
    cpu::moe_expert_choice_forward(in[0], out[0], out[1], args, h);
  });
}

void moe_capacity_drop(const Tensor& probs, const Tensor& indices, Tensor& kept, int64_t capacity,
                       int num_experts, CapacityDropPolicy policy, const Stream& stream) {
  NvtxRange range("moe_capacity_drop");
  on_host(stream, {&probs, &indices}, {&kept}, [&](auto& in, auto& out, const Stream& h) {
    cpu::moe_capacity_drop(in[0], in[1], out[0], capacity, num_experts, policy, h);
  });
}

void moe_router_stats(const Tensor& logits, Tensor& score_sums, Tensor& lse_sq,
                      const RowGroups& groups, const Stream& stream) {
  NvtxRange range("moe_router_stats");
  const int64_t rows = logits.rows();
  if (rows == 0) return;
  router_stats_kernel<<<row_blocks(rows), kRowThreads, 0, megadlm::detail::native_stream(stream)>>>(
      logits.data<float>(), score_sums.defined() ? score_sums.data<float>() : nullptr,
      lse_sq.defined() ? lse_sq.data<float>() : nullptr, rows, static_cast<int>(logits.cols()), groups);
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_count_tokens(const Tensor& indices, Tensor& counts, const RowGroups& groups, const Stream& stream) {
  NvtxRange range("moe_count_tokens");
  const int64_t n = indices.numel();
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 4096));
  count_tokens_kernel<<<blocks, 256, 0, megadlm::detail::native_stream(stream)>>>(
      indices.data<int32_t>(), counts.data<float>(), indices.rows(), static_cast<int>(indices.cols()),
      static_cast<int>(counts.cols()), groups);
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_router_loss_backward(const Tensor& logits, const Tensor& w, Tensor& dlogits,
                              const RouterLossArgs& args, const Stream& stream) {
  NvtxRange range("moe_router_loss_backward");
  const int64_t rows = logits.rows();
  if (rows == 0) return;
  router_loss_backward_kernel<<<row_blocks(rows), kRowThreads, 0, megadlm::detail::native_stream(stream)>>>(
      logits.data<float>(), w.defined() && args.aux_coeff != 0.0f ? w.data<float>() : nullptr,
      dlogits.data<float>(), rows, static_cast<int>(logits.cols()), args);
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_expert_choice_aux(const Tensor& logits, const Tensor& experts_per_row, Tensor& value,
                           Tensor& dlogits, float grad_scale, const Stream& stream) {
  NvtxRange range("moe_expert_choice_aux");
  on_host(stream, {&logits, &experts_per_row}, {&value, &dlogits}, [&](auto& in, auto& out, const Stream& h) {
    cpu::moe_expert_choice_aux(in[0], in[1], out[0], out[1], grad_scale, h);
  });
}

void moe_dispatch_plan(const Tensor& indices, int first_expert, int num_experts, Tensor& dest,
                       Tensor& counts, const Stream& stream) {
  NvtxRange range("moe_dispatch_plan");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const int64_t n = indices.numel();
  if (n == 0) {
    MDLM_CUDA_CHECK(cudaMemsetAsync(counts.data_ptr(), 0, counts.nbytes(), s));
    return;
  }
  const int64_t chunks = ceil_div(n, kPlanChunk);
  Tensor chunk = Tensor::empty({chunks, num_experts}, DType::I32, stream);
  const size_t smem = static_cast<size_t>(num_experts) * sizeof(int32_t);
  MDLM_CHECK(smem <= 48 * 1024, "moe_dispatch_plan: too many experts (", num_experts, ")");
  plan_count_kernel<<<static_cast<unsigned>(chunks), 256, smem, s>>>(indices.data<int32_t>(), n, first_expert,
                                                                     num_experts, chunk.data<int32_t>());
  MDLM_CUDA_CHECK_LAUNCH();
  plan_scan_kernel<<<1, 256, smem, s>>>(chunk.data<int32_t>(), chunks, num_experts, counts.data<int32_t>());
  MDLM_CUDA_CHECK_LAUNCH();
  plan_dest_kernel<<<static_cast<unsigned>(chunks), kPlanChunk, 0, s>>>(
      indices.data<int32_t>(), n, first_expert, num_experts, chunk.data<int32_t>(), dest.data<int32_t>());
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_random_logits(Tensor& logits, const RandomLogitsArgs& args, const Stream& stream) {
  NvtxRange range("moe_random_logits");
  const int64_t rows = logits.rows(), experts = logits.cols(), n = rows * ((experts + 1) / 2);
  if (n == 0) return;
  random_logits_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, megadlm::detail::native_stream(stream)>>>(
      logits.data<float>(), rows, experts, args, PhiloxKey::make(args.seed, RngPurpose::MoeRandomLogits));
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_permute(const Tensor& x, const Tensor& dest, Tensor& out, const Stream& stream) {
  NvtxRange range("moe_permute");
  const int64_t slots_total = dest.numel(), rows = out.rows(), h = x.cols();
  if (slots_total == 0 || rows == 0 || h == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  // The inverse map: all -1 (0xff bytes), then each slot's token at its destination row.
  Tensor src = Tensor::empty({rows}, DType::I32, stream);
  MDLM_CUDA_CHECK(cudaMemsetAsync(src.data_ptr(), 0xff, src.nbytes(), s));
  permute_sources_kernel<<<static_cast<unsigned>(ceil_div(slots_total, 256)), 256, 0, s>>>(
      dest.data<int32_t>(), slots_total, static_cast<int>(dest.cols()), src.data<int32_t>());
  MDLM_CUDA_CHECK_LAUNCH();
  constexpr int64_t rows_per_block = kTokenThreads / kWarpSize;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(rows, rows_per_block), int64_t{1} << 20));
  with_row_vector(x.dtype(), h, {x.data_ptr(), out.data_ptr()}, "moe_permute", [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    permute_gather_kernel<T, decltype(vec)::value><<<blocks, kTokenThreads, 0, s>>>(
        static_cast<const T*>(x.data_ptr()), src.data<int32_t>(), static_cast<T*>(out.data_ptr()), rows, h);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_unpermute(const Tensor& y, const Tensor& dest, const Tensor& probs, Tensor& out,
                   const Stream& stream) {
  NvtxRange range("moe_unpermute");
  const int64_t tokens = dest.rows(), h = out.cols();
  if (tokens == 0 || h == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const void* yp = y.numel() > 0 ? y.data_ptr() : nullptr;
  with_row_vector(out.dtype(), h, {yp, out.data_ptr()}, "moe_unpermute", [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    unpermute_kernel<T, decltype(vec)::value><<<token_blocks(tokens), kTokenThreads, 0, s>>>(
        static_cast<const T*>(yp), dest.data<int32_t>(), probs.defined() ? probs.data<float>() : nullptr,
        static_cast<T*>(out.data_ptr()), tokens, static_cast<int>(dest.cols()), h);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_backward(const Tensor& dout, const Tensor& y, const Tensor& dest,
                            const Tensor& probs, Tensor& dy, Tensor& dprobs, const Stream& stream) {
  NvtxRange range("moe_unpermute_backward");
  const int64_t tokens = dest.rows(), h = dout.cols();
  if (tokens == 0) return;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const void* yp = y.numel() > 0 ? y.data_ptr() : nullptr;
  void* dyp = dy.numel() > 0 ? dy.data_ptr() : nullptr;
  with_row_vector(dout.dtype(), h, {dout.data_ptr(), yp, dyp}, "moe_unpermute_backward", [&](auto tag, auto vec) {
    using T = typename decltype(tag)::type;
    unpermute_backward_kernel<T, decltype(vec)::value><<<token_blocks(tokens), kTokenThreads, 0, s>>>(
        static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(yp), dest.data<int32_t>(),
        probs.data<float>(), static_cast<T*>(dyp), dprobs.data<float>(), tokens,
        static_cast<int>(dest.cols()), h);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace megadlm::ops::cuda
