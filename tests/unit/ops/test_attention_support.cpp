// The attention support table (src/ops/attention_support.h): for each kind of call, which
// implementation runs, what runs when cuDNN refuses at run time, and the reason. Host code only:
// the device facts (a CUDA stream, the cuDNN runtime's version) are given, no GPU is needed.
#include <gtest/gtest.h>
#include <string>
#include <vector>
#include "megadlm/ops/attention.h"
#include "ops/attention_support.h"

namespace megadlm {
namespace {

using ops::AttentionArgs;
using ops::AttentionBackend;
using ops::AttentionChoice;
using ops::AttentionDeviceFacts;
using ops::AttentionEntry;
using ops::AttentionImpl;
using ops::AttentionMask;

constexpr AttentionDeviceFacts kH200{.cuda = true, .cudnn_version = 91400};

AttentionArgs dense(int64_t head_dim = 128) {
  return {.batch = 2, .seq = 256, .num_heads = 4, .num_kv_heads = 4, .head_dim = head_dim,
          .softmax_scale = 0.125f};
}

AttentionChoice fwd(const AttentionArgs& a, AttentionDeviceFacts d = kH200) {
  return ops::choose_attention(a, false, d);
}
AttentionChoice bwd(const AttentionArgs& a, AttentionDeviceFacts d = kH200) {
  return ops::choose_attention(a, true, d);
}

struct Documents {
  Tensor ids = Tensor::from_ints(std::vector<int32_t>(512, 0), {2, 256});
  Tensor lengths = Tensor::from_ints({256, 200}, {2});
};

TEST(AttentionSupport, CpuStreamRunsTheReference) {
  const AttentionChoice c = fwd(dense(), {.cuda = false, .cudnn_version = 91400});
  EXPECT_EQ(c.impl, AttentionImpl::Cpu);
  EXPECT_EQ(c.fallback, AttentionImpl::Cpu);
  EXPECT_EQ(c.reason, "a CPU stream");
  EXPECT_EQ(bwd(dense(37), {.cuda = false}).impl, AttentionImpl::Cpu);
}

TEST(AttentionSupport, DenseRowsRunOnCudnnWithTheOwnKernelAsFallback) {
  for (const bool backward : {false, true}) {
    const AttentionChoice c = ops::choose_attention(dense(), backward, kH200);
    EXPECT_EQ(c.impl, AttentionImpl::CudnnDense);
    EXPECT_EQ(c.fallback, AttentionImpl::Flash);
    EXPECT_EQ(c.reason, "dense rows, cuDNN 9.14.0");
    EXPECT_TRUE(c.error.empty());
  }
  AttentionArgs a = dense(80);  // a multiple of 8: cuDNN; the fallback is the simple kernels
  a.mask = AttentionMask::Causal;
  a.num_kv_heads = 2;
  EXPECT_EQ(fwd(a).impl, AttentionImpl::CudnnDense);
  EXPECT_EQ(fwd(a).fallback, AttentionImpl::Simple);
  EXPECT_EQ(fwd(dense(64)).fallback, AttentionImpl::Flash);
  a = dense();
  a.deterministic = true;  // the backward takes deterministic engines; the forward is unchanged
  EXPECT_EQ(bwd(a).reason, "dense rows, cuDNN 9.14.0, deterministic engines only");
  EXPECT_EQ(fwd(a).reason, "dense rows, cuDNN 9.14.0");
  a = dense();
  a.backend = AttentionBackend::Cudnn;
  EXPECT_EQ(bwd(a).impl, AttentionImpl::CudnnDense);
}

TEST(AttentionSupport, DocumentsRunRaggedAndRowLengthsPaddedInTheForwardOnly) {
  Documents d;
  AttentionArgs a = dense();
  a.document_ids = &d.ids;
  for (const bool backward : {false, true}) {
    const AttentionChoice c = ops::choose_attention(a, backward, kH200);
    EXPECT_EQ(c.impl, AttentionImpl::CudnnRagged);
    EXPECT_EQ(c.fallback, AttentionImpl::Flash);
    EXPECT_EQ(c.reason, "documents as one ragged batch, cuDNN 9.14.0");
  }
  a.row_lengths = &d.lengths;
  EXPECT_EQ(fwd(a).impl, AttentionImpl::CudnnPadded);
  EXPECT_EQ(fwd(a).reason, "dense rows, row_lengths' padding mask, cuDNN 9.14.0");
  EXPECT_EQ(bwd(a).impl, AttentionImpl::CudnnRagged);  // every backward ignores row_lengths
  a.backend = AttentionBackend::Flash;  // the own kernels run the documents, not the padding
  EXPECT_EQ(fwd(a).impl, AttentionImpl::Flash);
  // Ragged offsets are 32-bit element offsets: B S H D >= 2^31 refuses documents, not dense rows.
  AttentionArgs big = dense();
  big.batch = 64;
  big.seq = 8192;
  big.num_heads = 32;  // 64 * 8192 * 32 * 128 = 2^31
  EXPECT_EQ(fwd(big).impl, AttentionImpl::CudnnDense);
  big.document_ids = &d.ids;
  EXPECT_EQ(fwd(big).impl, AttentionImpl::Flash);
  EXPECT_EQ(fwd(big).reason, "cuDNN: packed rows too large for the ragged offsets");
}

TEST(AttentionSupport, WhatCudnnRefusesRunsOnTheOwnKernelsOrFailsUnderBackendCudnn) {
  AttentionArgs a = dense();
  a.dropout_p = 0.1f;
  AttentionChoice c = fwd(a);
  EXPECT_EQ(c.impl, AttentionImpl::Flash);
  EXPECT_EQ(c.fallback, AttentionImpl::Flash);
  EXPECT_EQ(c.reason, "cuDNN: attention dropout is keyed by global coordinates (cuDNN's dropout "
                      "cannot reproduce it)");
  EXPECT_TRUE(c.error.empty());
  a.backend = AttentionBackend::Cudnn;
  EXPECT_EQ(bwd(a).error, "--attention-backend cudnn (fused), but cuDNN cannot run this call: "
                          "attention dropout is keyed by global coordinates (cuDNN's dropout "
                          "cannot reproduce it); use --attention-backend auto or flash");
  a = dense(36);
  EXPECT_EQ(fwd(a).impl, AttentionImpl::Simple);
  EXPECT_EQ(fwd(a).reason, "cuDNN: head_dim 36 (cuDNN needs a multiple of 8, at most 256)");
  EXPECT_EQ(fwd(dense(264)).reason, "cuDNN: head_dim 264 (cuDNN needs a multiple of 8, at most 256)");
  EXPECT_EQ(fwd(dense(256)).impl, AttentionImpl::CudnnDense);
  a = dense();
  a.seq = 1;  // one key: the forward runs, the backward does not
  EXPECT_EQ(fwd(a).impl, AttentionImpl::CudnnDense);
  EXPECT_EQ(bwd(a).impl, AttentionImpl::Flash);
  EXPECT_EQ(bwd(a).reason, "cuDNN: a backward with one key (cuDNN does not support s = 1)");
}

TEST(AttentionSupport, TheCudnnRuntimeVersionGatesIt) {
  const AttentionArgs a = dense();
  EXPECT_EQ(fwd(a, {.cuda = true, .cudnn_version = 0}).reason,
            "cuDNN: this libmegadlm was built without cuDNN");
  EXPECT_EQ(fwd(a, {.cuda = true, .cudnn_version = 90500}).reason,
            "cuDNN: cuDNN 9.5.0 is older than 9.6.0");
  EXPECT_EQ(fwd(a, {.cuda = true, .cudnn_version = 91000}).reason,
            "cuDNN: cuDNN 9.10.0 has known SDPA bugs");
  EXPECT_EQ(fwd(a, {.cuda = true, .cudnn_version = 91001}).impl, AttentionImpl::Flash);
  EXPECT_EQ(fwd(a, {.cuda = true, .cudnn_version = 90600}).impl, AttentionImpl::CudnnDense);
  EXPECT_EQ(fwd(a, {.cuda = true, .cudnn_version = 91900}).reason, "dense rows, cuDNN 9.19.0");
  AttentionArgs forced = a;
  forced.backend = AttentionBackend::Cudnn;
  EXPECT_FALSE(fwd(forced, {.cuda = true, .cudnn_version = 0}).error.empty());
}

TEST(AttentionSupport, BackendFlashRunsTheOwnKernels) {
  AttentionArgs a = dense();
  a.backend = AttentionBackend::Flash;
  EXPECT_EQ(fwd(a).impl, AttentionImpl::Flash);
  EXPECT_EQ(bwd(a).reason, "--attention-backend flash");
  a.head_dim = 96;
  EXPECT_EQ(bwd(a).impl, AttentionImpl::Simple);
  EXPECT_EQ(bwd(a).fallback, AttentionImpl::Simple);
}

TEST(AttentionSupport, KeyBlocksRunFlashOnlyBidirectionalWithoutDropout) {
  Documents d;
  const Tensor key_ids = Tensor::from_ints(std::vector<int32_t>(1024, 0), {2, 512});
  for (const AttentionBackend backend :
       {AttentionBackend::Auto, AttentionBackend::Cudnn, AttentionBackend::Flash}) {
    AttentionArgs a = dense();
    a.backend = backend;  // the context-parallel cases ignore the backend
    a.kv_seq = 512;
    for (const bool backward : {false, true}) {
      const AttentionChoice c = ops::choose_attention(a, backward, kH200);
      EXPECT_EQ(c.impl, AttentionImpl::FlashKeyBlock);
      EXPECT_EQ(c.fallback, AttentionImpl::FlashKeyBlock);
      EXPECT_EQ(c.reason, "key block, bidirectional, no dropout, head_dim 64/128");
      EXPECT_TRUE(c.error.empty());
    }
  }
  AttentionArgs a = dense(64);
  a.kv_seq = 512;
  a.document_ids = &d.ids;
  EXPECT_EQ(fwd(a).impl, AttentionImpl::SimpleKeyBlock);
  EXPECT_EQ(fwd(a).reason,
            "key block, a separate key length with document_ids but no key_document_ids");
  a.key_document_ids = &key_ids;
  EXPECT_EQ(fwd(a).impl, AttentionImpl::FlashKeyBlock);
  a.head_dim = 80;
  EXPECT_EQ(bwd(a).impl, AttentionImpl::SimpleKeyBlock);
  EXPECT_EQ(bwd(a).reason, "key block, head_dim 80 (flash: 64 or 128)");
  a = dense();  // key documents of the same length: a key block too
  a.document_ids = a.key_document_ids = &d.ids;
  EXPECT_EQ(bwd(a).impl, AttentionImpl::FlashKeyBlock);
  a = dense();  // causal between different shards' chunks
  a.mask = AttentionMask::Causal;
  a.query_chunks = {.len = 128, .first = 0, .second = 768};
  a.key_chunks = {.len = 128, .first = 128, .second = 640};
  EXPECT_EQ(fwd(a).impl, AttentionImpl::SimpleKeyBlock);
  EXPECT_EQ(fwd(a).reason, "key block, causal mask at chunk-map positions");
  a.key_chunks = a.query_chunks;  // a ring's own block: the ordinary path with a local mask
  EXPECT_EQ(fwd(a).impl, AttentionImpl::CudnnDense);
  a.dropout_p = 0.1f;  // dropout at global positions needs the maps
  EXPECT_EQ(bwd(a).impl, AttentionImpl::SimpleKeyBlock);
  a.mask = AttentionMask::None;
  EXPECT_EQ(bwd(a).reason, "key block, dropout at chunk-map positions");
}

TEST(AttentionSupport, PackedRowsAreReadInPlaceOnlyByCudnn) {
  Documents d;
  auto packed = [](const AttentionArgs& a, bool backward, AttentionDeviceFacts f = kH200) {
    return ops::choose_attention(a, backward, f, AttentionEntry::Packed);
  };
  AttentionArgs a = dense();
  a.num_kv_heads = 2;
  AttentionChoice c = packed(a, true);
  EXPECT_TRUE(c.packed_in_place);
  EXPECT_EQ(c.impl, AttentionImpl::CudnnDense);
  EXPECT_EQ(c.reason, "dense rows, cuDNN 9.14.0");
  a.document_ids = &d.ids;  // documents with GQA: split copies, then cuDNN on the separate tensors
  for (const bool backward : {false, true}) {
    c = packed(a, backward);
    EXPECT_FALSE(c.packed_in_place);
    EXPECT_EQ(c.impl, AttentionImpl::CudnnRagged);
    EXPECT_EQ(c.reason,
              "split copies (packed QKV with documents and GQA (the separate-tensor path runs it))");
  }
  a.row_lengths = &d.lengths;  // the padded forward is dense rows: in place; its backward is not
  EXPECT_TRUE(packed(a, false).packed_in_place);
  EXPECT_EQ(packed(a, false).impl, AttentionImpl::CudnnPadded);
  EXPECT_FALSE(packed(a, true).packed_in_place);
  a = dense();
  a.document_ids = &d.ids;  // documents without GQA: in place
  EXPECT_TRUE(packed(a, true).packed_in_place);
  EXPECT_EQ(packed(a, true).impl, AttentionImpl::CudnnRagged);
  a = dense();
  a.dropout_p = 0.1f;
  c = packed(a, false);
  EXPECT_FALSE(c.packed_in_place);
  EXPECT_EQ(c.impl, AttentionImpl::Flash);
  EXPECT_EQ(c.reason, "split copies (cuDNN: attention dropout is keyed by global coordinates "
                      "(cuDNN's dropout cannot reproduce it))");
  a = dense();
  a.backend = AttentionBackend::Flash;
  EXPECT_EQ(packed(a, false).reason, "split copies (--attention-backend flash)");
  a = dense();
  a.kv_seq = 512;
  EXPECT_FALSE(packed(a, false).packed_in_place);
  EXPECT_EQ(packed(a, false).impl, AttentionImpl::FlashKeyBlock);
  EXPECT_FALSE(packed(dense(), false, {.cuda = false}).packed_in_place);
  EXPECT_FALSE(packed(dense(), false, {.cuda = true, .cudnn_version = 0}).packed_in_place);
}

TEST(AttentionSupport, BatchInvariantModeRunsOnlyKernelsWhoseKeyOrderIgnoresTheBatch) {
  // generate_difflm --batch-invariant (ops::batch_invariant()): no cuDNN (a plan per shape), the
  // flash kernels where a row's keys start at column 0, one key at a time where the block
  // sampler's batch-dependent left padding moves them (attention_support.h).
  constexpr AttentionDeviceFacts kInvariant{.cuda = true, .cudnn_version = 91400, .batch_invariant = true};
  Documents d;
  for (const AttentionBackend backend : {AttentionBackend::Auto, AttentionBackend::Cudnn, AttentionBackend::Flash}) {
    SCOPED_TRACE(ops::attention_backend_name(backend));
    AttentionArgs a = dense();
    a.backend = backend;
    EXPECT_EQ(fwd(a, kInvariant).impl, AttentionImpl::Flash);
    EXPECT_EQ(fwd(a, kInvariant).reason, "batch-invariant mode: no cuDNN (its plan depends on the shape)");
    EXPECT_TRUE(fwd(a, kInvariant).error.empty());
    // The full-sequence sampler's ragged batch: compacted rows with their padding mask.
    a.document_ids = &d.ids;
    a.row_lengths = &d.lengths;
    EXPECT_EQ(fwd(a, kInvariant).impl, AttentionImpl::Flash);
    EXPECT_EQ(fwd(a, kInvariant).fallback, AttentionImpl::Flash);
    a.head_dim = 96;
    EXPECT_EQ(fwd(a, kInvariant).impl, AttentionImpl::Simple);
    // The exact cache's key block (block decoding): one key at a time, not flash key tiles.
    const Tensor key_ids = Tensor::from_ints(std::vector<int32_t>(1024, 0), {2, 512});
    a = dense();
    a.backend = backend;
    a.kv_seq = 512;
    a.document_ids = &d.ids;
    a.key_document_ids = &key_ids;
    EXPECT_EQ(fwd(a, kInvariant).impl, AttentionImpl::SimpleKeyBlock);
    EXPECT_EQ(fwd(a, kInvariant).reason, "batch-invariant mode: key block, one key at a time");
    EXPECT_EQ(fwd(a, kH200).impl, AttentionImpl::FlashKeyBlock);  // the default is unchanged
    // Packed rows are never read in place (that is cuDNN's): split copies.
    a = dense();
    a.backend = backend;
    EXPECT_FALSE(ops::choose_attention(a, false, kInvariant, AttentionEntry::Packed).packed_in_place);
  }
  // Block diffusion's doubled rows (--kv-cache none): the simple kernels.
  const Tensor ranges = Tensor::from_ints(std::vector<int32_t>(2 * 4 * 256, 0), {2, 4, 256});
  AttentionArgs a = dense();
  a.seq = 512;
  a.mask = AttentionMask::BlockDiffusion;
  a.block_ranges = &ranges;
  EXPECT_EQ(fwd(a, kInvariant).impl, AttentionImpl::Simple);
  EXPECT_EQ(fwd(a, kInvariant).reason, "batch-invariant mode: block diffusion mask, one key at a time");
  EXPECT_EQ(fwd(a, kH200).impl, AttentionImpl::Flash);
  // A CPU stream is the reference either way.
  EXPECT_EQ(fwd(dense(), {.cuda = false, .batch_invariant = true}).impl, AttentionImpl::Cpu);
}

TEST(AttentionSupport, BlockDiffusionRunsFlashForHalfLengthsOf128AndSimpleOtherwise) {
  // The doubled row [x_t | x_0]: seq 512 is L = 256, a multiple of 128, so every 128-row tile of
  // the flash kernels lies in one half; cuDNN has no such mask, under any backend.
  const Tensor ranges = Tensor::from_ints(std::vector<int32_t>(2 * 4 * 256, 0), {2, 4, 256});
  for (const AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal})
    for (const AttentionBackend backend : {AttentionBackend::Auto, AttentionBackend::Flash})
      for (const int64_t head_dim : {64, 128})
        for (const bool deterministic : {false, true})
          for (const bool backward : {false, true}) {
            AttentionArgs a = dense(head_dim);
            a.seq = 512;
            a.num_kv_heads = 2;
            a.mask = mask;
            a.block_ranges = &ranges;
            a.backend = backend;
            a.deterministic = deterministic;
            const AttentionChoice c = ops::choose_attention(a, backward, kH200);
            EXPECT_EQ(c.impl, AttentionImpl::Flash);
            EXPECT_EQ(c.fallback, AttentionImpl::Flash);
            EXPECT_EQ(c.reason, "block diffusion mask");
            EXPECT_TRUE(c.error.empty());
            // Without cuDNN nothing changes.
            EXPECT_EQ(ops::choose_attention(a, backward, {.cuda = true, .cudnn_version = 0}).impl,
                      AttentionImpl::Flash);
          }
  AttentionArgs a = dense(32);
  a.seq = 512;
  a.mask = AttentionMask::BlockDiffusion;
  a.block_ranges = &ranges;
  for (const bool backward : {false, true}) {
    const AttentionChoice c = ops::choose_attention(a, backward, kH200);
    EXPECT_EQ(c.impl, AttentionImpl::Simple);
    EXPECT_EQ(c.fallback, AttentionImpl::Simple);
    EXPECT_EQ(c.reason, "block diffusion mask, head_dim 32 and half length 256 (flash: 64/128 and "
                        "a multiple of 128)");
  }
  a = dense(128);
  a.seq = 192;  // L = 96: a 128-row tile would straddle the halves
  a.mask = AttentionMask::BlockDiffusionCausal;
  a.block_ranges = &ranges;
  EXPECT_EQ(bwd(a).impl, AttentionImpl::Simple);
  EXPECT_EQ(bwd(a).reason, "block diffusion mask, head_dim 128 and half length 96 (flash: 64/128 "
                           "and a multiple of 128)");
  a.seq = 768;  // L = 384 (blocks of 48 fit it too)
  EXPECT_EQ(fwd(a).impl, AttentionImpl::Flash);
  a.backend = AttentionBackend::Cudnn;
  EXPECT_EQ(fwd(a).error, "--attention-backend cudnn (fused), but cuDNN has no block diffusion "
                          "mask; use --attention-backend auto or flash");
  EXPECT_EQ(bwd(a).error, fwd(a).error);
  a.backend = AttentionBackend::Auto;
  const AttentionChoice packed = ops::choose_attention(a, false, kH200, AttentionEntry::Packed);
  EXPECT_FALSE(packed.packed_in_place);
  EXPECT_EQ(packed.impl, AttentionImpl::Flash);
  EXPECT_EQ(packed.reason, "split copies (block diffusion mask)");
  EXPECT_EQ(fwd(a, {.cuda = false}).impl, AttentionImpl::Cpu);
  EXPECT_FALSE(ops::needs_context_parallel_kernel(a));
  // A context-parallel shard of the doubled rows (L = 384 over 2 ranks: halves of 192 rows,
  // chunk-mapped): the simple key-block kernels, which test every element on its global row.
  a.seq = 384;
  a.query_chunks = {96, 0, 3};
  a.key_chunks = {96, 1, 2};
  EXPECT_TRUE(ops::needs_context_parallel_kernel(a));
  EXPECT_EQ(fwd(a).impl, AttentionImpl::SimpleKeyBlock);
  EXPECT_EQ(bwd(a).impl, AttentionImpl::SimpleKeyBlock);
  EXPECT_EQ(bwd(a).reason, "block diffusion on a context-parallel shard");
  EXPECT_TRUE(fwd(a).error.empty());
}

constexpr AttentionDeviceFacts kBulk{.cuda = true, .cudnn_version = 91400,
                                     .block_diffusion = ops::BlockDiffusionAttention::Bulk};
constexpr AttentionDeviceFacts kBdFlash{.cuda = true, .cudnn_version = 91400,
                                        .block_diffusion = ops::BlockDiffusionAttention::Flash};

TEST(AttentionSupport, BlockDiffusionOfOneDocumentRowsRunsBulkUnderTheSwitch) {
  // MEGADLM_BD_ATTENTION=bulk (the fact block_diffusion) and the caller's promise of one
  // document a row (block_diffusion_max_block): cuDNN causal bulks + flash strips under auto.
  const Tensor ranges = Tensor::from_ints(std::vector<int32_t>(2 * 4 * 256, 0), {2, 4, 256});
  AttentionArgs a = dense(128);
  a.seq = 512;
  a.num_kv_heads = 2;
  a.block_ranges = &ranges;
  a.block_diffusion_max_block = 32;
  for (const AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal})
    for (const bool backward : {false, true}) {
      a.mask = mask;
      const AttentionChoice c = ops::choose_attention(a, backward, kBulk);
      EXPECT_EQ(c.impl, AttentionImpl::BlockDiffusionBulk);
      EXPECT_EQ(c.fallback, AttentionImpl::Flash);
      EXPECT_EQ(c.reason, "block diffusion, one document a row, blocks <= 32 (MEGADLM_BD_ATTENTION=bulk), "
                          "cuDNN 9.14.0");
      // auto below its threshold (L = 256), and flash: the whole mask on the flash kernels.
      EXPECT_EQ(ops::choose_attention(a, backward, kH200).impl, AttentionImpl::Flash);
      EXPECT_EQ(ops::choose_attention(a, backward, kBdFlash).impl, AttentionImpl::Flash);
    }
  // Whatever keeps the pieces off cuDNN or off the flash kernels keeps the whole mask on them.
  const auto impl = [&](AttentionArgs x, AttentionDeviceFacts d = kBulk) { return ops::choose_attention(x, true, d).impl; };
  AttentionArgs x = a;
  x.block_diffusion_max_block = 0;  // packed documents (no promise)
  EXPECT_EQ(impl(x), AttentionImpl::Flash);
  x = a;
  x.block_diffusion_strip = true;  // the strip itself
  EXPECT_EQ(impl(x), AttentionImpl::Flash);
  x = a;
  x.backend = AttentionBackend::Flash;
  EXPECT_EQ(impl(x), AttentionImpl::Flash);
  x = a;
  x.head_dim = 32;
  EXPECT_EQ(impl(x), AttentionImpl::Simple);
  x = a;
  x.block_diffusion_max_block = 256;  // blocks as long as the row: no bulk
  EXPECT_EQ(impl(x), AttentionImpl::Flash);
  EXPECT_EQ(impl(a, {.cuda = true, .cudnn_version = 0, .block_diffusion = ops::BlockDiffusionAttention::Bulk}),
            AttentionImpl::Flash);
  EXPECT_EQ(impl(a, {.cuda = true, .cudnn_version = 91400, .batch_invariant = true,
                     .block_diffusion = ops::BlockDiffusionAttention::Bulk}),
            AttentionImpl::Simple);
}

