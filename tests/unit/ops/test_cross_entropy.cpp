// Cross-entropy: closed forms (uniform logits give ln V), stability for large logits, f64 finite
// differences of the weighted, scaled loss against the in-place gradient, and target validation.
// Vocab-parallel shard ops: the vocabulary split into 2, 3 and 4 uneven shards with the
// tensor-parallel all-reduces emulated on the host, against the single-device op and f64 finite
// differences; evaluation (grad_scale 0), targets owned by no shard, argument checks.
#include <gtest/gtest.h>
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/elementwise.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

TEST(CrossEntropy, UniformLogitsGiveLogOfTheVocabularySize) {
  Stream s = Stream::cpu();
  const int64_t tokens = 3, vocab = 50;
  Tensor logits = Tensor::empty({tokens, vocab}, DType::F32, s);
  ops::fill(logits, 3.7f, s);
  Tensor targets = Tensor::from_ints({0, 17, 49}, {tokens});
  Tensor losses = Tensor::empty({tokens}, DType::F32, s);
  ops::cross_entropy_forward(logits, targets, losses, s);
  for (float l : losses.to_floats(s)) EXPECT_NEAR(l, std::log(50.0), 1e-6);
}

TEST(CrossEntropy, IsStableForLargeLogitsAndShiftInvariant) {
  Stream s = Stream::cpu();
  const std::vector<float> base = {1.0f, -2.0f, 0.5f, 3.0f};
  std::vector<float> shifted;
  for (float v : base) shifted.push_back(v + 20000.0f);  // exp(20000) overflows any float type
  Tensor targets = Tensor::from_ints({3}, {1});
  Tensor l0 = Tensor::empty({1}, DType::F32, s), l1 = Tensor::empty({1}, DType::F32, s);
  ops::cross_entropy_forward(Tensor::from_floats(base, {1, 4}), targets, l0, s);
  ops::cross_entropy_forward(Tensor::from_floats(shifted, {1, 4}), targets, l1, s);
  double sum = 0;
  for (float v : base) sum += std::exp(static_cast<double>(v) - 3.0);
  EXPECT_NEAR(l0.to_floats(s)[0], std::log(sum), 1e-6);
  EXPECT_TRUE(std::isfinite(l1.to_floats(s)[0]));
  EXPECT_NEAR(l1.to_floats(s)[0], l0.to_floats(s)[0], 1e-6);
}

TEST(CrossEntropy, ForwardBackwardMatchesFiniteDifferencesOfTheWeightedLoss) {
  Stream s = Stream::cpu();
  const int64_t tokens = 4, vocab = 7;
  const float grad_scale = 0.37f;
  Tensor logits = test::random_tensor({tokens, vocab}, 1, DType::F64, -3.0f, 3.0f);
  Tensor targets = Tensor::from_ints({2, 0, 6, 2}, {tokens});
  Tensor weights = Tensor::from_floats({1.0f, 0.0f, 2.5f, 0.5f}, {tokens}, DType::F64);
  Tensor losses = Tensor::empty({tokens}, DType::F64, s);
  auto loss = [&] {  // grad_scale * sum_t w_t * loss_t
    ops::cross_entropy_forward(logits, targets, losses, s);
    return static_cast<double>(grad_scale) * test::inner(weights, losses);
  };
  loss();
  const std::vector<double> forward_losses = test::to_doubles(losses);
  Tensor grad = Tensor::empty({tokens, vocab}, DType::F64, s);
  copy_tensor(logits, grad, s);
  Tensor fb_losses = Tensor::empty({tokens}, DType::F64, s);
  ops::cross_entropy_forward_backward(grad, targets, weights, fb_losses, grad_scale, s);
  EXPECT_EQ(test::to_doubles(fb_losses), forward_losses);
  EXPECT_LT(test::rel_l2(test::to_doubles(grad), test::finite_difference(logits, loss)),
            test::kFiniteDiffRelTolF64);
  // A zero-weight token gets a zero gradient row.
  const std::vector<double> g = test::to_doubles(grad);
  for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(g[static_cast<size_t>(vocab + j)], 0.0);
}

