// training/fault_detection.h. The checks, the replay decision table and error injection; the
// trainer calls run_step() around each step's forward-backward and acts on the verdict.
//
// Decision table (--rerun-mode validate_results), after a rejected first result R1 and its
// replay R2 (same batch, same masks, bitwise comparison of loss and gradient norm):
//   R2 != R1, R2 accepted     transient fault: R1 discarded, the step applied from R2
//   R2 != R1, R2 rejected     unstable: the step is skipped (no update)
//   R2 == R1, not finite      reproducible: stop with a checkpoint of the last good state (exit 16)
//   R2 == R1, finite          reproducible spike (the model and data give it, e.g. a divergence):
//                             reported, the step applied
// "R2 == R1" is bitwise, or — for a GPU whose kernels are not deterministic — R2 rejected for
// the same kind of reason (both spikes, or the same values non-finite): a replay that drifts in
// the last bits reproduces the result all the same, and the report says by how much it drifted.
// A spike is a loss >= 10x the median of recent accepted losses, or >= 10x the loss of a uniform
// guess, ln(vocabulary) (a gradual divergence raises the median with it; docs/faults.md).
// Without --check-for-spiky-loss both are still reported (never rejected): a diverging run is
// not silent. A flagged result that is applied marks the state after it as not good
// (FaultVerdict::flagged; the trainer's stop names the state before it).
// Megatron's machine also re-runs a reproducible result from a checkpoint on another GPU; a run
// stopped with exit code 16 is that checkpoint (resume it elsewhere to rule out a device fault).
#include "megadlm/training/fault_detection.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>
#include "megadlm/core/philox.h"

namespace megadlm {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6E", v);
  return buf;
}

std::string text(const StepResult& r) { return "lm loss " + num(r.lm_loss) + ", grad norm " + num(r.grad_norm); }

// Bitwise equality, NaN equal to NaN (a NaN that comes back is reproduced).
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }
bool same(const StepResult& a, const StepResult& b) {
  return same(a.lm_loss, b.lm_loss) && same(a.grad_norm, b.grad_norm);
}

double relative_difference(double a, double b) {
  if (same(a, b)) return 0.0;
  if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
  return std::fabs(a - b) / std::max(std::fabs(a) + std::fabs(b), 1e-300) * 2;
}

// The replay reproduces a rejected result without being bitwise equal: both finite (two spikes:
// rejection() has already said both are rejected), or non-finite in the same values.
bool same_kind(const StepResult& a, const StepResult& b) {
  return std::isfinite(a.lm_loss) == std::isfinite(b.lm_loss) &&
         std::isfinite(a.grad_norm) == std::isfinite(b.grad_norm);
}

double median(std::deque<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const char* injection_name(ErrorInjectionType t) {
  switch (t) {
    case ErrorInjectionType::CorrectResult: return "correct_result";
    case ErrorInjectionType::TransientError: return "transient_error";
    case ErrorInjectionType::PersistentError: return "persistent_error";
  }
  return "?";
}

}  // namespace

double uniform_guess_loss(const RunConfig& c) {
  const int64_t vocab = c.model.padded_vocab_size > 0 ? c.model.padded_vocab_size : c.model.vocab_size;
  if (vocab < 2) return 0;
  double scale = 1.0;
  if (c.diffusion.block_diffusion())
    scale = std::max(1.0, static_cast<double>(c.diffusion.diffusion_loss_scale) + c.diffusion.ar_loss_weight);
  return std::log(static_cast<double>(vocab)) * scale;
}

FaultDetector::FaultDetector(const FaultDetectionConfig& config, bool check_nan, double uniform_loss)
    : cfg_(config), check_nan_(check_nan), uniform_loss_(uniform_loss) {}

std::string FaultDetector::divergence(const StepResult& r) const {
  if (uniform_loss_ <= 0 || !std::isfinite(r.lm_loss) || r.lm_loss < cfg_.spike_factor * uniform_loss_) return "";
  return "a diverging loss (" + num(r.lm_loss) + " >= " + num(cfg_.spike_factor) + " x " + num(uniform_loss_) +
         ", the loss of a uniform guess over the vocabulary: the model is far worse than guessing)";
}

