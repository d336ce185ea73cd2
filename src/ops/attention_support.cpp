// The attention support table (contract in attention_support.h).
#include "ops/attention_support.h"
#include "megadlm/core/error.h"

namespace megadlm::ops {

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::Cpu: return "CPU reference";
    case AttentionImpl::CudnnDense: return "cuDNN fused attention";
    case AttentionImpl::CudnnRagged: return "cuDNN fused attention (ragged documents)";
    case AttentionImpl::CudnnPadded: return "cuDNN fused attention (padded rows)";
    case AttentionImpl::Flash: return "megadlm flash kernels";
    case AttentionImpl::Simple: return "megadlm simple kernels";
    case AttentionImpl::FlashKeyBlock: return "megadlm flash kernels (separate key block)";
    case AttentionImpl::SimpleKeyBlock: return "megadlm simple kernels (key block)";
    case AttentionImpl::BlockDiffusionBulk: return "cuDNN causal bulks + megadlm flash strips";
  }
  return "?";
}

bool is_cudnn(AttentionImpl impl) {
  return impl == AttentionImpl::CudnnDense || impl == AttentionImpl::CudnnRagged ||
         impl == AttentionImpl::CudnnPadded;
}

bool needs_context_parallel_kernel(const AttentionArgs& a) {
  // Block diffusion on a shard: chunk-mapped halves (or keys of another shard) need the rule on
  // the whole doubled row's positions.
  if (is_block_diffusion(a.mask))
    return a.keys() != a.seq || !a.query_chunks.identity() || !a.key_chunks.identity();
  // The flash kernels (and cuDNN) take keys that are the queries' own rows: one length, one
  // document tensor, a local causal mask and dropout at local positions plus offsets. Equal
  // increasing maps give the same causal mask as local order; dropout needs identity maps.
  if (a.keys() != a.seq || a.key_document_ids != nullptr) return true;
  if (a.mask == AttentionMask::Causal && !a.query_chunks.same_as(a.key_chunks)) return true;
  return a.dropout_p > 0 && !(a.query_chunks.identity() && a.key_chunks.identity());
}

bool attention_row_padded(const AttentionArgs& a, bool backward) {
  return !backward && a.document_ids != nullptr && a.row_lengths != nullptr;
}

bool attention_ragged_documents(const AttentionArgs& a, bool backward) {
  return a.document_ids != nullptr && !attention_row_padded(a, backward);
}

