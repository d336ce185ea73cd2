// Vocabulary-parallel embedding and cross-entropy (parallel/tensor_parallel/vocab_parallel.h) on
// CUDA tensors over NCCL (part of the gpu_nccl SPMD suite: 2, 4 or 8 ranks, one GPU each or all
// on one GPU through scripts/shared_gpu_rank.sh), TP = the world, with and without sequence
// parallelism, against the unsplit ops on the same GPU:
//   * embedding forward: each row is one rank's weight row plus zeros from the others, so the
//     all-reduce (or reduce-scatter under SP) is exact: EXPECT_EQ with the full lookup;
//   * embedding backward: upstream gradients are small integers (exact in bf16 and in any fp32
//     summation order), so every weight-gradient row of the shard equals the full backward's
//     row exactly, repeated ids included;
//   * cross-entropy: f32 statistics all-reduced (max exact; sums in another order than the
//     unsplit row sum), so losses and gradients agree to fp32 summation order (kF32AccumRelL2);
//     with bf16 logits the gradients are rounded to bf16 on both sides from those f32 values
//     (kBf16ParityRelL2). Every rank's losses are the same bits (the finish step's contract).
// Rows: 37 tokens (uneven SP shards, the last one padded). Skips without a GPU.
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"
#include "megadlm/parallel/tensor_parallel/vocab_parallel.h"
#include "support/op_testing.h"
#include "support/spmd.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

constexpr int64_t kTokens = 37, kHidden = 64, kVocab = 512;  // 512: divisible by TP 2, 4, 8

/// Token ids with repeats, spread over every rank's vocabulary rows.
std::vector<int32_t> token_ids() {
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < kTokens; ++t) ids.push_back(static_cast<int32_t>((t * 5 % 11) * 47 % kVocab));
  return ids;
}

std::vector<float> host(const Tensor& t, const Stream& s) {
  std::vector<float> v = t.to_floats(s);
  s.synchronize();
  return v;
}

class VocabParallelNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    runtime_ = test::spmd::runtime(comm::Transport::Nccl, &why);
    if (runtime_ == nullptr) GTEST_SKIP() << why;
    stream_ = Stream::create(runtime_->device());
  }

  /// TP over the whole world.
  ModelParallel tp_world(bool sp) {
    ParallelConfig pc;
    pc.world_size = pc.tensor_model_parallel_size = pc.expert_tensor_parallel_size = runtime_->world().size();
    pc.sequence_parallel = sp;
    if (!groups_) groups_ = std::make_unique<parallel::ProcessGroups>(parallel::ProcessGroups::build(runtime_->world_shared(), pc));
    return ModelParallel::from(*groups_, pc);
  }

  comm::DistributedRuntime* runtime_ = nullptr;
  Stream stream_;
  std::unique_ptr<parallel::ProcessGroups> groups_;
};

}  // namespace

TEST_F(VocabParallelNccl, EmbeddingForwardAndBackwardAreExactlyTheUnsplitOnes) {
  const int tp = runtime_->world().size(), me = runtime_->world().rank();
  const int64_t rows_per_rank = kVocab / tp, start = me * rows_per_rank;
  const Stream& s = stream_;
  const Tensor ids = Tensor::from_ints(token_ids(), {kTokens}).to(runtime_->device(), s);
  const Tensor weight = test::random_tensor({kVocab, kHidden}, 41).to(runtime_->device(), DType::BF16, s);
  const Tensor shard = weight.narrow(start, rows_per_rank);
  Tensor full_out = Tensor::empty({kTokens, kHidden}, DType::BF16, s);
  ops::embedding_forward(weight, ids, full_out, 0, s);
  // Upstream gradient: small integers, exact in bf16 and summed exactly in fp32.
  std::vector<float> dx_values;
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t h = 0; h < kHidden; ++h) dx_values.push_back(static_cast<float>((t * 3 + h) % 7 - 3));
  const Tensor dx_full = Tensor::from_floats(dx_values, {kTokens, kHidden}, DType::F32).to(runtime_->device(), DType::BF16, s);
  Tensor dw_full = Tensor::zeros({kVocab, kHidden}, DType::F32, s);
  ops::embedding_backward(ids, dx_full, dw_full, 0, s);
  const std::vector<float> want_dw = host(dw_full.narrow(start, rows_per_rank), s);

  for (bool sp : {false, true}) {
    SCOPED_TRACE(std::string(sp ? "sequence parallel" : "replicated rows") + ", rank " + std::to_string(me));
    const ModelParallel mp = tp_world(sp);
    const Tensor out = tp::vocab_parallel_embedding(shard, ids, start, mp, s);
    // Under SP this rank holds rows [me * per, me * per + per) of the padded rows.
    const int64_t per = sp ? shard_rows(kTokens, tp) : kTokens, first = sp ? me * per : 0;
    const int64_t real = std::max<int64_t>(0, std::min(per, kTokens - first));
    ASSERT_EQ(out.rows(), per);
    if (real > 0) {
      EXPECT_EQ(host(out.narrow(0, real), s), host(full_out.narrow(first, real), s));
    }
    Tensor dw = Tensor::zeros({rows_per_rank, kHidden}, DType::F32, s);
    Tensor dx = Tensor::zeros({per, kHidden}, DType::BF16, s);
    if (real > 0) {
      Tensor mine = dx.narrow(0, real);
      ops::copy(dx_full.narrow(first, real), mine, s);
    }
    tp::vocab_parallel_embedding_backward(ids, dx, dw, start, mp, s);
    EXPECT_EQ(host(dw, s), want_dw);
  }
}