bool FaultDetector::inject(int64_t iteration, uint64_t seed) const {
  // Never at the first step (as Megatron: there is no earlier state to stop at), and only where
  // results are validated. The draw depends on (seed, iteration) alone: every rank agrees, and
  // a resumed run injects at the same iterations.
  if (cfg_.error_injection_rate <= 0 || iteration <= 1 || cfg_.rerun_mode != RerunMode::ValidateResults)
    return false;
  const PhiloxWords w = philox(PhiloxKey::make(seed, RngPurpose::ErrorInjection),
                               static_cast<uint32_t>(iteration), static_cast<uint32_t>(iteration >> 32), 0, 0);
  return w.w[0] % static_cast<uint64_t>(cfg_.error_injection_rate) == 0;
}

std::string FaultDetector::rejection(const StepResult& r) const {
  if (check_nan_ && (!std::isfinite(r.lm_loss) || !std::isfinite(r.grad_norm)))
    return "a non-finite value (" + text(r) + ")";
  // A spike is measured against the median of recent accepted values (Megatron: the largest of
  // the first 100): a diverging run is caught within a step or two, and the noise of the
  // diffusion loss (random t) does not move a median.
  if (cfg_.check_spiky_loss && !losses_.empty() && std::isfinite(r.lm_loss)) {
    const double ref = median(losses_);
    if (std::fabs(r.lm_loss) >= cfg_.spike_factor * std::fabs(ref) && ref != 0)
      return "a spiky loss (" + num(r.lm_loss) + " >= " + num(cfg_.spike_factor) + " x the recent median " +
             num(ref) + ")";
  }
  // A gradual divergence raises the median with it (4.85 -> 2614 over 90 iterations is never 10x
  // the median of the last 32): an absolute reference catches it, the loss of a uniform guess.
  if (cfg_.check_spiky_loss) {
    const std::string why = divergence(r);
    if (!why.empty()) return why;
  }
  if (cfg_.check_large_grads && !grad_norms_.empty() && std::isfinite(r.grad_norm)) {
    const double ref = median(grad_norms_);
    if (r.grad_norm >= cfg_.spike_factor * ref && ref > 0)
      return "a large gradient norm (" + num(r.grad_norm) + " >= " + num(cfg_.spike_factor) +
             " x the recent median " + num(ref) + ")";
  }
  return "";
}

void FaultDetector::accept(const StepResult& r) {
  if (std::isfinite(r.lm_loss)) losses_.push_back(r.lm_loss);
  if (std::isfinite(r.grad_norm)) grad_norms_.push_back(r.grad_norm);
  while (losses_.size() > kReferenceWindow) losses_.pop_front();
  while (grad_norms_.size() > kReferenceWindow) grad_norms_.pop_front();
}

