// megadlm_bench rows of context parallelism: the merge of one ring block into the running
// result (ops/attention_merge.h: f32 accumulator, bf16 block), once per ring step and layer.
// Memory-bound: 4 B read and 4 B written of the accumulator and 2 B of the block per element,
// plus the two log-sum-exps read and one written per row.
#include <vector>
#include "megadlm/ops/attention_merge.h"
#include "megadlm_bench/bench.h"

namespace megadlm::bench {

std::vector<OpBench> context_parallel_benches() {
  const int64_t B = 1, S = kTokens, H = kHeads, D = kHeadDim;  // one 8192-token block, 16 heads
  OpBench b;
  b.name = "attention_merge";
  b.shape = "B=1 S=8192 H=16 D=128 f32 acc, bf16 block";
  b.bytes = static_cast<double>(B * S * H) * (D * (4 + 4 + 2) + 3 * 4);
  b.check = [](const Stream& s) {
    const ops::AttentionMergeArgs a{2, 100, 3, 80};
    const Shape os{2, 100, 3, 80}, ls{2, 3, 100};
    Pair acc = make_pair(os, DType::F32, s), block = make_pair(os, DType::BF16, s);
    Pair lse = make_pair(ls, DType::F32, s, -3, 3), block_lse = make_pair(ls, DType::F32, s, -3, 3);
    ops::attention_merge(acc.dev, lse.dev, block.dev, block_lse.dev, a, s);
    ops::attention_merge(acc.host, lse.host, block.host, block_lse.host, a, Stream::cpu());
    Check c;
    c.add(rel_err(acc.dev, acc.host, s), kTolF32);
    c.add(rel_err(lse.dev, lse.host, s), kTolF32);
    return c;
  };
  b.setup = [=](const Stream& s) -> std::function<void()> {
    const Shape os{B, S, H, D}, ls{B, H, S};
    Tensor acc = random_device(os, DType::F32, s), block = random_device(os, DType::BF16, s);
    Tensor lse = random_device(ls, DType::F32, s), block_lse = random_device(ls, DType::F32, s);
    return [=, &s]() mutable { ops::attention_merge(acc, lse, block, block_lse, {B, S, H, D}, s); };
  };
  return {b};
}

}  // namespace megadlm::bench
