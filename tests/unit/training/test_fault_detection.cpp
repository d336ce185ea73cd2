// Fault detection and replay (training/fault_detection.h): the decision table on scripted step
// results, error injection (deterministic, about one in N steps), and through the Trainer: an
// injected transient fault is replayed away (the run is bitwise the uninjected one), a
// persistent one stops the run with a checkpoint of the last good state and exit code 16, and a
// diverging run (--lr 1e3) is reported as a spike.
#include <gtest/gtest.h>
#include <cmath>
#include <filesystem>
#include <sstream>
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/fault_detection.h"
#include "megadlm/training/trainer.h"
#include "support/scratch.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

FaultDetectionConfig validate(bool spikes = false) {
  FaultDetectionConfig c;
  c.rerun_mode = RerunMode::ValidateResults;
  c.check_spiky_loss = spikes;
  return c;
}

// forward_backward that returns the scripted results in order and counts its calls.
struct Script {
  std::vector<StepResult> results;
  size_t calls = 0;
  StepResult operator()() { return results.at(calls++); }
};

FaultVerdict step(FaultDetector& d, int64_t iteration, Script& s) {
  return d.run_step(iteration, 1234, [&] { return s(); });
}

}  // namespace

TEST(FaultDetector, AcceptedStepsRunOnce) {
  FaultDetector d(validate(true), true);
  Script s{{{4.8, 1.2}, {4.7, 1.1}}};
  EXPECT_EQ(step(d, 1, s).action, FaultAction::Apply);
  const FaultVerdict v = step(d, 2, s);
  EXPECT_EQ(v.action, FaultAction::Apply);
  EXPECT_FALSE(v.replayed);
  EXPECT_EQ(v.report, "");
  EXPECT_EQ(s.calls, 2u);
}

TEST(FaultDetector, ANanThatTheReplayDoesNotReproduceIsTransientAndTheReplayIsApplied) {
  FaultDetector d(validate(), true);
  Script s{{{NAN, 1.0}, {4.5, 1.0}}};
  const FaultVerdict v = step(d, 7, s);
  EXPECT_EQ(s.calls, 2u);
  EXPECT_TRUE(v.replayed);
  EXPECT_EQ(v.action, FaultAction::Apply);
  EXPECT_EQ(v.result.lm_loss, 4.5);
  EXPECT_NE(v.report.find("iteration 7: found a non-finite value"), std::string::npos) << v.report;
  EXPECT_NE(v.report.find("a TRANSIENT fault"), std::string::npos) << v.report;
}

TEST(FaultDetector, AReproducedNanStopsAndAnUnstableOneIsSkipped) {
  FaultDetector d(validate(), true);
  Script same{{{NAN, 2.0}, {NAN, 2.0}}};
  const FaultVerdict stop = step(d, 3, same);
  EXPECT_EQ(stop.action, FaultAction::Stop);
  EXPECT_NE(stop.report.find("a REPRODUCIBLE fault"), std::string::npos) << stop.report;
  Script unstable{{{NAN, 2.0}, {4.0, INFINITY}}};
  EXPECT_EQ(step(d, 4, unstable).action, FaultAction::Skip);
}

TEST(FaultDetector, SpikesAreReplayedReportedAndAppliedThenNoLongerReplayedWhenTheRunDiverges) {
  FaultDetector d(validate(true), true);
  Script s;
  for (double l : {5.0, 4.9, 5.1}) s.results.push_back({l, 1.0});
  for (int i = 1; i <= 3; ++i) step(d, i, s);
  // 60 >= 10 x median(5.0, 4.9, 5.1): a spike; the replay gives it again.
  for (int k = 0; k < 4; ++k) {
    s.results.push_back({60.0 * (k + 1), 1.0});
    s.results.push_back({60.0 * (k + 1), 1.0});
  }
  for (int k = 0; k < FaultDetector::kMaxReplayedSpikesInARow; ++k) {
    const size_t before = s.calls;
    const FaultVerdict v = step(d, 4 + k, s);
    EXPECT_EQ(s.calls - before, 2u);
    EXPECT_EQ(v.action, FaultAction::Apply);
    EXPECT_NE(v.report.find("found a spiky loss"), std::string::npos) << v.report;
    EXPECT_NE(v.report.find("REPRODUCIBLE, not a transient fault"), std::string::npos) << v.report;
  }
  const size_t before = s.calls;
  const FaultVerdict v = step(d, 7, s);
  EXPECT_EQ(s.calls - before, 1u);  // reported, not replayed any more
  EXPECT_NE(v.report.find("3 reproducible spikes in a row: the run diverges"), std::string::npos) << v.report;
}

