// Flash-attention forward (FlashAttention-2 algorithm) for head_dim 64 and 128: one block per
// (query tile, head, batch), K/V tiles streamed through double-buffered shared memory with
// cp.async, S = Q K^T and O += P V on tensor cores (mma.sync m16n8k16 bf16 -> fp32), online
// softmax in fp32 registers. Tiling, register and shared-memory budgets: docs/kernels/attention.md.
#include <cmath>
#include "core/cuda/cuda_utils.h"
#include "ops/attention_block_diffusion.h"
#include "ops/cuda/attention_common.cuh"

namespace megadlm::ops::cuda::attn {
namespace {

// kWarps warps split kBlockM query rows (16 or 32 rows each: 1 or 2 m16 tiles). With 32 rows a
// warp reuses every K/V fragment it loads from shared memory for two mma tiles, which halves the
// shared-memory traffic per flop; Q is then re-read from shared memory at each K tile because
// keeping it in registers (64 more) would not fit next to the 128 O accumulators at D = 128.
template <int kDim_, int kBlockM_, int kBlockN_, int kWarps_, bool kQInRegs_>
struct ForwardConfig {
  static constexpr int kDim = kDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kWarps = kWarps_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;        // n8 tiles of S per m tile
  static constexpr int kDTiles = kDim / 8;           // n8 tiles of O per m tile
  static constexpr int kKSteps = kDim / 16;          // k16 steps of Q K^T
  static constexpr int kPSteps = kBlockN / 16;       // k16 steps of P V
  static constexpr int kRowBytes = kPaddedRowBytes<kDim>;  // shared row stride (padded)
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKVBytes = kBlockN * kRowBytes;
  static constexpr int kSmemBytes = kQBytes + 4 * kKVBytes;  // Q, 2 stages of K, 2 of V
  // kDocs only, after the above: 4 document bounds, the query rows' ids, 2 stages of key ids.
  static constexpr int kDocBytes = 4 * (4 + kBlockM + 2 * kBlockN);
  // kBlockDiff only, after the above: the key ranges of each query row, lo[2][kBlockM] then
  // hi[2][kBlockM] (BlockDiffusionRow::keys_of).
  static constexpr int kBdBytes = 4 * 4 * kBlockM;
  static_assert(kRowsPerWarp == 16 || kRowsPerWarp == 32, "a warp owns one or two m16 tiles");
  static_assert(kBlockN % 16 == 0 && kDim % 64 == 0, "tile shapes");
  static_assert(kWarps >= 4 && kThreads >= kBlockN, "document_bounds, key id copies");
};

// D = 128: 128x32 tiles, 4 warps of 32 rows (Q re-read from shared memory). Per thread: O 128 +
// S 32 fp32 accumulators; with 64-key tiles (S 64) ptxas spills ~100 bytes, with 32 it reports
// 250 registers and no spill (docs/kernels/attention.md). Shared: Q 34 KB + K, V double-buffered
// 4 x 8.5 KB = 68 KB; the 250 registers allow two blocks (8 warps) per SM.
using Fwd128 = ForwardConfig<128, 128, 32, 4, false>;
// D = 64: 128x64 tiles; Q stays in registers (32) next to O 64 + S 64. Shared 54 KB.
using Fwd64 = ForwardConfig<64, 128, 64, 4, true>;

// kDropout: P is multiplied by the keep mask of s.dropout (the row sum and lse stay undropped)
// and O by 1/(1-p) at the end; K and V are read in the fwd_dropout_key order so that each thread
// consumes whole Philox calls (attention_common.cuh).
// kDocs: per-document attention (s.docs). The block visits only the key tiles overlapping
// [first position of row m0's document, one past the last position of the last row's document)
// (documents are contiguous runs), and masks a score to -inf when the key's document id differs
// from the query's, as the causal mask does; the ids of the block's rows and of each key tile
// sit in shared memory after the tiles (kDocBytes). Dropout keeps its global coordinates.
// kKeys: the keys are a separate block (s.kv_seq rows of k, v; with kDocs their own ids
// s.key_docs), as context-parallel blocks and cached decoding give: key pointers, tile counts and
// the end mask run over kv_seq, and with kDocs the block visits the key tiles whose ids lie in
// [id of row m0, id of the last row] (key_document_bounds). A row that sees no key keeps max -inf
// and sum 0: out 0, lse -inf. Only without causal mask and dropout (both need the keys to be the
// queries' own positions; the context-parallel cases with chunk maps run on the simple kernels).
// kBlockDiff: block diffusion (s.bd_ranges; ops/attention_block_diffusion.h), alone (no causal
// mask, dropout, documents or key block), with seq / 2 a multiple of kBlockM so that the query
// tile lies in one half. The key ranges of the block's rows go to shared memory (kBdBytes); the
// block visits the key tiles of two ranges, [lo[0] of row m0, hi[0] of the last row) and then
// [lo[1] of row m0, hi[1] of the last row) (the noisy and the clean keys of a noisy tile; a clean
// tile has only the first, the second may be empty), a warp skips a tile outside its rows' hull,
// and a score is masked to -inf by its row's range only in tiles that are not inside every range
// of the warp's rows.
template <class C, bool kCausal, bool kDropout, bool kDocs, bool kKeys, bool kBlockDiff>
__global__ void __launch_bounds__(C::kThreads) flash_forward_kernel(ForwardPtrs p, Shape s) {
  static_assert(!kKeys || (!kCausal && !kDropout), "a separate key block: no causal mask, no dropout");
  static_assert(!kBlockDiff || (!kCausal && !kDropout && !kDocs && !kKeys),
                "block diffusion: no other mask, no dropout, no documents, no key block");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kDim = C::kDim, kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  constexpr int kMTiles = C::kMTiles, kNTiles = C::kNTiles, kDTiles = C::kDTiles;
  constexpr int kRowBytes = C::kRowBytes;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates (row group, thread in group)
  const int seq = static_cast<int>(s.seq);
  const int kv_seq = kKeys ? static_cast<int>(s.kv_seq) : seq;  // key rows per batch row
  // Causal: the last query tiles have the most key tiles; launch them first for better balance.
  const int m_block = kCausal ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : blockIdx.x;
  const int m0 = m_block * kBlockM;
  const int h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t kvh = h / (s.heads / s.kv_heads);
  const int q_stride = static_cast<int>(s.heads) * kDim;
  const int kv_stride = static_cast<int>(s.kv_heads) * kDim;
  const bf16* q = p.q + ((b * seq + m0) * s.heads + h) * kDim;
  const bf16* k = p.k + (b * kv_seq * s.kv_heads + kvh) * kDim;
  const bf16* v = p.v + (b * kv_seq * s.kv_heads + kvh) * kDim;

  const uint32_t sQ = smem_addr(smem);
  const uint32_t sK = sQ + C::kQBytes;
  const uint32_t sV = sK + 2 * C::kKVBytes;
  // kDocs: [0, 4) document bounds (document_bounds), [4, 4 + kBlockM) the ids of rows m0..,
  // then 2 stages of kBlockN key ids (stage j & 1 holds tile j's, in key order).
  int* const doc_smem = reinterpret_cast<int*>(smem + C::kSmemBytes);
  const uint32_t sKeyDocs = sQ + C::kSmemBytes + (4 + kBlockM) * 4;
  const int32_t* const docs = kDocs ? s.docs + b * seq : nullptr;
  const int32_t* const key_docs = kDocs ? (kKeys ? s.key_docs + b * kv_seq : docs) : nullptr;
  // kBlockDiff: lo[2][kBlockM], then hi[2][kBlockM], in the same place (never with kDocs).
  int* const bd_lo = reinterpret_cast<int*>(smem + C::kSmemBytes);
  int* const bd_hi = bd_lo + 2 * kBlockM;

  // Per-lane ldmatrix bases; a k step, n tile or m tile only adds a compile-time offset.
  // Q as the A operand: lanes 0-15 address rows 0-15 at the k step's first 8 columns, lanes
  // 16-31 the same rows at its last 8 columns (matrices a0..a3 of the m16k16 fragment).
  const uint32_t q_lane = sQ + (warp * C::kRowsPerWarp + (lane & 15)) * kRowBytes + (lane >> 4) * 16;
  // K as the B operand (K is [key][d], i.e. B^T): matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 0-7), (keys 8-15, d 8-15) = b0, b1 of two n8 tiles.
  const int k_col = (lane & 7) + ((lane >> 4) << 3);  // the S column this lane's row feeds
  const uint32_t k_lane =
      (kDropout ? fwd_dropout_key(k_col) : k_col) * kRowBytes + ((lane >> 3) & 1) * 16;
  // V as the B operand via .trans (V is [key][d] = [k][n]): matrices (keys 0-7, d 0-7),
  // (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15) = b0, b1 of two n8 tiles.
  const uint32_t v_lane =
      (kDropout ? fwd_dropout_key(lane & 15) : (lane & 15)) * kRowBytes + (lane >> 4) * 16;

  // Key tiles [j_first, j_first + n_tiles). With documents the keys any row of this block can see
  // lie in [doc_smem[0], doc_smem[3]) (set below, before the first use).
  int j_first = 0, n_end = kCausal ? min(seq, m0 + kBlockM) : kv_seq;
  int n_tiles = (n_end + kBlockN - 1) / kBlockN;
  // kBlockDiff: the tiles of the two key ranges (set below, before the first use).
  [[maybe_unused]] ops::detail::BlockDiffusionTiles bd_tiles{};
  // kDocs: every row of the block sees every key of [uniform_lo, uniform_hi) (modulo causal),
  // an empty range unless the block's rows are one document.
  [[maybe_unused]] int uniform_lo = 0, uniform_hi = 0;
  const int warp_row0 = m0 + warp * C::kRowsPerWarp;  // first query row of this warp
  const float scale_log2 = s.scale * kLog2e;          // exp(scale*x) = exp2(scale_log2*x)
  // Dropout keep bits per tile: 4 per (m tile, k16 step, row half).
  constexpr int kKeepWords = (kMTiles * C::kPSteps * 8 + 31) / 32;
  auto keep_bit = [](int mt, int kk, int hf) { return ((mt * C::kPSteps + kk) * 2 + hf) * 4; };

  // Commit groups: {Q, K0}, {V0}, then {K_j+1}, {V_j+1} per iteration (empty at the end), so
  // "all but the newest 1" means K_j landed and "all but the newest 2" means V_j landed. With
  // documents the key ids of tile j travel with K_j.
  load_tile_async<kBlockM, kDim, C::kThreads>(sQ, q, q_stride, seq - m0, tid);
  if constexpr (kDocs) {
    // Causal: the end stays min(seq, m0 + kBlockM) (<= doc_smem[3], which is past the last row).
    if constexpr (kKeys)
      key_document_bounds(key_docs, kv_seq, docs[m0], docs[min(m0 + kBlockM, seq) - 1], warp,
                          lane, doc_smem);
    else document_bounds(docs, m0, min(m0 + kBlockM, seq) - 1, seq, warp, lane, doc_smem);
    for (int r = tid; r < kBlockM; r += C::kThreads)
      doc_smem[4 + r] = m0 + r < seq ? docs[m0 + r] : -1;  // rows past the end: never stored
    __syncthreads();
    if constexpr (kKeys) {
      // The range may be empty (no key of these documents): still visit one tile, all masked,
      // so that the rows end with max -inf and sum 0 (out 0, lse -inf).
      j_first = min(doc_smem[0], kv_seq - 1) / kBlockN;
      n_end = max(doc_smem[3], j_first * kBlockN + 1);
    } else {
      j_first = doc_smem[0] / kBlockN;
      if (!kCausal) n_end = doc_smem[3];
    }
    uniform_lo = doc_smem[2];
    uniform_hi = doc_smem[1];
    n_tiles = (n_end + kBlockN - 1) / kBlockN - j_first;  // >= 1: row m0 sees itself
  }
  if constexpr (kBlockDiff) {
    const ops::detail::BlockDiffusionRow bd{s.bd_ranges + b * seq * 2, seq / 2, s.bd_causal_clean, s.bd_strip};
    for (int r = tid; r < kBlockM; r += C::kThreads) {
      int lo[2], hi[2];
      bd.keys_of(m0 + r, lo, hi);
      bd_lo[r] = lo[0];
      bd_lo[kBlockM + r] = lo[1];
      bd_hi[r] = hi[0];
      bd_hi[kBlockM + r] = hi[1];
    }
    __syncthreads();
    const int lo_first[2] = {bd_lo[0], bd_lo[kBlockM]};
    const int hi_last[2] = {bd_hi[kBlockM - 1], bd_hi[2 * kBlockM - 1]};
    bd_tiles = ops::detail::BlockDiffusionTiles::of(lo_first, hi_last, kBlockN);
    // >= 1 with valid ranges (row m0 sees its own key, in the first range); with malformed ones
    // still one tile (at a position inside the half, every score masked or not, never a read
    // outside the row) so that the pipeline below keeps its shape.
    if (bd_tiles.total() == 0) {
      bd_tiles.first[0] = min(bd_tiles.first[0], kv_seq / kBlockN - 1);
      bd_tiles.count[0] = 1;
    }
    n_tiles = bd_tiles.total();
  }
  // The first key of the j-th tile visited.
  auto tile_start = [&](int jj) {
    if constexpr (kBlockDiff) return bd_tiles.tile(jj) * kBlockN;
    else return (kDocs ? j_first + jj : jj) * kBlockN;
  };
  // Keys [n0, n0 + kBlockN) into stage `stage`: K in this commit group's call, V in the caller's
  // next one; rows past the sequence end are zero-filled.
  auto load_key_ids = [&](int n0, int stage) {
    if constexpr (kDocs) {
      if (tid < kBlockN) {
        const bool valid = n0 + tid < kv_seq;
        cp_async_4(sKeyDocs + (stage * kBlockN + tid) * 4, key_docs + (valid ? n0 + tid : 0),
                   valid);
      }
    }
  };
  if constexpr (kDocs || kBlockDiff) {
    const int n0 = tile_start(0);
    const int64_t first = static_cast<int64_t>(n0) * kv_stride;
    load_tile_async<kBlockN, kDim, C::kThreads>(sK, k + first, kv_stride, kv_seq - n0, tid);
    load_key_ids(n0, 0);
    cp_async_commit();
    load_tile_async<kBlockN, kDim, C::kThreads>(sV, v + first, kv_stride, kv_seq - n0, tid);
    cp_async_commit();
  } else {
    load_tile_async<kBlockN, kDim, C::kThreads>(sK, k, kv_stride, kv_seq, tid);
    cp_async_commit();
    load_tile_async<kBlockN, kDim, C::kThreads>(sV, v, kv_stride, kv_seq, tid);
    cp_async_commit();
  }

  float acc_o[kMTiles][kDTiles][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];  // per row half (g, g+8); sums are partial
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.0f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      row_max[mt][hf] = -INFINITY;
      row_sum[mt][hf] = 0.0f;
    }
  }
  uint32_t q_frag[C::kQInRegs ? kMTiles : 1][C::kQInRegs ? C::kKSteps : 1][4];

