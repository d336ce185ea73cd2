// The lexing half of parse_arguments (training/arguments/command_line.h): CLI11 driven by the flag
// table, and @file expansion. Each test states the argparse behaviour it pins; the values and
// messages the rules then produce are test_arguments.cpp's business. Last, parse_tool_flags: the
// same lexing over another program's table, each value checked by its row.
#include <gtest/gtest.h>
#include <fstream>
#include "megadlm/training/arguments/arguments.h"
#include "support/scratch.h"
#include "training/arguments/command_line.h"

using namespace megadlm;
using namespace megadlm::training;
using megadlm::training::detail::lex_command_line;
using Words = std::vector<std::string>;

namespace {

// "--flag v1 v2 | --other" for each occurrence, and every message in order, for compact asserts.
std::string shape(const training::detail::LexedCommandLine& lexed) {
  std::string out;
  for (const training::detail::FlagOccurrence& o : lexed.occurrences) {
    for (const std::string& e : o.errors_before) out += "{" + e + "} ";
    out += std::string(o.flag->name);
    for (const std::string& v : o.values) out += " " + v;
    out += " | ";
  }
  for (const std::string& e : lexed.trailing_errors) out += "{" + e + "} ";
  return out;
}

std::string lexed(const Words& words) { return shape(lex_command_line(words)); }

// A small valid command line (test_arguments.cpp's base).
Words base(const Words& extra = {}) {
  Words w = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
             "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
             "--vocab-size", "100", "--mask-token", "99", "--lr", "1e-3", "--train-iters", "10",
             "--mock-data"};
  w.insert(w.end(), extra.begin(), extra.end());
  return w;
}

std::vector<std::string> errors_of(const Words& words) {
  try {
    parse_arguments(words, {});
  } catch (const ConfigError& e) {
    return e.errors();
  }
  return {};
}

std::string at_file(const std::string& p) { return std::string(1, '@').append(p); }

}  // namespace

TEST(CommandLine, EqualsFormAndSeparateValueAreTheSameOccurrence) {
  EXPECT_EQ(lexed({"--num-layers=4", "--lr", "0.5", "--split=969, 30, 1"}),
            "--num-layers 4 | --lr 0.5 | --split 969, 30, 1 | ");
  // Only the first '=' separates: the rest is the value.
  EXPECT_EQ(lexed({"--data-cache-path=a=b"}), "--data-cache-path a=b | ");
}

TEST(CommandLine, RepeatedFlagsStaySeparateAndTheLastWins) {
  EXPECT_EQ(lexed({"--num-layers", "3", "--seed", "1", "--num-layers", "6"}),
            "--num-layers 3 | --seed 1 | --num-layers 6 | ");
  const ParsedArguments p = parse_arguments(
      base({"--num-layers", "6", "--cp-comm-type", "p2p", "a2a", "--cp-comm-type", "all_gather"}), {});
  EXPECT_EQ(p.config.model.num_layers, 6);
  // argparse's store action replaces a list; it does not extend it.
  EXPECT_EQ(p.config.parallel.cp_comm_type, (std::vector<cp::CommType>{cp::CommType::AllGather}));
}

TEST(CommandLine, ListFlagsEndAtTheNextFlag) {
  EXPECT_EQ(lexed({"--data-path", "0.3", "a", "0.7", "b", "--seed", "3"}),
            "--data-path 0.3 a 0.7 b | --seed 3 | ");
  EXPECT_EQ(lexed({"--spec", "--seed", "3"}), "--spec | --seed 3 | ");  // nargs '*': empty
  EXPECT_EQ(lexed({"--hierarchical-context-parallel-sizes", "2", "4", "--mock-data"}),
            "--hierarchical-context-parallel-sizes 2 4 | --mock-data | ");
  // CLI11 keeps reading list values after `=`, where argparse would stop; documented in
  // docs/compat.md.
  EXPECT_EQ(lexed({"--data-path=a", "b", "--seed", "1"}), "--data-path a b | --seed 1 | ");
  // nargs '+' needs one value; the next flag is not it.
  const std::vector<std::string> e = errors_of(base({"--hierarchical-context-parallel-sizes", "--seed", "1"}));
  ASSERT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0], "`--hierarchical-context-parallel-sizes` expects one or more values (an integer)");
}

TEST(CommandLine, NegativeNumbersAreValues) {
  // "-1" and "-1e-5" CLI11 reads as values itself; "-.5" and "-inf" it takes for short options,
  // and the lexer gives them to the flag before them, as the hand-written parser did.
  EXPECT_EQ(lexed({"--inference-batch-times-seqlen-threshold", "-1", "--adam-eps", "-1e-5", "--lr", "-.5",
                   "--clip-grad", "-inf", "--hierarchical-context-parallel-sizes", "2", "-.5", "-4", "7"}),
            "--inference-batch-times-seqlen-threshold -1 | --adam-eps -1e-5 | --lr -.5 | --clip-grad -inf | "
            "--hierarchical-context-parallel-sizes 2 -.5 -4 7 | ");
  EXPECT_EQ(lexed({"--lr=-.5"}), "--lr -.5 | ");
  // A flag that takes no value does not take a number either.
  EXPECT_EQ(lexed({"--mock-data", "-1"}), "--mock-data | {unexpected argument `-1`: values must follow a flag} ");
  // A single value takes one number; the next is stray.
  EXPECT_EQ(lexed({"--lr", "-.5", "-.25"}),
            "--lr -.5 | {unexpected argument `-.25`: values must follow a flag} ");
}