// A GPU without --deterministic-mode replays a step to nearly, not exactly, the same numbers: a
// replay rejected for the same kind of reason still reproduces the result (it used to be called
// "unstable" and the step skipped, every step of a diverging run).
TEST(FaultDetector, AReplayThatDriftsInTheLastBitsStillReproducesTheResult) {
  FaultDetector d(validate(true), true);
  Script s{{{5.0, 1.0}, {4.9, 1.0}, {5.1, 1.0}}};
  for (int i = 1; i <= 3; ++i) step(d, i, s);
  s.results.push_back({60.0, 1.0});
  s.results.push_back({60.0 * (1 + 1e-7), 1.0});
  const FaultVerdict spike = step(d, 4, s);
  EXPECT_EQ(spike.action, FaultAction::Apply);
  EXPECT_EQ(spike.result.lm_loss, 60.0 * (1 + 1e-7));  // the replay's gradients are in the buffers
  const std::string said = "the same result (not bitwise: relative difference ";
  const size_t at = spike.report.find(said);
  ASSERT_NE(at, std::string::npos) << spike.report;
  EXPECT_NEAR(std::stod(spike.report.substr(at + said.size())), 1e-7, 1e-12) << spike.report;
  EXPECT_NE(spike.report.find("REPRODUCIBLE, not a transient fault"), std::string::npos) << spike.report;
  // A NaN loss that comes back, with a gradient norm that drifted: reproducible, the run stops.
  Script nan{{{NAN, 2.0}, {NAN, 2.5}}};
  const FaultVerdict stop = step(d, 5, nan);
  EXPECT_EQ(stop.action, FaultAction::Stop);
  EXPECT_NE(stop.report.find("not bitwise"), std::string::npos) << stop.report;
  EXPECT_NE(stop.report.find("a REPRODUCIBLE fault"), std::string::npos) << stop.report;
  // Different values non-finite: not the same result.
  Script other{{{NAN, 2.0}, {NAN, INFINITY}}};
  EXPECT_EQ(step(d, 6, other).action, FaultAction::Skip);
}

// Without --check-for-spiky-loss nothing is rejected for a spike, but a loss 10x the recent
// median is reported (a run with `--lr 1e3` once went 4.85 -> 1.9e13 without a word).
TEST(FaultDetector, ByDefaultADivergingLossIsReportedNotRejected) {
  FaultDetector d(FaultDetectionConfig{}, true);
  Script s{{{5.0, 1.0}, {4.9, 1.0}, {48.9, 1.0}, {50.0, 1.0}, {2000.0, 1.0}}};
  EXPECT_EQ(step(d, 1, s).report, "");
  EXPECT_EQ(step(d, 2, s).report, "");
  EXPECT_EQ(step(d, 3, s).report, "");  // 48.9 < 10 x median(5.0, 4.9) = 49.5
  const FaultVerdict v = step(d, 4, s);  // 50 >= 10 x median(5.0, 4.9, 48.9) = 50
  EXPECT_EQ(v.action, FaultAction::Apply);
  EXPECT_FALSE(v.replayed);
  EXPECT_NE(v.report.find("iteration 4: lm loss 5.000000E+01 is >= 1.000000E+01 x the recent median "
                          "5.000000E+00: the run may be diverging"),
            std::string::npos) << v.report;
  EXPECT_NE(step(d, 5, s).report.find("may be diverging"), std::string::npos);  // 2000 >= 10 x 26.95
  EXPECT_EQ(s.calls, 5u);
}