  for (int j = 0; j < n_tiles; ++j) {  // j: iteration (stage j & 1); the tile is j_first + j
    const int n0 = tile_start(j);
    const uint32_t sKj = sK + (j & 1) * C::kKVBytes;
    const uint32_t sVj = sV + (j & 1) * C::kKVBytes;
    // ---- dropout keep bits of this tile, drawn before the wait so the integer work overlaps the
    // copies and no Philox temporaries are live next to the S accumulators. One call per (m tile,
    // k16 step kk, row half) covers this thread's keys 4t..4t+3 of the step (fwd_dropout_key):
    // words 0, 1 are columns 2t, 2t+1 of n8 tile 2kk, words 2, 3 those of tile 2kk+1; the word w
    // goes to bit keep_bit(mt, kk, hf) + w ----
    [[maybe_unused]] uint32_t keep_bits[kDropout ? kKeepWords : 1];
    if constexpr (kDropout) {
      if (!kCausal || n0 <= warp_row0 + C::kRowsPerWarp - 1) {  // warp_active, below
        const uint32_t key_group0 = static_cast<uint32_t>((s.dropout.key_offset + n0) / 4) + t;
#pragma unroll
        for (int i = 0; i < kKeepWords; ++i) keep_bits[i] = 0u;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int kk = 0; kk < C::kPSteps; ++kk)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int row = warp_row0 + mt * 16 + g + 8 * hf;
              const PhiloxWords w = s.dropout.group_words(b, h, row, key_group0 + 4 * kk);
              const int bit = keep_bit(mt, kk, hf);
#pragma unroll
              for (int k = 0; k < 4; ++k)
                keep_bits[bit / 32] |= uint32_t(s.dropout.keeps(w.w[k])) << (bit % 32 + k);
            }
      }
    }

    cp_async_wait<1>();
    // K_j is visible to every warp, and every warp has finished tile j-1, so the other stage
    // (read at j-1) may be refilled.
    __syncthreads();
    if (j + 1 < n_tiles) {
      // Contiguous tiles, except where block diffusion jumps to its second range.
      const int n1 = kBlockDiff ? tile_start(j + 1) : n0 + kBlockN;
      const int valid = kBlockDiff ? kv_seq - n1 : kv_seq - n0 - kBlockN;
      const int64_t next = static_cast<int64_t>(n1) * kv_stride;
      load_tile_async<kBlockN, kDim, C::kThreads>(sK + ((j + 1) & 1) * C::kKVBytes, k + next,
                                                  kv_stride, valid, tid);
      load_key_ids(n0 + kBlockN, (j + 1) & 1);
      cp_async_commit();
      load_tile_async<kBlockN, kDim, C::kThreads>(sV + ((j + 1) & 1) * C::kKVBytes, v + next,
                                                  kv_stride, valid, tid);
      cp_async_commit();
    } else {
      cp_async_commit();
      cp_async_commit();
    }
    if constexpr (C::kQInRegs) {
      if (j == 0) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int ks = 0; ks < C::kKSteps; ++ks)
            ldmatrix_x4(q_frag[mt][ks], q_lane + mt * 16 * kRowBytes + ks * 32);
      }
    }

    // Causal: a tile entirely above the diagonal for this warp's rows contributes nothing
    // (p = 0, the softmax state is unchanged), so the warp skips it; barriers stay uniform.
    // Block diffusion: the same for a tile outside the hull [lo of the warp's first row, hi of
    // its last row) of this range; `bd_row` is the warp's first row in this range's arrays.
    [[maybe_unused]] const int bd_row =
        kBlockDiff ? (j >= bd_tiles.count[0] ? kBlockM : 0) + warp * C::kRowsPerWarp : 0;
    const bool warp_active =
        kBlockDiff ? n0 < bd_hi[bd_row + C::kRowsPerWarp - 1] && n0 + kBlockN > bd_lo[bd_row]
                   : !kCausal || n0 <= warp_row0 + C::kRowsPerWarp - 1;
    float acc_s[kMTiles][kNTiles][4];
    if (warp_active) {
      // ---- S = Q K^T (raw scores, fp32) ----
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < C::kKSteps; ++ks) {
        uint32_t qa[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          if constexpr (C::kQInRegs) {
#pragma unroll
            for (int r = 0; r < 4; ++r) qa[mt][r] = q_frag[mt][ks][r];
          } else {
            ldmatrix_x4(qa[mt], q_lane + mt * 16 * kRowBytes + ks * 32);
          }
        }
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t kb[4];
          ldmatrix_x4(kb, sKj + k_lane + np * 16 * kRowBytes + ks * 32);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_bf16_16816(acc_s[mt][2 * np], qa[mt], kb[0], kb[1]);
            mma_bf16_16816(acc_s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }

      // ---- mask: keys past the sequence end, keys after the query when causal, and keys of
      // another document than the query's (kDocs; none when the tile lies in the block's one
      // document); block diffusion: keys outside the row's range ----
      [[maybe_unused]] const bool needs_mask =
          n0 + kBlockN > kv_seq || (kCausal && n0 + kBlockN - 1 > warp_row0) ||
          (kDocs && !(n0 >= uniform_lo && n0 + kBlockN <= uniform_hi));
      if constexpr (kBlockDiff) {
        // The ends of the ranges are non-decreasing along the rows, so the tile lies in the range
        // of every row of the warp iff it lies in [lo of its last row, hi of its first): then no
        // score is masked (the bulk of the tiles); otherwise each row tests its own range.
        if (!(n0 >= bd_lo[bd_row + C::kRowsPerWarp - 1] && n0 + kBlockN <= bd_hi[bd_row])) {
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int r = bd_row + mt * 16 + g + 8 * hf;  // this row's range
              const int lo = bd_lo[r], hi = bd_hi[r];
#pragma unroll
              for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                  const int col = n0 + nt * 8 + 2 * t + c;
                  if (col < lo || col >= hi) acc_s[mt][nt][2 * hf + c] = -INFINITY;
                }
            }
        }
      } else if (needs_mask) {
        [[maybe_unused]] const int* const key_ids = doc_smem + 4 + kBlockM + (j & 1) * kBlockN;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = warp_row0 + mt * 16 + g + (e >> 1) * 8;
              const int col = kDropout
                                  ? n0 + (nt >> 1) * 16 + 4 * t + 2 * (nt & 1) + (e & 1)
                                  : n0 + nt * 8 + 2 * t + (e & 1);
              bool masked = col >= kv_seq || (kCausal && col > row);
              if constexpr (kDocs) masked = masked || key_ids[col - n0] != doc_smem[4 + row - m0];
              if (masked) acc_s[mt][nt][e] = -INFINITY;
            }
      }

      // ---- online softmax: new row max, rescale O and the running sum, P = exp(S - max) ----
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float mx = row_max[mt][hf];
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
            mx = fmaxf(mx, fmaxf(acc_s[mt][nt][2 * hf], acc_s[mt][nt][2 * hf + 1]));
          // The 4 threads of a quad hold the same rows.
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // A row with no visible key yet keeps max -inf; subtract 0 so -inf - -inf never
          // makes a NaN (its p and alpha are then exp2(-inf) = 0). With documents this also
          // covers a row whose first visited tiles hold only other documents' keys.
          const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
          const float alpha = exp2f(row_max[mt][hf] * scale_log2 - m_scaled);
          row_max[mt][hf] = mx;
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float pv = exp2f(fmaf(acc_s[mt][nt][2 * hf + c], scale_log2, -m_scaled));
              acc_s[mt][nt][2 * hf + c] = pv;
              sum += pv;
            }
          row_sum[mt][hf] = row_sum[mt][hf] * alpha + sum;
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            acc_o[mt][dt][2 * hf] *= alpha;
            acc_o[mt][dt][2 * hf + 1] *= alpha;
          }
        }
      }

      // ---- dropout: zero the dropped P entries (after the row sum: lse stays undropped) ----
      if constexpr (kDropout) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int kk = 0; kk < C::kPSteps; ++kk)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int bit = keep_bit(mt, kk, hf);
              const uint32_t word = keep_bits[bit / 32] >> (bit % 32);
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                if (!((word >> c) & 1u)) acc_s[mt][2 * kk][2 * hf + c] = 0.0f;
                if (!((word >> (2 + c)) & 1u)) acc_s[mt][2 * kk + 1][2 * hf + c] = 0.0f;
              }
            }
      }
    }

    cp_async_wait<2>();
    __syncthreads();  // V_j visible to every warp

    if (warp_active) {
      // ---- O += P V: the S accumulators of n8 tiles 2kk, 2kk+1 are exactly the A fragment
      // of k16 step kk (rows g/g+8, cols 2t.. and 2t+8..), so P never leaves registers ----
#pragma unroll
      for (int kk = 0; kk < C::kPSteps; ++kk) {
        uint32_t pa[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          pa[mt][0] = pack_bf16(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
          pa[mt][1] = pack_bf16(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
          pa[mt][2] = pack_bf16(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack_bf16(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, sVj + v_lane + kk * 16 * kRowBytes + dp * 32);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_bf16_16816(acc_o[mt][2 * dp], pa[mt], vb[0], vb[1]);
            mma_bf16_16816(acc_o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
  }

  // ---- epilogue: O / l as bf16 through this warp's own rows of sQ (no other warp reads them any
  // more), then 16-byte coalesced stores; lse = max * scale + ln(l) ----
  __syncwarp();
  const int64_t lse_base = (b * s.heads + h) * seq;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = row_sum[mt][hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      // With dropout the kept probabilities carry 1/(1-p); applied once here.
      const float inv = l > 0.0f ? (kDropout ? s.dropout.scale / l : 1.0f / l) : 0.0f;
      const int local_row = warp * C::kRowsPerWarp + mt * 16 + g + hf * 8;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const uint32_t packed =
            pack_bf16(acc_o[mt][dt][2 * hf] * inv, acc_o[mt][dt][2 * hf + 1] * inv);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sQ + local_row * kRowBytes + dt * 16 + 4 * t),
                     "r"(packed)
                     : "memory");
      }
      const int row = m0 + local_row;
      if (t == 0 && row < seq)
        p.lse[lse_base + row] = row_max[mt][hf] * s.scale + logf(l);
    }
  }
  __syncwarp();
  constexpr int kChunksPerRow = kDim / 8;
#pragma unroll
  for (int i = 0; i < C::kRowsPerWarp * kChunksPerRow / 32; ++i) {
    const int idx = i * 32 + lane;
    const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
    const int row = warp_row0 + r;
    uint4 val;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                 : "r"(sQ + (warp * C::kRowsPerWarp + r) * kRowBytes + c * 16)
                 : "memory");
    if (row < seq)
      *reinterpret_cast<uint4*>(p.out + ((b * seq + row) * s.heads + h) * kDim + c * 8) = val;
  }
}

