// Scaled dot-product attention with grouped-query heads, bidirectional or causal, returning the
// per-row log-sum-exp so that partial results over key blocks can be merged exactly (context
// parallelism). CUDA: flash-attention style kernels (bf16 in/out, fp32 softmax and
// accumulation, never materialising the [S,S] matrix). CPU: direct loops, the reference.
//
// Shapes (contiguous): q [B, S, Hq, D]; k, v [B, S, Hkv, D] (S = kv_seq when given, below);
// out [B, S, Hq, D];
// lse f32 [B, Hq, S] (natural log of sum_j exp(scale * q.k_j)). Query head h uses key/value
// head h / (Hq / Hkv). CUDA: D <= 256 (tensor-core flash kernels for D = 64 and 128, a simple
// fp32 kernel otherwise); CPU: any D.
// Accumulation: every output (out, lse, dq, dk, dv) is written.
//
// Attention dropout (Megatron's --attention-dropout), keyed by global coordinates so that
// backward regenerates the mask and every backend and parallel layout drops the same elements.
// Element (b, h, i, j) of the probability matrix P has global sample sample_offset + b, head
// head_offset + h, query query_offset + i and key key_offset + j (gs, gh, gi, gj); it is kept iff
//   uniform_from_u32(philox(key(dropout_seed, AttentionDropout),
//                           {gj / 4, gi, gs mod 2^32, (dropout_site << 16) | gh}).w[gj % 4]) >= p
// (mapping in src/ops/attention_dropout_mask.h). With Z the keep mask:
//   out = (P * Z / (1-p)) V, lse unchanged (log-sum-exp of the undropped scores);
//   dV = (P * Z / (1-p))^T dO, dP = (dO V^T) * Z / (1-p), dS = P * (dP - rowsum(dO * out)).
// dropout_p = 0 runs exactly the path without dropout (no random numbers, identical results).
// Limits: global heads and dropout_site below 2^16; the CUDA flash kernels need
// key_offset % 4 == 0.
//
// Context-parallel shards (parallel/context_parallel/, docs/parallelism/context_parallel.md):
// the keys may be another shard of the sequence than the queries, so
//  - k, v hold kv_seq rows per batch row (0: seq): k, v, dk, dv [B, kv_seq, Hkv, D];
//  - query_chunks / key_chunks (ops/chunk_map.h) give the global position of each local row:
//    the causal mask shows key j to query i iff key_chunks.global(j) <= query_chunks.global(i),
//    and attention dropout keys element (i, j) by query_offset + query_chunks.global(i) and
//    key_offset + key_chunks.global(j) (the offsets shift the dropout coordinates only);
//  - key_document_ids (int32 [B, kv_seq]) are the keys' documents when they differ from the
//    queries' (document ids are global: equal ids are one document, whichever shard holds it);
//    it needs document_ids, and a query sees only keys of its own document.
// A query that sees no key of the block (possible only with these fields) gets out = 0 and
// lse = -inf, and receives no gradient; ops/attention_merge.h merges such blocks exactly.
// With the defaults (identity maps, kv_seq = seq, no key documents) nothing changes. On CUDA the
// support table (src/ops/attention_support.h) sends such calls to the key-block kernels, never
// cuDNN: a separate key block (kv_seq, key documents) bidirectionally without dropout to the
// flash kernels (head_dim 64/128), and what needs the chunk maps (a causal mask between different
// maps, dropout at chunked positions) or another head_dim to the simple kernels.
//
// Per-document (packed, "varlen") attention: with document_ids, an int32 [B, S] tensor whose
// values are non-decreasing along each row, query i of row b sees key j only when
// document_ids[b, i] == document_ids[b, j] (and j <= i when causal): each document of a packed
// row attends only to itself, as THD/cu_seqlens attention does. CPU, and CUDA on every kernel
// family (the flash kernels visit only the tiles of each tile's documents; cuDNN runs the
// documents as one ragged (THD) batch; see docs/kernels/attention.md).
//
// CUDA backends (AttentionBackend): cuDNN's fused flash attention (bf16, fp32 softmax, its
// softmax statistics are exactly this lse: natural log, [B, Hq, S]) and megadlm's own kernels
// (flash for head_dim 64/128, a simple path otherwise). Auto takes cuDNN wherever it computes
// the contract exactly (no attention dropout: ours is keyed by global coordinates, cuDNN's is
// not) and its plan builds, and the own kernels elsewhere; the choice is logged once per kind of
// call. Forward and backward may run on different backends (same lse convention).
// deterministic: a bitwise reproducible backward (--deterministic-mode): cuDNN's deterministic
// algorithm, or the flash backward with one dQ partial per key tile summed in a fixed order.
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/chunk_map.h"

