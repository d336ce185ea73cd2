// What a run prints and records: the start-up summary, Megatron's iteration and validation
// lines (formats users and their scripts parse: keep them exactly), and the metrics JSON-lines
// file (--metrics-jsonl). Written by the logging rank (world rank 0) only; the Trainer decides
// what to log when and hands the numbers over.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

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
  std::string fault_report;      ///< what fault detection found and decided ("" = nothing)
  /// Mixture of experts (model/moe.h), over the global batch and averaged over the MoE layers:
  /// the load-balancing loss and the z-loss without their coefficients (mean per micro-batch),
  /// the experts' load max / mean (tokens each expert processed), the dropped fraction of the
  /// routed slots (capacity), and the load per layer.
  struct Moe {
    bool enabled = false;
    double aux_loss = 0, z_loss = 0, load_max_over_mean = 0, dropped_fraction = 0;
    std::vector<double> load_max_over_mean_per_layer;
  } moe;
};

/// Peak memory of this process so far, in GB (1e9 bytes): the CUDA pool's peak on a GPU stream,
/// the resident set's peak on the CPU.
double peak_memory_gb(const Stream& stream);
/// Peak bytes the CUDA pool has reserved (in use or cached), in GB; 0 on the CPU.
double peak_reserved_memory_gb(const Stream& stream);

class TrainingLog {
 public:
  /// `logging_rank`: whether this rank writes (the others' calls do nothing). With
  /// --tensorboard-dir the logging rank creates its event file here (training/tensorboard_writer.h).
  TrainingLog(const RunConfig& config, std::ostream& log, bool logging_rank);
  ~TrainingLog();

  /// Checks at start-up that the metrics file can be appended to.
  void check_metrics_file() const;
  /// The start-up lines (already formatted by the caller).
  void startup(const std::string& text) const;
  /// Megatron's iteration line for the window since the last one (+ a metrics row, the fields of
  /// docs/metrics.md). `flops_per_iteration`: model FLOPs of one iteration (whole job);
  /// `peak_gb` / `peak_reserved_gb`: this rank's peaks in use / reserved (reserved 0: not recorded).
  /// `predicted_gb` (>= 0): the memory planner's peak for this rank, added to the metrics row.
  void iteration(const std::vector<IterationMetrics>& window, int64_t skipped_iterations,
                 int64_t nan_iterations, double flops_per_iteration, double peak_gb,
                 double peak_reserved_gb, const std::string& device, double predicted_gb = -1) const;
  /// " > peak memory by step N (GB): predicted peak P (training/memory_plan.h), measured
  /// peak M, reserved R" — once, after the first iteration, so a user sees how good the
  /// planner's number is for their layout. `reserved_gb` < 0: not measurable (CPU).
  void memory_check(double predicted_gb, double measured_gb, double reserved_gb, int64_t iteration) const;
  /// Megatron's validation block " validation loss at <what> | lm loss value: ... " (+ a metrics
  /// row keyed `key`, e.g. "validation_lm_loss").
  void validation(double loss, const std::string& what, const std::string& key, int64_t iteration,
                  int64_t consumed_samples) const;
  /// After every iteration: the per-iteration TensorBoard series (nothing without --tensorboard-dir).
  void step(const IterationMetrics& m) const;
  /// " > peak memory per pipeline stage (GB): ..." (+ a metrics row).
  void peak_memory_per_stage(const std::vector<float>& gb, int64_t iteration) const;

 private:
  /// One row of --metrics-jsonl; throws naming the file, `what` and the system's reason when
  /// it cannot be written whole (the run stops: docs/monitoring.md).
  void append_metrics(const std::string& json_line, const std::string& what) const;

  const RunConfig& cfg_;
  std::ostream& log_;
  bool logging_rank_;
  std::unique_ptr<training::TrainingTensorBoard> tensorboard_;  // --tensorboard-dir, logging rank
};

}  // namespace megadlm