template <class C, bool kCausal, bool kDropout, bool kDocs, bool kKeys = false,
          bool kBlockDiff = false>
void launch_forward(const Shape& s, const ForwardPtrs& p, cudaStream_t stream) {
  auto kernel = flash_forward_kernel<C, kCausal, kDropout, kDocs, kKeys, kBlockDiff>;
  constexpr int kSmem = C::kSmemBytes + (kDocs ? C::kDocBytes : 0) + (kBlockDiff ? C::kBdBytes : 0);
  if (kSmem > 48 * 1024)
    MDLM_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid(static_cast<unsigned>((s.seq + C::kBlockM - 1) / C::kBlockM),
                  static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch));
  kernel<<<grid, C::kThreads, kSmem, stream>>>(p, s);
  MDLM_CUDA_CHECK_LAUNCH();
}

template <class C, bool kDocs>
void launch_forward_mask(const Shape& s, const ForwardPtrs& p, cudaStream_t stream) {
  const bool dropout = s.dropout.p > 0.0f;
  if (s.causal) {
    if (dropout) launch_forward<C, true, true, kDocs>(s, p, stream);
    else launch_forward<C, true, false, kDocs>(s, p, stream);
  } else {
    if (dropout) launch_forward<C, false, true, kDocs>(s, p, stream);
    else launch_forward<C, false, false, kDocs>(s, p, stream);
  }
}

