// The training loop: micro-batches from a SampleSource, the diffusion (or AR) objective,
// gradient accumulation, global loss normalisation, clipping, AdamW with Megatron's LR schedule,
// and Megatron-style logging plus JSON-lines metrics.
//
// One iteration (global batch of G samples; each of the D data-parallel ranks runs
// M = G / (B * D) micro-batches of B samples, rank r taking samples [r*B, (r+1)*B) of every
// block of B*D consecutive samples, as Megatron's sampler does):
//   1. build this rank's M host micro-batches (noise is a pure function of the global sample
//      index); N = loss tokens of the whole global batch (all-reduced over DP)
//   2. run the pipeline schedule (parallel/pipeline_parallel/schedule.h; one stage: forward
//      then backward per micro-batch): forwards through the fused loss with grad_scale = 1/N,
//      backwards accumulating fp32 main grads, activations and their gradients exchanged with
//      the neighbouring stages; DP buckets reduce as they finish
//   3. lm loss = sum over all ranks of weighted CE / N (the same number the gradient is of)
//   4. grad norm over all main grads, each element once; non-finite -> the step is skipped (and
//      with --check-for-nan-in-loss-and-grad, the run stops with an error naming the iteration)
//   5. clip (clip_grad / (norm + 1e-6) when < 1), AdamW on fp32 masters with lr(iteration-1),
//      model weights refreshed from the masters (all-gathered under the distributed optimizer)
// Validation (--eval-interval, --eval-iters): the first eval_iters global batches of the
// validation data, forward only, with the fixed evaluation noise of diffusion/forward_process,
// so successive evaluations score the same samples under the same masks; logged as Megatron
// logs it and written to the metrics file as validation_lm_loss.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/comm/process_groups.h"
#include "megadlm/data/sample_source.h"
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/parameter_store.h"
#include "megadlm/parallel/data_parallel/data_parallel.h"
#include "megadlm/training/optimizer.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

namespace checkpoint {
class CheckpointWriter;
}
namespace training {
class TrainingTensorBoard;
}

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
  /// `log` receives the start-up summary and the iteration lines (written by rank 0 only).
  /// `groups`: the process groups of a multi-process run (null: a single process).
  /// With config.checkpoint.load, the checkpoint is verified and loaded here (collective), so a
  /// damaged or mismatched checkpoint fails before the first step.
  Trainer(const RunConfig& config, std::shared_ptr<const SampleSource> data, std::ostream& log,
          const comm::ProcessGroups* groups = nullptr);
  ~Trainer();

  /// Held-out data for --eval-interval evaluations and the final validation / test pass (either
  /// may be null: no such pass).
  void set_evaluation_data(std::shared_ptr<const SampleSource> valid,
                           std::shared_ptr<const SampleSource> test = nullptr);
  /// Loss over the first --eval-iters global batches of `data` (forward only, fixed noise).
  double evaluate(const SampleSource& data);

  /// Runs one iteration.
  IterationMetrics step();
  /// Runs until --train-iters (or --exit-interval), logging every --log-interval iterations.
  std::vector<IterationMetrics> train();

  int64_t iteration() const { return iteration_; }
  const ParameterStore& parameters() const { return store_; }
  const AdamWOptimizer& optimizer() const { return *optimizer_; }
  const RunConfig& config() const { return cfg_; }
  const ModelRuntime& runtime() const { return rt_; }

  // --- checkpoints (docs/checkpoints.md; implemented in trainer_checkpoint.cpp) ---
  /// Asked at every iteration boundary when set (for SIGTERM/SIGUSR1 handlers): true on any
  /// rank = every rank saves (with --save) and stops after the same iteration.
  void set_stop_request(std::function<bool()> stop_requested);
  /// Collective: saves the current state to --save now (after an earlier async save commits);
  /// `non_persistent`: to the rolling directory instead, whose older checkpoints are removed once
  /// this one has committed.
  void save_checkpoint(bool non_persistent = false);
  int64_t consumed_samples() const { return consumed_samples_; }
  /// The checkpoint directory this run started from ("" = none).
  const std::string& loaded_checkpoint() const { return loaded_from_; }

 private:
  void load_checkpoint();
  /// After each iteration: commits async saves, saves on schedule, decides whether to stop.
  bool checkpoint_boundary();
  /// After the loop: the final save (not when `exiting`: checkpoint_boundary() saved) and
  /// waiting for an async one.
  void finish_checkpoints(bool exiting = false);
  void log_interval(const std::vector<IterationMetrics>& window);
  void log_peak_memory_per_stage();
  /// Runs the pipeline schedule over this rank's micro-batches: training (grad_scale > 0,
  /// forwards and backwards, gradients accumulated) or evaluation (grad_scale 0, forwards only).
  /// The loss of the last stage is added into loss_sum.
  void run_schedule(const std::vector<HostMicroBatch>& host, Tensor& loss_sum, float grad_scale);
  /// Evaluates `data` and logs "validation loss at <what>" (+ a metrics line keyed `key`).
  void evaluate_and_log(const SampleSource& data, const std::string& what, const char* key);
  BatchContext batch_context(bool training) const;
  /// This rank's micro-batches of the global batch starting at sample `first`.
  std::vector<HostMicroBatch> host_micro_batches(const SampleSource& data, int64_t first,
                                                 const BatchContext& ctx, double& local_tokens) const;
  /// Sum over the data-parallel group of a host value (identity on one rank).
  double dp_sum(double local);
  bool logging_rank() const { return rank_ == 0; }

  RunConfig cfg_;
  std::shared_ptr<const SampleSource> data_;
  std::shared_ptr<const SampleSource> valid_, test_;
  std::ostream& log_;
  ModelRuntime rt_;
  ParameterStore store_;
  std::vector<std::unique_ptr<GptModel>> models_;  // this rank's pipeline chunks (1 without VPP)
  std::shared_ptr<comm::Communicator> pp_group_;
  int pp_rank_ = 0, pp_size_ = 1;
  std::shared_ptr<comm::Communicator> dp_group_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<AdamWOptimizer> optimizer_;
  int rank_ = 0;
  int64_t iteration_ = 0;
  int64_t consumed_samples_ = 0;
  int64_t adam_steps_ = 0;
  int64_t skipped_iterations_ = 0;
  int64_t nan_iterations_ = 0;
  double flops_per_iteration_ = 0;
  // Checkpoints.
  std::shared_ptr<comm::Communicator> world_, dist_opt_inter_;
  std::unique_ptr<checkpoint::CheckpointWriter> ckpt_writer_;
  std::function<bool()> stop_requested_;
  std::string loaded_from_;
  int64_t last_checkpoint_iteration_ = -1;  // iteration of the last persistent save or load
  std::chrono::steady_clock::time_point start_time_ = std::chrono::steady_clock::now();
  std::unique_ptr<training::TrainingTensorBoard> tensorboard_;  // --tensorboard-dir, rank 0
};

}  // namespace megadlm
