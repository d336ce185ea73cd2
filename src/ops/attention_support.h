// Internal: which implementation runs an attention call, decided in one place (host code,
// compiled in CPU builds too, so that a unit test can enumerate the cases without a GPU).
//
// choose_attention answers, for the arguments of one call, its direction, its entry (separate
// q, k, v tensors or the packed QKV rows) and the facts of the device (a CUDA stream or not, the
// cuDNN runtime's version), which implementation runs it and why:
//
//   CPU stream                                   -> Cpu
//   keys other than the queries' own rows        -> FlashKeyBlock / SimpleKeyBlock
//     (needs_context_parallel_kernel)               (the context-parallel cases, any backend)
//   --attention-backend flash                    -> Flash (head_dim 64/128) / Simple
//   cuDNN runs it exactly (cudnn_refusal == "")  -> CudnnDense / CudnnRagged (documents) /
//                                                   CudnnPadded (row_lengths, forward)
//   cuDNN refuses, backend auto                  -> Flash / Simple, the refusal as the reason
//   cuDNN refuses, backend cudnn                 -> an error (AttentionChoice::error)
//   block diffusion, backend auto, one-document  -> BlockDiffusionBulk (cuDNN causal bulks + flash
//     rows (block_diffusion_max_block), policy      strips), else Flash / Simple
//     bulk, or auto with L >= kBlockDiffusionBulkMinHalf
//
// Batch-invariant mode (AttentionDeviceFacts::batch_invariant, from ops::batch_invariant()):
// only kernels whose order of a query row's keys does not depend on the batch, whatever the
// backend flag says:
//   keys other than the queries' own rows, or a  -> SimpleKeyBlock / Simple: one key at a time
//     block diffusion mask                          in increasing order, invisible keys skipped.
//                                                   The flash kernels group keys in tiles at
//                                                   multiples of kBlockN (32 or 64) from column
//                                                   0, and the block sampler's left padding
//                                                   (B x whole blocks, B the block size) moves a
//                                                   row's keys by a batch-dependent amount, so
//                                                   its online-softmax groups (and bits) change.
//   otherwise                                    -> Flash (head_dim 64/128) / Simple, not cuDNN:
//                                                   cuDNN builds a plan per shape (batch, seq,
//                                                   padding mask) whose engine we cannot pin.
//                                                   The flash kernels have no split over keys
//                                                   (one block per query tile, head and row,
//                                                   attention_forward.cu launch_forward) and the
//                                                   full-sequence sampler's rows start at column
//                                                   0 (compact_rows), so their tiles are the same
//                                                   alone and in a batch.
//
// A cuDNN choice can still be refused when the call runs (a tensor not 16-byte aligned, a plan
// that does not build): the CUDA dispatcher then runs AttentionChoice::fallback (backend auto)
// or fails (backend cudnn). The packed entries read q, k, v in place only on cuDNN, and not for
// documents with GQA (packed_refusal); otherwise they split copies and run the separate-tensor
// choice. src/ops/cuda/attention.cu is the one caller that acts on the answer;
// tests/unit/ops/test_attention_support.cpp lists the cases. docs/kernels/attention.md, "Which
// implementation runs", says what adding a mask touches.
#pragma once
#include <cstdint>
#include <string>
#include "megadlm/ops/attention.h"