TEST(CrossEntropy, F32GradientIsScaledSoftmaxMinusOneHot) {
  Stream s = Stream::cpu();
  Tensor logits = Tensor::from_floats({0, 0, 0, 0, 1, 2, 3, 4}, {2, 4});
  Tensor targets = Tensor::from_ints({1, 3}, {2});
  Tensor weights = Tensor::from_floats({1.0f, 0.5f}, {2});
  Tensor losses = Tensor::empty({2}, DType::F32, s);
  ops::cross_entropy_forward_backward(logits, targets, weights, losses, 2.0f, s);
  const std::vector<float> g = logits.to_floats(s);
  EXPECT_NEAR(g[0], 2.0 * 0.25, 1e-7);
  EXPECT_NEAR(g[1], 2.0 * (0.25 - 1), 1e-7);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0);
  for (int j = 0; j < 4; ++j) {
    const double p = std::exp(1.0 + j) / z;
    EXPECT_NEAR(g[static_cast<size_t>(4 + j)], 1.0 * (j == 3 ? p - 1 : p), 1e-7) << j;
  }
  EXPECT_NEAR(losses.to_floats(s)[1], std::log(z) - 4.0, 1e-6);
}

TEST(CrossEntropy, OutOfRangeTargetIsAnErrorNamingTheTokenAndValue) {
  Stream s = Stream::cpu();
  Tensor logits = test::random_tensor({3, 5}, 2);
  const std::vector<float> before = logits.to_floats(s);
  Tensor targets = Tensor::from_ints({1, 4, 5}, {3});
  Tensor weights = Tensor::from_floats({1, 1, 1}, {3});
  Tensor losses = Tensor::empty({3}, DType::F32, s);
  try {
    ops::cross_entropy_forward_backward(logits, targets, weights, losses, 1.0f, s);
    FAIL() << "a target equal to the vocabulary size was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("token 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is 5"), std::string::npos) << msg;
  }
  EXPECT_EQ(logits.to_floats(s), before);  // validated before anything was overwritten
  Tensor negative = Tensor::from_ints({-3, 0, 0}, {3});
  EXPECT_THROW(ops::cross_entropy_forward(logits, negative, losses, s), Error);
}

// ---- vocab-parallel shard ops --------------------------------------------------------------

namespace {

using Widths = std::vector<int64_t>;  // columns per shard; shard k starts at the sum before it

/// A host vector of per-token values as f64, or rounded once to f32.
Tensor stat_tensor(const std::vector<double>& v, DType dtype = DType::F64) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, dtype, Stream::cpu());
  if (dtype == DType::F64) std::copy(v.begin(), v.end(), t.data<double>());
  else std::transform(v.begin(), v.end(), t.data<float>(), [](double x) { return static_cast<float>(x); });
  return t;
}

Tensor nan_stat(int64_t n, DType dtype) {
  return stat_tensor(std::vector<double>(static_cast<size_t>(n), NAN), dtype);
}

/// The three shard ops on every "rank" of a vocabulary split into `widths`, with the tensor-parallel
/// all-reduces emulated on the host (MAX, then SUM in shard order). Statistics have the logits'
/// dtype (f64 or f32).
struct Sharded {
  std::vector<Tensor> logits;                   ///< per shard; the gradient when grad_scale > 0
  std::vector<std::vector<double>> local_max;   ///< shard_max outputs, before the all-reduce
  std::vector<std::vector<double>> local_target;  ///< shard_stats target_logit, before it
  std::vector<std::vector<double>> losses;      ///< shard_finish outputs of every rank

  Tensor gradient() const {  // the shards' logits concatenated back to [T, V]
    int64_t vocab = 0;
    std::vector<const Tensor*> parts;
    for (const Tensor& t : logits) {
      vocab += t.cols();
      parts.push_back(&t);
    }
    Tensor out = Tensor::empty({logits[0].rows(), vocab}, logits[0].dtype(), Stream::cpu());
    ops::concat_columns(parts, out, Stream::cpu());
    return out;
  }
};