namespace megadlm::ops {

enum class AttentionMask : uint8_t {
  None,    ///< bidirectional (--attention-mask-type no_mask)
  Causal,  ///< query i sees keys j <= i (causal / causal_bottom_right with Sq == Skv; by
           ///< global position with chunk maps)
  /// Block diffusion over the doubled row [x_t | x_0] (seq = 2L, see block_ranges below): a
  /// noisy token sees the noisy tokens of its own block and the clean tokens of the earlier
  /// blocks of its document; a clean token sees the clean tokens of its own and earlier blocks
  /// (BD3-LM, Fast-dLLM v2, LLaDA2, SDAR).
  BlockDiffusion,
  /// The same, except that a clean token sees the clean tokens up to itself (causal), the
  /// variant trained with an autoregressive loss on the clean half.
  BlockDiffusionCausal,
};
inline bool is_block_diffusion(AttentionMask m) {
  return m == AttentionMask::BlockDiffusion || m == AttentionMask::BlockDiffusionCausal;
}

/// Which CUDA implementation runs (--attention-backend; the CPU backend ignores it).
enum class AttentionBackend : uint8_t {
  Auto,   ///< cuDNN where it runs these arguments exactly, else the own kernels
  Cudnn,  ///< cuDNN only: an error where it cannot (dropout, a refused shape)
  Flash,  ///< megadlm's own kernels (flash for head_dim 64/128, simple otherwise)
};
const char* attention_backend_name(AttentionBackend b);

struct AttentionArgs {
  int64_t batch = 0, seq = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  AttentionMask mask = AttentionMask::None;
  float softmax_scale = 0.0f;  ///< usually 1/sqrt(head_dim)
  // Dropout on P (see the top of this file); everything below is ignored when dropout_p == 0.
  float dropout_p = 0.0f;      ///< drop probability, in [0, 1)
  uint64_t dropout_seed = 0;
  uint32_t dropout_site = 0;   ///< which attention of the model (the global layer number)
  int64_t sample_offset = 0;   ///< global index of batch row 0
  int64_t head_offset = 0;     ///< global index of query head 0 (tensor-parallel head shards)
  int64_t query_offset = 0;    ///< global position of query row 0 (context-parallel shards)
  int64_t key_offset = 0;      ///< global position of key row 0 (context-parallel shards)
  // Context-parallel shards (see the top of this file); the defaults change nothing.
  int64_t kv_seq = 0;          ///< key rows per batch row (0: seq)
  ChunkMap query_chunks = {};  ///< global position of each query row (mask and dropout)
  ChunkMap key_chunks = {};    ///< global position of each key row (mask and dropout)
  /// int32 [B, kv_seq] document of each key when the keys are another shard (null: document_ids).
  const Tensor* key_document_ids = nullptr;
  /// Keys per batch row.
  int64_t keys() const { return kv_seq > 0 ? kv_seq : seq; }
  /// int32 [B, S] document of each position (non-decreasing per row), or null: one document.
  const Tensor* document_ids = nullptr;
  /// Optional with document_ids, for the cuDNN path: int32 [num_documents + 1] on the device,
  /// the flat token index (b * S + position) where each document starts, ascending, every row
  /// start among them, last entry B * S. Without it cuDNN derives it from document_ids on the
  /// host (one device synchronisation per call).
  const Tensor* document_starts = nullptr;
  /// Optional with document_ids, forward only (inference): int32 [B] on the device, the length
  /// of row b's one live document, which fills its first row_lengths[b] positions; the rest of
  /// the row is padding that nothing reads. cuDNN then runs the rows dense with its padding mask
  /// (keys at or past the length masked) instead of the ragged batch of documents: the same
  /// outputs at live positions, unspecified outputs and lse at padding positions. The other
  /// backends, and every backward, ignore it and use document_ids.
  const Tensor* row_lengths = nullptr;
  /// Block diffusion masks only: int32 [B, 4, L] on the device of q, L = seq / 2 (see the
  /// context-parallel shards below), for each
  /// position p of a row's L positions the four positions (within the same L) doc_start,
  /// doc_end (the document holding p: [doc_start, doc_end)), block_start, block_end (the
  /// diffusion block holding p, inside that document). Rows 0..L-1 of q/k/v are the noisy copy
  /// x_t of positions 0..L-1 and rows L..2L-1 the clean copy x_0. Query row i, key row j,
  /// p = i mod L, kp = j mod L, ranges of p:
  ///   noisy i, noisy j:  block_start <= kp < block_end
  ///   noisy i, clean j:  doc_start   <= kp < block_start
  ///   clean i, noisy j:  never
  ///   clean i, clean j:  doc_start   <= kp < block_end      (BlockDiffusion)
  ///                      doc_start   <= kp <= p             (BlockDiffusionCausal)
  /// Every query sees at least its own key. Not combined with document_ids (the ranges hold the
  /// documents), row_lengths or dropout.
  /// Context-parallel shards (docs/parallelism/context_parallel.md, "Block diffusion"): the
  /// ranges stay those of the whole rows (L positions), and q's seq rows (k's kv_seq rows) are
  /// two halves, noisy then clean, of seq / 2 rows each; query_chunks (key_chunks) maps each
  /// half's rows to positions in [0, L) (identity: the half is all L). Row i of a half of h rows
  /// is row (i < h ? 0 : L) + chunks.global(i mod h) of the whole doubled row, where the rule
  /// above applies; a query that sees no key of the block gets out = 0 and lse = -inf. On CUDA
  /// such calls run on the simple key-block kernels.
  const Tensor* block_ranges = nullptr;
  /// Block diffusion masks only: the caller's promise that every row of block_ranges is ONE
  /// document (doc_start 0 and doc_end L at every position) cut into diffusion blocks of at most
  /// this many positions; 0: no promise. It lets CUDA run the composed path (two causal bulks on
  /// cuDNN, the strips on the flash kernels, merged by lse; ops/attention_block_diffusion_bulk.h)
  /// where MEGADLM_BD_ATTENTION allows it (the default auto: from half length 2048; bulk: always; flash: never).
  /// The function computed is the same either way; a false promise gives a wrong mask on that path.
  int64_t block_diffusion_max_block = 0;
  /// Block diffusion masks only, the composed path's third piece: only the visible pairs that
  /// the two causal bulks leave, i.e. the rule above without (noisy p, clean kp <= p - N) and
  /// (clean p, clean kp <= p - 1), N = block_diffusion_max_block (> 0, whole rows). Every query
  /// still sees its own key.
  bool block_diffusion_strip = false;
  AttentionBackend backend = AttentionBackend::Auto;
  bool deterministic = false;  ///< bitwise reproducible backward (see the top of this file)
};

/// Whether block diffusion's query row i may see key row j (the rule above), from the int32
/// ranges of the batch row (4 x L, as block_ranges holds them). The CPU reference and the tests
/// use it; the CUDA kernels apply the same rule.
/// strip > 0: the rule of block_diffusion_strip with N = strip (the pairs the bulks leave).
bool block_diffusion_visible(const int32_t* row_ranges, int64_t half, bool causal_clean, int64_t i,
                             int64_t j, int64_t strip = 0);

/// For block_ranges [batch, 4, L] on the host: the longest diffusion block when every row is one
/// document (doc_start 0 and doc_end L everywhere, blocks contiguous runs), else 0: the value of
/// AttentionArgs::block_diffusion_max_block (the micro-batch upload computes it, a loop over
/// the ranges; packed documents give 0 and stay on the whole-mask path).
int64_t block_diffusion_one_document_max_block(const int32_t* ranges, int64_t batch, int64_t half);

/// Whether these arguments need the key-block kernels rather than the ordinary choices (cuDNN /
/// flash): a separate key length or key documents, a causal mask between different chunk maps,
/// dropout with a chunked map. The support table (src/ops/attention_support.h) then picks the
/// flash kernels where they compute the call exactly (a separate key block, bidirectional, no
/// dropout, head_dim 64/128) and the simple kernels otherwise. False for every call without the
/// CP fields.
bool needs_context_parallel_kernel(const AttentionArgs& args);

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionArgs& args, const Stream& stream);

