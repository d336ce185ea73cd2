// core/logging.h: level filtering, the rank prefix, rank 0 only unless all ranks, errors from
// every rank, per-rank files. The console is stderr, captured here by pointing file descriptor 2
// at a scratch file for the duration of a test.
#include <gtest/gtest.h>
#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <sstream>
#include "megadlm/core/logging.h"
#include "support/scratch.h"

using namespace megadlm;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Captures what is written to stderr while it lives; resets the logger to its defaults after.
class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::fflush(stderr);
    saved_ = ::dup(2);
    ASSERT_GE(saved_, 0);
    std::FILE* f = std::fopen(capture_path().c_str(), "w");
    ASSERT_NE(f, nullptr);
    ASSERT_GE(::dup2(::fileno(f), 2), 0);
    std::fclose(f);
  }
  void TearDown() override {
    logging::configure({});
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
  }
  std::string console() {
    std::fflush(stderr);
    return read_file(capture_path());
  }
  std::string capture_path() const { return dir_ / "stderr.txt"; }

  test::TempDir dir_{"megadlm_logging_"};
  int saved_ = -1;
};

logging::Options opts(logging::Level level, int rank, bool all_ranks = false, std::string dir = "") {
  logging::Options o;
  o.level = level;
  o.rank = rank;
  o.all_ranks = all_ranks;
  o.dir = std::move(dir);
  return o;
}

}  // namespace

TEST_F(LoggingTest, DropsMessagesBelowTheLevel) {
  logging::configure(opts(logging::Level::Warning, 0));
  EXPECT_FALSE(logging::enabled(logging::Level::Info));
  EXPECT_TRUE(logging::enabled(logging::Level::Warning));
  logging::debug("d");
  logging::info("i");
  logging::warn("w ", 1, " ", 2.5);
  logging::error("e");
  EXPECT_EQ(console(), "WARNING: w 1 2.5\nerror: e\n");

  logging::configure(opts(logging::Level::Trace, 0));
  logging::trace("t");
  logging::debug("d");
  logging::info("i");
  EXPECT_EQ(console(), "WARNING: w 1 2.5\nerror: e\ntrace: t\ndebug: d\ni\n");
}

TEST_F(LoggingTest, DefaultsAreRankZeroAtInfo) {
  logging::configure({});
  EXPECT_EQ(logging::options().level, logging::Level::Info);
  logging::debug("hidden");
  logging::info("shown");
  EXPECT_EQ(console(), "shown\n");
}

TEST_F(LoggingTest, OtherRanksWriteOnlyErrorsUnlessAllRanks) {
  logging::configure(opts(logging::Level::Info, 3));
  EXPECT_FALSE(logging::enabled(logging::Level::Warning));  // nowhere to go: no file
  EXPECT_TRUE(logging::enabled(logging::Level::Error));
  logging::info("quiet");
  logging::warn("quiet too");
  logging::error("rank 3 failed");
  EXPECT_EQ(console(), "[rank 3] error: rank 3 failed\n");

  logging::configure(opts(logging::Level::Info, 3, /*all_ranks=*/true));
  logging::info("hello");
  logging::warn("careful");
  EXPECT_EQ(console(), "[rank 3] error: rank 3 failed\n[rank 3] hello\n[rank 3] WARNING: careful\n");
}

TEST_F(LoggingTest, EveryLineOfAMessageCarriesTheRank) {
  logging::configure(opts(logging::Level::Info, 12, true));
  logging::error("invalid configuration:\n  first problem\n  second problem\n");
  EXPECT_EQ(console(), "[rank 12] error: invalid configuration:\n[rank 12]   first problem\n"
                       "[rank 12]   second problem\n");
}

TEST_F(LoggingTest, EachRankAppendsToItsOwnFile) {
  const std::string logs = dir_ / "run/logs";  // created, parents included
  logging::configure(opts(logging::Level::Info, 2, false, logs));
  EXPECT_TRUE(logging::enabled(logging::Level::Warning));  // the file takes it
  EXPECT_FALSE(logging::enabled(logging::Level::Debug));
  logging::warn("to the file only");
  logging::debug("below the level");
  logging::error("to both");
  EXPECT_EQ(console(), "[rank 2] error: to both\n");
  const std::string file = logs + "/rank_2.log";
  std::string text = read_file(file);
  // "[YYYY-mm-dd HH:MM:SS.mmm] " then the console's line.
  std::istringstream lines(text);
  std::vector<std::string> got;
  for (std::string line; std::getline(lines, line);) {
    ASSERT_GE(line.size(), 26u) << line;
    EXPECT_EQ(line[0], '[');
    EXPECT_EQ(line.substr(24, 2), "] ") << line;
    got.push_back(line.substr(26));
  }
  EXPECT_EQ(got, (std::vector<std::string>{"[rank 2] WARNING: to the file only", "[rank 2] error: to both"}));

  // A second run appends; rank 0's file has no prefix; other ranks' files are untouched.
  logging::configure(opts(logging::Level::Info, 2, false, logs));
  logging::warn("second run");
  logging::configure(opts(logging::Level::Info, 0, false, logs));
  logging::info("rank zero");
  EXPECT_NE(read_file(file).find(text), std::string::npos);
  EXPECT_NE(read_file(file).find("] [rank 2] WARNING: second run\n"), std::string::npos);
  EXPECT_NE(read_file(logs + "/rank_0.log").find("] rank zero\n"), std::string::npos);
  EXPECT_EQ(console(), "[rank 2] error: to both\nrank zero\n");
}

TEST_F(LoggingTest, AnUnusableDirectoryIsAnErrorNamingItAndKeepsTheOldSetup) {
  logging::configure(opts(logging::Level::Warning, 0));
  const std::string file = dir_ / "not_a_dir";
  std::ofstream(file) << "x";
  const std::string what = test::error_of([&] { logging::configure(opts(logging::Level::Info, 1, true, file)); });
  EXPECT_NE(what.find("cannot create the log directory `" + file + "`"), std::string::npos) << what;
  EXPECT_EQ(logging::options().level, logging::Level::Warning);
  EXPECT_EQ(logging::options().rank, 0);
  logging::info("still dropped");
  EXPECT_EQ(console(), "");
}
