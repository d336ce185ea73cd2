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

// ---------------------------------------------------------------- trajectories (rewinds)

namespace {

std::string latest_of(const std::string& dir) {
  std::ifstream f(fs::path(dir) / checkpoint::kLatestFileName);
  std::string s;
  f >> s;
  return s;
}

std::string index_text(const std::string& dir, int64_t iteration) {
  std::ifstream f(fs::path(dir) / checkpoint::iteration_dir_name(iteration) / checkpoint::kIndexFileName);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Run A: iterations 1..6 saved into `dir`, latest 6.
RunConfig six_saves(const std::string& dir) {
  RunConfig cfg = tiny_run(6);
  cfg.checkpoint.save = dir;
  cfg.checkpoint.save_interval = 1;
  train(cfg);
  return cfg;
}

}  // namespace

// C27: `--load D --ckpt-step 2 --save D` then saving 3 and 4 would replace run A's complete
// iter_0000003/4 and move latest from 6 back to 4. Refused naming the folder, the iterations at
// stake and --overwrite-checkpoints; with the flag it goes ahead, and a later plain resume of the
// rewound run is refused again while A's 5 and 6 are there.
TEST(Trajectories, ARewindDoesNotSaveOverAnotherTrajectoryUnlessAsked) {
  TempDir dir("safety_rewind_");
  RunConfig a = six_saves(dir.str());
  const std::string a3 = index_text(dir.str(), 3);
  RunConfig rewind = a;
  rewind.training.train_iters = 4;
  rewind.optimizer.lr_decay_iters = 6;
  rewind.checkpoint.load = dir.str();
  rewind.checkpoint.ckpt_step = 2;
  const std::string what = error_of([&] { train(rewind); });
  EXPECT_NE(what.find("--save " + dir.str() + ": this run resumes from " + (dir / "iter_0000002")), std::string::npos) << what;
  EXPECT_NE(what.find("also holds 4 newer checkpoint(s) of another trajectory: iter_0000003, iter_0000004, "
                      "iter_0000005, iter_0000006 (latest_checkpointed_iteration.txt names 6)"), std::string::npos) << what;
  EXPECT_NE(what.find("would overwrite iter_0000003, iter_0000004 and move latest back"), std::string::npos) << what;
  EXPECT_NE(what.find("--overwrite-checkpoints"), std::string::npos) << what;
  EXPECT_NE(what.find("--save NEW_DIR"), std::string::npos) << what;
  EXPECT_EQ(latest_of(dir.str()), "6");  // nothing was touched
  EXPECT_TRUE(index_text(dir.str(), 3) == a3);

  // Into another folder: allowed, and the original stays whole.
  TempDir other("safety_rewind_other_");
  RunConfig branch = rewind;
  branch.checkpoint.save = other.str();
  EXPECT_EQ(error_of([&] { train(branch); }), "");
  EXPECT_EQ(iteration_dirs(other.str()), (std::vector<std::string>{"iter_0000003", "iter_0000004"}));
  EXPECT_TRUE(index_text(dir.str(), 3) == a3);

  // Asked for: the rewound run replaces 3 and 4; A's 5 and 6 stay.
  rewind.checkpoint.overwrite_checkpoints = true;
  EXPECT_EQ(error_of([&] { train(rewind); }), "");
  EXPECT_EQ(latest_of(dir.str()), "4");
  EXPECT_FALSE(index_text(dir.str(), 3) == a3);
  EXPECT_EQ(iteration_dirs(dir.str()).back(), "iter_0000006");
  const auto b = checkpoint::read_trajectory(dir / "iter_0000004");
  ASSERT_TRUE(b);
  EXPECT_NE(*b, *checkpoint::read_trajectory(dir / "iter_0000005"));  // two trajectories in one folder
  EXPECT_EQ(*b, *checkpoint::read_trajectory(dir / "iter_0000003"));

  // Resuming the rewound run (latest 4) would save 5 over A's 5: refused again.
  RunConfig resume = a;
  resume.training.train_iters = 5;
  resume.checkpoint.load = dir.str();
  const std::string again = error_of([&] { train(resume); });
  EXPECT_NE(again.find("newer checkpoint(s) of another trajectory: iter_0000005, iter_0000006"), std::string::npos) << again;
}

// The other side: a plain resume continues its own trajectory, also when a newer checkpoint of
// that trajectory is there (a crash between the rename of iter_N and the rewrite of latest).
TEST(Trajectories, APlainResumeOverItsOwnNewerCheckpointIsNotRefused) {
  TempDir dir("safety_crash_window_");
  RunConfig a = six_saves(dir.str());
  write_latest(dir.str(), "5");  // as if the run died right after iter_0000006 was renamed into place
  RunConfig resume = a;
  resume.checkpoint.load = dir.str();
  const std::string what = error_of([&] { train(resume); });
  EXPECT_EQ(what, "");
  EXPECT_EQ(latest_of(dir.str()), "6");
}

// C28: the same rewind with --keep-last-n-checkpoints 2 must not remove the checkpoint it loaded
// or its own saves (ranking by iteration across trajectories kept A's 5/6 and removed 2 and 3),
// and never removes another trajectory's checkpoints.
TEST(Retention, ARewoundRunKeepsItsLoadSourceAndItsOwnSaves) {
  TempDir dir("safety_rewind_keep_");
  RunConfig a = six_saves(dir.str());
  RunConfig rewind = a;
  rewind.training.train_iters = 4;
  rewind.optimizer.lr_decay_iters = 6;
  rewind.checkpoint.load = dir.str();
  rewind.checkpoint.ckpt_step = 2;
  rewind.checkpoint.keep_last_n_checkpoints = 2;
  rewind.checkpoint.overwrite_checkpoints = true;
  const std::string log = train(rewind);
  const std::vector<std::string> left = iteration_dirs(dir.str());
  for (const char* name : {"iter_0000002", "iter_0000003", "iter_0000004"})
    EXPECT_NE(std::find(left.begin(), left.end(), name), left.end()) << name << " was removed:\n" << log;
  for (const char* name : {"iter_0000001", "iter_0000005", "iter_0000006"})  // A's: not this run's to remove
    EXPECT_NE(std::find(left.begin(), left.end(), name), left.end()) << name << " was removed:\n" << log;

  // A plain run of one trajectory: the newest N of its saves, and its load source.
  TempDir plain("safety_keep_source_");
  RunConfig first = tiny_run(5);
  first.checkpoint.save = plain.str();
  first.checkpoint.save_interval = 1;
  first.checkpoint.keep_last_n_checkpoints = 2;
  train(first);
  EXPECT_EQ(iteration_dirs(plain.str()), (std::vector<std::string>{"iter_0000004", "iter_0000005"}));
  RunConfig more = first;
  more.training.train_iters = 8;
  more.optimizer.lr_decay_iters = 5;
  more.checkpoint.load = plain.str();
  train(more);
  EXPECT_EQ(iteration_dirs(plain.str()), (std::vector<std::string>{"iter_0000005", "iter_0000007", "iter_0000008"}));
}

// ---------------------------------------------------------------- the index is the state

namespace {

void edit_index(const std::string& ckpt, const std::string& from, const std::string& to) {
  const std::string path = (fs::path(ckpt) / checkpoint::kIndexFileName).string();
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  in.close();
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::trunc) << text;
}

}  // namespace

