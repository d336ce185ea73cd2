// Internal to the attention family: the launcher interface shared by attention.cu (entries) and
// the kernel files, plus the device primitives of the flash kernels (cp.async, ldmatrix,
// mma.sync m16n8k16 bf16, the padded shared-memory layout). See docs/kernels/attention.md.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include "ops/attention_dropout_mask.h"

namespace megadlm::ops::cuda::attn {

using bf16 = __nv_bfloat16;

/// Problem sizes (contiguous q [B, S, Hq, D]; k, v [B, kv_seq, Hkv, D]; lse [B, Hq, S]).
struct Shape {
  int64_t batch, seq, heads, kv_heads;
  int dim;
  bool causal;
  float scale;  ///< softmax scale (applied to q.k)
  /// Attention dropout; read only by the kernels instantiated with kDropout (dropout.p > 0).
  ops::detail::AttentionDropoutMask dropout;
  /// Per-document attention (packed batches): int32 [B, S] document ids, non-decreasing along
  /// each row, or null for one document per row. The simple kernels and the flash kernels
  /// instantiated with kDocs (docs != null) read it.
  const int32_t* docs = nullptr;
  /// A key block that is not the queries' own rows (context-parallel shards, cached decoding):
  /// key rows per batch row (0: seq) and the keys' int32 [B, kv_seq] document ids (null: docs).
  /// The flash kernels read them only when instantiated with kKeys (separate_keys()).
  int64_t kv_seq = 0;
  const int32_t* key_docs = nullptr;
  /// Block diffusion (ops::AttentionMask::BlockDiffusion*): int32 [B, 4, seq / 2] ranges
  /// (doc_start, doc_end, block_start, block_end of each position; the rule is in
  /// include/megadlm/ops/attention.h), or null. causal is false then; bd_causal_clean selects
  /// BlockDiffusionCausal. Never with docs, a separate key block or dropout.
  const int32_t* bd_ranges = nullptr;
  bool bd_causal_clean = false;
  /// AttentionArgs::block_diffusion_strip: N (> 0) for the composed path's strips, else 0
  /// (BlockDiffusionRow::strip).
  int bd_strip = 0;
  /// L of bd_ranges ([B, 4, L]); 0: seq / 2. A context-parallel shard's rows (the simple
  /// key-block kernels only) are chunk-mapped halves of the whole doubled row of 2L.
  int64_t bd_half = 0;
  __host__ __device__ int64_t bd_len() const { return bd_half > 0 ? bd_half : seq / 2; }
  int64_t keys() const { return kv_seq > 0 ? kv_seq : seq; }
  bool separate_keys() const { return keys() != seq || key_docs != nullptr; }
};

struct ForwardPtrs {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* out;
  float* lse;
};

struct BackwardPtrs {
  const bf16* dout;
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const bf16* out;
  const float* lse;
  bf16* dq;
  bf16* dk;
  bf16* dv;
  float* delta;     ///< scratch [B, Hq, S]: rowsum(dout * out)
  float* dq_accum;  ///< scratch [B, S, Hq, D] fp32 (flash only; null for the simple kernels)
  /// Deterministic flash backward: dq_accum holds dq_slabs = ceil(S / 128) slabs of
  /// dq_slab_stride elements, one per key tile (each element of a slab receives one add, so no
  /// order dependence), summed in slab order by the conversion. 0: one accumulator, atomics.
  int64_t dq_slab_stride = 0;
  int dq_slabs = 1;
};

// Launchers (each checks its launches; the stream comes from the entry).
void flash_forward(const Shape& s, const ForwardPtrs& p, cudaStream_t stream);
void flash_backward(const Shape& s, const BackwardPtrs& p, cudaStream_t stream);
void simple_forward(const Shape& s, const ForwardPtrs& p, cudaStream_t stream);
void simple_backward(const Shape& s, const BackwardPtrs& p, cudaStream_t stream);
/// delta = rowsum(dout * out) for every query row, and dq_accum zeroed when not null (any D).
void launch_attention_delta(const Shape& s, const BackwardPtrs& p, cudaStream_t stream);

inline constexpr float kLog2e = 1.4426950408889634f;

// ---- key order of the flash kernels with dropout ---------------------------------------------
// One Philox call gives the keep words of four consecutive keys of one query row. The mma
// fragments give a thread two adjacent columns per n8 tile, so with keys in natural order two
// threads would each compute the same call and use half of it. With dropout the kernels instead
// load K and V rows through a permutation inside each 16-key block (only the per-lane ldmatrix row
// address changes; S = Q K^T and P V stay consistent because K and V are permuted alike):

/// Forward: column c of a k16 step of S / P holds key fwd_dropout_key(c), so the columns
/// 2t, 2t+1, 2t+8, 2t+9 of thread t (its A fragment of P V) are the keys 4t .. 4t+3.
__host__ __device__ constexpr int fwd_dropout_key(int c) {
  return 4 * ((c & 7) >> 1) + 2 * (c >> 3) + (c & 1);
}

/// Backward: row m of a warp's 16-key block of S^T / dP^T holds key bwd_dropout_key(m), so the
/// rows g, g+8 of a thread are the keys 2g, 2g+1, and threads g, g^1 share one call per query.
__host__ __device__ constexpr int bwd_dropout_key(int m) { return 2 * (m & 7) + (m >> 3); }

/// Both maps must be permutations of 0..15 (checked at compile time).
constexpr bool is_permutation16(int (*f)(int)) {
  unsigned seen = 0;
  for (int c = 0; c < 16; ++c) {
    const int k = f(c);
    if (k < 0 || k > 15 || (seen >> k & 1u)) return false;
    seen |= 1u << k;
  }
  return true;
}
static_assert(is_permutation16(fwd_dropout_key) && is_permutation16(bwd_dropout_key),
              "dropout key orders must permute a 16-key block");

// ---- device primitives of the flash kernels ------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte global -> shared copy that bypasses L1; when !valid nothing is read and the 16 bytes
/// are zero-filled (src-size 0), which is how rows past the sequence end become zeros.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}

/// 4-byte variant (for per-row statistics), zero-filled when !valid.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most `kPending` of this thread's most recent commit groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and lane l receives
/// elements (row l/4, cols 2(l%4), 2(l%4)+1) of each matrix in r[i].
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// Transposed: lane l receives elements (rows 2(l%4), 2(l%4)+1; col l/4) of each matrix.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// d += a * b for one m16n8k16 tile: a is 16x16 bf16 (row-major fragment, 4 regs), b 16x8 bf16
/// (column fragment, 2 regs), d 16x8 fp32. Fragment layouts (g = lane/4, t = lane%4):
/// a: {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, b: {(k 2t..2t+1, n g),
/// (k 2t+8.., n g)}, d: {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as a bf16x2 register, `lo` in the low half (the lower column of a fragment pair).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

/// Shared-memory tiles keep rows of kDim bf16 padded by 16 bytes. A row stride of
/// 2 * kDim + 16 bytes is 4 banks past a multiple of 32 banks, so the 8 rows an ldmatrix 8x8
/// matrix reads (8 consecutive rows, same 16-byte column) fall in 8 disjoint groups of 4 banks:
/// conflict-free ldmatrix (plain and .trans) and cp.async stores. Unlike an XOR swizzle, every
/// fragment address is then a per-lane base plus a compile-time offset, which the ldmatrix
/// immediate absorbs, so no address registers are held per k step.
template <int kDim>
inline constexpr int kPaddedRowBytes = kDim * 2 + 16;

/// Copies a [kRows, kDim] bf16 tile (global rows `stride` elements apart) into a padded
/// shared tile; rows >= `valid_rows` are zero-filled. All kThreads threads of the block call it.
/// Offsets inside a tile are 32-bit (kRows * stride stays far below 2^31 for any real head count),
/// which keeps the per-thread copy addresses in single registers.
template <int kRows, int kDim, int kThreads>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const bf16* gmem, int stride,
                                                int valid_rows, int tid) {
  constexpr int kChunksPerRow = kDim / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile copy must split evenly over the block");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int row = idx / kChunksPerRow;
    const int chunk = idx % kChunksPerRow;
    const bool valid = row < valid_rows;
    // An invalid row still needs a mapped source address: use the tile's first row.
    const bf16* src = gmem + (valid ? row * stride + chunk * 8 : 0);
    cp_async_16(smem + row * kPaddedRowBytes<kDim> + chunk * 16, src, valid);
  }
}

