// Unit tests of the causal half blocks of the context-parallel ring (cp::ring_block_forward /
// ring_block_backward, src/parallel/context_parallel/ring_attention.cpp): a causal block between
// two different shards runs only its visible half without a mask, and must give exactly what the
// masked whole block gives (f64 on the CPU), with packed documents and with attention dropout,
// for every (query shard, key shard) pair of CP 2 and CP 4.
#include <gtest/gtest.h>
#include <cmath>
#include <string>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/context_parallel/ring_attention.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"
#include "support/op_testing.h"

namespace megadlm {
namespace {

struct Outputs {
  std::vector<double> out, lse, dq, dk, dv;
};

/// Documents of global positions: runs of 5, 9, 3, 13, 7, ... tokens (crossing every chunk
/// and shard boundary), the same for every batch row.
std::vector<int32_t> documents_of(const cp::Split& s, int64_t batch) {
  std::vector<int32_t> global(static_cast<size_t>(s.seq));
  const int lengths[] = {5, 9, 3, 13, 7};
  int32_t doc = 0;
  for (int64_t i = 0, left = lengths[0]; i < s.seq; ++i, --left) {
    if (left == 0) left = lengths[++doc % 5];
    global[static_cast<size_t>(i)] = doc;
  }
  std::vector<int32_t> out;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < s.local_len(); ++i) out.push_back(global[static_cast<size_t>(s.global(i))]);
  return out;
}

Outputs run(bool half_blocks, const cp::Split& queries, const cp::Split& keys, bool docs, float dropout) {
  const int64_t batch = 2, heads = 4, kv_heads = 2, dim = 8, len = queries.local_len();
  const Stream cpu = Stream::cpu();
  const uint64_t seed = 100 + static_cast<uint64_t>(queries.rank * 10 + keys.rank);
  const Tensor q = test::random_tensor({batch * len, heads * dim}, seed, DType::F64);
  const Tensor k = test::random_tensor({batch * len, kv_heads * dim}, seed + 1, DType::F64);
  const Tensor v = test::random_tensor({batch * len, kv_heads * dim}, seed + 2, DType::F64);
  const Tensor dout = test::random_tensor({batch * len, heads * dim}, seed + 3, DType::F64);
  const Tensor qdocs = Tensor::from_ints(documents_of(queries, batch), {batch, len});
  const Tensor kdocs = Tensor::from_ints(documents_of(keys, batch), {batch, len});
  ops::AttentionArgs a{.batch = batch, .seq = len, .num_heads = heads, .num_kv_heads = kv_heads,
                       .head_dim = dim, .mask = ops::AttentionMask::Causal,
                       .softmax_scale = static_cast<float>(1.0 / std::sqrt(double(dim))),
                       .dropout_p = dropout, .dropout_seed = 77, .dropout_site = 1, .sample_offset = 3};
  a.query_chunks = queries.chunks();
  a.key_chunks = keys.chunks();
  if (docs) {
    a.document_ids = &qdocs;
    a.key_document_ids = &kdocs;
  }
  Tensor out = Tensor::empty(q.shape(), DType::F64, cpu), lse = Tensor::empty({batch, heads, len}, DType::F64, cpu);
  Tensor dq = Tensor::empty(q.shape(), DType::F64, cpu), dk = Tensor::empty(k.shape(), DType::F64, cpu),
         dv = Tensor::empty(v.shape(), DType::F64, cpu);
  if (half_blocks) {
    cp::ring_block_forward(q, k, v, out, lse, a, cpu);
    cp::ring_block_backward(dout, q, k, v, out, lse, dq, dk, dv, a, cpu);
  } else {
    ops::attention_forward(q, k, v, out, lse, a, cpu);
    ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, a, cpu);
  }
  return {test::to_doubles(out), test::to_doubles(lse), test::to_doubles(dq), test::to_doubles(dk),
          test::to_doubles(dv)};
}

void expect_same(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " [" << i << "]: a row that sees no key has lse -inf";
      continue;
    }
    EXPECT_NEAR(got[i], want[i], 1e-12 * (1.0 + std::fabs(want[i]))) << what << " [" << i << "]";
  }
}

TEST(RingHalfBlocks, CausalBlocksBetweenShardsEqualTheMaskedBlock) {
  for (int n : {2, 4}) {
    const int64_t seq = 8 * n * 3;  // chunks of 12 positions
    for (int r = 0; r < n; ++r)
      for (int src = 0; src < n; ++src)
        for (bool docs : {false, true})
          for (float p : {0.0f, 0.2f}) {
            const cp::Split queries{n, r, seq}, keys{n, src, seq};
            const std::string tag = "CP " + std::to_string(n) + " queries of rank " + std::to_string(r) +
                                    ", keys of rank " + std::to_string(src) + (docs ? ", documents" : "") +
                                    (p > 0 ? ", dropout" : "");
            SCOPED_TRACE(tag);
            const Outputs want = run(false, queries, keys, docs, p), got = run(true, queries, keys, docs, p);
            expect_same(got.out, want.out, "out");
            expect_same(got.lse, want.lse, "lse");
            expect_same(got.dq, want.dq, "dq");
            expect_same(got.dk, want.dk, "dk");
            expect_same(got.dv, want.dv, "dv");
          }
  }
}

}  // namespace
}  // namespace megadlm