TEST(AttentionSupport, BlockDiffusionAutoRunsBulkFromItsHalfLengthThreshold) {
  // MEGADLM_BD_ATTENTION=auto (the default, and the facts' default here): the composed path for one-document
  // rows from L = kBlockDiffusionBulkMinHalf, the whole mask on the flash kernels below it;
  // flash forces the flash kernels, bulk the composed path, at every length.
  EXPECT_EQ(AttentionDeviceFacts{}.block_diffusion, ops::BlockDiffusionAttention::Auto);
  const int64_t T = ops::kBlockDiffusionBulkMinHalf;
  const int64_t L_max = 2 * T;
  const Tensor ranges = Tensor::from_ints(std::vector<int32_t>(static_cast<size_t>(4 * L_max), 0), {1, 4, L_max});
  AttentionArgs a = dense(128);
  a.batch = 1;
  a.block_ranges = &ranges;
  a.block_diffusion_max_block = 32;
  for (const AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal})
    for (const bool backward : {false, true})
      for (const int64_t L : {T / 2, T - 128, T, 2 * T}) {
        SCOPED_TRACE(testing::Message() << "L " << L << (backward ? " backward" : " forward"));
        a.mask = mask;
        a.seq = 2 * L;
        const AttentionChoice c = ops::choose_attention(a, backward, kH200);
        EXPECT_EQ(c.impl, L >= T ? AttentionImpl::BlockDiffusionBulk : AttentionImpl::Flash);
        EXPECT_EQ(c.fallback, AttentionImpl::Flash);
        const std::string want =
            L >= T ? megadlm::detail::concat("block diffusion, one document a row, blocks <= 32, half length ", L,
                                             " >= ", T, " (MEGADLM_BD_ATTENTION=auto), cuDNN 9.14.0")
                   : std::string("block diffusion mask");
        EXPECT_EQ(c.reason, want);
        EXPECT_EQ(ops::choose_attention(a, backward, kBulk).impl, AttentionImpl::BlockDiffusionBulk);
        EXPECT_EQ(ops::choose_attention(a, backward, kBdFlash).impl, AttentionImpl::Flash);
        // Packed documents (no promise) stay on the flash kernels under auto at every length.
        AttentionArgs x = a;
        x.block_diffusion_max_block = 0;
        EXPECT_EQ(ops::choose_attention(x, backward, kH200).impl, AttentionImpl::Flash);
      }
}

