// Fused QK-norm + RoPE on CUDA (include/megadlm/ops/qk_norm_rope.h).
// General kernels: one block per token (grid-stride), 8 warps: the block first forms the token's
// rotary angles once (cos/sin of theta_i = p / base^(2i/rotary_dim), fp32 as rope.cu), then each
// warp takes whole query/key heads: a lane holds the elements lane + 32 j of a head (coalesced),
// the RMS statistic is a warp sum, and the rotation partner (i +- rotary_dim/2) comes through a
// per-warp row in shared memory. Value heads are copied with 16-byte accesses.
// head_dim 128 kernels (the 1.7B shape, forward and backward): a warp per token, 4 contiguous
// elements a lane, the rotation partner by one shuffle, the loads of 4 heads in flight at once,
// angles and weights in registers.
// In place (out == qkv) the value heads are left alone: a warp reads a whole head before it
// writes it, and heads do not overlap. Backward does the rotation by -theta, the RMSNorm
// backward, writes the gradient over dqkv in place (each head is read whole before it is
// written), and reduces dq_weight/dk_weight deterministically: per-lane registers, a fixed order
// over the block's warps into one partial row per block, then launch_add_partial_rows in block
// order (no float atomics).
#include <algorithm>
#include <type_traits>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxDim = 256;
constexpr int64_t kBackwardMaxBlocks = 1024;

struct Dims {
  int heads, kv_heads, dim, rotary_dim;
  float base, eps;
  bool copy_values;  ///< forward: whether out's value heads are written (out != qkv)
  __host__ __device__ int row() const { return (heads + 2 * kv_heads) * dim; }
};

/// The token's angles: cs[i], sn[i] for i < rotary_dim / 2 (block-wide, then a barrier).
__device__ __forceinline__ void token_angles(int32_t position, const Dims& d, float* cs, float* sn) {
  const int half = d.rotary_dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float inv_freq =
        1.0f / powf(d.base, static_cast<float>(2 * i) / static_cast<float>(d.rotary_dim));
    sincosf(static_cast<float>(position) * inv_freq, &sn[i], &cs[i]);
  }
  __syncthreads();
}

/// Element e of a head rotated by sign * theta, from the head's values in `row` (shared).
__device__ __forceinline__ float rotated(const float* row, int e, const Dims& d, const float* cs,
                                         const float* sn, float sign) {
  const int half = d.rotary_dim / 2;
  if (e < half) return row[e] * cs[e] - sign * row[e + half] * sn[e];
  if (e < d.rotary_dim) return row[e] * cs[e - half] + sign * row[e - half] * sn[e - half];
  return row[e];
}

template <typename T, int E>
__global__ void __launch_bounds__(kThreads)
qk_norm_rope_forward_kernel(const T* qkv, const T* __restrict__ q_weight,
                            const T* __restrict__ k_weight, const int32_t* __restrict__ positions,
                            T* out, float* __restrict__ rstd, int64_t tokens, Dims d) {
  __shared__ float cs[kMaxDim / 2], sn[kMaxDim / 2];
  __shared__ float rows[kWarps][kMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int normed = d.heads + d.kv_heads;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    __syncthreads();  // the previous token's angles and rows are no longer read
    if (d.rotary_dim > 0) token_angles(positions[t], d, cs, sn);
    const T* xt = qkv + t * d.row();
    T* yt = out + t * d.row();
    for (int h = warp; h < normed; h += kWarps) {
      const T* xh = xt + h * d.dim;
      float v[E];
#pragma unroll
      for (int j = 0; j < E; ++j) v[j] = to_float(xh[lane + 32 * j]);
      if (q_weight != nullptr) {
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < E; ++j) ss += v[j] * v[j];
        ss = warp_sum(ss);
        const float r = 1.0f / sqrtf(ss / static_cast<float>(d.dim) + d.eps);
        const T* w = h < d.heads ? q_weight : k_weight;
#pragma unroll
        for (int j = 0; j < E; ++j) v[j] = v[j] * r * to_float(w[lane + 32 * j]);
        if (lane == 0) rstd[t * normed + h] = r;
      }
      if (d.rotary_dim > 0) {
        float* row = rows[warp];
#pragma unroll
        for (int j = 0; j < E; ++j) row[lane + 32 * j] = v[j];
        __syncwarp();
#pragma unroll
        for (int j = 0; j < E; ++j) v[j] = rotated(row, lane + 32 * j, d, cs, sn, 1.0f);
        __syncwarp();  // the row is rewritten for the warp's next head
      }
      T* yh = yt + h * d.dim;
#pragma unroll
      for (int j = 0; j < E; ++j) yh[lane + 32 * j] = from_float<T>(v[j]);
    }
    // Value heads: a plain copy of the row's tail (nothing to do in place, or when the
    // attention reads them from qkv).
    if (qkv == out || !d.copy_values) continue;
    const int64_t v_begin = static_cast<int64_t>(normed) * d.dim, v_len = static_cast<int64_t>(d.kv_heads) * d.dim;
    if ((v_len * sizeof(T)) % 16 == 0 && (v_begin * sizeof(T)) % 16 == 0 && (d.row() * sizeof(T)) % 16 == 0) {
      const uint4* src = reinterpret_cast<const uint4*>(xt + v_begin);
      uint4* dst = reinterpret_cast<uint4*>(yt + v_begin);
      for (int64_t i = threadIdx.x; i < static_cast<int64_t>(v_len * sizeof(T) / 16); i += blockDim.x) dst[i] = src[i];
    } else {
      for (int64_t i = threadIdx.x; i < v_len; i += blockDim.x) yt[v_begin + i] = xt[v_begin + i];
    }
  }
}

