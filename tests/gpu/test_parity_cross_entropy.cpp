// Cross-entropy parity: CUDA losses and the in-place logits gradient (bf16 and f32) against the
// CPU reference on the same bf16-rounded logits, for the 1.7B model's vocabulary (50304), an odd
// vocabulary (rows then start at every alignment), a small one, and large logits; plus the CUDA
// rule for a target outside the vocabulary (NaN loss for that row only).
// Vocab-parallel shard ops: each of the three ops CUDA vs CPU on the same shard and the same
// all-reduced statistics (the all-reduces emulated on the host), for 50304 split in 2, 8 and an
// odd 3-way split, large logits, f32, and shards narrower than a 16-byte pack; the assembled
// losses and gradient against the single-device CPU op; one shard against the fused CUDA op.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
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

// ---- vocab-parallel shard ops ------------------------------------------------------------------

namespace {

/// Columns [start, start + width) of a row-major [tokens, vocab] array.
std::vector<float> columns(const std::vector<float>& v, int64_t tokens, int64_t vocab, int64_t start,
                           int64_t width) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(tokens * width));
  for (int64_t t = 0; t < tokens; ++t) {
    const auto row = v.begin() + t * vocab + start;
    out.insert(out.end(), row, row + width);
  }
  return out;
}

std::vector<float> as_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