// ---- per-document attention in the flash kernels ---------------------------------------------

/// First position p in [lo, hi) of a non-decreasing id row with row[p] > id (kUpper) or
/// row[p] >= id (!kUpper); hi when there is none. One whole warp calls it (same arguments in
/// every lane): each step the 32 lanes probe 32 evenly spaced positions and a ballot narrows the
/// range by 32x, so seq 2048 takes 3 rounds of loads and 32K takes 4.
template <bool kUpper>
__device__ __forceinline__ int warp_partition_point(const int32_t* __restrict__ row, int lo,
                                                    int hi, int32_t id, int lane) {
  while (lo < hi) {  // the answer lies in [lo, hi]; position hi counts as "true"
    const int stride = (hi - lo + 31) / 32;
    const int pos = lo + lane * stride;
    bool is_true = pos >= hi;
    if (!is_true) {
      const int32_t x = row[pos];
      is_true = kUpper ? x > id : x >= id;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, is_true);
    if (ballot & 1u) return lo;  // lane 0 probes lo itself
    // First true lane k >= 1 (or none: k = 32, and 32 * stride >= hi - lo puts hi there): the
    // answer is in (lo + (k-1) stride, min(lo + k stride, hi)].
    const int k = ballot ? __ffs(ballot) - 1 : 32;
    const int next_hi = min(lo + k * stride, hi);
    lo = lo + (k - 1) * stride + 1;
    hi = next_hi;
  }
  return lo;
}

