// Flash-attention backward (FlashAttention-2 algorithm) for head_dim 64 and 128, in three
// kernels: (1) delta = rowsum(dO * O) per query row, zeroing the fp32 dQ accumulator; (2) one
// block per (key tile, KV head, batch) that loops over every query head of the KV group and every
// query tile, recomputes P from Q, K and the forward's LSE, keeps dK and dV in fp32 registers and
// adds each tile's dQ into the accumulator with vector atomics (deterministic mode: into its key
// tile's own slab); (3) dQ fp32 -> bf16 with the softmax scale (summing the slabs in order). Layout, budgets and the reasons: docs/kernels/attention.md.
#include <algorithm>
#include <cmath>
#include "core/cuda/cuda_utils.h"
#include "ops/attention_block_diffusion.h"
#include "ops/cuda/attention_common.cuh"

namespace megadlm::ops::cuda::attn {
namespace {

// 8 warps own 16 keys each of a 128-key tile; a query tile is 64 rows. Per thread: dK and dV
// accumulators (2 * D/2 fp32), P^T of the query tile (32 fp32) and dP^T of half of it (16; the
// halves bound the live registers at D = 128). The transposed
// products (S^T = K Q^T, dP^T = V dO^T) leave P^T and dS^T in the accumulator layout that is
// exactly the A operand of dV += P^T dO and dK += dS^T Q, so only dS goes through shared memory
// (for dQ = dS K, whose rows are queries).
template <int kDim_>
struct BackwardConfig {
  static constexpr int kDim = kDim_;
  static constexpr int kBlockN = 128, kBlockM = 64, kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQTiles = kBlockM / 8;   // n8 tiles of S^T / dP^T (queries)
  static constexpr int kDTiles = kDim / 8;      // n8 tiles of dK / dV
  static constexpr int kKSteps = kDim / 16;     // k16 steps over d (S^T, dP^T)
  // dQ = dS K: 4 warps over the 64 query rows (16 each) x 2 warps over the d halves.
  static constexpr int kDqDTiles = kDim / 16;   // n8 tiles per warp
  static constexpr int kRowBytes = kPaddedRowBytes<kDim>;      // shared row strides (padded)
  static constexpr int kDsRowBytes = kPaddedRowBytes<kBlockM>;  // dS^T rows: one key, 64 queries
  static constexpr int kKVBytes = kBlockN * kRowBytes;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kSmemK = 0;
  static constexpr int kSmemV = kSmemK + kKVBytes;
  static constexpr int kSmemQ = kSmemV + kKVBytes;     // 2 stages
  static constexpr int kSmemDo = kSmemQ + 2 * kQBytes;  // 2 stages
  static constexpr int kSmemDs = kSmemDo + 2 * kQBytes;
  static constexpr int kSmemLse = kSmemDs + kBlockN * kDsRowBytes;  // 2 stages of kBlockM f32
  static constexpr int kSmemDelta = kSmemLse + 2 * kBlockM * 4;     // 2 stages
  static constexpr int kSmemBytes = kSmemDelta + 2 * kBlockM * 4;
  // kDocs only, after the above: 4 document bounds, the key tile's ids, 2 stages of query ids.
  static constexpr int kSmemDocs = kSmemBytes;
  static constexpr int kDocBytes = 4 * (4 + kBlockN + 2 * kBlockM);
  // kBlockDiff only, in the same place: the query-tile plan (first, count of the noisy and of
  // the clean query tiles: BlockDiffusionTiles), then the query ranges of each key of the tile,
  // lo[2][kBlockN] and hi[2][kBlockN] (BlockDiffusionRow::queries_of).
  static constexpr int kBdBytes = 4 * (4 + 4 * kBlockN);
  static_assert(kBlockN == 16 * kWarps && kBlockM == 64, "warp layout assumes these tiles");
  static_assert(kThreads >= 3 * kBlockM, "threads 2 kBlockM.. copy the query ids");
};

// Shared (rows padded by 16 bytes): D = 128: K, V 34 KB each, Q and dO double-buffered 34 KB
// each, dS^T 18 KB, LSE/delta 1 KB = 155 KB, one block of 8 warps per SM (255 registers).
// D = 64: 91 KB, 175 registers (one block per SM by registers).
using Bwd128 = BackwardConfig<128>;
using Bwd64 = BackwardConfig<64>;

// One warp per (b, s, h) row of dO/O: delta[b, h, s] = sum_d dO * O in fp32 (from the bf16 values
// the forward wrote), and the row of the fp32 dQ accumulator zeroed. Any D (the simple path uses
// it too); bf16 pairs when D is even.
__global__ void attention_delta_kernel(const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                       float* __restrict__ delta, float* __restrict__ dq_accum,
                                       int64_t rows, int seq, int heads, int dim, int slabs,
                                       int64_t slab_stride) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const bf16* a = dout + row * dim;
  const bf16* o = out + row * dim;
  float sum = 0.0f;
  if (dim % 2 == 0) {
    for (int d = 2 * lane; d < dim; d += 64) {
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(a + d));
      const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o + d));
      sum += x.x * y.x + x.y * y.y;
    }
  } else {
    for (int d = lane; d < dim; d += 32) sum += __bfloat162float(a[d]) * __bfloat162float(o[d]);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const int64_t h = row % heads, bs = row / heads;  // row = (b * seq + s) * heads + h
  const int64_t b = bs / seq, s = bs % seq;
  if (lane == 0) delta[(b * heads + h) * seq + s] = sum;
  if (dq_accum != nullptr) {
    for (int sl = 0; sl < slabs; ++sl)
      for (int d = lane; d < dim; d += 32) dq_accum[sl * slab_stride + row * dim + d] = 0.0f;
  }
}

