// The simple CUDA attention path: one warp per query row (forward; dq) or per key row (dk, dv),
// fp32 arithmetic on CUDA cores, head_dim up to 256, same contract as the flash kernels. Used for
// head dims the flash kernels do not cover and as a second opinion in the GPU parity test; it
// favours being obviously right over speed (each q.k dot product is a warp reduction).
// Dropout (kDropout): lane l draws the keep bit of the l-th next key (or query) from the shared
// mapping (ops/attention_dropout_mask.h) and one ballot hands 32 bits to the whole warp.
// Context-parallel blocks (KeyBlock: a separate key length, chunk maps, the keys' own document
// ids; include/megadlm/ops/attention.h) run here too: simple_attention_*_key_block at the end of
// the file, which the context-parallel entries (attention.cu) call for what the flash kernels
// cannot.
// Block diffusion (kBlockDiff, Shape::bd_ranges): each query row scans the two key ranges of
// BlockDiffusionRow::keys_of and each key row the two query ranges of queries_of
// (ops/attention_block_diffusion.h), testing every element with the rule itself; any L, any D.
// On a context-parallel shard (KeyBlock::per_key with block diffusion: chunk-mapped halves, a
// key block of another shard) every element is tested on its row of the whole doubled row.
#include <cmath>
#include "core/cuda/cuda_utils.h"
#include "ops/attention_block_diffusion.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/attention_impl.h"
#include "ops/cuda/cuda_ops.h"

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

/// The keys of a call beyond Shape (whose seq, causal and docs describe the queries): an ordinary
/// call has kv_seq = seq, identity maps and no key documents. per_key: the keys are not the
/// queries' own rows (another length, their own documents, or a causal mask between different
/// maps), so every key is tested instead of one contiguous range.
struct KeyBlock {
  int64_t kv_seq;
  ops::ChunkMap query_chunks, key_chunks;
  const int32_t* key_docs;  ///< [B, kv_seq], or null: the queries' document ids
  bool per_key;

  static KeyBlock of(const Shape& s) { return {s.seq, {}, {}, nullptr, false}; }

  /// Block diffusion on a shard: row r of `rows` (two halves, each mapped by m) -> its row of
  /// the whole doubled row of 2·half.
  __device__ __forceinline__ static int doubled(int64_t r, int64_t rows, const ops::ChunkMap& m,
                                                int64_t half) {
    const int64_t h = rows / 2;
    return static_cast<int>((r < h ? 0 : half) + m.global(r < h ? r : r - h));
  }

  /// In per_key mode: whether query i (document qdoc, global position gq) sees key j of row b.
  __device__ __forceinline__ bool visible(const Shape& s, int64_t b, int32_t qdoc, int64_t gq,
                                          int64_t j) const {
    if (s.docs != nullptr) {
      const int32_t kdoc = key_docs != nullptr ? key_docs[b * kv_seq + j] : s.docs[b * s.seq + j];
      if (kdoc != qdoc) return false;
    }
    return !s.causal || key_chunks.global(j) <= gq;
  }
};

/// The keys [first, n) query i of row b scans (every key in per_key mode).
__device__ __forceinline__ void key_window(const Shape& s, const KeyBlock& kb, int64_t b,
                                           int64_t i, int64_t& first, int64_t& n) {
  if (kb.per_key) {
    first = 0;
    n = kb.kv_seq;
    return;
  }
  const int32_t* docs = s.docs ? s.docs + b * s.seq : nullptr;
  first = docs ? doc_lo(docs, i) : 0;
  n = s.causal ? i + 1 : (docs ? doc_hi(docs, i, s.seq) : s.seq);
}