// A gradual divergence (R13: 4.85 -> 2614 over 90 iterations at --lr 20) raises the median of the
// last 32 with it, so the 10x-median rule never fires; the loss of a uniform guess, ln(vocab),
// does not move: 10 x it is a divergence, rejected with --check-for-spiky-loss, reported without.
TEST(FaultDetector, AGradualDivergenceIsCaughtAgainstTheUniformGuess) {
  const double uniform = std::log(128.0);  // 4.852
  std::vector<double> losses;
  for (int i = 0; i < 90; ++i) losses.push_back(uniform * std::pow(1.0735, i));  // -> ~2600
  ASSERT_GT(losses.back(), 2500.0);
  auto first_report = [&](const FaultDetectionConfig& c, double reference, const std::string& want) {
    FaultDetector d(c, true, reference);
    for (size_t i = 0; i < losses.size(); ++i) {
      Script s{{{losses[i], 1.0}, {losses[i], 1.0}}};
      const FaultVerdict v = step(d, static_cast<int64_t>(i) + 1, s);
      EXPECT_EQ(v.action, FaultAction::Apply);
      if (!v.report.empty()) {
        EXPECT_NE(v.report.find(want), std::string::npos) << v.report;
        EXPECT_TRUE(v.flagged);
        return static_cast<int64_t>(i) + 1;
      }
      EXPECT_FALSE(v.flagged);
    }
    return int64_t{-1};
  };
  // The median alone never sees it (each loss is 1.07x the previous one).
  EXPECT_EQ(first_report(validate(true), 0, ""), -1);
  // Against the uniform guess: from the first loss >= 48.5 (iteration 34), replayed and reported.
  const int64_t at = first_report(validate(true), uniform, "found a diverging loss (");
  EXPECT_EQ(at, 34);
  EXPECT_GE(losses[static_cast<size_t>(at - 1)], 10 * uniform);
  EXPECT_LT(losses[static_cast<size_t>(at - 2)], 10 * uniform);
  // Without --check-for-spiky-loss: reported, not replayed.
  EXPECT_EQ(first_report(FaultDetectionConfig{}, uniform, "the run is diverging (not rejected"), 34);
  // The reference: ln of the padded vocabulary (times block diffusion's loss scale above 1).
  RunConfig cfg;
  cfg.model.vocab_size = 100;
  cfg.model.padded_vocab_size = 128;
  EXPECT_DOUBLE_EQ(uniform_guess_loss(cfg), uniform);
  cfg.diffusion.block_size = 4;
  cfg.diffusion.diffusion_loss_scale = 2.0f;
  cfg.diffusion.ar_loss_weight = 1.0f;
  EXPECT_DOUBLE_EQ(uniform_guess_loss(cfg), 3 * uniform);
}

TEST(FaultDetector, WithoutReplaysSpikesAreReportedAndNansLeftToTheTrainersCheck) {
  FaultDetectionConfig c;
  c.check_spiky_loss = true;
  c.check_large_grads = true;
  FaultDetector d(c, true);
  Script s{{{5.0, 1.0}, {5.0, 50.0}, {NAN, 1.0}}};
  step(d, 1, s);
  const FaultVerdict grads = step(d, 2, s);
  EXPECT_NE(grads.report.find("a large gradient norm"), std::string::npos) << grads.report;
  EXPECT_NE(grads.report.find("not replayed: --rerun-mode disabled"), std::string::npos);
  const FaultVerdict nan = step(d, 3, s);
  EXPECT_EQ(nan.action, FaultAction::Apply);
  EXPECT_TRUE(std::isnan(nan.result.lm_loss));
  EXPECT_EQ(s.calls, 3u);
}

TEST(FaultDetector, ReportStatsReplaysEveryStep) {
  FaultDetectionConfig c;
  c.rerun_mode = RerunMode::ReportStats;
  FaultDetector d(c, true);
  Script s{{{5.0, 1.0}, {5.0, 1.0}, {4.0, 2.0}, {4.0, 2.5}}};
  step(d, 1, s);
  step(d, 2, s);
  EXPECT_EQ(s.calls, 4u);
  EXPECT_NE(d.stats_report().find("2 step(s) replayed, 1 bitwise identical, largest relative difference of "
                                  "loss or grad norm 2.222222E-01"),
            std::string::npos) << d.stats_report();  // |2 - 2.5| / (2 + 2.5) * 2
}