// kDropout: with the keep mask Z of s.dropout and c = 1/(1-p), dV += (P^T * Z) dO (times c at
// the end) and dS^T = P^T * (dP^T * Z c - delta). K and V rows are read in the bwd_dropout_key
// order (attention_common.cuh), so a thread's keys are 2g, 2g+1 and the pair of threads g, g^1
// (lanes l, l^4) shares one Philox call per query: each computes one of the two queries of its
// columns and they swap the keep bits through one shuffle per query tile.
// kDocs: per-document attention (s.docs). The queries that can see a key of this tile form the
// range [first position of key n0's document, one past the last position of the tile's last
// key's document) (documents are contiguous runs; causal starts at n0 as before); only the query
// tiles overlapping it are visited, and P^T is 0 where the key's and the query's document ids
// differ. The ids sit in shared memory after the tiles (kDocBytes).
// kKeys: the keys are a separate block (s.kv_seq rows of k, v, dk, dv; with kDocs their own ids
// s.key_docs): one block per key tile of kv_seq, and with kDocs the query tiles visited are those
// whose ids lie in [id of key n0, id of the tile's last key] (key_document_bounds over the query
// ids; possibly none: then one tile is visited, all masked, and dK = dV = 0). Only without causal
// mask and dropout, as in the forward.
// kBlockDiff: block diffusion (s.bd_ranges; ops/attention_block_diffusion.h), alone, with
// seq / 2 a multiple of kBlockN (the key tile and every query tile lie in one half). The query
// ranges of the tile's keys go to shared memory (kBdBytes); the block visits the query tiles of
// [lo[0] of key n0, hi[0] of its last key) (noisy queries) and then of [lo[1] of key n0, hi[1]
// of its last key) (clean queries; empty for a noisy key tile, and the noisy range of a clean key
// tile may be empty), and P^T is 0 outside each key's range, tested only in tiles that are not
// inside the range of every key of the warp.
template <class C, bool kCausal, bool kDropout, bool kDocs, bool kKeys, bool kBlockDiff>
__global__ void __launch_bounds__(C::kThreads) flash_backward_kernel(BackwardPtrs p, Shape s) {
  static_assert(!kKeys || (!kCausal && !kDropout), "a separate key block: no causal mask, no dropout");
  static_assert(!kBlockDiff || (!kCausal && !kDropout && !kDocs && !kKeys),
                "block diffusion: no other mask, no dropout, no documents, no key block");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kDim = C::kDim, kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  constexpr int kQTiles = C::kQTiles, kDTiles = C::kDTiles, kRowBytes = C::kRowBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int seq = static_cast<int>(s.seq);
  const int kv_seq = kKeys ? static_cast<int>(s.kv_seq) : seq;  // key rows per batch row
  const int heads = static_cast<int>(s.heads);
  const int group = static_cast<int>(s.heads / s.kv_heads);
  const int n0 = blockIdx.x * kBlockN;
  const int kvh = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int q_stride = heads * kDim;
  const int kv_stride = static_cast<int>(s.kv_heads) * kDim;
  const float scale_log2 = s.scale * kLog2e;

  const uint32_t base = smem_addr(smem);
  const uint32_t sK = base + C::kSmemK, sV = base + C::kSmemV, sQ = base + C::kSmemQ;
  const uint32_t sDo = base + C::kSmemDo, sDs = base + C::kSmemDs;
  const uint32_t sLse = base + C::kSmemLse, sDelta = base + C::kSmemDelta;
  const float* lse_smem = reinterpret_cast<const float*>(smem + C::kSmemLse);
  const float* delta_smem = reinterpret_cast<const float*>(smem + C::kSmemDelta);
  // kDocs: [0, 4) document bounds (document_bounds), [4, 4 + kBlockN) the ids of keys n0..,
  // then 2 stages of kBlockM query ids (stage it & 1 holds iteration it's query tile).
  int* const doc_smem = reinterpret_cast<int*>(smem + C::kSmemDocs);
  const uint32_t sQueryDocs = base + C::kSmemDocs + (4 + kBlockN) * 4;
  const int32_t* const docs = kDocs ? s.docs + b * seq : nullptr;
  const int32_t* const key_docs = kDocs ? (kKeys ? s.key_docs + b * kv_seq : docs) : nullptr;
  // kBlockDiff: [0, 4) the query-tile plan, then lo[2][kBlockN], hi[2][kBlockN] (never with kDocs).
  int* const bd_plan = reinterpret_cast<int*>(smem + C::kSmemDocs);
  int* const bd_lo = bd_plan + 4;
  int* const bd_hi = bd_lo + 2 * kBlockN;

  // Queries [q_begin, q_end) may see keys of this tile. Causal: query tiles that end before this
  // key tile starts see none of its keys.
  int q_begin = kCausal ? n0 : 0, q_end = seq;
  if constexpr (kDocs) {
    if constexpr (kKeys)
      key_document_bounds(docs, seq, key_docs[n0], key_docs[min(n0 + kBlockN, kv_seq) - 1], warp,
                          lane, doc_smem);
    else document_bounds(docs, n0, min(n0 + kBlockN, seq) - 1, seq, warp, lane, doc_smem);
    for (int r = tid; r < kBlockN; r += C::kThreads)
      doc_smem[4 + r] = n0 + r < kv_seq ? key_docs[n0 + r] : -1;  // keys past the end: never stored
    __syncthreads();
    if constexpr (kKeys) {
      // The range may be empty (no query of these documents): visit one query tile anyway, all
      // masked, so that the loop structure stays as it is; dK and dV stay 0.
      if (tid == 0) {
        doc_smem[0] = min(doc_smem[0], seq - 1);
        doc_smem[3] = max(doc_smem[3], doc_smem[0] / kBlockM * kBlockM + 1);
      }
      __syncthreads();
    }
    if (!kCausal) q_begin = doc_smem[0];  // causal: n0 is inside key n0's document already
    q_end = doc_smem[3];
  }
  if constexpr (kBlockDiff) {
    const ops::detail::BlockDiffusionRow bd{s.bd_ranges + b * seq * 2, seq / 2, s.bd_causal_clean, s.bd_strip};
    for (int r = tid; r < kBlockN; r += C::kThreads) {
      int lo[2], hi[2];
      bd.queries_of(n0 + r, lo, hi);
      bd_lo[r] = lo[0];
      bd_lo[kBlockN + r] = lo[1];
      bd_hi[r] = hi[0];
      bd_hi[kBlockN + r] = hi[1];
    }
    if (tid == 0) {  // the plan from the ranges of the first and the last key
      int lo_first[2], hi_first[2], lo_last[2], hi_last[2];
      bd.queries_of(n0, lo_first, hi_first);
      bd.queries_of(n0 + kBlockN - 1, lo_last, hi_last);
      ops::detail::BlockDiffusionTiles plan =
          ops::detail::BlockDiffusionTiles::of(lo_first, hi_last, kBlockM);
      // >= 1 with valid ranges (the key's own query sees it); with malformed ones still one
      // tile inside the row, so that the loop keeps its shape.
      if (plan.total() == 0) {
        plan.first[0] = min(plan.first[0], seq / kBlockM - 1);
        plan.count[0] = 1;
      }
      bd_plan[0] = plan.first[0];
      bd_plan[1] = plan.count[0];
      bd_plan[2] = plan.first[1];
      bd_plan[3] = plan.count[1];
    }
    __syncthreads();
  }
  const int q_tile_first = q_begin / kBlockM;
  // >= 1 since q_begin <= n0 < q_end (query n0 sees key n0).
  const int q_tiles =
      kBlockDiff ? bd_plan[1] + bd_plan[3] : (q_end + kBlockM - 1) / kBlockM - q_tile_first;
  const int iters = group * q_tiles;  // (query head of the group, query tile) pairs
  // Inside the loop the document variant re-derives these two from shared memory rather than
  // holding them in registers (D = 128 has none to spare).
  auto first_q_tile = [&]() -> int {
    if constexpr (kDocs) return (kCausal ? n0 : doc_smem[0]) / kBlockM;
    else return q_tile_first;
  };
  auto num_q_tiles = [&]() -> int {
    if constexpr (kDocs) return (doc_smem[3] + kBlockM - 1) / kBlockM - first_q_tile();
    else if constexpr (kBlockDiff) return bd_plan[1] + bd_plan[3];
    else return q_tiles;
  };
  // The first query of the ti-th query tile visited (ti < num_q_tiles()).
  auto q_tile_start = [&](int ti) -> int {
    if constexpr (kBlockDiff) {
      const int count0 = bd_plan[1];
      return (ti < count0 ? bd_plan[0] + ti : bd_plan[2] + (ti - count0)) * kBlockM;
    } else {
      return (first_q_tile() + ti) * kBlockM;
    }
  };

  // Q, dO tiles and the LSE/delta rows of iteration `it` into `stage`.
  auto load_query_tile = [&](int it, int stage) {
    const int h = kvh * group + it / num_q_tiles();
    const int q0 = q_tile_start(it % num_q_tiles());
    const int64_t offset = ((b * seq + q0) * heads + h) * kDim;
    load_tile_async<kBlockM, kDim, C::kThreads>(sQ + stage * C::kQBytes, p.q + offset, q_stride,
                                                seq - q0, tid);
    load_tile_async<kBlockM, kDim, C::kThreads>(sDo + stage * C::kQBytes, p.dout + offset,
                                                q_stride, seq - q0, tid);
    const int64_t stat = (b * heads + h) * seq + q0;
    if (tid < kBlockM) {
      const bool valid = q0 + tid < seq;
      cp_async_4(sLse + (stage * kBlockM + tid) * 4, p.lse + (valid ? stat + tid : 0), valid);
    } else if (tid < 2 * kBlockM) {
      const int r = tid - kBlockM;
      const bool valid = q0 + r < seq;
      cp_async_4(sDelta + (stage * kBlockM + r) * 4, p.delta + (valid ? stat + r : 0), valid);
    } else if (kDocs && tid < 3 * kBlockM) {
      const int r = tid - 2 * kBlockM;
      const bool valid = q0 + r < seq;
      cp_async_4(sQueryDocs + (stage * kBlockM + r) * 4, s.docs + (valid ? b * seq + q0 + r : 0),
                 valid);
    }
  };

  const int64_t kv_offset = ((b * kv_seq + n0) * s.kv_heads + kvh) * kDim;
  load_tile_async<kBlockN, kDim, C::kThreads>(sK, p.k + kv_offset, kv_stride, kv_seq - n0, tid);
  load_tile_async<kBlockN, kDim, C::kThreads>(sV, p.v + kv_offset, kv_stride, kv_seq - n0, tid);
  load_query_tile(0, 0);
  cp_async_commit();

  // Per-lane ldmatrix bases (fragment layouts as in attention_forward.cu); k steps, tiles and
  // stages only add compile-time or per-iteration offsets.
  // "rows" pattern: lanes 0-15 rows 0-15 at columns 0-7, lanes 16-31 rows 0-15 at columns 8-15:
  // A operands (K, V) and .trans B operands ([k][n] storage: Q, dO, K for dQ).
  const uint32_t rows_lane = (lane & 15) * kRowBytes + (lane >> 4) * 16;
  // The same pattern for K and V as the A operands (key = row) and as the .trans B operand of
  // dQ = dS K (key = k index): in the dropout key order when kDropout. dS^T is stored by
  // accumulator row, so its rows are in that order too and dQ pairs them with the same K rows.
  const uint32_t key_rows_lane =
      (kDropout ? bwd_dropout_key(lane & 15) : (lane & 15)) * kRowBytes + (lane >> 4) * 16;
  // "pairs" pattern: rows (lane & 7) + 8 (lane >> 4), columns 8 ((lane >> 3) & 1): B operands
  // from [n][k] storage (Q, dO in S^T, dP^T) and the .trans A operand of dS.
  const int pair_row = (lane & 7) + ((lane >> 4) << 3);
  const int pair_col = ((lane >> 3) & 1) * 16;
  const uint32_t pairs_lane = pair_row * kRowBytes + pair_col;
  const uint32_t k_warp = sK + warp * 16 * kRowBytes + key_rows_lane;
  const uint32_t v_warp = sV + warp * 16 * kRowBytes + key_rows_lane;
  // dQ warp tile: query rows 16 wq.., d columns [wd * D/2, (wd + 1) * D/2).
  const int wq = warp % 4, wd = warp / 4;
  const uint32_t ds_a = sDs + pair_row * C::kDsRowBytes + pair_col + wq * 32;
  const uint32_t k_b = sK + key_rows_lane + wd * kDim;  // wd * D/2 bf16 columns = wd * D bytes

  float acc_dk[kDTiles][4], acc_dv[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[dt][e] = acc_dv[dt][e] = 0.0f;

  const int key0 = n0 + warp * 16;  // first key of this warp
  // Accumulator row half r of this thread holds key key0 + key_of_row(r).
  auto key_of_row = [&](int r) { return kDropout ? 2 * g + r : g + 8 * r; };

  for (int it = 0; it < iters; ++it) {
    const int stage = it & 1;
    // The other stage was last read before the second barrier of iteration it-1, which every
    // thread has passed: refill it now so the copy overlaps this whole iteration.
    if (it + 1 < iters) load_query_tile(it + 1, stage ^ 1);
    cp_async_commit();

    // ---- dropout keep bits of this tile, drawn before the wait so the integer work overlaps
    // the copies. Thread (g, t) draws, for each n8 tile nt, query q0 + 8 nt + 2t + (g & 1) and
    // keys key0 + 4 (g >> 1) .. + 3 (its own two keys and its partner's), bits 4 nt + word.
    // After the swap with lane ^ 4, bit 4 nt + r of keep_col[c] is the element of row half r
    // (key key0 + 2g + r) and column 2t + c of n8 tile nt ----
    [[maybe_unused]] uint32_t keep_col[2] = {0u, 0u};
    if constexpr (kDropout) {
      const int h = kvh * group + it / num_q_tiles();  // as below
      const int q0 = q_tile_start(it % num_q_tiles());
      const uint32_t key_group =
          static_cast<uint32_t>((s.dropout.key_offset + key0) / 4) + (g >> 1);
      uint32_t mine = 0;
#pragma unroll
      for (int nt = 0; nt < kQTiles; ++nt) {
        const PhiloxWords w =
            s.dropout.group_words(b, h, q0 + nt * 8 + 2 * t + (g & 1), key_group);
#pragma unroll
        for (int k = 0; k < 4; ++k) mine |= uint32_t(s.dropout.keeps(w.w[k])) << (4 * nt + k);
      }
      uint32_t theirs = __shfl_xor_sync(0xffffffffu, mine, 4);
      // Both calls cover keys 4 (g >> 1) + 0..3; this thread's are words 2 (g & 1) + r.
      mine >>= 2 * (g & 1);
      theirs >>= 2 * (g & 1);
      keep_col[0] = (g & 1) ? theirs : mine;
      keep_col[1] = (g & 1) ? mine : theirs;
    }
    // Element (nt, e): row half e / 2, column e % 2.
    [[maybe_unused]] auto kept = [&](int nt, int e) {
      return (keep_col[e & 1] >> (4 * nt + (e >> 1))) & 1u;
    };

    cp_async_wait<1>();
    __syncthreads();  // tile `it` (and K, V) visible to all warps

    const int h = kvh * group + it / num_q_tiles();
    const int q0 = q_tile_start(it % num_q_tiles());
    const uint32_t sQs = sQ + stage * C::kQBytes, sDos = sDo + stage * C::kQBytes;

    // kDocs: bit 4 nt + e of `visible` says whether element (nt, e) below (key
    // key0 + key_of_row(e / 2), query q0 + 8 nt + 2t + e % 2) is seen: both inside the sequence,
    // one document, and key <= query when causal. Gathered here, before S^T is live, so the
    // whole mask costs one register through the tile (D = 128 has no others to spare).
    [[maybe_unused]] uint32_t visible = 0u;
    if constexpr (kDocs) {
      const int* const query_ids = doc_smem + 4 + kBlockN + stage * kBlockM;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = key0 + key_of_row(r);
        const int key_id = doc_smem[4 + key - n0];
#pragma unroll
        for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int ql = nt * 8 + 2 * t + c, q = q0 + ql;
            const bool seen = key < kv_seq && q < seq && query_ids[ql] == key_id &&
                              (!kCausal || key <= q);
            visible |= uint32_t(seen) << (4 * nt + 2 * r + c);
          }
      }
    }
    // kBlockDiff: the same word from the keys' query ranges of this tile's half. The ends of the
    // ranges are non-decreasing along the keys, so the whole tile is visible to the warp's 16
    // keys iff [q0, q0 + kBlockM) lies in [lo of its last key, hi of its first): no test then.
    if constexpr (kBlockDiff) {
      const int* const lo = bd_lo + (q0 >= seq / 2 ? kBlockN : 0);
      const int* const hi = lo + 2 * kBlockN;
      if (q0 >= lo[warp * 16 + 15] && q0 + kBlockM <= hi[warp * 16]) {
        visible = 0xffffffffu;
      } else {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key = warp * 16 + key_of_row(r);  // in the tile
          const int key_lo = lo[key], key_hi = hi[key];
#pragma unroll
          for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int q = q0 + nt * 8 + 2 * t + c;
              visible |= uint32_t(q >= key_lo && q < key_hi) << (4 * nt + 2 * r + c);
            }
        }
      }
    }

    // ---- S^T = K Q^T for this warp's 16 keys x 64 queries ----
    float acc_s[kQTiles][4];
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt][e] = 0.0f;
#pragma unroll 1
    for (int ks = 0; ks < C::kKSteps; ++ks) {
      uint32_t ka[4];
      ldmatrix_x4(ka, k_warp + ks * 32);
#pragma unroll
      for (int np = 0; np < kQTiles / 2; ++np) {
        uint32_t qb[4];
        ldmatrix_x4(qb, sQs + pairs_lane + np * 16 * kRowBytes + ks * 32);
        mma_bf16_16816(acc_s[2 * np], ka, qb[0], qb[1]);
        mma_bf16_16816(acc_s[2 * np + 1], ka, qb[2], qb[3]);
      }
    }

    // ---- P^T = exp(scale * S^T - lse), masked entries 0 ----
    // Element (nt, e) is key key0 + key_of_row(e / 2), query q0 + 8 nt + 2t + e % 2.
    const bool needs_mask = kDocs || kBlockDiff ? visible != 0xffffffffu
                                  : q0 + kBlockM > seq || key0 + 16 > kv_seq ||
                                        (kCausal && key0 + 15 > q0);
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int ql = nt * 8 + 2 * t + c;
        const float lse_log2 = lse_smem[stage * kBlockM + ql] * kLog2e;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 2 * r + c;
          float pv = exp2f(fmaf(acc_s[nt][e], scale_log2, -lse_log2));
          if (needs_mask) {
            const int key = key0 + key_of_row(r), q = q0 + ql;
            const bool masked = kDocs || kBlockDiff ? !((visible >> (4 * nt + e)) & 1u)
                                      : key >= kv_seq || q >= seq || (kCausal && key > q);
            if (masked) pv = 0.0f;
          }
          acc_s[nt][e] = pv;
        }
      }
    }

    // ---- per half of the query tile (32 queries, to bound live registers): dP^T = V dO^T,
    // dS^T = P^T (dP^T - delta), then dV += P^T dO and dK += dS^T Q. Accumulator tiles
    // (2kk, 2kk+1) form the A fragment of k16 step kk; dO and Q are [query][d] in shared
    // memory, read as B via .trans. dS^T also goes to shared memory (bf16) for dQ. ----
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      constexpr int kHalfTiles = kQTiles / 2;
      float acc_dp[kHalfTiles][4];
