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

}  // namespace megadlm::ops::cpu
