// Megatron's learning-rate schedule (OptimizerParamScheduler.get_lr),
// counted in iterations (Megatron counts samples, = iterations x global batch, which gives the
// same values with a constant batch size).
//
// lr(step): warmup  init + (max - init) * step / warmup          for warmup > 0, step <= warmup
//           constant max;  after decay_iters: min
//           inverse-square-root: max(min, max * sqrt(warmup) / sqrt(step))
//           otherwise ratio = (step - warmup) / (decay - warmup) and lr = min + coeff * (max - min)
//           with linear 1 - ratio, cosine (cos(pi ratio) + 1) / 2, and WSD: 1 until
//           decay - wsd_decay, then q = (step - anneal_start) / wsd_decay and linear 1 - q,
//           cosine (cos(pi q) + 1) / 2, exponential 2 * 0.5^q - 1.
// Iteration k (1-based) trains with lr(k - 1); Megatron's log line at iteration k shows lr(k).
#pragma once
#include <cstdint>
#include "megadlm/training/training_config.h"

namespace megadlm {

double learning_rate(const OptimizerConfig& cfg, int64_t step);

}  // namespace megadlm
