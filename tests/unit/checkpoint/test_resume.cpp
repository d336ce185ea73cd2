// Checkpoints through the Trainer in one process (CPU, fp32): N steps straight and k steps,
// save, a new trainer that loads, N - k more steps give bit-identical losses and gradient norms
// (synchronous and asynchronous saves, a stop request at an iteration boundary, --exit-interval);
// --finetune and --no-load-optim restart what they should; a checkpoint of another model, of
// another LR schedule or with a flipped byte fails in the Trainer's constructor, naming the flag
// or the file.
#include <gtest/gtest.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "megadlm/core/logging.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/file_io.h"
#include "megadlm/training/trainer.h"
#include "support/scratch.h"
#include "support/tiny_model.h"

using namespace megadlm;
using test::TempDir;
using test::error_of;
namespace fs = std::filesystem;

namespace {

// The tiny diffusion LM with every source of randomness on (dropout, varilen) and clipping
// active, so that a resume that forgot anything would show.
RunConfig tiny_run(int64_t iters) {
  RunConfig r = test::tiny_run(test::TinyShape::small(), iters);
  r.model.hidden_dropout = r.model.attention_dropout = 0.1f;
  r.diffusion.varilen_prob = 0.3f;
  r.optimizer.min_lr = 3e-4f;
  r.training.global_batch_size = 4;
  return r;
}

struct TrainResult {
  std::vector<IterationMetrics> metrics;
  std::string log;
  int64_t iteration = 0;
};

TrainResult train(const RunConfig& cfg, std::function<bool()> stop = nullptr) {
  auto data = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length,
                                               cfg.diffusion.mask_token);
  std::ostringstream log;
  Trainer t(cfg, data, log);
  if (stop) t.set_stop_request(std::move(stop));
  TrainResult out;
  out.metrics = t.train();
  out.log = log.str();
  out.iteration = t.iteration();
  return out;
}

void expect_same_tail(const std::vector<IterationMetrics>& straight, const std::vector<IterationMetrics>& resumed) {
  ASSERT_LE(resumed.size(), straight.size());
  const size_t off = straight.size() - resumed.size();
  for (size_t i = 0; i < resumed.size(); ++i) {
    const IterationMetrics& a = straight[off + i];
    const IterationMetrics& b = resumed[i];
    EXPECT_EQ(a.iteration, b.iteration);
    EXPECT_EQ(a.consumed_samples, b.consumed_samples);
    EXPECT_EQ(a.lm_loss, b.lm_loss) << "iteration " << a.iteration;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "iteration " << a.iteration;
    EXPECT_EQ(a.lr, b.lr) << "iteration " << a.iteration;
  }
}

}  // namespace

TEST(Resume, StoppingAtAnIntervalAndLoadingIsBitIdentical) {
  constexpr int64_t kIters = 8;
  const TrainResult straight = train(tiny_run(kIters));
  for (const bool async : {false, true}) {
    TempDir dir;
    RunConfig first = tiny_run(kIters);
    first.checkpoint.save = dir.str();
    first.checkpoint.save_interval = 2;
    first.checkpoint.async_save = async;
    first.training.exit_interval = 5;  // stops (and saves) at 5, not a multiple of the interval
    const TrainResult a = train(first);
    EXPECT_EQ(a.iteration, 5);
    EXPECT_EQ(*checkpoint::read_latest(dir.str()), "5");
    for (const char* it : {"iter_0000002", "iter_0000004", "iter_0000005"})
      EXPECT_TRUE(fs::exists(fs::path(dir.str()) / it)) << it;
    expect_same_tail(std::vector<IterationMetrics>(straight.metrics.begin(), straight.metrics.begin() + 5), a.metrics);

    RunConfig second = tiny_run(kIters);
    second.checkpoint.load = dir.str();
    const TrainResult b = train(second);
    EXPECT_NE(b.log.find("successfully loaded checkpoint"), std::string::npos) << b.log;
    ASSERT_EQ(b.metrics.size(), 3u);
    expect_same_tail(straight.metrics, b.metrics);
  }
}

