// The training loop: micro-batches from a SampleSource, the diffusion (or AR) objective,
// gradient accumulation, global loss normalisation, clipping, AdamW with Megatron's LR schedule,
// and Megatron-style logging plus JSON-lines metrics.
//
// The layout (model chunks, store, data-parallel wrapper, optimizer, groups) is built by
// training/parallelize; the lines and metrics rows are written by training/training_log.
// One iteration (global batch of G samples; each of the D data-parallel ranks runs
// M = G / (B * D) micro-batches of B samples, rank r taking samples [r*B, (r+1)*B) of every
// block of B*D consecutive samples, as Megatron's sampler does: parallel/data_parallel/
// data_shard.h):
//   1. build this rank's M host micro-batches (noise is a pure function of the global sample
//      index); N = loss tokens of the whole global batch (all-reduced over DP)
//   2. run the pipeline schedule (parallel/pipeline_parallel/executor.h; one stage: forward
//      then backward per micro-batch): forwards through the fused loss with grad_scale = 1/N,
//      backwards accumulating fp32 main grads, activations and their gradients exchanged with
//      the neighbouring stages; DP buckets reduce as they finish
//   3. lm loss = sum over the gradient group (dp×cp) of weighted CE / N (the same number the
//      gradient is of)
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
#include <optional>
#include <string>
#include <vector>
#include "megadlm/data/sample_source.h"
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/checkpoint/directory_lock.h"
#include "megadlm/training/fault_detection.h"
#include "megadlm/training/optimizer.h"
#include "megadlm/training/parallelize.h"
#include "megadlm/training/training_config.h"
#include "megadlm/training/training_log.h"

namespace megadlm {

namespace checkpoint {
class CheckpointWriter;
class CheckpointReader;
struct StateSnapshot;
}

class Trainer {
 public:
  /// `log` receives the start-up summary and the iteration lines (written by rank 0 only).
  /// `groups`: the process groups of a multi-process run (null: a single process).
  /// With config.checkpoint.load, the checkpoint is verified and loaded here (collective), so a
  /// damaged or mismatched checkpoint fails before the first step.
  Trainer(const RunConfig& config, std::shared_ptr<const SampleSource> data, std::ostream& log,
          const parallel::ProcessGroups* groups = nullptr);
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
  const ParameterStore& parameters() const { return pm_->store; }
  const AdamWOptimizer& optimizer() const { return *pm_->optimizer; }
  const RunConfig& config() const { return cfg_; }
  const ModelRuntime& runtime() const { return pm_->runtime; }
  /// This rank's part of the model and its groups (training/parallelize.h).
  const ParallelModel& parallel_model() const { return *pm_; }

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
  /// At construction: locks the save directories, loads --load, decides this run's trajectory,
  /// and refuses to save over another run's or trajectory's checkpoints unless
  /// --overwrite-checkpoints (trainer_checkpoint.cpp).
  void load_checkpoint();
  void lock_save_directories();
  void load_checkpoint_files();
  void check_save_directories();
  /// MoE state that is not a parameter (expert biases): added to a save, read on a load.
  void add_moe_state(checkpoint::StateSnapshot& snap) const;
  void load_moe_state(const checkpoint::CheckpointReader& reader);
  /// FP8 delayed-scaling histories and scales (written once per stage, read by every rank).
  void add_fp8_state(checkpoint::StateSnapshot& snap) const;
  void load_fp8_state(const checkpoint::CheckpointReader& reader);
  /// After each iteration: commits async saves, saves on schedule, decides whether to stop.
  bool checkpoint_boundary();
  /// After the loop: the final save (not when `exiting`: checkpoint_boundary() saved) and
  /// waiting for an async one.
  void finish_checkpoints(bool exiting = false);
  /// A reproducible fault at the current step: saves the state before it (with --save) and
  /// throws FaultStop naming the checkpoint — unless an earlier update came from a flagged
  /// result (a spike, a divergence): then nothing is saved and the message names the last good
  /// state, the one before that update, and the checkpoint holding it if any.
  [[noreturn]] void stop_on_fault(const std::string& report);
  void log_interval(const std::vector<IterationMetrics>& window);
  void log_peak_memory_per_stage();
  std::string startup_summary() const;
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
  /// Sum of a host value over `group` (identity on one rank or a null group).
  double sum_over(const std::shared_ptr<comm::Communicator>& group, double local);
  /// Over the data group: sums of whole-sample quantities (the loss-token normaliser).
  double data_sum(double local) { return sum_over(pm_->data_group, local); }
  /// Over the gradient group (dp×cp): sums of what each rank computed of its own share (the
  /// loss numerator).
  double grad_sum(double local) { return sum_over(pm_->grad_group, local); }
  /// The loss of the last pipeline stage, summed into every stage.
  void sum_loss_over_pipeline(Tensor& loss_sum);
  /// MoE: the step's statistics summed over the world (every rank calls it, also on stages
  /// without MoE layers), the metrics, and the expert-bias update.
  IterationMetrics::Moe finish_moe_step();
  bool logging_rank() const { return pm_->rank == 0; }

  RunConfig cfg_;
  std::shared_ptr<const SampleSource> data_;
  std::shared_ptr<const SampleSource> valid_, test_;
  std::ostream& log_;
  std::unique_ptr<ParallelModel> pm_;
  TrainingLog training_log_;
  // --rerun-mode and the checks (training/fault_detection.h); cfg_ is initialised before it.
  FaultDetector fault_detector_{cfg_.fault_detection, cfg_.training.check_for_nan_in_loss_and_grad,
                                uniform_guess_loss(cfg_)};
  int64_t iteration_ = 0;
  int64_t consumed_samples_ = 0;
  int64_t adam_steps_ = 0;
  int64_t skipped_iterations_ = 0;
  int64_t nan_iterations_ = 0;
  double flops_per_iteration_ = 0;
  double predicted_peak_gb_ = -1;  // the memory planner's peak for this rank (< 0: none)
  bool memory_logged_ = false;
  // Checkpoints.
  std::unique_ptr<checkpoint::CheckpointWriter> ckpt_writer_;
  std::function<bool()> stop_requested_;
  std::string loaded_from_;
  bool resumed_ = false;  // loaded_from_ holds this run's own state (not --finetune, not release)
  std::vector<std::unique_ptr<checkpoint::DirectoryLock>> save_locks_;  // rank 0
  int64_t last_checkpoint_iteration_ = -1;  // iteration of the last persistent save or load
  // The run history this run's saves belong to (checkpoint::CheckpointState::trajectory): a
  // resume continues its checkpoint's, a fresh run or a rewind below newer checkpoints draws a
  // new one. Retention ranks only its checkpoints; saves over another's need
  // --overwrite-checkpoints. Decided by rank 0, the rank that writes the index.
  std::string trajectory_;
  // The first iteration whose update was applied from a result fault detection flagged (a
  // spike, a possible divergence): that state and every later one are not a good state
  // (stop_on_fault). Unset while none was.
  std::optional<int64_t> first_flagged_iteration_;
  bool announced_block_size_ = false;  ///< the block-size schedule logged its current size
  std::string first_flagged_report_;
  int64_t last_loaded_iteration_ = -1;  // the iteration this run resumed from (-1: none)
  std::chrono::steady_clock::time_point start_time_ = std::chrono::steady_clock::now();
};

}  // namespace megadlm