/// Document ranges at both ends of a tile of positions [p0, p1] (p1 the last position inside
/// the sequence) of batch row `row` (seq ids): out[0], out[1] = first position and one past the
/// last of p0's document, out[2], out[3] = the same for p1's. Warps 0..3 of the block run one
/// search each (the block needs >= 4 warps); the caller synchronizes before reading `out`.
/// Since documents are contiguous runs, every position of [p0, p1] lies in a document inside
/// [out[0], out[3]), and the whole tile is one document exactly when out[2] < out[1].
__device__ __forceinline__ void document_bounds(const int32_t* __restrict__ row, int p0, int p1,
                                                int seq, int warp, int lane, int* out) {
  if (warp >= 4) return;
  const int pos = warp < 2 ? p0 : p1;
  const int32_t id = row[pos];
  const int r = (warp & 1) ? warp_partition_point<true>(row, pos + 1, seq, id, lane)
                           : warp_partition_point<false>(row, 0, pos, id, lane);
  if (lane == 0) out[warp] = r;
}

/// The key range of a query tile whose rows span documents [first_id, last_id] (ids of its first
/// and last rows), against a separate key block (key ids `keys`, non-decreasing, kv_seq long):
/// out[0] = first key with id >= first_id, out[1] = first key with id > first_id, out[2] = first
/// key with id >= last_id, out[3] = first key with id > last_id. Every key a row of the tile can
/// see lies in [out[0], out[3]) (possibly empty); when first_id == last_id every key of
/// [out[2], out[1]) is visible to every row, otherwise that range is empty. Warps 0..3 run one
/// search each; the caller synchronizes before reading `out`.
__device__ __forceinline__ void key_document_bounds(const int32_t* __restrict__ keys, int kv_seq,
                                                    int32_t first_id, int32_t last_id, int warp,
                                                    int lane, int* out) {
  if (warp >= 4) return;
  const int32_t id = warp < 2 ? first_id : last_id;
  const int r = (warp & 1) ? warp_partition_point<true>(keys, 0, kv_seq, id, lane)
                           : warp_partition_point<false>(keys, 0, kv_seq, id, lane);
  if (lane == 0) out[warp] = r;
}

}  // namespace megadlm::ops::cuda::attn