// Row index r = (b * Hq + h) * S + i (the lse order); single-pass online softmax. With dropout
// the row sum stays undropped (lse unchanged) and only the P V terms are masked. A row that sees
// no key (context-parallel blocks only) writes zeros and lse = -inf.
template <bool kDropout, bool kBlockDiff>
__global__ void attention_forward_warp_per_row_kernel(ForwardPtrs p, Shape s, KeyBlock kb) {
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
  const int32_t qdoc = s.docs ? s.docs[b * s.seq + i] : 0;
  const int64_t gq = kb.query_chunks.global(i);
  // Block diffusion: two key ranges (the second empty for a clean row), every key tested.
  [[maybe_unused]] const ops::detail::BlockDiffusionRow bd{
      kBlockDiff ? s.bd_ranges + b * 4 * s.bd_len() : nullptr, static_cast<int>(s.bd_len()),
      s.bd_causal_clean, s.bd_strip};
  [[maybe_unused]] int bd_lo[2] = {0, 0}, bd_hi[2] = {0, 0};
  [[maybe_unused]] const int bd_q = kBlockDiff && kb.per_key ? KeyBlock::doubled(i, s.seq, kb.query_chunks, s.bd_len())
                                                              : static_cast<int>(i);
  if constexpr (kBlockDiff) {
    if (kb.per_key) bd_hi[0] = static_cast<int>(kb.kv_seq);  // a shard: every key, each tested
    else bd.keys_of(static_cast<int>(i), bd_lo, bd_hi);
  }
  for (int range = 0; range < (kBlockDiff ? 2 : 1); ++range) {
    int64_t first, n;
    if constexpr (kBlockDiff) {
      first = range == 0 ? bd_lo[0] : bd_lo[1];  // selects: no local-memory array
      n = range == 0 ? bd_hi[0] : bd_hi[1];
    } else {
      key_window(s, kb, b, i, first, n);
    }
    [[maybe_unused]] uint32_t keep_bits = 0;
    for (int64_t j = first; j < n; ++j) {
      if constexpr (kDropout) {
        if (((j - first) & 31) == 0)
          keep_bits = __ballot_sync(0xffffffffu, s.dropout.keep(b, h, i, j + lane));
      }
      if (kb.per_key && !kb.visible(s, b, qdoc, gq, j)) continue;  // uniform over the warp
      if (kBlockDiff && !bd.visible(bd_q, kb.per_key ? KeyBlock::doubled(j, kb.kv_seq, kb.key_chunks, s.bd_len())
                                                     : static_cast<int>(j)))
        continue;
      const int64_t kv = ((b * kb.kv_seq + j) * s.kv_heads + kh) * s.dim;
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
  }
  const float out_scale = l > 0.0f ? (kDropout ? s.dropout.scale / l : 1.0f / l) : 0.0f;
  store_row(p.out + ((b * s.seq + i) * s.heads + h) * s.dim, acc, out_scale, s.dim, lane);
  if (lane == 0) p.lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// dq of one query row (same row order as the forward), delta already computed.
template <bool kDropout, bool kBlockDiff>
__global__ void attention_dq_warp_per_row_kernel(BackwardPtrs p, Shape s, KeyBlock kb) {
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
  const int32_t qdoc = s.docs ? s.docs[b * s.seq + i] : 0;
  const int64_t gq = kb.query_chunks.global(i);
  [[maybe_unused]] const ops::detail::BlockDiffusionRow bd{
      kBlockDiff ? s.bd_ranges + b * 4 * s.bd_len() : nullptr, static_cast<int>(s.bd_len()),
      s.bd_causal_clean, s.bd_strip};
  [[maybe_unused]] int bd_lo[2] = {0, 0}, bd_hi[2] = {0, 0};
  [[maybe_unused]] const int bd_q = kBlockDiff && kb.per_key ? KeyBlock::doubled(i, s.seq, kb.query_chunks, s.bd_len())
                                                              : static_cast<int>(i);
  if constexpr (kBlockDiff) {
    if (kb.per_key) bd_hi[0] = static_cast<int>(kb.kv_seq);  // a shard: every key, each tested
    else bd.keys_of(static_cast<int>(i), bd_lo, bd_hi);
  }
  for (int range = 0; range < (kBlockDiff ? 2 : 1); ++range) {
    int64_t first, n;
    if constexpr (kBlockDiff) {
      first = range == 0 ? bd_lo[0] : bd_lo[1];  // selects: no local-memory array
      n = range == 0 ? bd_hi[0] : bd_hi[1];
    } else {
      key_window(s, kb, b, i, first, n);
    }
    [[maybe_unused]] uint32_t keep_bits = 0;
    for (int64_t j = first; j < n; ++j) {
      if constexpr (kDropout) {
        if (((j - first) & 31) == 0)
          keep_bits = __ballot_sync(0xffffffffu, s.dropout.keep(b, h, i, j + lane));
      }
      if (kb.per_key && !kb.visible(s, b, qdoc, gq, j)) continue;
      if (kBlockDiff && !bd.visible(bd_q, kb.per_key ? KeyBlock::doubled(j, kb.kv_seq, kb.key_chunks, s.bd_len())
                                                     : static_cast<int>(j)))
        continue;
      const int64_t kv = ((b * kb.kv_seq + j) * s.kv_heads + kh) * s.dim;
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
  }
  store_row(p.dq + qi, dq, s.scale, s.dim, lane);
}

// dk, dv of one key row r = (b * Hkv + kh) * S + j, summed over the query heads of the group.
template <bool kDropout, bool kBlockDiff>
__global__ void attention_dkdv_warp_per_row_kernel(BackwardPtrs p, Shape s, KeyBlock kb) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  const int64_t kv_seq = kb.kv_seq;
  if (row >= s.batch * s.kv_heads * kv_seq) return;
  const int64_t j = row % kv_seq, kh = (row / kv_seq) % s.kv_heads, b = row / (kv_seq * s.kv_heads);
  const int64_t group = s.heads / s.kv_heads;
  const int64_t kv = ((b * kv_seq + j) * s.kv_heads + kh) * s.dim;
  float k[kMaxPerLane], v[kMaxPerLane], dk[kMaxPerLane], dv[kMaxPerLane];
  load_row(k, p.k + kv, s.dim, lane);
  load_row(v, p.v + kv, s.dim, lane);
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) dk[r] = dv[r] = 0.0f;
  [[maybe_unused]] uint32_t keep_bits = 0;
  const int32_t* docs = s.docs ? s.docs + b * s.seq : nullptr;
  int64_t q_first = 0, q_end = s.seq;  // per_key: every query, each tested
  int32_t kdoc = 0;
  int64_t gk = 0;
  if (kb.per_key) {
    if (docs) kdoc = kb.key_docs ? kb.key_docs[b * kv_seq + j] : docs[j];
    gk = kb.key_chunks.global(j);
  } else {
    q_first = s.causal ? j : (docs ? doc_lo(docs, j) : 0);
    q_end = docs ? doc_hi(docs, j, s.seq) : s.seq;
  }
  // Block diffusion: the noisy and the clean queries that see this key, every query tested.
  [[maybe_unused]] const ops::detail::BlockDiffusionRow bd{
      kBlockDiff ? s.bd_ranges + b * 4 * s.bd_len() : nullptr, static_cast<int>(s.bd_len()),
      s.bd_causal_clean, s.bd_strip};
  [[maybe_unused]] int bd_lo[2] = {0, 0}, bd_hi[2] = {0, 0};
  [[maybe_unused]] const int bd_k = kBlockDiff && kb.per_key ? KeyBlock::doubled(j, kv_seq, kb.key_chunks, s.bd_len())
                                                              : static_cast<int>(j);
  if constexpr (kBlockDiff) {
    if (kb.per_key) bd_hi[0] = static_cast<int>(s.seq);  // a shard: every query, each tested
    else bd.queries_of(static_cast<int>(j), bd_lo, bd_hi);
  }
  for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
    for (int range = 0; range < (kBlockDiff ? 2 : 1); ++range) {
      if constexpr (kBlockDiff) {
        q_first = range == 0 ? bd_lo[0] : bd_lo[1];  // selects: no local-memory array
        q_end = range == 0 ? bd_hi[0] : bd_hi[1];
      }
      for (int64_t i = q_first; i < q_end; ++i) {
        [[maybe_unused]] const int64_t i_step = i - q_first;
        if constexpr (kDropout) {
          // Here the lanes draw the next 32 queries of this key.
          if ((i_step & 31) == 0)
            keep_bits = __ballot_sync(0xffffffffu, s.dropout.keep(b, h, i + lane, j));
        }
        if (kb.per_key) {  // uniform over the warp
          if (docs && docs[i] != kdoc) continue;
          if (s.causal && gk > kb.query_chunks.global(i)) continue;
        }
        if (kBlockDiff && !bd.visible(kb.per_key ? KeyBlock::doubled(i, s.seq, kb.query_chunks, s.bd_len())
                                                 : static_cast<int>(i),
                                      bd_k))
          continue;
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
  }
  store_row(p.dk + kv, dk, s.scale, s.dim, lane);
  store_row(p.dv + kv, dv, kDropout ? s.dropout.scale : 1.0f, s.dim, lane);
}

template <bool kDropout, bool kBlockDiff = false>
void launch_simple_forward(const Shape& s, const KeyBlock& kb, const ForwardPtrs& p,
                           cudaStream_t stream) {
  const int64_t rows = s.batch * s.heads * s.seq;
  attention_forward_warp_per_row_kernel<kDropout, kBlockDiff><<<megadlm::detail::grid_for(rows, kWarpsPerBlock),
                                                    kWarpsPerBlock * 32, 0, stream>>>(p, s, kb);
  MDLM_CUDA_CHECK_LAUNCH();
}

template <bool kDropout, bool kBlockDiff = false>
void launch_simple_backward(const Shape& s, const KeyBlock& kb, const BackwardPtrs& p,
                            cudaStream_t stream) {
  const int64_t q_rows = s.batch * s.heads * s.seq;
  attention_dq_warp_per_row_kernel<kDropout, kBlockDiff><<<megadlm::detail::grid_for(q_rows, kWarpsPerBlock),
                                               kWarpsPerBlock * 32, 0, stream>>>(p, s, kb);
  MDLM_CUDA_CHECK_LAUNCH();
  const int64_t kv_rows = s.batch * s.kv_heads * kb.kv_seq;
  attention_dkdv_warp_per_row_kernel<kDropout, kBlockDiff><<<megadlm::detail::grid_for(kv_rows, kWarpsPerBlock),
                                                 kWarpsPerBlock * 32, 0, stream>>>(p, s, kb);
  MDLM_CUDA_CHECK_LAUNCH();
}

void forward_blocks(const Shape& s, const KeyBlock& kb, const ForwardPtrs& p, cudaStream_t stream) {
  if (s.bd_ranges != nullptr) launch_simple_forward<false, true>(s, kb, p, stream);  // no dropout
  else if (s.dropout.p > 0.0f) launch_simple_forward<true>(s, kb, p, stream);
  else launch_simple_forward<false>(s, kb, p, stream);
}

void backward_blocks(const Shape& s, const KeyBlock& kb, const BackwardPtrs& p,
                     cudaStream_t stream) {
  launch_attention_delta(s, p, stream);
  if (s.bd_ranges != nullptr) launch_simple_backward<false, true>(s, kb, p, stream);  // no dropout
  else if (s.dropout.p > 0.0f) launch_simple_backward<true>(s, kb, p, stream);
  else launch_simple_backward<false>(s, kb, p, stream);
}

}  // namespace

void simple_forward(const Shape& s, const ForwardPtrs& p, cudaStream_t stream) {
  forward_blocks(s, KeyBlock::of(s), p, stream);
}

void simple_backward(const Shape& s, const BackwardPtrs& p, cudaStream_t stream) {
  backward_blocks(s, KeyBlock::of(s), p, stream);
}

}  // namespace megadlm::ops::cuda::attn