Sharded run_sharded(const Tensor& logits, const Widths& widths, const Tensor& targets,
                    const Tensor& weights, float grad_scale) {
  Stream s = Stream::cpu();
  const int64_t tokens = logits.rows();
  const size_t n = widths.size();
  const DType dt = logits.dtype();
  Sharded r;
  std::vector<Tensor*> outs;
  for (int64_t w : widths) r.logits.push_back(Tensor::empty({tokens, w}, logits.dtype(), s));
  for (Tensor& t : r.logits) outs.push_back(&t);
  ops::split_columns(logits, outs, s);

  std::vector<double> row_max(static_cast<size_t>(tokens), -INFINITY);
  for (size_t k = 0; k < n; ++k) {
    Tensor m = nan_stat(tokens, dt);
    ops::cross_entropy_shard_max(r.logits[k], m, s);
    r.local_max.push_back(test::to_doubles(m));
    for (size_t t = 0; t < row_max.size(); ++t) row_max[t] = std::max(row_max[t], r.local_max[k][t]);
  }
  const Tensor max_t = stat_tensor(row_max, dt);

  std::vector<double> sum_exp(static_cast<size_t>(tokens), 0.0), target(sum_exp);
  int64_t start = 0;
  for (size_t k = 0; k < n; ++k) {
    Tensor se = nan_stat(tokens, dt), tl = nan_stat(tokens, dt);
    ops::cross_entropy_shard_stats(r.logits[k], targets, start, max_t, se, tl, s);
    r.local_target.push_back(test::to_doubles(tl));
    const std::vector<double> local_sum = test::to_doubles(se);
    for (size_t t = 0; t < sum_exp.size(); ++t) {
      sum_exp[t] += local_sum[t];
      target[t] += r.local_target[k][t];
    }
    start += widths[k];
  }
  const Tensor sum_t = stat_tensor(sum_exp, dt), target_t = stat_tensor(target, dt);

  start = 0;
  for (size_t k = 0; k < n; ++k) {
    Tensor losses = nan_stat(tokens, dt);
    ops::cross_entropy_shard_finish(r.logits[k], targets, start, max_t, sum_t, target_t, weights,
                                    losses, grad_scale, s);
    r.losses.push_back(test::to_doubles(losses));
    start += widths[k];
  }
  return r;
}

}  // namespace

TEST(CrossEntropyShards, TwoThreeAndFourShardsMatchTheSingleDeviceOp) {
  Stream s = Stream::cpu();
  const int64_t tokens = 12, vocab = 37;
  const float grad_scale = 0.37f;
  const Tensor logits = test::random_tensor({tokens, vocab}, 11, DType::F64, -4.0f, 4.0f);
  // The first and last columns of every shard below, and both ends of the vocabulary.
  const Tensor targets = Tensor::from_ints({0, 36, 6, 7, 9, 10, 15, 16, 22, 23, 25, 26}, {tokens});
  Tensor weights = test::random_tensor({tokens}, 12, DType::F64, 0.0f, 2.0f);
  weights.data<double>()[3] = 0.0;

  Tensor ref = Tensor::empty({tokens, vocab}, DType::F64, s);
  copy_tensor(logits, ref, s);
  Tensor ref_losses = nan_stat(tokens, DType::F64);
  ops::cross_entropy_forward_backward(ref, targets, weights, ref_losses, grad_scale, s);
  const std::vector<double> want_losses = test::to_doubles(ref_losses);
  const std::vector<double> want_grad = test::to_doubles(ref);
  const std::vector<double> x = test::to_doubles(logits);

  for (const Widths& widths : {Widths{16, 21}, Widths{10, 13, 14}, Widths{7, 9, 10, 11}}) {
    const std::string tag = detail::concat(widths.size(), " shards");
    const Sharded r = run_sharded(logits, widths, targets, weights, grad_scale);
    int64_t start = 0;
    for (size_t k = 0; k < widths.size(); ++k) {
      for (int64_t t = 0; t < tokens; ++t) {
        const auto row = x.begin() + t * vocab + start;
        EXPECT_EQ(r.local_max[k][static_cast<size_t>(t)], *std::max_element(row, row + widths[k]))
            << tag << ", shard " << k << ", token " << t;
        const int64_t j = targets.data<int32_t>()[t] - start;
        const double owned = j >= 0 && j < widths[k] ? row[j] : 0.0;
        EXPECT_EQ(r.local_target[k][static_cast<size_t>(t)], owned)
            << tag << ", shard " << k << ", token " << t;
      }
      // Every rank reports the same losses, bit for bit.
      EXPECT_EQ(r.losses[k], r.losses[0]) << tag << ", shard " << k;
      start += widths[k];
    }
    // Only the grouping of the f64 sum-exp differs (~1e-16 relative): 1e-12 is tight yet safe.
    for (int64_t t = 0; t < tokens; ++t) {
      EXPECT_NEAR(r.losses[0][static_cast<size_t>(t)], want_losses[static_cast<size_t>(t)], 1e-12)
          << tag << ", token " << t;
    }
    EXPECT_LT(test::max_abs_diff(test::to_doubles(r.gradient()), want_grad), 1e-12) << tag;
  }
}