TEST(Resume, AStopRequestSavesAtTheNextBoundaryAndResumesExactly) {
  constexpr int64_t kIters = 6;
  const TrainResult straight = train(tiny_run(kIters));
  TempDir dir;
  RunConfig first = tiny_run(kIters);
  first.checkpoint.save = dir.str();
  first.checkpoint.save_interval = 100;
  int calls = 0;
  const TrainResult a = train(first, [&] { return ++calls >= 3; });  // "SIGTERM" during iteration 3
  EXPECT_EQ(a.iteration, 3);
  EXPECT_NE(a.log.find("exiting program at iteration 3 (stop requested"), std::string::npos) << a.log;
  EXPECT_EQ(*checkpoint::read_latest(dir.str()), "3");
  RunConfig second = tiny_run(kIters);
  second.checkpoint.load = dir.str();
  second.checkpoint.save = dir.str();  // the usual auto-resume setup: --save and --load the same
  second.checkpoint.save_interval = 100;
  const TrainResult b = train(second);
  expect_same_tail(straight.metrics, b.metrics);
  EXPECT_EQ(*checkpoint::read_latest(dir.str()), "6");  // the final save at the end of training
}

TEST(Resume, FinetuneAndNoLoadOptimRestartWhatTheySay) {
  TempDir dir;
  RunConfig first = tiny_run(6);
  first.checkpoint.save = dir.str();
  first.checkpoint.save_interval = 3;
  first.training.exit_interval = 3;
  train(first);

  RunConfig ft = tiny_run(6);
  ft.checkpoint.load = dir.str();
  ft.checkpoint.finetune = true;
  const TrainResult f = train(ft);
  ASSERT_EQ(f.metrics.size(), 6u);  // iteration and data position restart at 0
  EXPECT_EQ(f.metrics[0].consumed_samples, 4);
  EXPECT_NE(f.log.find("fine-tuning from its weights"), std::string::npos);
  const TrainResult scratch = train(tiny_run(6));
  EXPECT_LT(f.metrics[0].lm_loss, scratch.metrics[0].lm_loss) << "fine-tuning should start from trained weights";

  RunConfig no_optim = tiny_run(6);
  no_optim.checkpoint.load = dir.str();
  no_optim.checkpoint.load_optim = false;
  const TrainResult n = train(no_optim);
  ASSERT_EQ(n.metrics.size(), 3u);  // iteration kept
  EXPECT_NE(n.log.find("fresh optimizer state"), std::string::npos);
}

TEST(Resume, ALoadFindingNoCheckpointStartsFromScratchUnlessTold) {
  TempDir dir;
  RunConfig cfg = tiny_run(2);
  cfg.checkpoint.load = dir.str();
  // The warning is a diagnostic (core/logging), caught here in a per-rank log file.
  TempDir logs;
  logging::Options to_file;
  to_file.dir = logs.str();
  logging::configure(to_file);
  const TrainResult r = train(cfg);
  logging::configure({});
  std::stringstream warnings;
  warnings << std::ifstream(logs / "rank_0.log").rdbuf();
  EXPECT_NE(warnings.str().find("WARNING: could not find a checkpoint in --load " + dir.str()), std::string::npos)
      << warnings.str();
  EXPECT_EQ(r.log.find("could not find a checkpoint"), std::string::npos);  // not in Megatron's record
  EXPECT_EQ(r.metrics.size(), 2u);
  cfg.checkpoint.exit_on_missing_checkpoint = true;
  EXPECT_NE(error_of([&] { train(cfg); }).find("holds no checkpoint"), std::string::npos);
}