FaultVerdict FaultDetector::run_step(int64_t iteration, uint64_t seed,
                                     const std::function<StepResult()>& forward_backward) {
  FaultVerdict v;
  const bool injecting = inject(iteration, seed);
  // Injected faults corrupt the reported loss, as a flipped bit in the loss reduction would;
  // the gradients stay what the computation made them, so a discarded result leaves no trace.
  auto computed = [&](bool replay) {
    StepResult r = forward_backward();
    if (injecting && cfg_.error_injection_type != ErrorInjectionType::CorrectResult &&
        (!replay || cfg_.error_injection_type == ErrorInjectionType::PersistentError))
      r.lm_loss = NAN;
    return r;
  };
  const StepResult first = computed(false);
  v.result = first;
  std::string why = rejection(first);
  if (injecting && why.empty()) why = "an injected " + std::string(injection_name(cfg_.error_injection_type)) + " (the result itself passes)";
  if (injecting) why += " [injected: --error-injection-type " + std::string(injection_name(cfg_.error_injection_type)) + "]";
  const std::string at = "iteration " + std::to_string(iteration) + ": ";

  if (cfg_.rerun_mode == RerunMode::ReportStats) {
    const StepResult replay = computed(true);
    ++replays_;
    identical_ += same(first, replay) ? 1 : 0;
    max_relative_difference_ = std::max({max_relative_difference_, relative_difference(first.lm_loss, replay.lm_loss),
                                         relative_difference(first.grad_norm, replay.grad_norm)});
    v.replayed = true;
    v.result = replay;
    if (!why.empty()) v.report = at + "found " + why + " (--rerun-mode report_stats: no verdict, the replay is applied)";
    v.flagged = !rejection(replay).empty();
    if (!v.flagged) accept(replay);
    return v;
  }
  if (why.empty()) {
    spikes_in_a_row_ = 0;
    // Not checked (no --check-for-spiky-loss), still not silent: a divergence is reported.
    if (!cfg_.check_spiky_loss && !losses_.empty() && std::isfinite(first.lm_loss)) {
      const double ref = median(losses_);
      if (ref > 0 && first.lm_loss >= cfg_.spike_factor * ref)
        v.report = at + "lm loss " + num(first.lm_loss) + " is >= " + num(cfg_.spike_factor) +
                   " x the recent median " + num(ref) + ": the run may be diverging (not rejected; "
                   "--check-for-spiky-loss with --rerun-mode validate_results replays such steps)";
    }
    // ... and a gradual one, against the uniform guess.
    if (!cfg_.check_spiky_loss && v.report.empty() && !divergence(first).empty())
      v.report = at + "found " + divergence(first) + ": the run is diverging (not rejected; "
                 "--check-for-spiky-loss with --rerun-mode validate_results replays such steps)";
    v.flagged = !v.report.empty();
    accept(first);
    return v;
  }
  const bool non_finite = !std::isfinite(first.lm_loss) || !std::isfinite(first.grad_norm);
  if (cfg_.rerun_mode == RerunMode::Disabled) {
    // No replay: the trainer's NaN check decides about non-finite values; a spike is reported.
    if (!non_finite) v.report = at + "found " + why + " (not replayed: --rerun-mode disabled)";
    v.flagged = !non_finite;
    return v;
  }
  if (!non_finite && !injecting && spikes_in_a_row_ >= kMaxReplayedSpikesInARow) {
    v.report = at + "found " + why + " again (" + std::to_string(spikes_in_a_row_) +
               " reproducible spikes in a row: the run diverges; no longer replayed)";
    v.flagged = true;
    ++spikes_in_a_row_;
    return v;
  }
  const StepResult replay = computed(true);
  v.replayed = true;
  v.result = replay;
  const std::string replay_why = rejection(replay);
  const std::string found = at + "found " + why + "; replayed the step with the same batch and masks: ";
  // Reproduced, though not bitwise: the kernels of this device are not deterministic.
  const bool drifted = !same(first, replay) && !replay_why.empty() && same_kind(first, replay);
  const std::string drift =
      drifted ? " (not bitwise: relative difference " +
                    num(std::max(relative_difference(first.lm_loss, replay.lm_loss),
                                 relative_difference(first.grad_norm, replay.grad_norm))) +
                    "; the kernels are not deterministic, --deterministic-mode makes replays exact)"
              : "";
  if (!same(first, replay) && !drifted) {
    if (replay_why.empty()) {
      v.action = FaultAction::Apply;
      v.report = found + text(replay) + ", a different result: a TRANSIENT fault. The first result is "
                 "discarded and the step applied from the replay";
      spikes_in_a_row_ = 0;
      accept(replay);
    } else {
      v.action = FaultAction::Skip;
      v.report = found + "another rejected result (" + replay_why + "): an unstable fault. The step is "
                 "skipped (no update)";
    }
    return v;
  }
  if (non_finite) {
    v.action = FaultAction::Stop;
    v.report = found + "the same result" + drift + ": a REPRODUCIBLE fault (not a transient one)";
    return v;
  }
  v.action = FaultAction::Apply;
  if (injecting && cfg_.error_injection_type == ErrorInjectionType::CorrectResult) {
    v.report = found + "the same result" + drift + ": the flagged result is CORRECT (reproducible). The step is applied";
    accept(replay);
  } else {
    ++spikes_in_a_row_;
    v.flagged = true;
    v.report = found + "the same result" + drift + ": REPRODUCIBLE, not a transient fault (the model and data give it; "
               "a diverging run, e.g. --lr too high?). The step is applied";
  }
  return v;
}

std::string FaultDetector::stats_report() const {
  if (cfg_.rerun_mode != RerunMode::ReportStats) return "";
  std::ostringstream os;
  os << "rerun stats (--rerun-mode report_stats): " << replays_ << " step(s) replayed, " << identical_
     << " bitwise identical, largest relative difference of loss or grad norm " << num(max_relative_difference_);
  return os.str();
}

}  // namespace megadlm