TEST(CommandLine, AMissingValueDoesNotSwallowTheNextFlag) {
  EXPECT_EQ(lexed({"--seed", "--lr", "1"}), "--seed | --lr 1 | ");
  const std::vector<std::string> e = errors_of(base({"--seed", "--global-batch-size", "4"}));
  ASSERT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0], "`--seed` expects a value");
  // A boolean flag given a value with `=` keeps it, for the "takes no value" message.
  EXPECT_EQ(lexed({"--swiglu=yes"}), "--swiglu yes | ");
}

TEST(CommandLine, UnknownFlagsSuggestTheNearestAndTakeTheirValuesWithThem) {
  EXPECT_EQ(lexed({"--micro-batch", "2", "--seed", "1"}),
            "{unknown flag `--micro-batch`; did you mean `--micro-batch-size`?} --seed 1 | ");
  EXPECT_EQ(lexed({"--lr-warmup-iter=3"}),
            "{unknown flag `--lr-warmup-iter`; did you mean `--lr-warmup-iters`?} ");
  EXPECT_EQ(lexed({"--zzzzzzzzzzzzzzzzzzzz", "1", "-.5", "x"}), "{unknown flag `--zzzzzzzzzzzzzzzzzzzz`} ");
  EXPECT_EQ(lexed({"-x"}), "{unknown flag `-x`} ");  // no abbreviations, no other short flags
  // A word after a known boolean flag is stray even when an unknown flag came before it.
  EXPECT_EQ(lexed({"--foo", "1", "--mock-data", "stray"}),
            "{unknown flag `--foo`} --mock-data | {unexpected argument `stray`: values must follow a flag} ");
  // No prefix matching (argparse allow_abbrev=False).
  EXPECT_EQ(lexed({"--tensor-model-parallel", "2"}).rfind("{unknown flag `--tensor-model-parallel`;", 0), 0u);
}

TEST(CommandLine, ReportsProblemsInCommandLineOrder) {
  const std::vector<std::string> e =
      errors_of(base({"--foo", "--num-layers", "x", "stray", "--swiglu=1", "--bar", "2"}));
  ASSERT_EQ(e.size(), 5u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0], "unknown flag `--foo`");
  EXPECT_EQ(e[1], "`--num-layers x`: invalid value; valid: an integer");
  EXPECT_EQ(e[2], "unexpected argument `stray`: values must follow a flag");
  EXPECT_EQ(e[3], "`--swiglu` takes no value (got `1`)");
  EXPECT_EQ(e[4].rfind("unknown flag `--bar`", 0), 0u) << e[4];
}

TEST(CommandLine, DoubleDashIsAStrayWordAndFlagsAfterItStillCount) {
  // CLI11 (and argparse) read everything after `--` as positional; pretrain_difflm has no
  // positionals, so `--` is reported and the words after it are lexed as flags.
  EXPECT_EQ(lexed({"--seed", "1", "--", "--lr", "0.5"}),
            "--seed 1 | {unexpected argument `--`: values must follow a flag} --lr 0.5 | ");
}

TEST(CommandLine, HelpHasAShortAndALongSpelling) {
  EXPECT_EQ(lexed({"-h"}), "--help | ");
  EXPECT_EQ(lexed({"--help"}), "--help | ");
  EXPECT_TRUE(parse_arguments({"--foo", "-h"}, {}).help);  // help wins over errors, as argparse
}

TEST(CommandLine, FlagFilesNestRelativeToTheFileThatNamesThem) {
  test::TempDir dir;
  std::filesystem::create_directories(dir / "configs/model");
  std::ofstream(dir / "configs/run.args") << "--seed 7  # comment --lr 9\n@model/tiny.args --split '90, 5, 5'\n";
  std::ofstream(dir / "configs/model/tiny.args") << "--num-layers 2\n@../common.args\n";
  std::ofstream(dir / "configs/common.args") << "--mock-data\n";
  std::vector<std::string> errors;
  const Words words = training::detail::expand_flag_files({"--lr", "1", at_file(dir / "configs/run.args"), "--seed", "8"}, errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  EXPECT_EQ(words, (Words{"--lr", "1", "--seed", "7", "--num-layers", "2", "--mock-data", "--split", "90, 5, 5",
                          "--seed", "8"}));
}

TEST(CommandLine, FlagFileProblemsNameTheFileAndLine) {
  test::TempDir dir;
  std::ofstream(dir / "nul.args") << "--seed 1\n--lr 1" << '\0' << "e-3\n";
  std::ofstream(dir / "quote.args") << "--seed 1\n\n--split \"90, 5\n";
  std::ofstream(dir / "ok.args") << "--seed 2\n";
  std::vector<std::string> errors;
  const Words words = training::detail::expand_flag_files(
      {at_file(dir / "missing.args"), at_file(dir.str()), at_file(dir / "nul.args"), at_file(dir / "quote.args"),
       at_file(dir / "ok.args")},
      errors);
  ASSERT_EQ(errors.size(), 4u) << ::testing::PrintToString(errors);
  EXPECT_EQ(errors[0], "cannot read flag file `@" + (dir / "missing.args") + "` (does it exist?)");
  EXPECT_EQ(errors[1], "flag file `@" + dir.str() + "` is a directory; @ takes a file of flags");
  EXPECT_EQ(errors[2].rfind("flag file `@" + (dir / "nul.args") + "` line 2: contains a NUL byte", 0), 0u)
      << errors[2];
  EXPECT_EQ(errors[3], "flag file `@" + (dir / "quote.args") + "` line 3: unterminated quote");
  EXPECT_EQ(words, (Words{"--seed", "2"}));  // a broken file adds nothing; the others still count
  // Through parse_arguments the file problems come first, all of them.
  const std::vector<std::string> e = errors_of({at_file(dir.str()), "--foo"});
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0], errors[1]);
}

