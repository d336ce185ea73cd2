// Every number flag is finite and inside the range its flag-table row
// states (generic over the table: a flag added tomorrow is covered), and the directories a run
// writes into are checked at start-up, naming the flag.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include "megadlm/training/arguments/arguments.h"
#include "megadlm/training/arguments/flags.h"
#include "support/scratch.h"
#include "training/arguments/argument_safety.h"

using namespace megadlm;
using namespace megadlm::training;
using megadlm::training::detail::parse_value_range;

// Rows name only the fields they set, as in flag_table.cpp.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace {

using Argv = std::vector<std::string>;

// A small valid command line (the one test_arguments.cpp uses), followed by `extra`.
Argv cmd(const Argv& extra = {}) {
  Argv out = {"--num-layers", "2",  "--hidden-size", "64", "--num-attention-heads", "4",
              "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
              "--vocab-size", "100", "--mask-token", "99", "--lr", "1e-3", "--train-iters", "10",
              "--mock-data"};
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// The ConfigError message of a command line ("" when it is accepted).
std::string rejection(const Argv& argv) {
  try {
    parse_arguments(argv, {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ValueRange, ParsesIntervalsAndSaysThemAsMessagesDo) {
  const auto half_open = parse_value_range("[0, 1)");
  ASSERT_TRUE(half_open);
  EXPECT_TRUE(half_open->contains(0.0));
  EXPECT_TRUE(half_open->contains(0.999));
  EXPECT_FALSE(half_open->contains(1.0));
  EXPECT_FALSE(half_open->contains(-1e-300));
  EXPECT_FALSE(half_open->contains(NAN));
  EXPECT_EQ(half_open->text(), "in [0, 1)");
  const auto positive = parse_value_range("(0, inf)");
  ASSERT_TRUE(positive);
  EXPECT_FALSE(positive->contains(0.0));
  EXPECT_TRUE(positive->contains(1e-30));
  EXPECT_FALSE(positive->contains(INFINITY));  // open at infinity: values are finite
  EXPECT_EQ(positive->text(), "> 0");
  EXPECT_EQ(parse_value_range("[1, inf)")->text(), ">= 1");
  EXPECT_EQ(parse_value_range("(0, 1]")->text(), "in (0, 1]");
  EXPECT_EQ(parse_value_range("[0.5, 2.5]")->text(), "in [0.5, 2.5]");
  for (const char* bad : {"", "0, 1", "[0 1)", "[1, 0]", "[0, inf]", "[x, 1)", "[0, 1, 2]", "{0, 1}"}) {
    std::string why;
    EXPECT_FALSE(parse_value_range(bad, &why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
}

TEST(ValueRange, TheTableSelfCheckCatchesBadRows) {
  EXPECT_TRUE(check_flag_table().empty());  // every range parses and holds its default
  const FlagSpec bad[] = {
      {.name = "--a", .kind = FlagKind::Float, .default_value = "2.0", .help = "x", .range = "[0, 1)"},
      {.name = "--b", .kind = FlagKind::String, .help = "x", .range = "[0, 1)"},
      {.name = "--c", .kind = FlagKind::Float, .help = "x", .range = "0 to 1"},
  };
  const std::vector<std::string> problems = training::detail::check_flag_ranges(bad);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_NE(problems[0].find("--a: default 2.0 is outside its range [0, 1)"), std::string::npos);
  EXPECT_NE(problems[1].find("--b: a range on a flag that takes no number"), std::string::npos);
  EXPECT_NE(problems[2].find("--c: range \"0 to 1\""), std::string::npos);
}

// Values each of which used to pass validation.
TEST(ValueRanges, NonFiniteValuesOfTheIssueAreRejectedNamingFlagValueAndRange) {
  const struct {
    Argv flag;
    std::string message;
  } cases[] = {
      {{"--lr", "nan"}, "`--lr nan` must be a finite number >= 0 [V-60]"},
      {{"--lr", "inf"}, "`--lr inf` must be a finite number >= 0 [V-60]"},
      {{"--min-lr", "nan"}, "`--min-lr nan` must be a finite number >= 0 [V-60]"},
      {{"--clip-grad", "nan"}, "`--clip-grad nan` must be a finite number >= 0 [M-2]"},
      {{"--clip-grad", "inf"}, "`--clip-grad inf` must be a finite number >= 0 [M-2]"},
      {{"--difflm-varilen-prob", "nan"}, "`--difflm-varilen-prob nan` must be a finite number in [0, 1] [D-7]"},
      {{"--weight-decay", "nan"}, "`--weight-decay nan` must be a finite number >= 0 [M-2]"},
      {{"--adam-beta2", "nan"}, "`--adam-beta2 nan` must be a finite number in [0, 1) [M-2]"},
      {{"--norm-epsilon", "nan"}, "`--norm-epsilon nan` must be a finite number >= 0 [M-2]"},
      {{"--init-method-std", "nan"}, "`--init-method-std nan` must be a finite number >= 0 [M-2]"},
      {{"--lr-warmup-fraction", "nan"}, "`--lr-warmup-fraction nan` must be a finite number in [0, 1) [V-60]"},
      {{"--adam-eps", "0"}, "`--adam-eps 0.0` must be > 0 [M-2]"},
  };
  for (const auto& c : cases) {
    const std::string what = rejection(cmd(c.flag));
    EXPECT_NE(what.find(c.message), std::string::npos) << c.message << "\nin:\n" << what;
    // One problem: the value's own range, no follow-up complaints from rules comparing it.
    EXPECT_NE(what.find("(1 problem)"), std::string::npos) << what;
  }
}

// Generic over the table: nan, inf and -inf are refused for every floating-point flag, and a
// value just outside each row's range is refused with that range in the message.
TEST(ValueRanges, EveryFloatFlagRefusesNonFiniteValuesAndEveryRangeIsEnforced) {
  int floats = 0, ranged = 0;
  for (const FlagSpec& f : flag_table()) {
    const std::string name(f.name);
    if (f.kind == FlagKind::Float) {
      ++floats;
      for (const char* v : {"nan", "inf", "-inf"}) {
        const std::string what = rejection(cmd({name, v}));
        EXPECT_NE(what.find("`" + name + " " + v + "` must be a finite number"), std::string::npos)
            << name << " " << v << ":\n" << what;
      }
    }
    if (f.range.empty()) continue;
    ++ranged;
    const auto r = parse_value_range(f.range);
    ASSERT_TRUE(r) << name;
    std::vector<double> outside;
    if (!std::isinf(r->low)) outside.push_back(r->low_open ? r->low : r->low - 1);
    if (!std::isinf(r->high)) outside.push_back(r->high_open ? r->high : r->high + 1);
    ASSERT_FALSE(outside.empty()) << name << " has a range that refuses nothing finite";
    for (double v : outside) {
      const bool integer = f.kind == FlagKind::Int;
      const std::string text = integer ? std::to_string(static_cast<int64_t>(v)) : std::to_string(v);
      const std::string what = rejection(cmd({name, text}));
      EXPECT_NE(what.find(r->text()), std::string::npos) << name << " " << text << ":\n" << what;
      EXPECT_NE(what.find("`" + name + " "), std::string::npos) << name << " " << text << ":\n" << what;
    }
  }
  EXPECT_GE(floats, 30);  // the table has ~35 floating-point flags
  EXPECT_GE(ranged, 30);
}

TEST(ValueRanges, ValuesInsideTheirRangesStillPass) {
  const ParsedArguments p = parse_arguments(
      cmd({"--adam-beta1", "0", "--adam-beta2", "0.95", "--clip-grad", "0", "--attention-dropout", "0",
           "--difflm-varilen-prob", "1", "--rotary-percent", "1", "--min-lr", "1e-3"}),
      {});
  EXPECT_FLOAT_EQ(p.config.optimizer.adam_beta2, 0.95f);
  EXPECT_FLOAT_EQ(p.config.diffusion.varilen_prob, 1.0f);
}

// Case 4: an unusable --save or --data-cache-path is found at start-up, naming the flag (it
// used to surface at the first save or as a bare `filesystem error`).
TEST(OutputPaths, UnusableDirectoriesAreRefusedAtStartUpNamingTheFlag) {
  test::TempDir dir("output_paths");
  const std::string file = dir / "a_file";
  std::ofstream(file) << "not a directory";
  const std::string under_file = file + "/sub";
  const struct {
    Argv flags;
    std::string message;
  } cases[] = {
      {{"--save", file, "--save-interval", "5"}, "`--save " + file + "` cannot be used: " + file + " exists and is not a directory [M-30]"},
      {{"--save", under_file, "--save-interval", "5"},
       "`--save " + under_file + "` cannot be used: " + under_file + " cannot be created: " + file + " is not a directory"},
      {{"--data-cache-path", file}, "`--data-cache-path " + file + "` cannot be used: " + file + " exists and is not a directory"},
      {{"--save", dir / "ok", "--save-interval", "5", "--non-persistent-save-interval", "2",
        "--non-persistent-ckpt-type", "global", "--non-persistent-global-ckpt-dir", file},
       "`--non-persistent-global-ckpt-dir " + file + "` cannot be used"},
      {{"--metrics-jsonl", dir.str()}, "`--metrics-jsonl " + dir.str() + "` cannot be used: " +
                                                      dir.str() + " is a directory, not a file"},
  };
  for (const auto& c : cases) {
    const std::string what = rejection(cmd(c.flags));
    EXPECT_NE(what.find(c.message), std::string::npos) << c.message << "\nin:\n" << what;
  }
  // Directories that do not exist yet below a writable one are fine (created at the first save).
  EXPECT_EQ(rejection(cmd({"--save", dir / "new/deeper", "--save-interval", "5",
                           "--data-cache-path", dir / "cache"})), "");
  // --dry-run validates a layout for another machine: its paths are not looked at.
  EXPECT_EQ(rejection(cmd({"--save", file, "--save-interval", "5", "--dry-run"})), "");
}

TEST(OutputPaths, AReadOnlyDirectoryIsRefused) {
  if (::geteuid() == 0)
    GTEST_SKIP() << "running as root: permission bits do not stop root from writing, so a "
                    "read-only folder cannot be made here (the check uses access(W_OK))";
  test::TempDir dir("read_only");
  const std::string ro = dir / "ro";
  std::filesystem::create_directory(ro);
  ::chmod(ro.c_str(), 0555);
  const std::string what = rejection(cmd({"--save", ro, "--save-interval", "5"}));
  const std::string below = rejection(cmd({"--data-cache-path", ro + "/cache"}));
  ::chmod(ro.c_str(), 0755);
  EXPECT_NE(what.find("`--save " + ro + "` cannot be used: " + ro + " is not writable by this process"),
            std::string::npos) << what;
  EXPECT_NE(below.find("cannot be created: " + ro + " is not writable"), std::string::npos) << below;
}

// Case 6: a bad blend weight stops the tokenizer from loading; its vocabulary is then unknown,
// so --vocab-size (which the tokenizer overrides) must not produce a mask-token complaint too.
TEST(ValueRanges, ABadBlendWeightIsTheOnlyComplaint) {
  Argv argv = cmd({"--data-path", "0.3", "corpus_a", "x", "corpus_b", "--tokenizer-type",
                   "HuggingFaceTokenizer", "--tokenizer-model", "/nonexistent/tokenizer.json", "--mask-token",
                   "150000"});
  argv.erase(std::find(argv.begin(), argv.end(), "--mock-data"));
  const std::string what = rejection(argv);
  EXPECT_NE(what.find("unparsable blend weight(s) \"x\""), std::string::npos) << what;
  EXPECT_EQ(what.find("--mask-token"), std::string::npos) << what;
  EXPECT_NE(what.find("(1 problem)"), std::string::npos) << what;
}

TEST(ValueRanges, MockDataNeedsThreeIdsAndAMaskTokenThatIsNotTheEndOfDocument) {
  EXPECT_NE(rejection(cmd({"--vocab-size", "2", "--mask-token", "1"}))
                .find("`--vocab-size 2` is too small for `--mock-data`"), std::string::npos);
  EXPECT_NE(rejection(cmd({"--mask-token", "0"})).find("`--mask-token 0` is the end-of-document id of `--mock-data`"),
            std::string::npos);
}
