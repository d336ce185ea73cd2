#include "megadlm/training/lr_schedule.h"
#include <algorithm>
#include <cmath>

namespace megadlm {

double learning_rate(const OptimizerConfig& c, int64_t step) {
  const double max_lr = c.lr, min_lr = c.min_lr;
  const double warmup = static_cast<double>(c.lr_warmup_iters);
  const double decay = static_cast<double>(c.lr_decay_iters);
  const double s = static_cast<double>(step);
  if (c.lr_warmup_iters > 0 && s <= warmup)
    return c.lr_warmup_init + (max_lr - c.lr_warmup_init) * s / warmup;
  if (c.decay_style == LrDecayStyle::Constant) return max_lr;
  if (s > decay) return min_lr;
  if (c.decay_style == LrDecayStyle::InverseSquareRoot) {
    const double w = std::max(warmup, 1.0), n = std::max(s, 1.0);
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(n));
  }
  const double ratio = (s - warmup) / (decay - warmup);
  double coeff = 1.0;
  switch (c.decay_style) {
    case LrDecayStyle::Linear: coeff = 1.0 - ratio; break;
    case LrDecayStyle::Cosine: coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0); break;
    case LrDecayStyle::WSD: {
      const double wsd = static_cast<double>(c.lr_wsd_decay_iters);
      const double anneal_start = decay - wsd;
      if (s <= anneal_start) {
        coeff = 1.0;
      } else {
        const double q = (s - anneal_start) / wsd;
        switch (c.wsd_decay_style) {
          case WsdDecayStyle::Linear: coeff = 1.0 - q; break;
          case WsdDecayStyle::Cosine: coeff = 0.5 * (std::cos(M_PI * q) + 1.0); break;
          case WsdDecayStyle::Exponential: coeff = 2.0 * std::pow(0.5, q) - 1.0; break;
        }
      }
      break;
    }
    default: break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace megadlm