// ---- head_dim 128 kernels: the pieces forward and backward share ----
// Everything a lane uses lives in registers, indexed by compile-time indices only (a pointer
// that picks between two register arrays, or an index the compiler cannot fold, moves them to
// local memory: ncu measured that as the forward's main cost on the H200).

constexpr int kD128Half = 64;
/// Heads whose loads a warp issues before it uses the first.
constexpr int kD128Group = 4;
/// The forward's blocks per SM, which caps its registers at 64 (measured on the H200 at 8192
/// tokens: 0.072 ms, against 0.088 with the 70 registers the compiler picks by itself (3 blocks),
/// 0.107 with 8 heads in flight and 0.085 for the previous kernel, whose weights sat in local
/// memory; the backward, which reads two tensors, gains nothing from it: 0.098 ms either way).
constexpr int kD128ForwardMinBlocks = 4;

/// inv_freq of a lane's 4 elements 4 lane + j (rotation pair i = (4 lane + j) mod 64), by
/// token_angles' expression, so the angles are the same as the general kernels'.
__device__ __forceinline__ void d128_lane_frequencies(float (&inv_freq)[4], int lane, const Dims& d) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = (4 * lane + j) & (kD128Half - 1);
    inv_freq[j] = 1.0f / powf(d.base, static_cast<float>(2 * i) / static_cast<float>(d.rotary_dim));
  }
}

/// cos/sin(p * inv_freq[j]) of a lane's 4 elements at this token's position.
__device__ __forceinline__ void d128_lane_angles(int32_t position, const float (&inv_freq)[4], float (&cs)[4],
                                                 float (&sn)[4]) {
  const float p = static_cast<float>(position);
#pragma unroll
  for (int j = 0; j < 4; ++j) sincosf(p * inv_freq[j], &sn[j], &cs[j]);
}

/// The rotation of a lane's 4 elements (4 lane + j) by +theta (kInverse: -theta); the partner
/// e +- 64 sits in lane ^ 16 and has the same angle.
template <bool kInverse>
__device__ __forceinline__ void d128_rotate(float (&v)[4], int lane, const float (&cs)[4], const float (&sn)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float partner = __shfl_xor_sync(0xffffffffu, v[j], 16);
    if constexpr (kInverse) v[j] = lane < 16 ? v[j] * cs[j] + partner * sn[j] : v[j] * cs[j] - partner * sn[j];
    else v[j] = lane < 16 ? v[j] * cs[j] - partner * sn[j] : v[j] * cs[j] + partner * sn[j];
  }
}