TEST_F(VocabParallelNccl, CrossEntropyMatchesTheUnsplitLossAndGradient) {
  const int tp = runtime_->world().size(), me = runtime_->world().rank();
  const int64_t cols = kVocab / tp, start = me * cols;
  const Stream& s = stream_;
  std::vector<int32_t> targets;
  std::vector<float> weights;
  for (int64_t t = 0; t < kTokens; ++t) {
    targets.push_back(static_cast<int32_t>((t * 97 + 13) % kVocab));
    weights.push_back(0.25f * static_cast<float>(1 + t % 3));
  }
  const Tensor tgt = Tensor::from_ints(targets, {kTokens}).to(runtime_->device(), s);
  const Tensor w = Tensor::from_floats(weights, {kTokens}, DType::F32).to(runtime_->device(), s);
  const ModelParallel mp = tp_world(false);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " logits, rank " + std::to_string(me));
    const Tensor logits = test::random_tensor({kTokens, kVocab}, 42, DType::F32, -4.0f, 4.0f)
                              .to(runtime_->device(), dtype, s);
    // Unsplit: the whole row on this GPU.
    Tensor full = logits.to(runtime_->device(), s);  // a copy: overwritten with the gradient
    Tensor full_losses = Tensor::empty({kTokens}, DType::F32, s);
    ops::cross_entropy_forward_backward(full, tgt, w, full_losses, 0.5f, s);
    // This rank's columns: a contiguous copy of the shard.
    const std::vector<float> all = host(logits, s);
    std::vector<float> mine;
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t c = 0; c < cols; ++c) mine.push_back(all[static_cast<size_t>(t * kVocab + start + c)]);
    Tensor shard = Tensor::from_floats(mine, {kTokens, cols}, DType::F32).to(runtime_->device(), dtype, s);
    Tensor losses = Tensor::empty({kTokens}, DType::F32, s);
    tp::vocab_parallel_cross_entropy(shard, tgt, w, losses, 0.5f, start, mp, s);
    const double loss_err = test::rel_l2(test::to_doubles(losses, s), test::to_doubles(full_losses, s));
    std::vector<double> want_grad;
    {
      const std::vector<double> g = test::to_doubles(full, s);
      for (int64_t t = 0; t < kTokens; ++t)
        for (int64_t c = 0; c < cols; ++c) want_grad.push_back(g[static_cast<size_t>(t * kVocab + start + c)]);
    }
    const double grad_err = test::rel_l2(test::to_doubles(shard, s), want_grad);
    std::printf("[vocab nccl] rank %d tp %d %s: losses rel %.2e, gradient shard rel %.2e\n", me, tp,
                dtype_name(dtype), loss_err, grad_err);
    EXPECT_LT(loss_err, test::kF32AccumRelL2);
    EXPECT_LT(grad_err, dtype == DType::F32 ? test::kF32AccumRelL2 : test::kBf16ParityRelL2);
    // Every rank holds the same losses, bit for bit: max and min over the group agree.
    Tensor lo = losses.to(runtime_->device(), s), hi = losses.to(runtime_->device(), s);
    runtime_->world().all_reduce(lo, comm::ReduceOp::Min, s);
    runtime_->world().all_reduce(hi, comm::ReduceOp::Max, s);
    EXPECT_EQ(host(lo, s), host(hi, s));
  }
}