#pragma unroll
      for (int nt = 0; nt < kHalfTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dp[nt][e] = 0.0f;
#pragma unroll 1
      for (int ks = 0; ks < C::kKSteps; ++ks) {
        uint32_t va[4];
        ldmatrix_x4(va, v_warp + ks * 32);
#pragma unroll
        for (int np = 0; np < kHalfTiles / 2; ++np) {
          uint32_t dob[4];
          ldmatrix_x4(dob, sDos + pairs_lane + (half * kHalfTiles / 2 + np) * 16 * kRowBytes +
                               ks * 32);
          mma_bf16_16816(acc_dp[2 * np], va, dob[0], dob[1]);
          mma_bf16_16816(acc_dp[2 * np + 1], va, dob[2], dob[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kHalfTiles; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float dlt = delta_smem[stage * kBlockM + (half * kHalfTiles + nt) * 8 + 2 * t + c];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float dpv = acc_dp[nt][2 * r + c];
            if constexpr (kDropout)
              dpv = kept(half * kHalfTiles + nt, 2 * r + c) ? dpv * s.dropout.scale : 0.0f;
            acc_dp[nt][2 * r + c] = acc_s[half * kHalfTiles + nt][2 * r + c] * (dpv - dlt);
          }
        }
      }
#pragma unroll
      for (int kh = 0; kh < kHalfTiles / 2; ++kh) {
        const int kk = half * kHalfTiles / 2 + kh;  // k16 step over the 64 queries
        // dV takes the dropped P^T (without 1/(1-p), applied to dV at the end).
        auto p_dropped = [&](int nt, int e) {
          if constexpr (kDropout) return kept(nt, e) ? acc_s[nt][e] : 0.0f;
          else return acc_s[nt][e];
        };
        uint32_t pa[4], da[4];
        pa[0] = pack_bf16(p_dropped(2 * kk, 0), p_dropped(2 * kk, 1));
        pa[1] = pack_bf16(p_dropped(2 * kk, 2), p_dropped(2 * kk, 3));
        pa[2] = pack_bf16(p_dropped(2 * kk + 1, 0), p_dropped(2 * kk + 1, 1));
        pa[3] = pack_bf16(p_dropped(2 * kk + 1, 2), p_dropped(2 * kk + 1, 3));
        da[0] = pack_bf16(acc_dp[2 * kh][0], acc_dp[2 * kh][1]);
        da[1] = pack_bf16(acc_dp[2 * kh][2], acc_dp[2 * kh][3]);
        da[2] = pack_bf16(acc_dp[2 * kh + 1][0], acc_dp[2 * kh + 1][1]);
        da[3] = pack_bf16(acc_dp[2 * kh + 1][2], acc_dp[2 * kh + 1][3]);
        // dS^T rows (warp * 16 + g, +8) = accumulator rows (keys key_of_row), columns query
        // (n8 tiles 2kk, 2kk+1).
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            const uint32_t addr =
                sDs + (warp * 16 + g + 8 * r) * C::kDsRowBytes + (2 * kk + hi) * 16 + 4 * t;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(da[2 * hi + r]) : "memory");
          }
        }
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          const uint32_t off = rows_lane + kk * 16 * kRowBytes + dp * 32;
          uint32_t dob[4], qb[4];
          ldmatrix_x4_trans(dob, sDos + off);
          ldmatrix_x4_trans(qb, sQs + off);
          mma_bf16_16816(acc_dv[2 * dp], pa, dob[0], dob[1]);
          mma_bf16_16816(acc_dv[2 * dp + 1], pa, dob[2], dob[3]);
          mma_bf16_16816(acc_dk[2 * dp], da, qb[0], qb[1]);
          mma_bf16_16816(acc_dk[2 * dp + 1], da, qb[2], qb[3]);
        }
      }
    }
    __syncthreads();  // dS^T of all 8 warps in shared memory

    // ---- dQ[q0 + 16 wq .., wd * D/2 ..] += dS K over the 128 keys; fp32 vector atomics ----
    float acc_dq[C::kDqDTiles][4];