/// dq, dk, dv written (dk/dv summed over the query heads of each group).
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionArgs& args, const Stream& stream);

/// The same attention on the fused QKV projection's output, without split or concat copies:
/// qkv [B, S, (Hq + 2 Hkv) D] holds per token the Hq query heads, then the Hkv key heads, then
/// the Hkv value heads (the layout qk_norm_rope_forward writes); out, lse as attention_forward.
/// cuDNN reads q, k, v through their strides; the own kernels get split copies.
void attention_forward_packed(const Tensor& qkv, Tensor& out, Tensor& lse,
                              const AttentionArgs& args, const Stream& stream);
/// dqkv [B, S, (Hq + 2 Hkv) D] written with dq, dk, dv in qkv's layout.
void attention_backward_packed(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, Tensor& dqkv, const AttentionArgs& args,
                               const Stream& stream);
/// The same with q and k read from qk_rows and v from the value columns of v_rows, two buffers
/// of the packed layout: the training forward rotates q and k into a buffer of their own while
/// the values stay in the QKV projection's output (qk_norm_rope with copy_values = false).
void attention_forward_packed(const Tensor& qk_rows, const Tensor& v_rows, Tensor& out, Tensor& lse,
                              const AttentionArgs& args, const Stream& stream);
void attention_backward_packed(const Tensor& dout, const Tensor& qk_rows, const Tensor& v_rows,
                               const Tensor& out, const Tensor& lse, Tensor& dqkv,
                               const AttentionArgs& args, const Stream& stream);
/// Whether both packed calls of these arguments read the packed rows in place (cuDNN on CUDA),
/// so that split buffers for q, k and v cost no copies; false where they fall back to split
/// copies (CPU, the own kernels), which then take the values from one buffer most cheaply.
bool attention_packed_reads_in_place(const AttentionArgs& args, const Stream& stream);

}  // namespace megadlm::ops