// head_dim 128 with full (or no) rotation, 2-byte types: a lane holds 4 contiguous elements
// (8-byte accesses instead of 2-byte ones), and the rotation partner e +- 64 of lane l's elements
// sits in lane l ^ 16, so it comes by one shuffle instead of a shared-memory round trip. The
// arithmetic is the general kernel's expression for expression; only the order of the RMS
// statistic's sum differs. Lane l keeps the rstd of head 32 c + l, stored in one coalesced
// write per 32 heads.
template <typename T>
__global__ void __launch_bounds__(kThreads, kD128ForwardMinBlocks)
qk_norm_rope_forward_d128_kernel(const T* qkv, const T* __restrict__ q_weight,
                                 const T* __restrict__ k_weight, const int32_t* __restrict__ positions,
                                 T* out, float* __restrict__ rstd, int64_t tokens, Dims d) {
  constexpr int kDim = 128, kGroup = kD128Group;
  static_assert(32 % kGroup == 0, "a load group stays inside a 32-head rstd chunk");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int normed = d.heads + d.kv_heads;
  const bool norm = q_weight != nullptr, rope = d.rotary_dim > 0;
  float wq[4] = {}, wk[4] = {}, inv_freq[4] = {};
  if (norm) {
    load_vec<4>(q_weight + 4 * lane, wq);
    load_vec<4>(k_weight + 4 * lane, wk);
  }
  if (rope) d128_lane_frequencies(inv_freq, lane, d);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    const T* xt = qkv + t * d.row();
    T* yt = out + t * d.row();
    float v[kGroup][4];
    auto load_group = [&](int h0) {
#pragma unroll
      for (int u = 0; u < kGroup; ++u)
        if (h0 + u < normed) load_vec<4>(xt + (h0 + u) * kDim + 4 * lane, v[u]);
    };
    load_group(0);  // in flight while the angles are formed
    float cs[4] = {}, sn[4] = {};
    if (rope) d128_lane_angles(positions[t], inv_freq, cs, sn);
    float lane_rstd = 0.0f;
    for (int h0 = 0; h0 < normed; h0 += kGroup) {
      if (h0 > 0) load_group(h0);
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        const int h = h0 + u;
        if (h < normed) {  // uniform over the warp
          if (norm) {
            float ss = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) ss += v[u][j] * v[u][j];
            ss = warp_sum(ss);
            const float r = 1.0f / sqrtf(ss / static_cast<float>(kDim) + d.eps);
            const bool is_q = h < d.heads;
#pragma unroll
            for (int j = 0; j < 4; ++j) v[u][j] = v[u][j] * r * (is_q ? wq[j] : wk[j]);
            if (lane == (h & 31)) lane_rstd = r;
          }
          if (rope) d128_rotate<false>(v[u], lane, cs, sn);
          store_vec<4>(yt + h * kDim + 4 * lane, v[u]);
        }
      }
      const int next = h0 + kGroup, chunk = h0 & ~31;
      if (norm && ((next & 31) == 0 || next >= normed) && chunk + lane < normed)
        rstd[t * normed + chunk + lane] = lane_rstd;
    }
    if (qkv == out || !d.copy_values) continue;  // in place, or read from qkv by the attention
    const int64_t v_begin = static_cast<int64_t>(normed) * kDim, v_len = static_cast<int64_t>(d.kv_heads) * kDim;
    const uint2* src = reinterpret_cast<const uint2*>(xt + v_begin);
    uint2* dst = reinterpret_cast<uint2*>(yt + v_begin);
#pragma unroll 4
    for (int64_t i = lane; i < v_len / 4; i += 32) dst[i] = src[i];
  }
}

/// Whether the d128 kernels (forward and backward) run these arguments (else the general ones).
bool d128_kernels_take(const Dims& d, size_t element_bytes, std::initializer_list<const void*> pointers) {
  if (d.dim != 128 || (d.rotary_dim != 0 && d.rotary_dim != 128) || element_bytes != 2) return false;
  for (const void* p : pointers)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 8 != 0) return false;
  return true;
}