#pragma unroll
    for (int dt = 0; dt < C::kDqDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dq[dt][e] = 0.0f;
#pragma unroll 1
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      // A = dS (query x key) read from dS^T [key][query] with .trans: matrices (keys 0-7,
      // queries 0-7), (keys 0-7, queries 8-15), (keys 8-15, q 0-7), (keys 8-15, q 8-15).
      uint32_t dsa[4];
      ldmatrix_x4_trans(dsa, ds_a + kk * 16 * C::kDsRowBytes);
#pragma unroll
      for (int dp = 0; dp < C::kDqDTiles / 2; ++dp) {
        uint32_t kb[4];
        ldmatrix_x4_trans(kb, k_b + kk * 16 * kRowBytes + dp * 32);
        mma_bf16_16816(acc_dq[2 * dp], dsa, kb[0], kb[1]);
        mma_bf16_16816(acc_dq[2 * dp + 1], dsa, kb[2], kb[3]);
      }
    }
    // Quad neighbours t, t^1 swap halves so each thread holds 4 consecutive columns of one row:
    // even t keeps row g, cols 2t..2t+3; odd t keeps row g+8, cols 2t-2..2t+1. One 16-byte
    // atomic (sm_90 float4 atomicAdd) instead of two 8-byte ones.
    const bool odd = t & 1;
    const int q_row = q0 + wq * 16 + g + (odd ? 8 : 0);
    // Deterministic mode: this key tile's own slab (dq_slab_stride 0 otherwise).
    float* dq_row = p.dq_accum + blockIdx.x * p.dq_slab_stride +
                    ((b * seq + q_row) * heads + h) * kDim + wd * (kDim / 2) + 2 * (t & ~1);