/// The three shard ops on every "rank" of `widths`, CUDA and CPU side by side. Each op gets the
/// same inputs on both backends: the statistics fed to the next op are the host-emulated
/// all-reduces (MAX; SUM in shard order) of the CUDA outputs, as a TP run would use them. Then the
/// assembled CUDA losses and gradient are compared with the single-device CPU op.
///   row_max, target_logit: exact (a max and a copy of bf16 values);
///   sum_exp, losses: kF32AccumRelL2 (fp32 sums, __expf vs double);
///   gradient: kBf16ParityRelL2 for bf16 (kF32AccumRelL2 for f32).
void check_shards(int64_t tokens, int64_t vocab, const std::vector<int64_t>& widths, DType dt,
                  float spread) {
  Stream gpu = gpu_stream();
  Stream cpu = Stream::cpu();
  const size_t n = widths.size();
  std::string split;
  for (size_t k = 0; k < n; ++k) split += detail::concat(k ? "/" : "", widths[k]);
  const std::string tag = detail::concat("ce_shard [", tokens, ", ", vocab, "] split ", split, " ",
                                         dtype_name(dt), " +-", spread);

  std::vector<int32_t> targets = random_targets(tokens, vocab);
  // The first tokens aim at the edges of the vocabulary and of every shard (head/tail paths).
  std::vector<int32_t> edges = {0, static_cast<int32_t>(vocab - 1)};
  int64_t start = 0;
  std::vector<int64_t> starts;
  for (int64_t w : widths) {
    starts.push_back(start);
    edges.push_back(static_cast<int32_t>(start));
    edges.push_back(static_cast<int32_t>(start + w - 1));
    start += w;
  }
  ASSERT_EQ(start, vocab);
  for (size_t i = 0; i < edges.size() && i < targets.size(); ++i) targets[i] = edges[i];
  Tensor tgt_host = Tensor::from_ints(targets, {tokens});
  Tensor tgt_dev = tgt_host.to(gpu.device(), gpu);

  const std::vector<float> values = bf16_values(tokens * vocab, -spread, spread);
  std::vector<Tensor> host, dev;
  for (size_t k = 0; k < n; ++k) {
    const std::vector<float> part = columns(values, tokens, vocab, starts[k], widths[k]);
    host.push_back(Tensor::from_floats(part, {tokens, widths[k]}));
    dev.push_back(to_device(part, {tokens, widths[k]}, dt, gpu));
  }
  auto shard_tag = [&](size_t k, const char* what) {
    return detail::concat(tag, " #", k, " ", what);
  };

  // ---- 1. shard max, all-reduce MAX ----
  std::vector<double> row_max(static_cast<size_t>(tokens), -INFINITY);
  for (size_t k = 0; k < n; ++k) {
    Tensor m = poisoned({tokens}, DType::F32, gpu), m_ref = poisoned_host({tokens});
    ops::cross_entropy_shard_max(dev[k], m, gpu);
    ops::cross_entropy_shard_max(host[k], m_ref, cpu);
    const std::vector<double> got = download(m, gpu);
    expect_close(shard_tag(k, "row_max"), got, test::to_doubles(m_ref), 0.0);
    for (size_t t = 0; t < got.size(); ++t) row_max[t] = std::max(row_max[t], got[t]);
  }
  const std::vector<float> max_f = as_floats(row_max);
  Tensor max_host = Tensor::from_floats(max_f, {tokens});
  Tensor max_dev = to_device(max_f, {tokens}, DType::F32, gpu);

  // ---- 2. shard stats, all-reduce SUM ----
  std::vector<double> sum_exp(static_cast<size_t>(tokens), 0.0), target(sum_exp);
  for (size_t k = 0; k < n; ++k) {
    Tensor se = poisoned({tokens}, DType::F32, gpu), se_ref = poisoned_host({tokens});
    Tensor tl = poisoned({tokens}, DType::F32, gpu), tl_ref = poisoned_host({tokens});
    ops::cross_entropy_shard_stats(dev[k], tgt_dev, starts[k], max_dev, se, tl, gpu);
    ops::cross_entropy_shard_stats(host[k], tgt_host, starts[k], max_host, se_ref, tl_ref, cpu);
    const std::vector<double> got_se = download(se, gpu), got_tl = download(tl, gpu);
    expect_close(shard_tag(k, "sum_exp"), got_se, test::to_doubles(se_ref), test::kF32AccumRelL2);
    expect_close(shard_tag(k, "target_logit"), got_tl, test::to_doubles(tl_ref), 0.0);
    for (size_t t = 0; t < got_se.size(); ++t) {
      sum_exp[t] += got_se[t];
      target[t] += got_tl[t];
    }
  }
  const std::vector<float> sum_f = as_floats(sum_exp), target_f = as_floats(target);
  Tensor sum_host = Tensor::from_floats(sum_f, {tokens}), target_host = Tensor::from_floats(target_f, {tokens});
  Tensor sum_dev = to_device(sum_f, {tokens}, DType::F32, gpu);
  Tensor target_dev = to_device(target_f, {tokens}, DType::F32, gpu);

  // ---- 3. finish: evaluation (logits untouched), then training (gradient in place) ----
  Input weights = make_input({tokens}, DType::F32, gpu, 0.0f, 2.0f);
  const float grad_scale = 1.0f / static_cast<float>(tokens);
  std::vector<double> losses0;
  std::vector<std::vector<double>> grads;
  for (size_t k = 0; k < n; ++k) {
    Tensor eval = poisoned({tokens}, DType::F32, gpu), eval_ref = poisoned_host({tokens});
    ops::cross_entropy_shard_finish(dev[k], tgt_dev, starts[k], max_dev, sum_dev, target_dev,
                                    Tensor(), eval, 0.0f, gpu);
    ops::cross_entropy_shard_finish(host[k], tgt_host, starts[k], max_host, sum_host, target_host,
                                    Tensor(), eval_ref, 0.0f, cpu);
    const std::vector<double> got_eval = download(eval, gpu);
    expect_close(shard_tag(k, "losses (grad_scale 0)"), got_eval, test::to_doubles(eval_ref),
                 test::kF32AccumRelL2);
    expect_close(shard_tag(k, "grad_scale 0 leaves logits"), download(dev[k], gpu),
                 as_doubles(columns(values, tokens, vocab, starts[k], widths[k])), 0.0);

    Tensor loss = poisoned({tokens}, DType::F32, gpu), loss_ref = poisoned_host({tokens});
    ops::cross_entropy_shard_finish(dev[k], tgt_dev, starts[k], max_dev, sum_dev, target_dev,
                                    weights.device, loss, grad_scale, gpu);
    ops::cross_entropy_shard_finish(host[k], tgt_host, starts[k], max_host, sum_host, target_host,
                                    weights.host, loss_ref, grad_scale, cpu);
    const std::vector<double> got_loss = download(loss, gpu);
    expect_close(shard_tag(k, "losses"), got_loss, test::to_doubles(loss_ref), test::kF32AccumRelL2);
    // Training and evaluation report the same losses, and so does every rank.
    expect_identical(shard_tag(k, "losses train vs eval"), got_loss, got_eval);
    if (k == 0) losses0 = got_loss;
    else expect_identical(shard_tag(k, "losses vs rank 0"), got_loss, losses0);
    grads.push_back(download(dev[k], gpu));
    expect_close(shard_tag(k, "gradient"), grads.back(), test::to_doubles(host[k]),
                 dt == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32AccumRelL2);
  }

  // ---- the sharded CUDA result against the single-device CPU op ----
  Tensor full = Tensor::from_floats(values, {tokens, vocab}), full_losses = poisoned_host({tokens});
  ops::cross_entropy_forward_backward(full, tgt_host, weights.host, full_losses, grad_scale, cpu);
  expect_close(tag + " losses vs single-device", losses0, test::to_doubles(full_losses),
               test::kF32AccumRelL2);
  std::vector<double> assembled(static_cast<size_t>(tokens * vocab));
  for (size_t k = 0; k < n; ++k) {
    for (int64_t t = 0; t < tokens; ++t) {
      const auto src = grads[k].begin() + t * widths[k];
      std::copy(src, src + widths[k], assembled.begin() + t * vocab + starts[k]);
    }
  }
  expect_close(tag + " gradient vs single-device", assembled, test::to_doubles(full),
               dt == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32AccumRelL2);
}

}  // namespace

