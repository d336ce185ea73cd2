// Saving and loading checkpoints in one process: pieces of any shape come back as any region,
// "latest" moves only when a checkpoint is complete, damaged files are named with expected and
// actual checksums, and a save killed at random points (SIGKILL from a parent process) always
// leaves "latest" naming a checkpoint that verifies and holds the values of its iteration.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include "megadlm/core/stream.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/checkpoint/file_io.h"
#include "support/scratch.h"

using namespace megadlm;
using test::TempDir;
using test::error_of;
using namespace megadlm::checkpoint;
namespace fs = std::filesystem;

namespace {

// Values that identify the element and the save: v = tag * 1000 + global index.
std::vector<float> tagged(int64_t tag, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(tag * 1000 + i);
  return v;
}

// Saves tensor "model/w" [rows, 8] as three pieces (a row band in two flat halves, and the
// rest) plus "optimizer/exp_avg/w" whole, all holding tagged(tag).
void save_tagged(CheckpointWriter& w, const std::string& dir, int64_t tag, int64_t rows, bool async) {
  const Shape g = {rows, 8};
  auto data = std::make_shared<std::vector<float>>(tagged(tag, rows * 8));
  const float* p = data->data();
  const int64_t band = rows / 2;
  std::vector<OutgoingPiece> pieces = {
      {"model/w", g, Region{{0, 0}, {band, 8}, 0, band * 4}, DType::F32, p, false},
      {"model/w", g, Region{{0, 0}, {band, 8}, band * 4, band * 8}, DType::F32, p + band * 4, false},
      {"model/w", g, Region{{band, 0}, {rows - band, 8}, 0, (rows - band) * 8}, DType::F32, p + band * 8, false},
      {"optimizer/exp_avg/w", g, Region::whole(g), DType::F32, p, true}};
  CheckpointState st;
  st.iteration = tag;
  st.has_optimizer = true;
  w.save(dir, std::to_string(tag), st, std::move(pieces), data, async);
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
}

}  // namespace