namespace {

constexpr int64_t kCudnnMinVersion = 90600;  // ragged statistics and ragged GQA

std::string version_name(int64_t v) {
  return detail::concat("cuDNN ", v / 10000, ".", v / 100 % 100, ".", v % 100);
}

bool flash_head_dim(const AttentionArgs& a) { return a.head_dim == 64 || a.head_dim == 128; }

AttentionImpl own_kernel(const AttentionArgs& a) {
  // Packed documents run on the flash kernels too: each query tile visits only the key tiles
  // of its documents.
  return flash_head_dim(a) ? AttentionImpl::Flash : AttentionImpl::Simple;
}

/// The context-parallel cases: the flash kernels take a separate key length and the keys' own
/// documents (kKeys), but their causal mask and dropout coordinates are local positions, so a
/// causal mask or dropout here needs the chunk maps (or keys at other positions), which only the
/// simple kernels apply. A separate key length with document_ids needs the keys' own ids.
AttentionChoice key_block_choice(const AttentionArgs& a) {
  AttentionChoice c;
  c.impl = AttentionImpl::SimpleKeyBlock;
  if (!flash_head_dim(a)) {
    c.reason = detail::concat("key block, head_dim ", a.head_dim, " (flash: 64 or 128)");
  } else if (a.mask != AttentionMask::None) {
    c.reason = "key block, causal mask at chunk-map positions";
  } else if (a.dropout_p != 0.0f) {
    c.reason = "key block, dropout at chunk-map positions";
  } else if (a.document_ids != nullptr && a.key_document_ids == nullptr && a.keys() != a.seq) {
    c.reason = "key block, a separate key length with document_ids but no key_document_ids";
  } else {
    c.impl = AttentionImpl::FlashKeyBlock;
    c.reason = "key block, bidirectional, no dropout, head_dim 64/128";
  }
  c.fallback = c.impl;
  return c;
}

/// Why the composed block diffusion path cannot run a call, or "".
std::string block_diffusion_bulk_refusal(const AttentionArgs& a, bool backward, const AttentionDeviceFacts& device) {
  if (device.block_diffusion == BlockDiffusionAttention::Flash) return "MEGADLM_BD_ATTENTION=flash";
  if (device.block_diffusion == BlockDiffusionAttention::Auto && a.seq / 2 < kBlockDiffusionBulkMinHalf)
    return detail::concat("half length ", a.seq / 2, " < ", kBlockDiffusionBulkMinHalf,
                          " (MEGADLM_BD_ATTENTION=auto: the flash kernels are faster there)");
  if (a.block_diffusion_strip) return "a strip (the composed path's own piece)";
  if (a.block_diffusion_max_block <= 0) return "rows not promised to hold one document each";
  if (a.backend != AttentionBackend::Auto) return "--attention-backend is not auto";
  if (a.seq / 2 <= a.block_diffusion_max_block + 1) return "no bulk (blocks as long as the row)";
  AttentionArgs piece = a;
  piece.mask = AttentionMask::Causal;
  piece.block_ranges = nullptr;
  piece.block_diffusion_max_block = 0;
  piece.seq = a.seq / 2 - a.block_diffusion_max_block;
  return attention_cudnn_refusal(piece, backward, device.cudnn_version);
}

}  // namespace

std::string attention_cudnn_refusal(const AttentionArgs& a, bool backward, int64_t v) {
  if (v <= 0) return "this libmegadlm was built without cuDNN";
  if (v < kCudnnMinVersion) return version_name(v) + " is older than 9.6.0";
  if (v == 91000 || v == 91001) return version_name(v) + " has known SDPA bugs";
  if (a.dropout_p > 0.0f)
    return "attention dropout is keyed by global coordinates (cuDNN's dropout cannot reproduce it)";
  if (a.head_dim % 8 != 0 || a.head_dim > 256)
    return "head_dim " + std::to_string(a.head_dim) + " (cuDNN needs a multiple of 8, at most 256)";
  if (backward && a.seq == 1) return "a backward with one key (cuDNN does not support s = 1)";
  if (a.document_ids != nullptr && a.batch * a.seq * a.num_heads * a.head_dim >= (int64_t{1} << 31))
    return "packed rows too large for the ragged offsets";
  return {};
}

std::string attention_cudnn_packed_refusal(const AttentionArgs& a, bool backward) {
  // The ragged GQA backward's full-head scratch would take the packed row's stride (the
  // frontend's implicit multiplier), several times its size; the forward follows so that both
  // directions read the same buffers.
  if (attention_ragged_documents(a, backward) && a.num_heads != a.num_kv_heads)
    return "packed QKV with documents and GQA (the separate-tensor path runs it)";
  return {};
}