TEST(CrossEntropyShardParity, EachOpMatchesCpuAndTheShardsMatchTheSingleDeviceOp) {
  MDLM_REQUIRE_GPU();
  check_shards(1024, 50304, {25152, 25152}, DType::BF16, 8.0f);  // TP 2: 512-thread blocks
  check_shards(512, 50304, std::vector<int64_t>(8, 6288), DType::BF16, 8.0f);  // TP 8: 256 threads
  check_shards(333, 50304, {12577, 25001, 12726}, DType::BF16, 8.0f);  // odd: rows at every alignment
  check_shards(64, 50304, {16768, 16768, 16768}, DType::BF16, 60.0f);  // large logits
  check_shards(48, 32001, {16001, 16000}, DType::F32, 8.0f);
  check_shards(40, 11, {3, 5, 3}, DType::BF16, 2.0f);  // shards narrower than a pack
}

TEST(CrossEntropyShardParity, OneShardMatchesTheFusedCudaOp) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  const int64_t tokens = 64, vocab = 50257;
  const std::string tag = "ce_shard one shard vs fused [64, 50257] bf16";
  Tensor tgt = ints_to_device(random_targets(tokens, vocab), {tokens}, gpu);
  Input logits = make_input({tokens, vocab}, DType::BF16, gpu, -8.0f, 8.0f);
  Input weights = make_input({tokens}, DType::F32, gpu, 0.0f, 2.0f);
  const float grad_scale = 0.5f;
  Tensor fused = to_device(logits.values, {tokens, vocab}, DType::BF16, gpu);
  Tensor fused_losses = poisoned({tokens}, DType::F32, gpu);
  ops::cross_entropy_forward_backward(fused, tgt, weights.device, fused_losses, grad_scale, gpu);

  Tensor row_max = poisoned({tokens}, DType::F32, gpu), sum_exp = poisoned({tokens}, DType::F32, gpu);
  Tensor target = poisoned({tokens}, DType::F32, gpu), losses = poisoned({tokens}, DType::F32, gpu);
  ops::cross_entropy_shard_max(logits.device, row_max, gpu);
  ops::cross_entropy_shard_stats(logits.device, tgt, 0, row_max, sum_exp, target, gpu);
  ops::cross_entropy_shard_finish(logits.device, tgt, 0, row_max, sum_exp, target, weights.device,
                                  losses, grad_scale, gpu);
  expect_close(tag + " losses", download(losses, gpu), download(fused_losses, gpu), test::kF32AccumRelL2);
  expect_close(tag + " gradient", download(logits.device, gpu), download(fused, gpu),
               test::kBf16ParityRelL2);
}
