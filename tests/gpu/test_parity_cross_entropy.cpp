// Cross-entropy parity: CUDA losses and the in-place logits gradient (bf16 and f32) against the
// CPU reference on the same bf16-rounded logits, for the 1.7B model's vocabulary (50304), an odd
// vocabulary (rows then start at every alignment), a small one, and large logits; plus the CUDA
// rule for a target outside the vocabulary (NaN loss for that row only).
#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/ops/cross_entropy.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

std::vector<int32_t> random_targets(int64_t tokens, int64_t vocab) {
  const std::vector<float> u = test::random_floats(tokens, fresh_seed(), 0.0f, 1.0f);
  std::vector<int32_t> t(static_cast<size_t>(tokens));
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = std::min(static_cast<int32_t>(u[i] * static_cast<float>(vocab)), static_cast<int32_t>(vocab - 1));
  return t;
}

/// Losses are fp32 (log-sum-exp of the same inputs; fp32 with __expf vs double on the CPU):
/// kF32AccumRelL2. The gradient is a bf16 output (kBf16ParityRelL2), fp32 for f32 logits.
void check(int64_t tokens, int64_t vocab, DType dt, float spread) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("cross_entropy [", tokens, ", ", vocab, "] ", dtype_name(dt),
                                         " logits in +-", spread);
  const std::vector<int32_t> targets = random_targets(tokens, vocab);
  Tensor tgt_host = Tensor::from_ints(targets, {tokens});
  Tensor tgt_dev = tgt_host.to(gpu.device(), gpu);
  Input logits = make_input({tokens, vocab}, dt, gpu, -spread, spread);

  Tensor losses = poisoned({tokens}, DType::F32, gpu), losses_ref = poisoned_host({tokens});
  ops::cross_entropy_forward(logits.device, tgt_dev, losses, gpu);
  ops::cross_entropy_forward(logits.host, tgt_host, losses_ref, Stream::cpu());
  expect_close(tag + " forward losses", download(losses, gpu), test::to_doubles(losses_ref),
               test::kF32AccumRelL2);
  // forward must leave the logits untouched.
  expect_close(tag + " forward leaves logits", download(logits.device, gpu), as_doubles(logits.values), 0.0);

  Input weights = make_input({tokens}, DType::F32, gpu, 0.0f, 2.0f);
  const float grad_scale = 1.0f / static_cast<float>(tokens);
  Tensor fb_losses = poisoned({tokens}, DType::F32, gpu), fb_losses_ref = poisoned_host({tokens});
  Tensor grad = logits.device, grad_ref = logits.host;  // overwritten in place
  ops::cross_entropy_forward_backward(grad, tgt_dev, weights.device, fb_losses, grad_scale, gpu);
  ops::cross_entropy_forward_backward(grad_ref, tgt_host, weights.host, fb_losses_ref, grad_scale,
                                      Stream::cpu());
  expect_close(tag + " forward_backward losses", download(fb_losses, gpu),
               test::to_doubles(fb_losses_ref), test::kF32AccumRelL2);
  expect_close(tag + " gradient", download(grad, gpu), test::to_doubles(grad_ref),
               dt == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32AccumRelL2);
}

}  // namespace

TEST(CrossEntropyParity, MatchesCpuLossesAndGradients) {
  MDLM_REQUIRE_GPU();
  check(64, 50304, DType::BF16, 8.0f);
  check(37, 50257, DType::BF16, 8.0f);  // odd V: rows at every alignment, head/body/tail paths
  check(300, 1000, DType::BF16, 4.0f);
  check(16, 50304, DType::BF16, 60.0f);  // large logits: the max subtraction matters
  check(40, 3, DType::BF16, 2.0f);       // V smaller than a 16-byte pack
  check(48, 32001, DType::F32, 8.0f);
}

TEST(CrossEntropyParity, TargetOutsideTheVocabularyGivesNanLossForThatRowOnly) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  const int64_t tokens = 4, vocab = 1000;
  std::vector<int32_t> targets = {5, -1, 999, 1000};
  Tensor tgt = ints_to_device(targets, {tokens}, gpu);
  Input logits = make_input({tokens, vocab}, DType::BF16, gpu);
  Tensor losses = poisoned({tokens}, DType::F32, gpu);
  ops::cross_entropy_forward(logits.device, tgt, losses, gpu);
  const std::vector<double> l = download(losses, gpu);
  std::printf("[parity] cross_entropy bad targets: losses %g %g %g %g\n", l[0], l[1], l[2], l[3]);
  EXPECT_TRUE(std::isfinite(l[0]));
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_TRUE(std::isfinite(l[2]));
  EXPECT_TRUE(std::isnan(l[3]));
}