#pragma unroll
    for (int dt = 0; dt < C::kDqDTiles; ++dt) {
      const float send0 = odd ? acc_dq[dt][0] : acc_dq[dt][2];
      const float send1 = odd ? acc_dq[dt][1] : acc_dq[dt][3];
      const float recv0 = __shfl_xor_sync(0xffffffffu, send0, 1);
      const float recv1 = __shfl_xor_sync(0xffffffffu, send1, 1);
      const float4 val = odd ? make_float4(recv0, recv1, acc_dq[dt][2], acc_dq[dt][3])
                             : make_float4(acc_dq[dt][0], acc_dq[dt][1], recv0, recv1);
      if (q_row < seq) atomicAdd(reinterpret_cast<float4*>(dq_row + dt * 8), val);
    }
    // No barrier here: the next writes of dS^T come after the next iteration's first barrier,
    // which no warp passes before every warp has finished these reads.
  }

  // ---- dK = scale * sum dS^T Q, dV = sum P^T dO (over the group's heads), bf16 ----
  const float dv_scale = kDropout ? s.dropout.scale : 1.0f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + key_of_row(r);
    if (key >= kv_seq) continue;
    const int64_t offset = ((b * kv_seq + key) * s.kv_heads + kvh) * kDim + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      *reinterpret_cast<uint32_t*>(p.dk + offset + dt * 8) =
          pack_bf16(acc_dk[dt][2 * r] * s.scale, acc_dk[dt][2 * r + 1] * s.scale);
      if constexpr (kDropout)
        *reinterpret_cast<uint32_t*>(p.dv + offset + dt * 8) =
            pack_bf16(acc_dv[dt][2 * r] * dv_scale, acc_dv[dt][2 * r + 1] * dv_scale);
      else
        *reinterpret_cast<uint32_t*>(p.dv + offset + dt * 8) =
            pack_bf16(acc_dv[dt][2 * r], acc_dv[dt][2 * r + 1]);
    }
  }
}