// parse_tool_flags: another program's own table, lexed and checked like pretrain_difflm's.
// (Rows name only the fields they set, as the flag table does.)
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
namespace {

const std::vector<FlagSpec>& tool_table() {
  static const std::vector<FlagSpec> t = {
      {.name = "--workers", .kind = FlagKind::Int, .default_value = "1", .help = "threads", .range = "[1, 4096]"},
      {.name = "--dtype", .kind = FlagKind::String, .choices = "fp32 bf16", .help = "dtype"},
      {.name = "--tolerance", .kind = FlagKind::Float, .default_value = "0", .help = "tolerance", .range = "[0, inf)"},
      {.name = "--json-keys", .kind = FlagKind::StringList, .default_value = "text", .help = "keys"},
      {.name = "--help", .kind = FlagKind::StoreTrue, .help = "help"},
  };
  return t;
}

std::vector<std::string> tool_errors(const Words& words, std::vector<ToolFlag>* parsed = nullptr) {
  std::vector<std::string> errors;
  std::vector<ToolFlag> out = parse_tool_flags(tool_table(), words, errors);
  if (parsed != nullptr) *parsed = std::move(out);
  return errors;
}

}  // namespace

TEST(ToolFlags, TheTestTableIsConsistent) { EXPECT_EQ(check_flag_table(tool_table()), std::vector<std::string>{}); }

TEST(ToolFlags, ValuesAreCheckedByKindChoicesAndRangeInCommandLineOrder) {
  EXPECT_EQ(tool_errors({"--workers", "0", "--dtype", "fp16", "--tolerance", "nan", "--workres", "2", "--workers", "x",
                         "--tolerance", "-0.5"}),
            (Words{"`--workers 0` must lie in [1, 4096]", "`--dtype fp16`: invalid value; valid: fp32, bf16",
                   "`--tolerance nan` must be a finite number >= 0", "unknown flag `--workres`; did you mean `--workers`?",
                   "`--workers x`: invalid value; valid: an integer", "`--tolerance -0.5` must be >= 0"}));
}

TEST(ToolFlags, GoodOccurrencesComeBackWithTheirWordsBesideTheBadOnes) {
  std::vector<ToolFlag> parsed;
  EXPECT_EQ(tool_errors({"--workers", "4096", "--json-keys", "text", "title", "--dtype", "fp16", "--help"}, &parsed),
            Words{"`--dtype fp16`: invalid value; valid: fp32, bf16"});
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[0].flag->name, "--workers");
  EXPECT_EQ(parsed[0].values, Words{"4096"});
  EXPECT_EQ(parsed[1].values, (Words{"text", "title"}));
  EXPECT_EQ(parsed[2].flag->name, "--help");
  EXPECT_TRUE(parsed[2].values.empty());
}

TEST(ToolFlags, TheThrowingFormListsEveryProblem) {
  try {
    parse_tool_flags(tool_table(), {"--workers", "5000", "-h", "--json-keys"});
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.errors(), (Words{"`--workers 5000` must lie in [1, 4096]", "`--json-keys` expects one or more values (a string)"}));
  }
  EXPECT_NO_THROW(parse_tool_flags(tool_table(), {"--workers", "1", "-h"}));
}

TEST(ToolFlags, ATableDefaultOutsideItsRangeOrChoicesIsCaught) {
  std::vector<FlagSpec> bad = tool_table();
  bad[0].default_value = "0";     // outside [1, 4096]
  bad[1].default_value = "fp16";  // not a choice
  const std::vector<std::string> problems = check_flag_table(bad);
  ASSERT_EQ(problems.size(), 2u) << ::testing::PrintToString(problems);
  EXPECT_NE(problems[0].find("--dtype: default 'fp16' is not a valid value"), std::string::npos) << problems[0];
  EXPECT_EQ(problems[1], "--workers: default 0.0 is outside its range [1, 4096]");
}