TEST(Resume, MismatchedOrDamagedCheckpointsFailBeforeTrainingNamingFlagOrFile) {
  TempDir dir;
  RunConfig first = tiny_run(4);
  first.checkpoint.save = dir.str();
  first.checkpoint.save_interval = 2;
  first.training.exit_interval = 2;
  train(first);

  RunConfig wide = tiny_run(4);
  wide.model.hidden_size = 48;
  wide.model.kv_channels = 12;
  wide.checkpoint.load = dir.str();
  std::string err = error_of([&] { train(wide); });
  EXPECT_NE(err.find("--hidden-size: checkpoint 32, this run 48"), std::string::npos) << err;
  EXPECT_NE(err.find("--use-checkpoint-args"), std::string::npos) << err;

  RunConfig vocab = tiny_run(4);
  vocab.model.vocab_size = vocab.model.padded_vocab_size = 128;
  vocab.checkpoint.load = dir.str();
  err = error_of([&] { train(vocab); });
  EXPECT_NE(err.find("--vocab-size: checkpoint 64, this run 128"), std::string::npos) << err;

  RunConfig seq = tiny_run(4);
  seq.model.seq_length = seq.model.max_position_embeddings = 32;
  seq.checkpoint.load = dir.str();
  err = error_of([&] { train(seq); });
  EXPECT_NE(err.find("--seq-length: checkpoint 16, this run 32"), std::string::npos) << err;
  seq.checkpoint.finetune = true;  // another context length is fine when fine-tuning
  EXPECT_EQ(error_of([&] { train(seq); }), "");

  RunConfig lr = tiny_run(4);
  lr.optimizer.lr = 1e-3f;
  lr.checkpoint.load = dir.str();
  err = error_of([&] { train(lr); });
  EXPECT_NE(err.find("another learning-rate schedule"), std::string::npos) << err;
  EXPECT_NE(err.find("--lr: checkpoint 0.003"), std::string::npos) << err;
  lr.checkpoint.override_opt_param_scheduler = true;
  EXPECT_EQ(error_of([&] { train(lr); }), "");

  // A flipped byte in a tensor file: named, with both checksums, before any step.
  const std::string file = dir.str() + "/iter_0000002/optim_rank00000.safetensors";
  const int64_t size = checkpoint::file_size_or_missing(file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(size - 17);
    f.put('\x7f');
  }
  RunConfig resume = tiny_run(4);
  resume.checkpoint.load = dir.str();
  err = error_of([&] { train(resume); });
  EXPECT_NE(err.find(file + " is corrupted: SHA-256 expected "), std::string::npos) << err;
  EXPECT_NE(err.find(", actual "), std::string::npos) << err;
  // Weights only (--finetune) never reads the optimizer file, so it still loads.
  resume.checkpoint.finetune = true;
  EXPECT_EQ(error_of([&] { train(resume); }), "");
}