TEST(FaultDetector, InjectionHitsAboutOneStepInNAndTheSameStepsEveryTime) {
  FaultDetectionConfig c = validate();
  c.error_injection_rate = 10;
  c.error_injection_type = ErrorInjectionType::CorrectResult;
  auto injected = [&] {
    FaultDetector d(c, true);
    std::vector<int64_t> hits;
    for (int64_t it = 1; it <= 2000; ++it) {
      Script s{{{5.0, 1.0}, {5.0, 1.0}}};
      if (step(d, it, s).replayed) hits.push_back(it);
    }
    return hits;
  };
  const std::vector<int64_t> a = injected(), b = injected();
  EXPECT_EQ(a, b);
  EXPECT_GT(a.size(), 150u);  // 200 expected; binomial sd ~13
  EXPECT_LT(a.size(), 250u);
  EXPECT_TRUE(a.empty() || a.front() > 1);  // never the first step
}

// ------------------------------------------------------------------------- through the Trainer

namespace {

struct TrainResult {
  std::vector<IterationMetrics> metrics;
  std::string log;
};

TrainResult train(const RunConfig& cfg) {
  auto data = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length, cfg.diffusion.mask_token);
  std::ostringstream log;
  Trainer t(cfg, data, log);
  TrainResult r;
  r.metrics = t.train();
  r.log = log.str();
  return r;
}

}  // namespace

TEST(FaultReplay, AnInjectedTransientFaultIsReplayedAwayBitwise) {
  RunConfig cfg = test::tiny_run(test::TinyShape::small(), 8);
  const TrainResult clean = train(cfg);
  cfg.fault_detection = validate();
  cfg.fault_detection.error_injection_rate = 3;
  cfg.fault_detection.error_injection_type = ErrorInjectionType::TransientError;
  const TrainResult faulty = train(cfg);
  ASSERT_EQ(faulty.metrics.size(), clean.metrics.size());
  int transient = 0;
  for (const IterationMetrics& m : faulty.metrics) transient += m.fault_report.find("a TRANSIENT fault") != std::string::npos;
  EXPECT_GE(transient, 1) << "no step was injected: the comparison below would prove nothing";
  for (size_t i = 0; i < clean.metrics.size(); ++i) {
    EXPECT_EQ(faulty.metrics[i].lm_loss, clean.metrics[i].lm_loss) << "iteration " << i + 1;
    EXPECT_EQ(faulty.metrics[i].grad_norm, clean.metrics[i].grad_norm) << "iteration " << i + 1;
    EXPECT_FALSE(faulty.metrics[i].skipped);
  }
}

TEST(FaultReplay, APersistentFaultStopsWithACheckpointOfTheLastGoodState) {
  test::TempDir dir("fault_stop_");
  RunConfig cfg = test::tiny_run(test::TinyShape::small(), 8);
  cfg.checkpoint.save = dir.str();
  cfg.checkpoint.save_interval = 100;
  cfg.fault_detection = validate();
  cfg.fault_detection.error_injection_rate = 1;  // every step from the second on
  cfg.fault_detection.error_injection_type = ErrorInjectionType::PersistentError;
  auto data = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length, cfg.diffusion.mask_token);
  std::ostringstream log;
  Trainer t(cfg, data, log);
  try {
    t.train();
    FAIL() << "a persistent fault did not stop the run";
  } catch (const FaultStop& e) {
    EXPECT_EQ(e.exit_code(), 16);
    const std::string what = e.what();
    EXPECT_NE(what.find("iteration 2: found a non-finite value"), std::string::npos) << what;
    EXPECT_NE(what.find("a REPRODUCIBLE fault"), std::string::npos) << what;
    EXPECT_NE(what.find("the last good state (iteration 1) is the checkpoint " + (dir / "iter_0000001")),
              std::string::npos) << what;
  }
  EXPECT_EQ(t.iteration(), 1);  // the faulty step was not applied
  const checkpoint::CheckpointReader saved(dir / "iter_0000001");
  EXPECT_EQ(saved.index().state.iteration, 1);
}