TEST(CrossEntropyShards, GradientMatchesFiniteDifferencesThroughTheThreeOps) {
  const int64_t tokens = 4, vocab = 11;
  const Widths widths = {3, 5, 3};
  const float grad_scale = 0.37f;
  Tensor logits = test::random_tensor({tokens, vocab}, 13, DType::F64, -3.0f, 3.0f);
  const Tensor targets = Tensor::from_ints({2, 0, 10, 5}, {tokens});
  const Tensor weights = Tensor::from_floats({1.0f, 0.0f, 2.5f, 0.5f}, {tokens}, DType::F64);
  auto loss = [&] {  // grad_scale * sum_t w_t * loss_t, evaluated with no weights (grad_scale 0)
    const Sharded r = run_sharded(logits, widths, targets, Tensor(), 0.0f);
    return static_cast<double>(grad_scale) * test::inner(weights, stat_tensor(r.losses[0]));
  };
  const Sharded r = run_sharded(logits, widths, targets, weights, grad_scale);
  const std::vector<double> g = test::to_doubles(r.gradient());
  EXPECT_LT(test::rel_l2(g, test::finite_difference(logits, loss)), test::kFiniteDiffRelTolF64);
  for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(g[static_cast<size_t>(vocab + j)], 0.0);  // w = 0
}

TEST(CrossEntropyShards, GradScaleZeroLeavesTheLogitsUntouchedAndWritesTheSameLosses) {
  const int64_t tokens = 5, vocab = 23;
  const Widths widths = {9, 14};
  const Tensor logits = test::random_tensor({tokens, vocab}, 14, DType::F32, -5.0f, 5.0f);
  const Tensor targets = Tensor::from_ints({0, 8, 9, 22, 13}, {tokens});
  const Tensor weights = Tensor::from_floats({1, 2, 3, 4, 5}, {tokens});
  const Sharded eval = run_sharded(logits, widths, targets, weights, 0.0f);
  const Sharded train = run_sharded(logits, widths, targets, weights, 1.0f);
  EXPECT_EQ(eval.gradient().to_floats(Stream::cpu()), logits.to_floats(Stream::cpu()));
  EXPECT_NE(train.gradient().to_floats(Stream::cpu()), logits.to_floats(Stream::cpu()));
  for (size_t k = 0; k < widths.size(); ++k) EXPECT_EQ(eval.losses[k], train.losses[k]) << k;
  for (double l : eval.losses[0]) EXPECT_TRUE(std::isfinite(l));
}

TEST(CrossEntropyShards, TargetsInNoShardContributeATargetLogitOfZero) {
  const int64_t tokens = 5, vocab = 12;
  const Widths widths = {5, 7};
  const float grad_scale = 0.5f;
  const Tensor logits = test::random_tensor({tokens, vocab}, 15, DType::F64, -2.0f, 2.0f);
  // Only token 3's target is in the vocabulary; the others are what the caller must reject.
  const Tensor targets = Tensor::from_ints({-1, 12, 1000, 3, INT32_MIN}, {tokens});
  const Tensor weights = Tensor::from_floats({1, 1, 1, 1, 1}, {tokens}, DType::F64);
  const Sharded r = run_sharded(logits, widths, targets, weights, grad_scale);
  const std::vector<double> x = test::to_doubles(logits);
  const std::vector<double> g = test::to_doubles(r.gradient());
  for (int64_t t = 0; t < tokens; ++t) {
    const size_t ti = static_cast<size_t>(t);
    for (size_t k = 0; k < widths.size(); ++k) {
      const double want = t == 3 && k == 0 ? x[ti * vocab + 3] : 0.0;
      EXPECT_EQ(r.local_target[k][ti], want) << "token " << t << ", shard " << k;
    }
    if (t == 3) continue;
    // No target column: the loss is the row's logsumexp and the gradient the plain softmax.
    double lse = 0;
    for (int64_t j = 0; j < vocab; ++j) lse += std::exp(x[ti * vocab + static_cast<size_t>(j)]);
    lse = std::log(lse);
    EXPECT_NEAR(r.losses[0][ti], lse, 1e-12) << "token " << t;
    for (int64_t j = 0; j < vocab; ++j) {
      const size_t i = ti * vocab + static_cast<size_t>(j);
      EXPECT_NEAR(g[i], grad_scale * std::exp(x[i] - lse), 1e-12) << "token " << t << ", column " << j;
    }
  }
}