template <typename T, int E>
__global__ void __launch_bounds__(kThreads)
qk_norm_rope_backward_kernel(T* __restrict__ dqkv, const T* __restrict__ qkv,
                             const T* __restrict__ q_weight, const T* __restrict__ k_weight,
                             const float* __restrict__ rstd, const int32_t* __restrict__ positions,
                             float* __restrict__ partial_q, float* __restrict__ partial_k,
                             int64_t tokens, Dims d) {
  __shared__ float cs[kMaxDim / 2], sn[kMaxDim / 2];
  __shared__ float rows[kWarps][kMaxDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int normed = d.heads + d.kv_heads;
  const bool norm = q_weight != nullptr;
  float acc_q[E], acc_k[E];
#pragma unroll
  for (int j = 0; j < E; ++j) acc_q[j] = acc_k[j] = 0.0f;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    __syncthreads();
    if (d.rotary_dim > 0) token_angles(positions[t], d, cs, sn);
    for (int h = warp; h < normed; h += kWarps) {
      T* gh = dqkv + t * d.row() + h * d.dim;
      float dn[E];
#pragma unroll
      for (int j = 0; j < E; ++j) dn[j] = to_float(gh[lane + 32 * j]);
      if (d.rotary_dim > 0) {
        float* row = rows[warp];
#pragma unroll
        for (int j = 0; j < E; ++j) row[lane + 32 * j] = dn[j];
        __syncwarp();
#pragma unroll
        for (int j = 0; j < E; ++j) dn[j] = rotated(row, lane + 32 * j, d, cs, sn, -1.0f);
        __syncwarp();
      }
      if (norm) {
        const T* xh = qkv + t * d.row() + h * d.dim;
        const T* w = h < d.heads ? q_weight : k_weight;
        const float r = rstd[t * normed + h];
        float x[E], wv[E], gx = 0.0f;
#pragma unroll
        for (int j = 0; j < E; ++j) {
          x[j] = to_float(xh[lane + 32 * j]);
          wv[j] = to_float(w[lane + 32 * j]);
          gx += dn[j] * wv[j] * x[j];
        }
        gx = warp_sum(gx);
        const float coef = r * r * r * gx / static_cast<float>(d.dim);
#pragma unroll
        for (int j = 0; j < E; ++j) {
          if (h < d.heads) acc_q[j] += dn[j] * x[j] * r;
          else acc_k[j] += dn[j] * x[j] * r;
          dn[j] = r * dn[j] * wv[j] - x[j] * coef;
        }
      }
#pragma unroll
      for (int j = 0; j < E; ++j) gh[lane + 32 * j] = from_float<T>(dn[j]);
    }
  }
  if (!norm) return;
  // Block partial rows: the warps' sums in warp order (fixed), one row per weight.
  __syncthreads();
  float* comb_q = &rows[0][0];  // [kWarps][dim], reused
#pragma unroll
  for (int j = 0; j < E; ++j) comb_q[warp * d.dim + lane + 32 * j] = acc_q[j];
  __syncthreads();
  for (int c = threadIdx.x; c < d.dim; c += blockDim.x) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s += comb_q[w * d.dim + c];
    partial_q[static_cast<int64_t>(blockIdx.x) * d.dim + c] = s;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < E; ++j) comb_q[warp * d.dim + lane + 32 * j] = acc_k[j];
  __syncthreads();
  for (int c = threadIdx.x; c < d.dim; c += blockDim.x) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s += comb_q[w * d.dim + c];
    partial_k[static_cast<int64_t>(blockIdx.x) * d.dim + c] = s;
  }
}