template <class C>
void launch_forward_docs(const Shape& s, const ForwardPtrs& p, cudaStream_t stream) {
  if (s.bd_ranges != nullptr) {  // block diffusion: alone (checked in flash_forward)
    launch_forward<C, false, false, false, false, true>(s, p, stream);
    return;
  }
  if (s.separate_keys()) {  // a key block of its own: bidirectional, no dropout (checked)
    Shape keys = s;
    keys.kv_seq = s.keys();
    if (s.docs != nullptr && keys.key_docs == nullptr) keys.key_docs = s.docs;  // kv_seq == seq
    if (s.docs != nullptr) launch_forward<C, false, false, true, true>(keys, p, stream);
    else launch_forward<C, false, false, false, true>(keys, p, stream);
    return;
  }
  if (s.docs != nullptr) launch_forward_mask<C, true>(s, p, stream);
  else launch_forward_mask<C, false>(s, p, stream);
}

}  // namespace

void flash_forward(const Shape& s, const ForwardPtrs& p, cudaStream_t stream) {
  MDLM_CHECK(s.bd_ranges == nullptr ||
                 (s.seq % 256 == 0 && !s.causal && s.dropout.p == 0.0f && s.docs == nullptr &&
                  !s.separate_keys()),
             "flash attention forward: block diffusion needs seq / 2 a multiple of 128 (got seq ",
             s.seq, ") and runs without causal mask, dropout, document ids and a separate key "
             "block; use the simple kernels");
  MDLM_CHECK(!s.separate_keys() || (!s.causal && s.dropout.p == 0.0f &&
                                    (s.docs == nullptr || s.key_docs != nullptr || s.keys() == s.seq)),
             "flash attention forward: a separate key block runs without causal mask and dropout "
             "(and with the keys' document ids when kv_seq != seq); use the simple kernels");
  if (s.dim == 128) launch_forward_docs<Fwd128>(s, p, stream);
  else launch_forward_docs<Fwd64>(s, p, stream);
}

}  // namespace megadlm::ops::cuda::attn