// dq = bf16(scale * dq_accum), 4 elements per thread (numel is a multiple of 64 here); with
// slabs, the sum over the slabs in slab order (a fixed order: deterministic).
__global__ void attention_dq_convert_kernel(const float4* __restrict__ acc, uint2* __restrict__ dq,
                                            int64_t n4, float scale, int slabs,
                                            int64_t slab_stride4) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 v = acc[i];
    for (int sl = 1; sl < slabs; ++sl) {
      const float4 w = acc[sl * slab_stride4 + i];
      v.x += w.x;
      v.y += w.y;
      v.z += w.z;
      v.w += w.w;
    }
    dq[i] = make_uint2(pack_bf16(v.x * scale, v.y * scale), pack_bf16(v.z * scale, v.w * scale));
  }
}

template <class C, bool kCausal, bool kDropout, bool kDocs, bool kKeys = false,
          bool kBlockDiff = false>
void launch_backward_main(const Shape& s, const BackwardPtrs& p, cudaStream_t stream) {
  auto kernel = flash_backward_kernel<C, kCausal, kDropout, kDocs, kKeys, kBlockDiff>;
  constexpr int kSmem = C::kSmemBytes + (kDocs ? C::kDocBytes : 0) + (kBlockDiff ? C::kBdBytes : 0);
  if (kSmem > 48 * 1024)
    MDLM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(static_cast<unsigned>((s.keys() + C::kBlockN - 1) / C::kBlockN),
                  static_cast<unsigned>(s.kv_heads), static_cast<unsigned>(s.batch));
  kernel<<<grid, C::kThreads, kSmem, stream>>>(p, s);
  MDLM_CUDA_CHECK_LAUNCH();
}