// The backward at head_dim 128 with full (or no) rotation, 2-byte types: the forward d128
// kernel's lane layout (4 contiguous elements a lane, the rotation partner in lane l ^ 16) and
// its grouped loads (a warp's 4 heads of a token, gradient and input, in flight at once); the
// token's rstd comes in one coalesced load per 32 heads and reaches the lanes by shuffles. The
// arithmetic is the general kernel's expression for expression; the weight sums keep a fixed
// order (per lane over tokens, then warps in order), so repeated runs are bitwise equal.
template <typename T>
__global__ void __launch_bounds__(kThreads)
qk_norm_rope_backward_d128_kernel(T* __restrict__ dqkv, const T* __restrict__ qkv,
                                  const T* __restrict__ q_weight, const T* __restrict__ k_weight,
                                  const float* __restrict__ rstd, const int32_t* __restrict__ positions,
                                  float* __restrict__ partial_q, float* __restrict__ partial_k,
                                  int64_t tokens, Dims d) {
  constexpr int kDim = 128, kGroup = kD128Group;
  static_assert(32 % kGroup == 0, "a load group stays inside a 32-head rstd chunk");
  __shared__ float comb[kWarps][kDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int normed = d.heads + d.kv_heads;
  const bool norm = q_weight != nullptr, rope = d.rotary_dim > 0;
  float wq[4] = {}, wk[4] = {}, acc_q[4] = {}, acc_k[4] = {}, inv_freq[4] = {};
  if (norm) {
    load_vec<4>(q_weight + 4 * lane, wq);
    load_vec<4>(k_weight + 4 * lane, wk);
  }
  if (rope) d128_lane_frequencies(inv_freq, lane, d);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    T* gt = dqkv + t * d.row();
    const T* xt = qkv + t * d.row();
    float g[kGroup][4], x[kGroup][4];
    auto load_group = [&](int h0) {
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        if (h0 + u >= normed) continue;
        load_vec<4>(gt + (h0 + u) * kDim + 4 * lane, g[u]);
        if (norm) load_vec<4>(xt + (h0 + u) * kDim + 4 * lane, x[u]);
      }
    };
    float lane_rstd = 0.0f;
    load_group(0);
    float cs[4] = {}, sn[4] = {};
    if (rope) d128_lane_angles(positions[t], inv_freq, cs, sn);
    for (int h0 = 0; h0 < normed; h0 += kGroup) {
      if (norm && (h0 & 31) == 0) lane_rstd = h0 + lane < normed ? rstd[t * normed + h0 + lane] : 0.0f;
      if (h0 > 0) load_group(h0);
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        const int h = h0 + u;
        if (h >= normed) continue;  // uniform over the warp
        float dn[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) dn[j] = g[u][j];
        if (rope) d128_rotate<true>(dn, lane, cs, sn);
        if (norm) {
          const bool is_q = h < d.heads;
          const float r = __shfl_sync(0xffffffffu, lane_rstd, h & 31);
          float gx = 0.0f;
#pragma unroll
          for (int j = 0; j < 4; ++j) gx += dn[j] * (is_q ? wq[j] : wk[j]) * x[u][j];
          gx = warp_sum(gx);
          const float coef = r * r * r * gx / static_cast<float>(kDim);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (is_q) acc_q[j] += dn[j] * x[u][j] * r;
            else acc_k[j] += dn[j] * x[u][j] * r;
            dn[j] = r * dn[j] * (is_q ? wq[j] : wk[j]) - x[u][j] * coef;
          }
        }
        store_vec<4>(gt + h * kDim + 4 * lane, dn);
      }
    }
  }
  if (!norm) return;
  // Block partial rows: the warps' sums in warp order (fixed), one row per weight.
  for (int which = 0; which < 2; ++which) {
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; ++j) comb[warp][4 * lane + j] = which == 0 ? acc_q[j] : acc_k[j];
    __syncthreads();
    for (int c = threadIdx.x; c < kDim; c += blockDim.x) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += comb[w][c];
      (which == 0 ? partial_q : partial_k)[static_cast<int64_t>(blockIdx.x) * kDim + c] = sum;
    }
  }
}

Dims dims_of(const QkNormRopeArgs& a) {
  MDLM_CHECK(a.head_dim % 32 == 0 && a.head_dim <= kMaxDim, "CUDA qk_norm_rope needs head_dim a "
             "multiple of 32 up to ", kMaxDim, ", got ", a.head_dim, " (--kv-channels)");
  return {static_cast<int>(a.heads), static_cast<int>(a.kv_heads), static_cast<int>(a.head_dim),
          static_cast<int>(a.rotary_dim), a.base, a.eps, a.copy_values};
}

/// Calls f(std::integral_constant<int, E>) for E = head_dim / 32.
template <typename F>
void with_elements(int dim, F&& f) {
  switch (dim / 32) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

}  // namespace