// R14: after a fast divergence the run stopped on a reproducible NaN and called the state
// before the NaN — the weights after several applied spikes (loss 2.2e13) — "the last good
// state", and saved it as such. The last good state is the one before the first flagged result
// was applied; no checkpoint of a diverged state is written as a good one.
TEST(FaultReplay, AfterAnAppliedSpikeTheLastGoodStateIsTheOneBeforeIt) {
  test::TempDir dir("fault_spike_stop_");
  RunConfig cfg = test::tiny_run(test::TinyShape::small(), 12);
  cfg.optimizer.lr = 1e3f;
  cfg.optimizer.clip_grad = 0.0f;
  cfg.checkpoint.save = dir.str();
  cfg.checkpoint.save_interval = 1;
  cfg.fault_detection = validate(true);
  auto data = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length, cfg.diffusion.mask_token);
  std::ostringstream log;
  Trainer t(cfg, data, log);
  std::string what;
  try {
    t.train();
  } catch (const FaultStop& e) {
    what = e.what();
  }
  ASSERT_NE(what, "") << "the diverging run did not stop on a reproducible fault: " << log.str();
  // The first applied spike, as the message names it.
  const std::string marker = "whose result was flagged (iteration ";
  const size_t m = what.find(marker);
  ASSERT_NE(m, std::string::npos) << what;
  const int64_t flagged = std::stoll(what.substr(m + marker.size()));
  ASSERT_LT(flagged, t.iteration() + 1) << what;
  const int64_t good = flagged - 1;
  EXPECT_EQ(what.find("the last good state (iteration " + std::to_string(t.iteration()) + ")"), std::string::npos) << what;
  EXPECT_NE(what.find("no checkpoint was written: the state at iteration " + std::to_string(t.iteration()) +
                      " is not a good state"), std::string::npos) << what;
  EXPECT_NE(what.find("The last good state is iteration " + std::to_string(good)), std::string::npos) << what;
  if (good > 0) {
    EXPECT_NE(what.find("the checkpoint " + (dir / checkpoint::iteration_dir_name(good)) + " (resume it"),
              std::string::npos) << what;
  }
  EXPECT_EQ(t.iteration(), checkpoint::list_checkpoint_iterations(dir.str()).back());  // nothing saved at the stop
}

TEST(FaultReplay, ADivergingRunIsReportedAsASpike) {
  RunConfig cfg = test::tiny_run(test::TinyShape::small(), 6);
  cfg.optimizer.lr = 1e3f;
  cfg.optimizer.clip_grad = 0.0f;
  cfg.training.check_for_nan_in_loss_and_grad = false;  // the divergence may reach inf
  cfg.fault_detection = validate(true);
  const TrainResult r = train(cfg);
  bool spike = false;
  for (const IterationMetrics& m : r.metrics) spike = spike || m.fault_report.find("found a spiky loss") != std::string::npos;
  EXPECT_TRUE(spike) << "losses: " << r.metrics[0].lm_loss << " ... " << r.metrics.back().lm_loss;
}

TEST(FaultReplay, ADivergingRunIsReportedWithoutAnyFlag) {
  RunConfig cfg = test::tiny_run(test::TinyShape::small(), 6);
  cfg.optimizer.lr = 1e3f;
  cfg.optimizer.clip_grad = 0.0f;
  cfg.training.check_for_nan_in_loss_and_grad = false;
  const TrainResult r = train(cfg);
  int reported = 0;
  for (const IterationMetrics& m : r.metrics) reported += m.fault_report.find("the run may be diverging") != std::string::npos;
  EXPECT_GE(reported, 1) << "losses: " << r.metrics[0].lm_loss << " ... " << r.metrics.back().lm_loss;
}

// The other side of the spike rules (docs/faults.md): a healthy run of the tiny model,
// its diffusion loss noisy (random t, random masks), is never reported, with every check on.
TEST(FaultReplay, AHealthyRunReportsNothing) {
  for (const bool checks : {false, true}) {
    RunConfig cfg = test::tiny_run(test::TinyShape::small(), 300);
    if (checks) {
      cfg.fault_detection = validate(true);
      cfg.fault_detection.check_large_grads = true;
    }
    const TrainResult r = train(cfg);
    ASSERT_EQ(r.metrics.size(), 300u);
    for (const IterationMetrics& m : r.metrics) EXPECT_EQ(m.fault_report, "") << "checks " << checks;
    EXPECT_LT(r.metrics.back().lm_loss, r.metrics.front().lm_loss);  // it did train
  }
}