TEST(CheckpointWriter, SavesPiecesThatLoadAsAnyRegion) {
  TempDir dir;
  CheckpointWriter w(nullptr, Stream::cpu());
  save_tagged(w, dir.str(), 7, 6, false);
  EXPECT_EQ(*read_latest(dir.str()), "7");
  const std::string path = *find_checkpoint(dir.str(), std::nullopt);
  EXPECT_EQ(path, dir / "iter_0000007");
  EXPECT_FALSE(fs::exists(dir / "iter_0000007.incomplete"));
  CheckpointReader r(path);
  EXPECT_EQ(r.index().state.iteration, 7);
  EXPECT_EQ(r.files_with({"model/"}), (std::vector<std::string>{"model_rank00000.safetensors"}));
  r.verify_files(r.files_with({"model/", "optimizer/"}), nullptr, Stream::cpu());
  // A column slice (what a tensor-parallel rank of a row-split layer would want), read as bf16.
  Tensor cols = Tensor::empty({6 * 3}, DType::BF16, Stream::cpu());
  r.read("model/w", {6, 8}, Region{{0, 2}, {6, 3}, 0, 18}, cols);
  const std::vector<float> got = cols.to_floats(Stream::cpu());
  for (int64_t row = 0; row < 6; ++row)
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_EQ(got[static_cast<size_t>(row * 3 + c)], round_to_bf16(static_cast<float>(7000 + row * 8 + 2 + c)));
  Tensor whole = r.read_whole("optimizer/exp_avg/w");
  EXPECT_EQ(whole.data<float>()[47], 7047.0f);
  EXPECT_NE(error_of([&] { Tensor t = Tensor::empty({4}, DType::F32, Stream::cpu());
                           r.read("model/w", {6, 9}, Region{{0, 0}, {1, 4}, 0, 4}, t); })
                .find("holds global shape [6, 8], this model needs [6, 9]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.read_whole("model/absent"); }).find("has no tensor model/absent"), std::string::npos);
}

TEST(CheckpointWriter, SpreadsARanksPiecesOverFilesOfTheTargetSize) {
  TempDir dir;
  CheckpointWriter w(nullptr, Stream::cpu());
  // The model pieces are 48, 48 and 96 bytes: at 64 bytes a file they take three files (the
  // 96-byte piece alone: pieces are never cut); the 192-byte optimizer piece one.
  w.set_target_file_bytes(64);
  save_tagged(w, dir.str(), 5, 6, false);
  CheckpointReader r(*find_checkpoint(dir.str(), std::nullopt));
  EXPECT_EQ(r.files_with({"model/"}), (std::vector<std::string>{"model_rank00000-00001-of-00003.safetensors",
                                                                "model_rank00000-00002-of-00003.safetensors",
                                                                "model_rank00000-00003-of-00003.safetensors"}));
  EXPECT_EQ(r.files_with({"optimizer/"}), (std::vector<std::string>{"optim_rank00000.safetensors"}));
  r.verify_files(r.files_with({"model/", "optimizer/"}), nullptr, Stream::cpu());
  const std::vector<float> want = tagged(5, 48);
  EXPECT_EQ(r.read_whole("model/w").to_floats(Stream::cpu()), want);
  EXPECT_EQ(r.read_whole("optimizer/exp_avg/w").to_floats(Stream::cpu()), want);
  // A damaged shard is named when the files are verified in parallel.
  const std::string second = r.dir() + "/model_rank00000-00002-of-00003.safetensors";
  flip_byte(second, fs::file_size(second) - 1);
  EXPECT_NE(error_of([&] { r.verify_files(r.files_with({"model/", "optimizer/"}), nullptr, Stream::cpu()); })
                .find(second + " is corrupted"),
            std::string::npos);
  EXPECT_NE(error_of([&] { w.set_target_file_bytes(0); }).find("positive target size"), std::string::npos);
}

TEST(CheckpointWriter, ReplacesLatestOnlyWithCompleteCheckpointsAndCleansLeftovers) {
  TempDir dir;
  CheckpointWriter w(nullptr, Stream::cpu());
  save_tagged(w, dir.str(), 1, 4, false);
  fs::create_directory(dir / "iter_0000005.incomplete");  // an interrupted save of the past
  save_tagged(w, dir.str(), 2, 4, true);                  // asynchronous: not latest until committed
  EXPECT_TRUE(w.pending());
  EXPECT_FALSE(fs::exists(dir / "iter_0000005.incomplete"));
  w.wait();
  EXPECT_FALSE(w.pending());
  EXPECT_EQ(*read_latest(dir.str()), "2");
  // Saving the same iteration again replaces it in one step.
  save_tagged(w, dir.str(), 2, 4, false);
  EXPECT_EQ(CheckpointReader(dir / "iter_0000002").index().state.iteration, 2);
  EXPECT_EQ(fs::directory_iterator(dir.str()) == fs::directory_iterator(), false);
  for (const auto& e : fs::directory_iterator(dir.str()))
    EXPECT_EQ(e.path().filename().string().find(".incomplete"), std::string::npos) << e.path();
}

TEST(CheckpointWriter, RefusesPiecesThatDoNotAddUpToTheTensor) {
  TempDir dir;
  CheckpointWriter w(nullptr, Stream::cpu());
  std::vector<float> v(8, 1.0f);
  CheckpointState st;
  const std::string err = error_of([&] {
    w.save(dir.str(), "3", st, {{"model/w", {2, 4}, Region{{0, 0}, {2, 4}, 0, 6}, DType::F32, v.data(), false}},
           nullptr, false);
  });
  EXPECT_NE(err.find("tensor model/w: the ranks' pieces hold 6 elements, the tensor has 8"), std::string::npos) << err;
  EXPECT_FALSE(read_latest(dir.str()).has_value());
}

TEST(CheckpointReader, NamesDamagedFilesWithExpectedAndActualChecksums) {
  TempDir dir;
  CheckpointWriter w(nullptr, Stream::cpu());
  save_tagged(w, dir.str(), 3, 64, false);
  const std::string ck = dir / "iter_0000003";
  const std::string file = ck + "/model_rank00000.safetensors";
  const int64_t size = file_size_or_missing(file);
  {
    CheckpointReader r(ck);
    flip_byte(file, static_cast<uint64_t>(size - 100));  // inside the tensor data
    const std::string err = error_of([&] { r.verify_file("model_rank00000.safetensors"); });
    EXPECT_NE(err.find(file + " is corrupted: SHA-256 expected " + r.index().files.at("model_rank00000.safetensors").sha256 +
                       ", actual "), std::string::npos) << err;
    flip_byte(file, static_cast<uint64_t>(size - 100));  // repaired
    r.verify_file("model_rank00000.safetensors");
  }
  fs::resize_file(file, static_cast<uintmax_t>(size - 10));
  std::string err = error_of([&] { CheckpointReader(ck).verify_file("model_rank00000.safetensors"); });
  EXPECT_NE(err.find("bytes, the index expects " + std::to_string(size) + " (truncated)"), std::string::npos) << err;
  fs::remove(file);
  err = error_of([&] { CheckpointReader(ck).verify_file("model_rank00000.safetensors"); });
  EXPECT_NE(err.find(file + " is missing"), std::string::npos) << err;
  // Stale metadata: a file from another save under the right name.
  save_tagged(w, dir.str(), 4, 64, false);
  fs::copy_file(dir / "iter_0000004/model_rank00000.safetensors", file);
  err = error_of([&] { CheckpointReader(ck).verify_file("model_rank00000.safetensors"); });
  EXPECT_NE(err.find("is corrupted: SHA-256 expected"), std::string::npos) << err;
  fs::remove(ck + "/metadata.json");
  err = error_of([&] { CheckpointReader r(ck); });
  EXPECT_NE(err.find("has no metadata.json: it is not a complete megadlm checkpoint"), std::string::npos) << err;
  std::ofstream(dir / kLatestFileName) << "9";
  err = error_of([&] { find_checkpoint(dir.str(), std::nullopt); });
  EXPECT_NE(err.find("names 9, but " + (dir / "iter_0000009") + " does not exist"), std::string::npos) << err;
}

// D5: kill -9 at random points of a stream of saves; "latest" must always load.
TEST(CheckpointWriter, SaveKilledAtRandomPointsLeavesALoadableLatest) {
  std::mt19937 rng(20240607);
  int checked = 0, with_leftover = 0;
  for (int trial = 0; trial < 20; ++trial) {
    TempDir dir;
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // Saves of ~1.5 MB (two files, an index and "latest" each) back to back until killed.
      try {
        CheckpointWriter w(nullptr, Stream::cpu());
        for (int64_t it = 1;; ++it) save_tagged(w, dir.str(), it, 24000, false);
      } catch (...) {
      }
      ::_exit(1);
    }
    // After the first complete save (so that every trial has something to load, however
    // slow the machine), a random moment in the stream of saves.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!fs::exists(dir / kLatestFileName) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 60000));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "trial " << trial << ": the saving process ended by itself";
    for (const auto& e : fs::directory_iterator(dir.str()))
      with_leftover += e.path().string().find(".incomplete") != std::string::npos;
    const std::optional<std::string> latest = find_checkpoint(dir.str(), std::nullopt);
    ASSERT_TRUE(latest.has_value()) << "trial " << trial << ": no checkpoint after the first save";
    CheckpointReader r(*latest);
    r.verify_files(r.files_with({"model/", "optimizer/"}), nullptr, Stream::cpu());
    const int64_t tag = r.index().state.iteration;
    EXPECT_EQ(*latest, dir / iteration_dir_name(tag));
    Tensor w = r.read_whole("model/w");
    EXPECT_EQ(w.data<float>()[0], static_cast<float>(tag * 1000));
    EXPECT_EQ(w.data<float>()[12345], static_cast<float>(tag * 1000 + 12345));
    ++checked;
  }
  EXPECT_EQ(checked, 20);
  RecordProperty("trials_with_an_interrupted_save_left_behind", with_leftover);
}