AttentionChoice choose_attention(const AttentionArgs& a, bool backward,
                                 const AttentionDeviceFacts& device, AttentionEntry entry) {
  AttentionChoice c;
  if (!device.cuda) {
    c.impl = c.fallback = AttentionImpl::Cpu;
    c.reason = "a CPU stream";
    return c;
  }
  if (device.batch_invariant) {
    // Kernels whose key order per query row is the batch's no matter (attention_support.h).
    if (is_block_diffusion(a.mask) || needs_context_parallel_kernel(a)) {
      const bool keys = needs_context_parallel_kernel(a);
      c.impl = c.fallback = keys ? AttentionImpl::SimpleKeyBlock : AttentionImpl::Simple;
      c.reason = keys ? "batch-invariant mode: key block, one key at a time"
                      : "batch-invariant mode: block diffusion mask, one key at a time";
    } else {
      c.impl = c.fallback = own_kernel(a);
      c.reason = "batch-invariant mode: no cuDNN (its plan depends on the shape)";
    }
  } else if (is_block_diffusion(a.mask)) {
    // cuDNN has no block diffusion mask; the flash kernels apply it per tile (kBlockDiffusion,
    // whole query tiles in one half: L a multiple of 128), the simple kernels per element.
    const bool flash = flash_head_dim(a) && (a.seq / 2) % 128 == 0;
    c.impl = c.fallback = flash ? AttentionImpl::Flash : AttentionImpl::Simple;
    c.reason = flash ? "block diffusion mask" : detail::concat("block diffusion mask, head_dim ", a.head_dim,
                                                              " and half length ", a.seq / 2,
                                                              " (flash: 64/128 and a multiple of 128)");
    if (a.backend == AttentionBackend::Cudnn)
      c.error = "--attention-backend cudnn (fused), but cuDNN has no block diffusion mask; use "
                "--attention-backend auto or flash";
    if (needs_context_parallel_kernel(a)) {
      // A context-parallel shard (ring step, all_gather): the simple key-block kernels test
      // every element on its global row (the flash kernels' tile plans take whole rows).
      c.impl = c.fallback = AttentionImpl::SimpleKeyBlock;
      c.reason = "block diffusion on a context-parallel shard";
    } else if (std::string why = block_diffusion_bulk_refusal(a, backward, device); flash && why.empty()) {
      // One document a row: most pairs are two causal bulks that cuDNN runs at its dense rates;
      // the flash kernels keep the strips (fallback: the whole mask on them).
      c.impl = AttentionImpl::BlockDiffusionBulk;
      c.reason = "block diffusion, one document a row, blocks <= " +
                 std::to_string(a.block_diffusion_max_block) +
                 (device.block_diffusion == BlockDiffusionAttention::Bulk
                      ? std::string(" (MEGADLM_BD_ATTENTION=bulk), ")
                      : detail::concat(", half length ", a.seq / 2, " >= ", kBlockDiffusionBulkMinHalf,
                                       " (MEGADLM_BD_ATTENTION=auto), ")) +
                 version_name(device.cudnn_version);
    }
  } else if (needs_context_parallel_kernel(a)) {
    c = key_block_choice(a);
  } else if (a.backend == AttentionBackend::Flash) {
    c.impl = c.fallback = own_kernel(a);
    c.reason = "--attention-backend flash";
  } else if (std::string why = attention_cudnn_refusal(a, backward, device.cudnn_version);
             !why.empty()) {
    c.impl = c.fallback = own_kernel(a);
    c.reason = "cuDNN: " + why;
    if (a.backend == AttentionBackend::Cudnn)
      c.error = "--attention-backend cudnn (fused), but cuDNN cannot run this call: " + why +
                "; use --attention-backend auto or flash";
  } else {
    c.fallback = own_kernel(a);
    if (attention_row_padded(a, backward)) {
      c.impl = AttentionImpl::CudnnPadded;
      c.reason = "dense rows, row_lengths' padding mask";
    } else if (attention_ragged_documents(a, backward)) {
      c.impl = AttentionImpl::CudnnRagged;
      c.reason = "documents as one ragged batch";
    } else {
      c.impl = AttentionImpl::CudnnDense;
      c.reason = "dense rows";
    }
    c.reason += ", " + version_name(device.cudnn_version);
    if (backward && a.deterministic) c.reason += ", deterministic engines only";
  }
  if (entry == AttentionEntry::Packed) {
    const std::string why = is_cudnn(c.impl) ? attention_cudnn_packed_refusal(a, backward) : "";
    c.packed_in_place = is_cudnn(c.impl) && why.empty();
    if (!c.packed_in_place) c.reason = "split copies (" + (why.empty() ? c.reason : why) + ")";
  }
  return c;
}

}  // namespace megadlm::ops
