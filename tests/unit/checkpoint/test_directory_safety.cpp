// Directory safety and keep-last-k (docs/checkpoints.md): a checkpoint directory never loses
// data silently. A missing latest pointer with iter_* folders present is refused (naming them
// and --ckpt-step); a fresh run does not save over another run's checkpoints; one run holds a
// directory at a time (a lock naming its holder, taken over only from a dead process on this
// host); --keep-last-n-checkpoints keeps exactly the newest N and never the one "latest" names.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/config_json.h"
#include "megadlm/training/checkpoint/directory_lock.h"
#include "megadlm/training/trainer.h"
#include "support/scratch.h"

using namespace megadlm;
using test::TempDir;
using test::error_of;
namespace fs = std::filesystem;

namespace {

// A complete-looking checkpoint directory (an index file is what makes it complete).
void fake_checkpoint(const std::string& dir, int64_t iteration) {
  const fs::path p = fs::path(dir) / checkpoint::iteration_dir_name(iteration);
  fs::create_directories(p);
  std::ofstream(p / checkpoint::kIndexFileName) << "{}";
}

void write_latest(const std::string& dir, const std::string& tag) {
  std::ofstream(fs::path(dir) / checkpoint::kLatestFileName) << tag << "\n";
}

std::vector<std::string> iteration_dirs(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("iter_", 0) == 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

RunConfig tiny_run(int64_t iters) {
  RunConfig r;
  TransformerConfig& m = r.model;
  m.num_layers = 1;
  m.hidden_size = 16;
  m.num_attention_heads = 2;
  m.num_query_groups = 2;
  m.kv_channels = 8;
  m.ffn_hidden_size = 32;
  m.seq_length = 8;
  m.max_position_embeddings = 8;
  m.position_embedding_type = PositionEmbeddingType::Rope;
  m.normalization = NormType::RMSNorm;
  m.vocab_size = m.padded_vocab_size = 32;
  r.diffusion.mask_token = 31;
  r.optimizer.lr = 1e-3f;
  r.optimizer.lr_decay_iters = iters;
  r.training.micro_batch_size = 2;
  r.training.global_batch_size = 2;
  r.training.train_iters = iters;
  r.training.log_interval = 1000;
  r.training.device = DeviceKind::Cpu;
  return r;
}

std::string train(const RunConfig& cfg) {
  auto data = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length, cfg.diffusion.mask_token);
  std::ostringstream log;
  Trainer t(cfg, data, log);
  t.train();
  return log.str();
}

}  // namespace

TEST(FindCheckpoint, AMissingLatestPointerWithCheckpointsIsRefusedNamingThemAndCkptStep) {
  TempDir dir("safety_latest_");
  EXPECT_FALSE(checkpoint::find_checkpoint(dir.str(), std::nullopt));  // empty: a fresh start
  fake_checkpoint(dir.str(), 4);
  fake_checkpoint(dir.str(), 12);
  fake_checkpoint(dir.str(), 8);
  fs::create_directories(dir / "iter_0000016.incomplete");  // an interrupted save: not a checkpoint
  fs::create_directories(dir / "iter_0000020");             // no index: not complete
  const std::string what = error_of([&] { checkpoint::find_checkpoint(dir.str(), std::nullopt); });
  EXPECT_NE(what.find("has no latest_checkpointed_iteration.txt but holds the checkpoint(s) iter_0000004, "
                      "iter_0000008, iter_0000012: starting from scratch would overwrite them"),
            std::string::npos) << what;
  EXPECT_NE(what.find("--ckpt-step 12"), std::string::npos) << what;
  EXPECT_EQ(*checkpoint::find_checkpoint(dir.str(), 8), dir / "iter_0000008");
  EXPECT_EQ(checkpoint::list_checkpoint_iterations(dir.str()), (std::vector<int64_t>{4, 8, 12}));
}

TEST(Retention, KeepsTheNewestNAndAlwaysTheOneLatestNames) {
  TempDir dir("safety_keep_");
  for (int64_t it : {2, 4, 6, 8}) fake_checkpoint(dir.str(), it);
  fs::create_directories(dir / "release");
  fs::create_directories(dir / "iter_0000001");  // no index: never touched
  write_latest(dir.str(), "8");
  const std::vector<std::string> removed = checkpoint::remove_checkpoints_beyond(dir.str(), 2);
  EXPECT_EQ(removed, (std::vector<std::string>{dir / "iter_0000002", dir / "iter_0000004"}));
  EXPECT_EQ(iteration_dirs(dir.str()), (std::vector<std::string>{"iter_0000001", "iter_0000006", "iter_0000008"}));
  EXPECT_TRUE(fs::is_directory(dir / "release"));
  // A run resumed at 6 and saved 6 again: "latest" names 6 while 8 (and 10) are newer. Keeping
  // one keeps the newest by iteration and the one "latest" names.
  fake_checkpoint(dir.str(), 10);
  write_latest(dir.str(), "6");
  checkpoint::remove_checkpoints_beyond(dir.str(), 1);
  EXPECT_EQ(iteration_dirs(dir.str()), (std::vector<std::string>{"iter_0000001", "iter_0000006", "iter_0000010"}));
  EXPECT_NE(error_of([&] { checkpoint::remove_checkpoints_beyond(dir.str(), 0); }), "");
}