template <class C, bool kDocs>
void launch_backward_mask(const Shape& s, const BackwardPtrs& p, cudaStream_t stream) {
  const bool dropout = s.dropout.p > 0.0f;
  if (s.causal) {
    if (dropout) launch_backward_main<C, true, true, kDocs>(s, p, stream);
    else launch_backward_main<C, true, false, kDocs>(s, p, stream);
  } else {
    if (dropout) launch_backward_main<C, false, true, kDocs>(s, p, stream);
    else launch_backward_main<C, false, false, kDocs>(s, p, stream);
  }
}

template <class C>
void launch_backward_docs(const Shape& s, const BackwardPtrs& p, cudaStream_t stream) {
  if (s.bd_ranges != nullptr) {  // block diffusion: alone (checked in flash_backward)
    launch_backward_main<C, false, false, false, false, true>(s, p, stream);
    return;
  }
  if (s.separate_keys()) {  // a key block of its own: bidirectional, no dropout (checked)
    Shape keys = s;
    keys.kv_seq = s.keys();
    if (s.docs != nullptr && keys.key_docs == nullptr) keys.key_docs = s.docs;  // kv_seq == seq
    if (s.docs != nullptr) launch_backward_main<C, false, false, true, true>(keys, p, stream);
    else launch_backward_main<C, false, false, false, true>(keys, p, stream);
    return;
  }
  if (s.docs != nullptr) launch_backward_mask<C, true>(s, p, stream);
  else launch_backward_mask<C, false>(s, p, stream);
}

}  // namespace