TEST(CrossEntropyShards, OneF32ShardMatchesTheSingleDeviceOpWithinFp32Rounding) {
  Stream s = Stream::cpu();
  const int64_t tokens = 6, vocab = 50;
  const float grad_scale = 0.25f;
  const Tensor logits = test::random_tensor({tokens, vocab}, 16, DType::F32, -8.0f, 8.0f);
  const Tensor targets = Tensor::from_ints({0, 49, 17, 3, 25, 40}, {tokens});
  const Tensor weights = test::random_tensor({tokens}, 17, DType::F32, 0.0f, 2.0f);
  Tensor ref = Tensor::empty({tokens, vocab}, DType::F32, s);
  copy_tensor(logits, ref, s);
  Tensor ref_losses = Tensor::empty({tokens}, DType::F32, s);
  ops::cross_entropy_forward_backward(ref, targets, weights, ref_losses, grad_scale, s);

  Tensor shard = Tensor::empty({tokens, vocab}, DType::F32, s);
  copy_tensor(logits, shard, s);
  Tensor row_max = Tensor::empty({tokens}, DType::F32, s), sum_exp = Tensor::empty({tokens}, DType::F32, s);
  Tensor target = Tensor::empty({tokens}, DType::F32, s), losses = Tensor::empty({tokens}, DType::F32, s);
  ops::cross_entropy_shard_max(shard, row_max, s);
  ops::cross_entropy_shard_stats(shard, targets, 0, row_max, sum_exp, target, s);
  ops::cross_entropy_shard_finish(shard, targets, 0, row_max, sum_exp, target, weights, losses,
                                  grad_scale, s);
  const std::vector<double> l = test::to_doubles(losses), want = test::to_doubles(ref_losses);
  for (size_t t = 0; t < l.size(); ++t) EXPECT_NEAR(l[t], want[t], 2e-6 * std::max(1.0, want[t])) << t;
  EXPECT_LT(test::max_abs_diff(test::to_doubles(shard), test::to_doubles(ref)), 1e-7);
}

TEST(CrossEntropyShards, RejectsBadArgumentsBeforeTouchingTheLogits) {
  Stream s = Stream::cpu();
  const int64_t tokens = 3, vocab = 8;
  Tensor logits = test::random_tensor({tokens, vocab}, 18);
  const std::vector<float> before = logits.to_floats(s);
  const Tensor targets = Tensor::from_ints({1, 2, 3}, {tokens});
  const Tensor weights = Tensor::from_floats({1, 1, 1}, {tokens});
  Tensor stat = Tensor::from_floats({0, 1, 0}, {tokens});
  Tensor losses = Tensor::empty({tokens}, DType::F32, s), short_stat = Tensor::empty({2}, DType::F32, s);
  EXPECT_THROW(ops::cross_entropy_shard_max(logits, short_stat, s), Error);
  EXPECT_THROW(ops::cross_entropy_shard_stats(logits, targets, -1, stat, losses, losses, s), Error);
  EXPECT_THROW(ops::cross_entropy_shard_stats(logits, targets, int64_t{INT32_MAX}, stat, losses,
                                              losses, s),
               Error);  // columns past the largest i32 target id
  Tensor f64_stat = Tensor::from_floats({0, 1, 0}, {tokens}, DType::F64);
  EXPECT_THROW(ops::cross_entropy_shard_max(logits, f64_stat, s), Error);  // f64 stats need f64 logits
  try {
    ops::cross_entropy_shard_finish(logits, targets, 0, stat, stat, stat, weights, losses, -1.0f, s);
    FAIL() << "a negative grad_scale was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grad_scale"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::cross_entropy_shard_finish(logits, targets, 0, stat, stat, stat, Tensor(),
                                               losses, 1.0f, s),
               Error);  // training needs the weights
  EXPECT_EQ(logits.to_floats(s), before);
}