// ---- key-block entries (attention_impl.h) ----------------------------------------------------

namespace megadlm::ops::cuda {
namespace {

constexpr int kMaxHeadDim = 32 * attn::kMaxPerLane;  // a lane holds 8 dims

void check_cp_tensor(const char* op, const Tensor& t, DType dtype, int64_t numel, const char* what) {
  MDLM_CHECK(t.defined() && t.is_cuda() && t.dtype() == dtype && t.numel() == numel, op, ": ",
             what, " must be a CUDA ", dtype_name(dtype), " tensor of ", numel, " elements, got ",
             t.defined() ? t.str() : std::string("undefined"));
}

/// Shape and KeyBlock of a context-parallel call (the shared checks ran in src/ops/attention.cpp).
void shape_of(const char* op, const AttentionArgs& a, attn::Shape& s, attn::KeyBlock& kb) {
  MDLM_CHECK(a.head_dim <= kMaxHeadDim, op, ": CUDA attention supports head_dim <= ", kMaxHeadDim,
             ", got ", a.head_dim, " (--kv-channels)");
  MDLM_CHECK(a.batch <= 65535 && a.num_heads <= 65535, op, ": batch ", a.batch, " and heads ",
             a.num_heads, " must be <= 65535");
  s = {a.batch,
       a.seq,
       a.num_heads,
       a.num_kv_heads,
       static_cast<int>(a.head_dim),
       a.mask == AttentionMask::Causal,
       a.softmax_scale,
       ops::detail::AttentionDropoutMask::from_args(a),
       a.document_ids != nullptr ? static_cast<const int32_t*>(a.document_ids->data_ptr()) : nullptr};
  kb.kv_seq = a.keys();
  kb.query_chunks = a.query_chunks;
  kb.key_chunks = a.key_chunks;
  kb.key_docs = a.key_document_ids != nullptr && a.document_ids != nullptr
                    ? static_cast<const int32_t*>(a.key_document_ids->data_ptr())
                    : nullptr;
  kb.per_key = kb.kv_seq != a.seq || kb.key_docs != nullptr ||
               (s.causal && !a.query_chunks.same_as(a.key_chunks));
  if (is_block_diffusion(a.mask)) {  // a shard of the doubled rows: every element on its global row
    s.bd_ranges = static_cast<const int32_t*>(a.block_ranges->data_ptr());
    s.bd_causal_clean = a.mask == AttentionMask::BlockDiffusionCausal;
    s.bd_half = a.block_ranges->shape()[2];
    kb.per_key = true;
  }
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

void simple_attention_forward_key_block(const Tensor& q, const Tensor& k, const Tensor& v,
                                        Tensor& out, Tensor& lse, const AttentionArgs& args,
                                        const Stream& stream) {
  const char* op = "cuda::attention_forward_context_parallel";
  attn::Shape s{};
  attn::KeyBlock kb{};
  shape_of(op, args, s, kb);
  const int64_t q_numel = args.batch * args.seq * args.num_heads * args.head_dim;
  const int64_t kv_numel = args.batch * kb.kv_seq * args.num_kv_heads * args.head_dim;
  check_cp_tensor(op, q, DType::BF16, q_numel, "q");
  check_cp_tensor(op, k, DType::BF16, kv_numel, "k");
  check_cp_tensor(op, v, DType::BF16, kv_numel, "v");
  check_cp_tensor(op, out, DType::BF16, q_numel, "out");
  check_cp_tensor(op, lse, DType::F32, args.batch * args.num_heads * args.seq, "lse");
  const attn::ForwardPtrs p{ptr<const attn::bf16>(q), ptr<const attn::bf16>(k),
                            ptr<const attn::bf16>(v), ptr<attn::bf16>(out), ptr<float>(lse)};
  attn::forward_blocks(s, kb, p, megadlm::detail::native_stream(stream));
}

void simple_attention_backward_key_block(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         Tensor& dq, Tensor& dk, Tensor& dv,
                                         const AttentionArgs& args, const Stream& stream) {
  const char* op = "cuda::attention_backward_context_parallel";
  attn::Shape s{};
  attn::KeyBlock kb{};
  shape_of(op, args, s, kb);
  const int64_t q_numel = args.batch * args.seq * args.num_heads * args.head_dim;
  const int64_t kv_numel = args.batch * kb.kv_seq * args.num_kv_heads * args.head_dim;
  check_cp_tensor(op, dout, DType::BF16, q_numel, "dout");
  check_cp_tensor(op, q, DType::BF16, q_numel, "q");
  check_cp_tensor(op, k, DType::BF16, kv_numel, "k");
  check_cp_tensor(op, v, DType::BF16, kv_numel, "v");
  check_cp_tensor(op, out, DType::BF16, q_numel, "out");
  check_cp_tensor(op, lse, DType::F32, args.batch * args.num_heads * args.seq, "lse");
  check_cp_tensor(op, dq, DType::BF16, q_numel, "dq");
  check_cp_tensor(op, dk, DType::BF16, kv_numel, "dk");
  check_cp_tensor(op, dv, DType::BF16, kv_numel, "dv");
  // delta: scratch from the stream-ordered pool, freed after the kernels queued below.
  Tensor delta = Tensor::empty({args.batch, args.num_heads, args.seq}, DType::F32, stream);
  const attn::BackwardPtrs p{ptr<const attn::bf16>(dout), ptr<const attn::bf16>(q),
                             ptr<const attn::bf16>(k),    ptr<const attn::bf16>(v),
                             ptr<const attn::bf16>(out),  ptr<const float>(lse),
                             ptr<attn::bf16>(dq),         ptr<attn::bf16>(dk),
                             ptr<attn::bf16>(dv),         ptr<float>(delta),
                             nullptr};
  attn::backward_blocks(s, kb, p, megadlm::detail::native_stream(stream));
}

}  // namespace megadlm::ops::cuda