// Over a grid of calls: a cuDNN choice is exactly a call cuDNN accepts (under a backend other
// than flash, outside the key-block cases), the fallback is never cuDNN, and only the cudnn
// backend fails.
TEST(AttentionSupport, TheGridAgreesWithTheRefusalRules) {
  Documents d;
  int cudnn = 0, own = 0, key_block = 0, errors = 0;
  for (const int64_t head_dim : {36, 64, 80, 128, 256})
    for (const bool causal : {false, true})
      for (const float dropout : {0.0f, 0.1f})
        for (const bool documents : {false, true})
          for (const int64_t kv_seq : {0, 512})
            for (const AttentionBackend backend :
                 {AttentionBackend::Auto, AttentionBackend::Cudnn, AttentionBackend::Flash})
              for (const bool backward : {false, true}) {
                AttentionArgs a = dense(head_dim);
                a.mask = causal ? AttentionMask::Causal : AttentionMask::None;
                a.dropout_p = dropout;
                a.document_ids = documents ? &d.ids : nullptr;
                a.kv_seq = kv_seq;
                a.backend = backend;
                const AttentionChoice c = ops::choose_attention(a, backward, kH200);
                const std::string refusal = ops::attention_cudnn_refusal(a, backward, 91400);
                const bool cp = ops::needs_context_parallel_kernel(a);
                EXPECT_FALSE(ops::is_cudnn(c.fallback));
                EXPECT_EQ(ops::is_cudnn(c.impl),
                          !cp && backend != AttentionBackend::Flash && refusal.empty());
                EXPECT_EQ(!c.error.empty(),
                          !cp && backend == AttentionBackend::Cudnn && !refusal.empty());
                EXPECT_FALSE(c.reason.empty());
                cudnn += ops::is_cudnn(c.impl);
                key_block += c.impl == AttentionImpl::FlashKeyBlock ||
                             c.impl == AttentionImpl::SimpleKeyBlock;
                own += c.impl == AttentionImpl::Flash || c.impl == AttentionImpl::Simple;
                errors += !c.error.empty();
              }
  // 5 head dims x 2 x 2 x 2 x 2 kv_seq x 3 backends x 2 directions = 480 calls, half with a
  // separate key length. Of the 240 others, cuDNN takes dropout-free calls with head_dim % 8 == 0
  // under auto and cudnn: 4 x 2 x 2 x 2 x 2 = 64 (32 a backend); the cudnn backend fails on
  // its other 80 - 32 = 48 calls, which still name the own kernel (176 = 240 - 64).
  EXPECT_EQ(key_block, 240);
  EXPECT_EQ(cudnn, 64);
  EXPECT_EQ(errors, 48);
  EXPECT_EQ(own, 176);
}

}  // namespace
}  // namespace megadlm
