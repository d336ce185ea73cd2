// CPU reference softmax cross-entropy over the vocabulary, with the fused in-place gradient.
// logsumexp is max-subtracted and summed in double. losses and loss weights may be f32 or the
// logits' dtype (f64 gradient checks). Every target is validated before any logit is overwritten,
// so a bad batch leaves the logits intact.
#include <algorithm>
#include <cmath>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

void check_targets(const char* op, const Tensor& targets, int64_t vocab) {
  const int32_t* pt = targets.data<int32_t>();
  for (int64_t t = 0; t < targets.numel(); ++t) {
    MDLM_CHECK(pt[t] >= 0 && pt[t] < vocab, op, ": target of token ", t, " is ", pt[t],
               ", outside the vocabulary [0, ", vocab, ")");
  }
}

/// log(sum_j exp(row[j])), stable for large logits.
template <typename T>
double logsumexp(const T* row, int64_t vocab) {
  double m = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) m = std::max(m, static_cast<double>(row[j]));
  double s = 0;
  for (int64_t j = 0; j < vocab; ++j) s += std::exp(row[j] - m);
  return m + std::log(s);
}

template <typename T>
void ce_forward(const Tensor& logits, const Tensor& targets, Tensor& losses) {
  const int64_t tokens = logits.rows(), vocab = logits.cols();
  const T* pl = logits.data<T>();
  const int32_t* pt = targets.data<int32_t>();
  const detail::FloatAccess loss("cross_entropy_forward", losses, "losses");
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = pl + t * vocab;
    loss.set(t, logsumexp(row, vocab) - row[pt[t]]);
  }
}

template <typename T>
void ce_forward_backward(Tensor& logits, const Tensor& targets, const Tensor& weights,
                         Tensor& losses, float grad_scale) {
  const int64_t tokens = logits.rows(), vocab = logits.cols();
  T* pl = logits.data<T>();
  const int32_t* pt = targets.data<int32_t>();
  const detail::FloatAccess loss("cross_entropy_forward_backward", losses, "losses");
  const detail::FloatAccess weight("cross_entropy_forward_backward", weights, "weights");
  for (int64_t t = 0; t < tokens; ++t) {
    T* row = pl + t * vocab;
    const double lse = logsumexp(row, vocab);
    loss.set(t, lse - row[pt[t]]);
    const double scale = static_cast<double>(grad_scale) * weight.get(t);
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(row[j] - lse);
      row[j] = static_cast<T>(scale * (j == pt[t] ? p - 1.0 : p));
    }
  }
}

template <typename T>
void shard_max(const Tensor& logits, Tensor& row_max) {
  const int64_t tokens = logits.rows(), cols = logits.cols();
  const T* pl = logits.data<T>();
  const detail::FloatAccess out("cross_entropy_shard_max", row_max, "row_max");
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = pl + t * cols;
    double m = -INFINITY;  // std::max keeps m on a NaN logit; the NaN reaches sum_exp instead
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, static_cast<double>(row[j]));
    out.set(t, m);
  }
}

/// The target's column in the shard, or -1 when another shard (or no shard) owns it.
inline int64_t local_column(int32_t target, int64_t vocab_start, int64_t cols) {
  const int64_t j = static_cast<int64_t>(target) - vocab_start;
  return j >= 0 && j < cols ? j : -1;
}

template <typename T>
void shard_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                 const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "cross_entropy_shard_stats";
  const int64_t tokens = logits.rows(), cols = logits.cols();
  const T* pl = logits.data<T>();
  const int32_t* pt = targets.data<int32_t>();
  const detail::FloatAccess max_in(op, row_max, "row_max");
  const detail::FloatAccess sum_out(op, sum_exp, "sum_exp");
  const detail::FloatAccess target_out(op, target_logit, "target_logit");
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = pl + t * cols;
    const double m = max_in.get(t);
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(row[j] - m);
    sum_out.set(t, s);
    const int64_t jt = local_column(pt[t], vocab_start, cols);
    target_out.set(t, jt >= 0 ? static_cast<double>(row[jt]) : 0.0);
  }
}

template <typename T>
void shard_finish(Tensor& logits, const Tensor& targets, int64_t vocab_start,
                  const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                  const Tensor& weights, Tensor& losses, float grad_scale) {
  const char* op = "cross_entropy_shard_finish";
  const int64_t tokens = logits.rows(), cols = logits.cols();
  const detail::FloatAccess max_in(op, row_max, "row_max");
  const detail::FloatAccess sum_in(op, sum_exp, "sum_exp");
  const detail::FloatAccess target_in(op, target_logit, "target_logit");
  const detail::FloatAccess loss(op, losses, "losses");
  for (int64_t t = 0; t < tokens; ++t)
    loss.set(t, std::log(sum_in.get(t)) + max_in.get(t) - target_in.get(t));
  if (!(grad_scale > 0.0f)) return;  // evaluation: the logits stay as they are
  T* pl = logits.data<T>();
  const int32_t* pt = targets.data<int32_t>();
  const detail::FloatAccess weight(op, weights, "weights");
  for (int64_t t = 0; t < tokens; ++t) {
    T* row = pl + t * cols;
    const double m = max_in.get(t), inv_s = 1.0 / sum_in.get(t);
    const double scale = static_cast<double>(grad_scale) * weight.get(t);
    const int64_t jt = local_column(pt[t], vocab_start, cols);
    for (int64_t j = 0; j < cols; ++j) {
      const double p = std::exp(row[j] - m) * inv_s;
      row[j] = static_cast<T>(scale * (j == jt ? p - 1.0 : p));
    }
  }
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses,
                           const Stream& stream) {
  check_targets("cross_entropy_forward", targets, logits.cols());
  detail::with_float_type("cross_entropy_forward", logits,
                          [&](auto t) { ce_forward<decltype(t)>(logits, targets, losses); });
}

void cross_entropy_forward_backward(Tensor& logits, const Tensor& targets, const Tensor& weights,
                                    Tensor& losses, float grad_scale, const Stream& stream) {
  check_targets("cross_entropy_forward_backward", targets, logits.cols());
  detail::with_float_type("cross_entropy_forward_backward", logits, [&](auto t) {
    ce_forward_backward<decltype(t)>(logits, targets, weights, losses, grad_scale);
  });
}

void cross_entropy_shard_max(const Tensor& logits, Tensor& row_max, const Stream& stream) {
  detail::with_float_type("cross_entropy_shard_max", logits,
                          [&](auto t) { shard_max<decltype(t)>(logits, row_max); });
}

void cross_entropy_shard_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit,
                               const Stream& stream) {
  detail::with_float_type("cross_entropy_shard_stats", logits, [&](auto t) {
    shard_stats<decltype(t)>(logits, targets, vocab_start, row_max, sum_exp, target_logit);
  });
}

void cross_entropy_shard_finish(Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, const Tensor& weights, Tensor& losses,
                                float grad_scale, const Stream& stream) {
  detail::with_float_type("cross_entropy_shard_finish", logits, [&](auto t) {
    shard_finish<decltype(t)>(logits, targets, vocab_start, row_max, sum_exp, target_logit,
                              weights, losses, grad_scale);
  });
}

}  // namespace megadlm::ops::cpu