namespace megadlm::ops {

enum class AttentionImpl : uint8_t {
  Cpu,             ///< the reference loops (src/ops/cpu/attention.cpp)
  CudnnDense,      ///< cuDNN's fused attention on the [B, S] rows
  CudnnRagged,     ///< cuDNN, the packed documents of every row as one ragged (THD) batch
  CudnnPadded,     ///< cuDNN, dense rows with the padding mask of row_lengths (forward only)
  Flash,           ///< megadlm's flash kernels (head_dim 64/128; documents, dropout included)
  Simple,          ///< megadlm's simple kernels (any head_dim <= 256)
  FlashKeyBlock,   ///< the flash kernels on a separate key block (kv_seq, key documents)
  SimpleKeyBlock,  ///< the simple kernels with the chunk maps (causal / dropout across shards)
  /// Block diffusion of one-document rows as two causal bulks (their own choice: cuDNN) and the
  /// strips (the flash kernels), merged by lse (ops/attention_block_diffusion_bulk.h)
  BlockDiffusionBulk,
};
const char* attention_impl_name(AttentionImpl impl);
bool is_cudnn(AttentionImpl impl);

/// How block diffusion of one-document rows runs (MEGADLM_BD_ATTENTION, read by
/// ops::detail::block_diffusion_attention()).
enum class BlockDiffusionAttention : uint8_t {
  Auto,   ///< the composed path (BlockDiffusionBulk) from half length kBlockDiffusionBulkMinHalf, else flash
  Flash,  ///< the whole mask on the flash kernels
  Bulk,   ///< the composed path wherever it runs
};

/// Auto's threshold on the half length L = seq / 2: the composed path from here on. Measured on
/// an H100 (H16, D128, blocks of 32, bf16; `megadlm_bench ops --op attention_fwd_bd` /
/// `attention_bwd_bd`, 2026-12-07) with the copy-free composition, bulk against flash: L 2048
/// (batch 4) 1.22x forward / 1.17x backward, L 4096 (batch 2) 1.61x / 1.56x, L 8192 (batch 1)
/// 1.97x / 1.84x. 2048 is the shortest length measured; below it flash runs.
inline constexpr int64_t kBlockDiffusionBulkMinHalf = 2048;

/// What choose_attention needs to know about the device of the call.
struct AttentionDeviceFacts {
  bool cuda = false;          ///< the call's stream is a CUDA stream
  int64_t cudnn_version = 0;  ///< cudnnGetVersion() of the loaded library (91400 = 9.14.0); 0: no cuDNN
  bool batch_invariant = false;  ///< ops::batch_invariant() (ops/gemm.h): batch-invariant kernels only
  /// MEGADLM_BD_ATTENTION (ops::detail::block_diffusion_attention): whether block diffusion of
  /// one-document rows may run as causal bulks + strips (auto: from kBlockDiffusionBulkMinHalf)
  BlockDiffusionAttention block_diffusion = BlockDiffusionAttention::Auto;
};

/// Which entry the call came through.
enum class AttentionEntry : uint8_t {
  Separate,  ///< attention_forward / attention_backward: q, k, v as separate tensors
  Packed,    ///< attention_*_packed: q, k, v as columns of the fused QKV rows
};

struct AttentionChoice {
  AttentionImpl impl = AttentionImpl::Cpu;
  /// What runs when a cuDNN choice is refused at run time (an unaligned tensor, a plan that does
  /// not build) under --attention-backend auto: the own kernel. Equal to impl otherwise.
  AttentionImpl fallback = AttentionImpl::Cpu;
  std::string reason;  ///< why, one short phrase (also the dispatcher's log line)
  /// Packed entry only: cuDNN reads the packed rows in place. False: split copies of q, k, v
  /// run `impl` through the separate-tensor entry.
  bool packed_in_place = false;
  /// Non-empty: the call fails with this message (--attention-backend cudnn that cuDNN refuses).
  std::string error;
};

AttentionChoice choose_attention(const AttentionArgs& args, bool backward,
                                 const AttentionDeviceFacts& device,
                                 AttentionEntry entry = AttentionEntry::Separate);

/// Why cuDNN cannot compute these arguments exactly with this runtime version (too old, a known
/// bad version, dropout, head_dim, a backward with one key, ragged offsets overflowing), or ""
/// when it may (the plan build can still refuse).
std::string attention_cudnn_refusal(const AttentionArgs& args, bool backward, int64_t cudnn_version);

/// The packed entries' own limit on top of attention_cudnn_refusal, or "".
std::string attention_cudnn_packed_refusal(const AttentionArgs& args, bool backward);

/// Whether cuDNN runs a call with documents as dense rows with row_lengths' padding mask (forward
/// with row_lengths) rather than as a ragged batch, and whether it runs a ragged batch.
bool attention_row_padded(const AttentionArgs& args, bool backward);
bool attention_ragged_documents(const AttentionArgs& args, bool backward);

}  // namespace megadlm::ops
