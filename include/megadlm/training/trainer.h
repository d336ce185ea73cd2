// The training loop: micro-batches from a SampleSource, the diffusion (or AR) objective,
// gradient accumulation, global loss normalisation, clipping, AdamW with Megatron's LR schedule,
// and Megatron-style logging plus JSON-lines metrics.
//
// One iteration (global batch of G samples = M micro-batches of B samples):
//   1. build all M host micro-batches (noise is a pure function of the global sample index);
//      N = loss tokens of the whole global batch
//   2. for each micro-batch: forward through the fused loss with grad_scale = 1/N, backward
//      (weight gradients accumulate in fp32 main grads)
//   3. lm loss = sum of weighted CE / N (the same number the gradient is of)
//   4. grad norm over all main grads; non-finite -> the step is skipped (and with
//      --check-for-nan-in-loss-and-grad, the run stops with an error naming the iteration)
//   5. clip (clip_grad / (norm + 1e-6) when < 1), AdamW on fp32 masters with lr(iteration-1),
//      model weights refreshed from the masters
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/data/sample_source.h"
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/parameter_store.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

struct IterationMetrics {
  int64_t iteration = 0;         ///< 1-based, after the step
  int64_t consumed_samples = 0;
  double lm_loss = 0;            ///< this iteration's loss
  double grad_norm = 0;          ///< before clipping
  double lr = 0;                 ///< as Megatron logs it: lr(iteration)
  double elapsed_ms = 0;         ///< wall time of this iteration
  bool skipped = false;          ///< update not applied (non-finite gradients)
  bool nan = false;
};

class Trainer {
 public:
  /// `log` receives the start-up summary and the iteration lines (rank 0's job).
  Trainer(const RunConfig& config, std::shared_ptr<const SampleSource> data, std::ostream& log);
  ~Trainer();

  /// Runs one iteration.
  IterationMetrics step();
  /// Runs until --train-iters (or --exit-interval), logging every --log-interval iterations.
  std::vector<IterationMetrics> train();

  int64_t iteration() const { return iteration_; }
  const ParameterStore& parameters() const { return store_; }
  const RunConfig& config() const { return cfg_; }
  const ModelRuntime& runtime() const { return rt_; }

 private:
  void log_interval(const std::vector<IterationMetrics>& window);

  RunConfig cfg_;
  std::shared_ptr<const SampleSource> data_;
  std::ostream& log_;
  ModelRuntime rt_;
  ParameterStore store_;
  std::unique_ptr<GptModel> model_;
  int64_t iteration_ = 0;
  int64_t consumed_samples_ = 0;
  int64_t adam_steps_ = 0;
  int64_t skipped_iterations_ = 0;
  int64_t nan_iterations_ = 0;
  double flops_per_iteration_ = 0;
};

}  // namespace megadlm