TEST(Retention, TheTrainerKeepsExactlyTheNewestTwoAndResumesFromThem) {
  TempDir dir("safety_trainer_keep_");
  RunConfig cfg = tiny_run(5);
  cfg.checkpoint.save = dir.str();
  cfg.checkpoint.save_interval = 1;
  cfg.checkpoint.keep_last_n_checkpoints = 2;
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    fs::remove_all(dir.str());
    cfg.checkpoint.async_save = async;
    const std::string log = train(cfg);
    EXPECT_EQ(iteration_dirs(dir.str()), (std::vector<std::string>{"iter_0000004", "iter_0000005"})) << log;
    EXPECT_NE(log.find("removed checkpoints beyond the newest 2 (--keep-last-n-checkpoints)"), std::string::npos);
  }
  RunConfig more = cfg;
  more.training.train_iters = 6;
  more.optimizer.lr_decay_iters = 5;
  more.checkpoint.load = dir.str();
  const std::string log = train(more);
  EXPECT_NE(log.find("successfully loaded checkpoint from " + (dir / "iter_0000005")), std::string::npos) << log;
  EXPECT_EQ(iteration_dirs(dir.str()), (std::vector<std::string>{"iter_0000005", "iter_0000006"}));
}

TEST(SaveDirectory, AFreshRunDoesNotSaveOverAnotherRunsCheckpoints) {
  TempDir dir("safety_other_run_");
  RunConfig cfg = tiny_run(2);
  cfg.checkpoint.save = dir.str();
  cfg.checkpoint.save_interval = 1;
  train(cfg);
  ASSERT_EQ(iteration_dirs(dir.str()), (std::vector<std::string>{"iter_0000001", "iter_0000002"}));
  const std::string what = error_of([&] { train(cfg); });  // the same command without --load
  EXPECT_NE(what.find("--save " + dir.str() + " already holds 2 checkpoint(s) of another run (newest: "
                      "iter_0000002) and this run does not resume from it"), std::string::npos) << what;
  EXPECT_NE(what.find("Resume from it with --load " + dir.str()), std::string::npos) << what;
  // Fine-tuning from it into it would replace its checkpoints too.
  RunConfig finetune = cfg;
  finetune.checkpoint.load = dir.str();
  finetune.checkpoint.finetune = true;
  EXPECT_NE(error_of([&] { train(finetune); }).find("starts anew from"), std::string::npos);
  // Resuming continues the run's own history.
  RunConfig resume = cfg;
  resume.training.train_iters = 3;
  resume.checkpoint.load = dir.str();
  EXPECT_EQ(error_of([&] { train(resume); }), "");
  EXPECT_EQ(iteration_dirs(dir.str()).back(), "iter_0000003");
}

TEST(DirectoryLock, ASecondHolderIsRefusedNamingTheFirst) {
  TempDir dir("safety_lock_");
  {
    checkpoint::DirectoryLock first(dir.str(), "--save");
    EXPECT_TRUE(fs::exists(dir / checkpoint::kLockFileName));
    const std::string what = error_of([&] { checkpoint::DirectoryLock second(dir.str(), "--save"); });
    EXPECT_NE(what.find("--save " + dir.str() + " is in use by another run: pid " + std::to_string(::getpid())),
              std::string::npos) << what;
    // Two trainers of one process saving into one folder are refused the same way.
    RunConfig cfg = tiny_run(1);
    cfg.checkpoint.save = dir.str();
    cfg.checkpoint.save_interval = 1;
    EXPECT_NE(error_of([&] { train(cfg); }).find("is in use by another run"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(dir / checkpoint::kLockFileName));  // released with its holder
}

TEST(DirectoryLock, TheLockOfAKilledProcessIsTakenOverWithAWarning) {
  TempDir dir("safety_stale_");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    checkpoint::DirectoryLock held(dir.str(), "--save");
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(3);
    ::pause();  // until SIGKILL: the lock is never released
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_NE(error_of([&] { checkpoint::DirectoryLock busy(dir.str(), "--save"); }).find(std::to_string(child)),
            std::string::npos);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(fs::exists(dir / checkpoint::kLockFileName));  // left behind by the dead holder
  std::string warning;
  checkpoint::DirectoryLock mine(dir.str(), "--save", &warning);
  EXPECT_NE(warning.find("took over the lock " + (dir / checkpoint::kLockFileName) + " of pid " +
                         std::to_string(child)), std::string::npos) << warning;
  // A lock file that is not megadlm's is never taken over.
  TempDir other("safety_foreign_");
  std::ofstream(other / checkpoint::kLockFileName) << "someone else's";
  EXPECT_NE(error_of([&] { checkpoint::DirectoryLock x(other.str(), "--save"); }).find("is not megadlm's"),
            std::string::npos);
}

// Non-finite values, the last line of defence: a configuration built in code with a NaN (the
// flags refuse them) cannot be saved into a checkpoint that would fail to load ("is null").
TEST(RunConfigJson, NonFiniteValuesAreRefusedNamingTheField) {
  RunConfig cfg = tiny_run(1);
  cfg.optimizer.min_lr = NAN;
  const std::string what = error_of([&] { checkpoint::run_config_to_json(cfg); });
  EXPECT_NE(what.find("the run configuration holds a non-finite optimizer.min_lr"), std::string::npos) << what;
}