void launch_attention_delta(const Shape& s, const BackwardPtrs& p, cudaStream_t stream) {
  const int64_t rows = s.batch * s.seq * s.heads;
  constexpr int kWarpsPerBlock = 8;
  attention_delta_kernel<<<megadlm::detail::grid_for(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                           stream>>>(
      p.dout, p.out, p.delta, p.dq_accum, rows, static_cast<int>(s.seq),
      static_cast<int>(s.heads), s.dim, p.dq_slabs, p.dq_slab_stride);
  MDLM_CUDA_CHECK_LAUNCH();
}

void flash_backward(const Shape& s, const BackwardPtrs& p, cudaStream_t stream) {
  MDLM_CHECK(!s.separate_keys() || (!s.causal && s.dropout.p == 0.0f &&
                                    (s.docs == nullptr || s.key_docs != nullptr || s.keys() == s.seq)),
             "flash attention backward: a separate key block runs without causal mask and dropout "
             "(and with the keys' document ids when kv_seq != seq); use the simple kernels");
  MDLM_CHECK(s.bd_ranges == nullptr ||
                 (s.seq % 256 == 0 && !s.causal && s.dropout.p == 0.0f && s.docs == nullptr &&
                  !s.separate_keys()),
             "flash attention backward: block diffusion needs seq / 2 a multiple of 128 (got seq ",
             s.seq, ") and runs without causal mask, dropout, document ids and a separate key "
             "block; use the simple kernels");
  launch_attention_delta(s, p, stream);
  if (s.dim == 128) launch_backward_docs<Bwd128>(s, p, stream);
  else launch_backward_docs<Bwd64>(s, p, stream);
  const int64_t n4 = s.batch * s.seq * s.heads * s.dim / 4;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n4 + 255) / 256, 8192));
  attention_dq_convert_kernel<<<blocks, 256, 0, stream>>>(
      reinterpret_cast<const float4*>(p.dq_accum), reinterpret_cast<uint2*>(p.dq), n4, s.scale,
      p.dq_slabs, p.dq_slab_stride / 4);
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace megadlm::ops::cuda::attn
