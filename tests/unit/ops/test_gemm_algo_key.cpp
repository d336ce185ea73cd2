// The CUDA GEMM's algorithm-cache keys (src/ops/gemm_algo_key.h), host code only: which products
// share one cuBLASLt algorithm in the default mode and in batch-invariant mode (ops/gemm.h), and
// that the two modes never share a cache entry. The products themselves: gpu_parity's
// GemmParity.BatchInvariant* on a GPU.
#include <gtest/gtest.h>
#include <unordered_set>
#include "megadlm/ops/gemm.h"
#include "ops/gemm_algo_key.h"

namespace megadlm {
namespace {

using ops::detail::AlgoKey;
using ops::detail::AlgoKeyHash;
using ops::detail::heuristic_key;
using ops::detail::kInvariantM;
using ops::detail::problem_key;

/// A bf16 linear layer's product C[m, 2048] = A[m, 1024] W^T, operands 256-byte aligned.
AlgoKey linear(int64_t m, int64_t k = 1024) {
  return {.device = 0, .m = m, .n = 2048, .k = k, .trans_a = false, .trans_b = true, .has_bias = false,
          .ab = DType::BF16, .c = DType::BF16, .align_a = 256, .align_b = 256, .align_c = 256, .align_bias = 256};
}

TEST(GemmAlgoKey, DefaultModeAsksAboutTheSizeBucketOfMAndK) {
  EXPECT_EQ(ops::detail::heuristic_bucket(1), 16);
  EXPECT_EQ(ops::detail::heuristic_bucket(17), 32);
  EXPECT_EQ(ops::detail::heuristic_bucket(128), 128);
  EXPECT_EQ(ops::detail::heuristic_bucket(129), 256);
  EXPECT_EQ(ops::detail::heuristic_bucket(512), 512);
  const AlgoKey key = problem_key(linear(7, 1000), false);
  EXPECT_FALSE(key.invariant);
  EXPECT_EQ(key.align_a, 256u);  // alignments untouched
  const AlgoKey asked = heuristic_key(key);
  EXPECT_EQ(asked.m, 16);
  EXPECT_EQ(asked.k, 1024);
  // Different M buckets ask about different problems: the algorithm may depend on M.
  EXPECT_NE(heuristic_key(problem_key(linear(1), false)).m, heuristic_key(problem_key(linear(512), false)).m);
}

TEST(GemmAlgoKey, BatchInvariantModeAsksAboutOneProblemForEveryM) {
  const AlgoKey first = heuristic_key(problem_key(linear(1), true));
  EXPECT_TRUE(first.invariant);
  EXPECT_EQ(first.m, kInvariantM);
  EXPECT_EQ(first.k, 1024);
  for (const int64_t m : {1, 7, 32, 512, 4096, 10000}) {
    SCOPED_TRACE(m);
    const AlgoKey own = problem_key(linear(m), true);
    EXPECT_EQ(own.m, m);  // each M keeps its own (checked) cache entry ...
    EXPECT_EQ(heuristic_key(own), first);  // ... of the one algorithm
  }
  // K is never bucketed: every element of a row reduces over all of it.
  EXPECT_EQ(heuristic_key(problem_key(linear(7, 1000), true)).k, 1000);
  // Other N, K or transposes are other problems.
  AlgoKey other = linear(7);
  other.n = 4096;
  EXPECT_NE(heuristic_key(problem_key(other, true)), first);
  other = linear(7);
  other.trans_b = false;
  EXPECT_NE(heuristic_key(problem_key(other, true)), first);
}

TEST(GemmAlgoKey, BatchInvariantAlignmentsAreCappedAt16Bytes) {
  // A view at a batch-dependent row offset is 128- or 256-byte aligned: the same algorithm.
  AlgoKey a128 = linear(7), a256 = linear(7);
  a128.align_a = 128;
  a128.align_c = 64;
  EXPECT_EQ(heuristic_key(problem_key(a128, true)), heuristic_key(problem_key(a256, true)));
  EXPECT_EQ(problem_key(a128, true).align_a, ops::detail::kInvariantAlignment);
  // Below 16 bytes the alignment still counts (cuBLASLt's vector kernels cannot run it).
  AlgoKey a8 = linear(7);
  a8.align_a = 8;
  EXPECT_EQ(problem_key(a8, true).align_a, 8u);
  EXPECT_NE(heuristic_key(problem_key(a8, true)), heuristic_key(problem_key(a256, true)));
  // The default mode keeps them as they are (its cache is unchanged).
  EXPECT_NE(problem_key(a128, false), problem_key(a256, false));
}

TEST(GemmAlgoKey, TheTwoModesNeverShareACacheEntry) {
  std::unordered_set<AlgoKey, AlgoKeyHash> keys;
  for (const int64_t m : {16, 4096}) {
    for (const bool invariant : {false, true}) {
      const AlgoKey own = problem_key(linear(m), invariant);
      EXPECT_TRUE(keys.insert(own).second) << "m " << m << " invariant " << invariant;
    }
  }
  // The default key asked about at M = 4096 and the invariant canonical key: same shape, two entries.
  const AlgoKey def = heuristic_key(problem_key(linear(kInvariantM), false));
  const AlgoKey inv = heuristic_key(problem_key(linear(kInvariantM), true));
  EXPECT_EQ(def.m, inv.m);
  EXPECT_NE(def, inv);
  EXPECT_NE(AlgoKeyHash{}(def), AlgoKeyHash{}(inv));
}

TEST(GemmAlgoKey, TheSwitchIsProcessWideAndOffByDefault) {
  EXPECT_FALSE(ops::batch_invariant());
  ops::set_batch_invariant(true);
  EXPECT_TRUE(ops::batch_invariant());
  ops::set_batch_invariant(false);
  EXPECT_FALSE(ops::batch_invariant());
}

}  // namespace
}  // namespace megadlm
