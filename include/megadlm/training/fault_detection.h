// Fault detection and replay, with Megatron's flags (--check-for-nan-in-loss-and-grad,
// --check-for-spiky-loss, --check-for-large-grads, --rerun-mode, --error-injection-rate,
// --error-injection-type; Megatron-LM's rerun state machine is the model, docs/faults.md the
// description). Every step's global loss and gradient norm are checked; a rejected result (NaN,
// a spike) is re-computed from the same batch and the same masks — exact, since every random
// number is a function of (seed, global position) — to tell a transient fault (the replay
// differs) from a reproducible result (it does not), and the step is then applied from the
// replay, skipped, or the run stops with a checkpoint of the last good state; the log says which.
// The verdict depends only on global values, so every rank reaches it without communicating.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include "megadlm/core/error.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

/// What one forward-backward of a step produced (global values, identical on every rank).
struct StepResult {
  double lm_loss = 0;
  double grad_norm = 0;
};

enum class FaultAction {
  Apply,  ///< apply the update of `result` (the gradients in the buffers are that run's)
  Skip,   ///< do not apply any update for this batch
  Stop,   ///< stop the run, with a checkpoint of the state before this step
};

struct FaultVerdict {
  FaultAction action = FaultAction::Apply;
  StepResult result;   ///< the result the action refers to (the replay's when one ran)
  bool replayed = false;
  /// The result applied (action Apply) was itself flagged — a spike, a possible divergence —
  /// so the state after this step is not a good state to fall back to (Trainer::stop_on_fault).
  bool flagged = false;
  std::string report;  ///< for the log: what was found and decided ("" when nothing was)
};

/// The run stopped on a reproducible fault: the message says what and which checkpoint holds
/// the last good state; programs exit with `exit_code` (16, Megatron's "resume to disambiguate").
class FaultStop : public Error {
 public:
  FaultStop(const std::string& message, int exit_code) : Error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

inline constexpr int kExitReproducibleFault = 16;

/// The loss of a model that guesses uniformly over the `vocab` logits: ln(vocab), times the
/// objective's scale (block diffusion's --dlm-diffusion-loss-scale plus --dlm-ar-loss-weight
/// when they add up to more than 1). A freshly initialised model is near it; a loss many times
/// above it is a divergence.
double uniform_guess_loss(const RunConfig& config);

class FaultDetector {
 public:
  /// `check_nan`: --check-for-nan-in-loss-and-grad. `uniform_loss` (> 0; 0 turns the rule off):
  /// the loss of a uniform guess, ln(vocabulary) times the objective's scale
  /// (uniform_guess_loss()); a loss of spike_factor times it is a divergence whatever the recent
  /// losses were (a gradual one raises the median with it).
  FaultDetector(const FaultDetectionConfig& config, bool check_nan, double uniform_loss = 0);

  /// Runs `forward_backward` for step `iteration` (1-based) — it zeroes and fills the gradient
  /// buffers and returns the global loss and gradient norm — once, and once more when the
  /// result is rejected under --rerun-mode validate_results (every step under report_stats).
  /// `seed` (--seed, or the checkpoint's) keys the error-injection draws.
  FaultVerdict run_step(int64_t iteration, uint64_t seed, const std::function<StepResult()>& forward_backward);

  /// --rerun-mode report_stats: replays so far, how many were bitwise identical, the largest
  /// relative difference ("" in other modes).
  std::string stats_report() const;

  /// Spikes are measured against the median of this many recent accepted values.
  static constexpr size_t kReferenceWindow = 32;
  /// After this many reproducible spikes in a row (a divergence), spikes are reported without
  /// being replayed.
  static constexpr int kMaxReplayedSpikesInARow = 3;

 private:
  /// Why `r` is rejected ("" = it is not).
  std::string rejection(const StepResult& r) const;
  /// "a diverging loss (...)" when r's loss is spike_factor x the uniform guess or more, else "".
  std::string divergence(const StepResult& r) const;
  void accept(const StepResult& r);
  bool inject(int64_t iteration, uint64_t seed) const;

  FaultDetectionConfig cfg_;
  bool check_nan_;
  double uniform_loss_ = 0;
  std::deque<double> losses_, grad_norms_;  // recent accepted values (the spike references)
  int spikes_in_a_row_ = 0;
  // report_stats
  int64_t replays_ = 0, identical_ = 0;
  double max_relative_difference_ = 0;
};

}  // namespace megadlm