void qk_norm_rope_forward(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                          const Tensor& positions, Tensor& out, Tensor& rstd,
                          const QkNormRopeArgs& args, const Stream& stream) {
  NvtxRange range("qk_norm_rope_forward");
  const Dims d = dims_of(args);
  const int64_t tokens = qkv.rows();
  if (tokens == 0) return;
  MDLM_CHECK(!q_weight.defined() || rstd.dtype() == DType::F32, "qk_norm_rope_forward: rstd must be f32, got ",
             rstd.str());
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tokens, 65535));
  const unsigned grid_d128 = static_cast<unsigned>(std::min<int64_t>(ceil_div(tokens, int64_t{kWarps}), 65535));
  dispatch_activation_dtype(qkv.dtype(), "qk_norm_rope_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (sizeof(T) == 2) {
      if (d128_kernels_take(d, sizeof(T), {qkv.data_ptr(), out.data_ptr(), ptr_or_null<T>(q_weight),
                                      ptr_or_null<T>(k_weight)})) {
        qk_norm_rope_forward_d128_kernel<T><<<grid_d128, kThreads, 0, megadlm::detail::native_stream(stream)>>>(
            static_cast<const T*>(qkv.data_ptr()), ptr_or_null<T>(q_weight), ptr_or_null<T>(k_weight),
            static_cast<const int32_t*>(positions.data_ptr()), static_cast<T*>(out.data_ptr()),
            q_weight.defined() ? rstd.data<float>() : nullptr, tokens, d);
        return;
      }
    }
    with_elements(d.dim, [&](auto e) {
      qk_norm_rope_forward_kernel<T, decltype(e)::value>
          <<<grid, kThreads, 0, megadlm::detail::native_stream(stream)>>>(
              static_cast<const T*>(qkv.data_ptr()), ptr_or_null<T>(q_weight), ptr_or_null<T>(k_weight),
              static_cast<const int32_t*>(positions.data_ptr()), static_cast<T*>(out.data_ptr()),
              q_weight.defined() ? rstd.data<float>() : nullptr, tokens, d);
    });
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

void qk_norm_rope_backward(Tensor& dqkv, const Tensor& qkv, const Tensor& q_weight,
                           const Tensor& k_weight, const Tensor& rstd, const Tensor& positions,
                           Tensor& dq_weight, Tensor& dk_weight, const QkNormRopeArgs& args,
                           const Stream& stream) {
  NvtxRange range("qk_norm_rope_backward");
  const Dims d = dims_of(args);
  const int64_t tokens = qkv.rows();
  if (tokens == 0) return;
  const bool norm = q_weight.defined();
  const bool d128 = d128_kernels_take(d, dtype_size(qkv.dtype()), {dqkv.data_ptr(), qkv.data_ptr(),
                                      q_weight.defined() ? q_weight.data_ptr() : nullptr,
                                      k_weight.defined() ? k_weight.data_ptr() : nullptr});
  // The d128 kernel takes a token per warp, the general one a token per block.
  const int64_t blocks = std::min(d128 ? ceil_div(tokens, int64_t{kWarps}) : tokens, kBackwardMaxBlocks);
  Tensor partial;
  if (norm) partial = Tensor::empty({2, blocks, d.dim}, DType::F32, stream);
  float* pq = norm ? partial.data<float>() : nullptr;
  float* pk = norm ? pq + blocks * d.dim : nullptr;
  cudaStream_t s = megadlm::detail::native_stream(stream);
  dispatch_activation_dtype(qkv.dtype(), "qk_norm_rope_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (sizeof(T) == 2) {
      if (d128) {
        qk_norm_rope_backward_d128_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
            static_cast<T*>(dqkv.data_ptr()), static_cast<const T*>(qkv.data_ptr()),
            ptr_or_null<T>(q_weight), ptr_or_null<T>(k_weight), norm ? rstd.data<float>() : nullptr,
            static_cast<const int32_t*>(positions.data_ptr()), pq, pk, tokens, d);
        return;
      }
    }
    with_elements(d.dim, [&](auto e) {
      qk_norm_rope_backward_kernel<T, decltype(e)::value><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
          static_cast<T*>(dqkv.data_ptr()), static_cast<const T*>(qkv.data_ptr()),
          ptr_or_null<T>(q_weight), ptr_or_null<T>(k_weight), norm ? rstd.data<float>() : nullptr,
          static_cast<const int32_t*>(positions.data_ptr()), pq, pk, tokens, d);
    });
  });
  MDLM_CUDA_CHECK_LAUNCH();
  if (norm) {
    launch_add_partial_rows(pq, blocks, d.dim, dq_weight.data<float>(), s);
    launch_add_partial_rows(pk, blocks, d.dim, dk_weight.data<float>(), s);
  }
}

}  // namespace megadlm::ops::cuda
