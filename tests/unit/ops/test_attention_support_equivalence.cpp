// Transitional: the support table against the decision the CUDA dispatcher makes today
// (default_attention_kernel, context_parallel_attention_kernel, cudnn_attention_unsupported,
// cuda::attention_packed_reads_in_place), over a grid of calls. Removed with those functions
// once the dispatcher asks the table.
#include <gtest/gtest.h>
#include <cstdio>
#include <string>
#include <vector>
#include "megadlm/ops/attention.h"
#include "ops/attention_support.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/attention_cudnn.h"
#include "ops/cuda/attention_impl.h"
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm {
namespace {

#if MEGADLM_WITH_CUDA
using ops::AttentionArgs;
using ops::AttentionBackend;
using ops::AttentionImpl;
using ops::AttentionMask;

int64_t loaded_cudnn_version() {
  // "cuDNN 9.14.0" -> 91400; 0 when not built.
  const std::string s = ops::cuda::cudnn_attention_version();
  int major = 0, minor = 0, patch = 0;
  if (std::sscanf(s.c_str(), "cuDNN %d.%d.%d", &major, &minor, &patch) != 3) return 0;
  return major * 10000 + minor * 100 + patch;
}

AttentionImpl own(ops::cuda::AttentionKernel k, bool key_block) {
  if (k == ops::cuda::AttentionKernel::Flash)
    return key_block ? AttentionImpl::FlashKeyBlock : AttentionImpl::Flash;
  return key_block ? AttentionImpl::SimpleKeyBlock : AttentionImpl::Simple;
}

/// Today's dispatch (src/ops/attention.cpp + src/ops/cuda/attention.cu) without running anything.
ops::AttentionChoice today(const AttentionArgs& a, bool backward) {
  ops::AttentionChoice c;
  if (ops::needs_context_parallel_kernel(a)) {
    c.impl = c.fallback = own(ops::cuda::context_parallel_attention_kernel(a, backward), true);
    return c;
  }
  const AttentionImpl fallback = own(ops::cuda::default_attention_kernel(a), false);
  c.fallback = fallback;
  if (a.backend == AttentionBackend::Flash) {
    c.impl = fallback;
    return c;
  }
  const std::string why = ops::cuda::cudnn_attention_unsupported(a, backward);
  if (!why.empty()) {
    c.impl = fallback;
    if (a.backend == AttentionBackend::Cudnn) c.error = why;
    return c;
  }
  const bool padded = !backward && a.document_ids != nullptr && a.row_lengths != nullptr;
  c.impl = padded ? AttentionImpl::CudnnPadded
                  : a.document_ids != nullptr ? AttentionImpl::CudnnRagged : AttentionImpl::CudnnDense;
  return c;
}

TEST(AttentionSupportEquivalence, TheTableChoosesWhatTheDispatcherChoseBefore) {
  const ops::AttentionDeviceFacts facts{.cuda = true, .cudnn_version = loaded_cudnn_version()};
  // A loaded cuDNN that runs attention, so that the grid reaches every cuDNN case.
  ASSERT_GE(facts.cudnn_version, 90600) << ops::cuda::cudnn_attention_version();
  const Tensor ids = Tensor::from_ints(std::vector<int32_t>(2 * 256, 0), {2, 256});
  const Tensor key_ids = Tensor::from_ints(std::vector<int32_t>(2 * 512, 0), {2, 512});
  const Tensor lengths = Tensor::from_ints({256, 100}, {2});
  int calls = 0;
  for (const int64_t head_dim : {8, 36, 64, 80, 128, 256})
    for (const int64_t seq : {1, 256})
      for (const int64_t kv_heads : {4, 2})
        for (const bool causal : {false, true})
          for (const float dropout : {0.0f, 0.1f})
            for (const int docs : {0, 1, 2})  // none, document_ids, + row_lengths
              for (const int keys : {0, 1, 2, 3})  // own rows, kv_seq, key documents, chunk maps
                for (const AttentionBackend backend :
                     {AttentionBackend::Auto, AttentionBackend::Cudnn, AttentionBackend::Flash})
                  for (const bool deterministic : {false, true}) {
                    AttentionArgs a{.batch = 2, .seq = seq, .num_heads = 4, .num_kv_heads = kv_heads,
                                    .head_dim = head_dim,
                                    .mask = causal ? AttentionMask::Causal : AttentionMask::None,
                                    .softmax_scale = 0.1f, .dropout_p = dropout};
                    a.backend = backend;
                    a.deterministic = deterministic;
                    if (docs >= 1) a.document_ids = &ids;
                    if (docs == 2) a.row_lengths = &lengths;
                    if (keys == 1) a.kv_seq = 512;
                    if (keys == 2) {
                      a.kv_seq = 512;
                      a.key_document_ids = &key_ids;
                    }
                    if (keys == 3) {
                      a.query_chunks = {.len = seq / 2, .first = 0, .second = 3 * seq / 2};
                      a.key_chunks = {.len = seq / 2, .first = seq / 2, .second = seq};
                    }
                    for (const bool backward : {false, true}) {
                      const ops::AttentionChoice want = today(a, backward);
                      const ops::AttentionChoice got = ops::choose_attention(a, backward, facts);
                      SCOPED_TRACE(testing::Message() << "D " << head_dim << " S " << seq << " Hkv "
                                                      << kv_heads << " causal " << causal << " p "
                                                      << dropout << " docs " << docs << " keys "
                                                      << keys << " backend "
                                                      << static_cast<int>(backend) << " bwd "
                                                      << backward);
                      EXPECT_EQ(got.impl, want.impl) << got.reason;
                      EXPECT_EQ(got.fallback, want.fallback);
                      EXPECT_EQ(got.error.empty(), want.error.empty()) << got.error;
                      if (!want.error.empty()) {
                        EXPECT_NE(got.error.find(want.error), std::string::npos);
                      }
                      ++calls;
                    }
                    // The packed entries: in place iff both directions would be.
                    const bool in_place_today = !ops::needs_context_parallel_kernel(a) &&
                                                ops::cuda::attention_packed_reads_in_place(a);
                    const bool in_place =
                        ops::choose_attention(a, false, facts, ops::AttentionEntry::Packed).packed_in_place &&
                        ops::choose_attention(a, true, facts, ops::AttentionEntry::Packed).packed_in_place;
                    EXPECT_EQ(in_place, in_place_today);
                  }
  EXPECT_EQ(calls, 6 * 2 * 2 * 2 * 2 * 3 * 4 * 3 * 2 * 2);
}
#endif

}  // namespace
}  // namespace megadlm