// Rolling (non-persistent) checkpoints, Megatron's global type: saved every N iterations where no
// persistent save happens, only the newest kept, and a load takes the newer of the two kinds.
namespace {

RunConfig rolling_run(const std::string& dir, bool async) {
  RunConfig r = tiny_run(12);
  r.checkpoint.save = dir;
  r.checkpoint.save_interval = 6;
  r.checkpoint.non_persistent_save_interval = 4;
  r.checkpoint.non_persistent_global = true;
  r.checkpoint.async_save = async;
  return r;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(Rolling, KeepsOnlyTheNewestAndSkipsPersistentIterations) {
  for (const bool async : {false, true}) {
    TempDir dir;
    const TrainResult r = train(rolling_run(dir.str(), async));
    EXPECT_EQ(r.iteration, 12);
    // 4 and 8 are rolling; 12 is persistent (Megatron's elif), so 8 stays the newest rolling one.
    EXPECT_EQ(entries(dir.str()), (std::vector<std::string>{"iter_0000006", "iter_0000012",
                                                            "latest_checkpointed_iteration.txt",
                                                            "non_persistent"}))
        << "async " << async;
    const std::string np = dir.str() + "/non_persistent";
    EXPECT_EQ(entries(np), (std::vector<std::string>{"iter_0000008", "latest_checkpointed_iteration.txt"}))
        << "async " << async;
    EXPECT_EQ(*checkpoint::read_latest(np), "8");
    EXPECT_NE(r.log.find("saving non-persistent checkpoint at iteration        8"), std::string::npos) << r.log;
    EXPECT_NE(r.log.find("removed older non-persistent checkpoints: " + np + "/iter_0000004"),
              std::string::npos) << r.log;
  }
}

TEST(Rolling, ALoadTakesTheNewerOfPersistentAndRollingAndResumesExactly) {
  const TrainResult straight = train(tiny_run(12));
  // Synchronous saves only here: an asynchronous rolling 8 may not have committed yet when the
  // "crash" comes (the first test covers asynchronous rolling saves).
  for (const bool async : {false}) {
    TempDir dir;
    // Killed after iteration 10 (a crash, not an exit: --exit-interval 10 would save 10): the
    // newest checkpoint is the rolling 8, the persistent one is 6.
    int calls = 0;
    EXPECT_NE(error_of([&] {
                train(rolling_run(dir.str(), async), [&]() -> bool {
                  if (++calls == 10) MDLM_FAIL("simulated crash");
                  return false;
                });
              }),
              "");
    EXPECT_EQ(*checkpoint::read_latest(dir.str()), "6");
    EXPECT_EQ(*checkpoint::read_latest(dir.str() + "/non_persistent"), "8");

    RunConfig second = rolling_run(dir.str(), async);
    second.checkpoint.load = dir.str();
    const TrainResult b = train(second);
    EXPECT_NE(b.log.find("loading: non-persistent checkpoint (iteration 8, persistent 6)"), std::string::npos) << b.log;
    ASSERT_EQ(b.metrics.size(), 4u);  // 9..12
    expect_same_tail(straight.metrics, b.metrics);

    // Without the rolling flags --load sees only the persistent checkpoints (now 12).
    RunConfig plain = tiny_run(12);
    plain.checkpoint.load = dir.str();
    EXPECT_EQ(train(plain).metrics.size(), 0u);
  }

  // An exit at 10 saves persistently: the persistent 10 beats the rolling 8.
  TempDir dir;
  RunConfig first = rolling_run(dir.str(), false);
  first.training.exit_interval = 10;
  EXPECT_EQ(train(first).iteration, 10);
  RunConfig second = rolling_run(dir.str(), false);
  second.checkpoint.load = dir.str();
  const TrainResult b = train(second);
  EXPECT_NE(b.log.find("loading: persistent checkpoint (iteration 10; the non-persistent one in " +
                       dir.str() + "/non_persistent is older: 8)"), std::string::npos) << b.log;
  ASSERT_EQ(b.metrics.size(), 2u);
  expect_same_tail(straight.metrics, b.metrics);
  // --ckpt-step names a persistent iteration, whatever the rolling directory holds. (A rewind
  // below the folder's 10 and 12: saving over them needs --overwrite-checkpoints.)
  second.checkpoint.ckpt_step = 6;
  EXPECT_NE(error_of([&] { train(second); }).find("newer checkpoint(s) of another trajectory: iter_0000010, iter_0000012"),
            std::string::npos);
  second.checkpoint.overwrite_checkpoints = true;
  EXPECT_EQ(train(second).metrics.size(), 6u);
}

TEST(Rolling, CleanupKeepsTheCommittedAndTheLatestAndFinishesInterruptedRemovals) {
  TempDir dir;
  RunConfig r = rolling_run(dir.str(), false);
  r.training.train_iters = 4;
  r.checkpoint.save_interval = 100;
  train(r);  // rolling 4, persistent 4 at the end
  const std::string np = dir.str() + "/non_persistent";
  fs::copy(np + "/iter_0000004", np + "/iter_0000002", fs::copy_options::recursive);
  fs::create_directory(np + "/iter_0000001.removing");  // a crash during an earlier cleanup
  fs::create_directory(np + "/notes");                    // not a checkpoint: untouched
  const std::vector<std::string> removed = checkpoint::remove_older_checkpoints(np, "4");
  EXPECT_EQ(removed, (std::vector<std::string>{np + "/iter_0000002"}));
  EXPECT_EQ(entries(np), (std::vector<std::string>{"iter_0000004", "latest_checkpointed_iteration.txt", "notes"}));
}