// C5: metadata.json carries its own checksum. An edited consumed_samples (120 -> 920 skipped 800
// samples) or seed (every mask changes) used to load silently; now every reader (a resume,
// convert_checkpoint --check) refuses naming the file.
TEST(IndexIntegrity, AnEditedIndexIsRefusedNamingTheFile) {
  TempDir dir("safety_index_");
  RunConfig cfg = tiny_run(2);
  cfg.checkpoint.save = dir.str();
  cfg.checkpoint.save_interval = 1;
  cfg.training.seed = 1234;
  train(cfg);
  const std::string ckpt = dir / "iter_0000002";
  EXPECT_EQ(checkpoint::CheckpointReader(ckpt).index().state.consumed_samples, 4);
  EXPECT_TRUE(checkpoint::CheckpointReader(ckpt).index().checksummed);
  RunConfig resume = cfg;
  resume.training.train_iters = 3;
  resume.checkpoint.load = dir.str();
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"consumed_samples\": 4,", "\"consumed_samples\": 904,"}, {"\"seed\": 1234", "\"seed\": 1235"}}) {
    SCOPED_TRACE(to);
    const std::string saved = index_text(dir.str(), 2);
    edit_index(ckpt, from, to);
    const std::string what = error_of([&] { checkpoint::CheckpointReader r(ckpt); });
    EXPECT_NE(what.find(ckpt + "/metadata.json was modified after it was saved"), std::string::npos) << what;
    EXPECT_NE(error_of([&] { train(resume); }).find("was modified after it was saved"), std::string::npos);
    std::ofstream(fs::path(ckpt) / checkpoint::kIndexFileName, std::ios::trunc) << saved;
  }
  // Whitespace is not content: the index re-indented still loads.
  edit_index(ckpt, "\"consumed_samples\": 4,", "\"consumed_samples\":     4,");
  EXPECT_EQ(error_of([&] { checkpoint::CheckpointReader r(ckpt); }), "");
}

// C4b: the folder's number (what latest and --ckpt-step go by) and the index's iteration (what a
// resume continues from) must agree.
TEST(IndexIntegrity, AFolderWhoseNumberIsNotItsIterationIsRefused) {
  TempDir dir("safety_rename_");
  RunConfig cfg = tiny_run(2);
  cfg.checkpoint.save = dir.str();
  cfg.checkpoint.save_interval = 2;
  train(cfg);
  fs::rename(dir / "iter_0000002", dir / "iter_0000007");
  write_latest(dir.str(), "7");
  const std::string what = error_of([&] { checkpoint::CheckpointReader r(dir / "iter_0000007"); });
  EXPECT_NE(what.find((dir / "iter_0000007") + "/metadata.json records iteration 2, but its folder is "
                      "iter_0000007"), std::string::npos) << what;
  EXPECT_NE(what.find("Rename the folder back (iter_0000002)"), std::string::npos) << what;
  RunConfig resume = cfg;
  resume.training.train_iters = 8;
  resume.checkpoint.load = dir.str();
  EXPECT_NE(error_of([&] { train(resume); }).find("records iteration 2, but its folder is iter_0000007"),
            std::string::npos);
}
