// Megatron-style command line → validated RunConfig. The only code that knows flag spellings
// (with training/arguments/flags.h, the table). Parsing follows argparse (allow_abbrev=False):
// --kebab-case flags, `--flag value` or `--flag=value`, lists, `--no-X` flags, last duplicate
// wins, unknown flags are errors; plus `@file` expansion. Validation reports every violated rule
// at once (Megatron's validate_args and more; rule ids in brackets, docs/rules.md). Library code:
// never exits, never reads the
// environment; the launcher facts come in as LaunchInfo.
#pragma once
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/training/arguments/flags.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

/// A command line that cannot run: every problem found, one per line in what().
class ConfigError : public Error {
 public:
  ConfigError(std::vector<std::string> errors, std::vector<std::string> not_supported);
  /// Violated rules and parse errors, each "message [rule id]".
  const std::vector<std::string>& errors() const { return errors_; }
  /// Valid settings this build cannot run yet (for a real run they are errors too).
  const std::vector<std::string>& not_supported() const { return not_supported_; }

 private:
  std::vector<std::string> errors_;
  std::vector<std::string> not_supported_;
};

}  // namespace megadlm

namespace megadlm::training {

/// What the launcher knows (comm/bootstrap reads it from the environment; tests make it up).
struct LaunchInfo {
  int world_size = 1;
  int rank = 0;
  int visible_gpus = 0;
};

struct ParsedArguments {
  RunConfig config;
  bool dry_run = false;        ///< --dry-run (or --plan): report and exit, touch no GPU
  bool plan = false;           ///< --plan: rank the layouts for --world-size GPUs
  bool help = false;           ///< --help / -h: print format_help() and exit
  bool help_markdown = false;  ///< --help-markdown: print format_flags_markdown() and exit
  int rank = 0;                ///< this process's global rank (from LaunchInfo)
  std::vector<std::string> warnings;
  /// With --dry-run: what this (valid) configuration needs that megadlm cannot run yet.
  /// Empty for a real run (those items make parse_arguments throw).
  std::vector<std::string> not_supported;
  /// Every dest (and derived value such as padded_vocab_size) → resolved value, printed as
  /// Megatron prints its arguments.
  std::map<std::string, std::string> values;
  /// The dests given on the command line (the others hold defaults or derived values).
  std::set<std::string> given;
};

/// Parses and validates `args` (the command line without the program name).
/// When --help or --help-markdown is present, returns with `help`/`help_markdown` set and
/// nothing validated. Throws ConfigError listing every problem: parse errors (unknown flag with
/// the nearest known one, bad value with what is valid, unreadable @file) first and alone;
/// otherwise every violated rule, plus — in a real run — every not-supported-yet item.
ParsedArguments parse_arguments(const std::vector<std::string>& args, const LaunchInfo& launch);

/// Megatron's start-up dump: "------------------------ arguments ------------------------",
/// one "  name ..... value" line per dest sorted by name, then the closing line.
std::string format_arguments(const ParsedArguments& parsed);

/// What --dry-run prints: the arguments, the warnings, the not-supported-yet items, the rank
/// layout of `rank` (parallel/rank_layout.h format_layout) and the memory plan
/// (training/memory_plan.h).
std::string format_dry_run_report(const ParsedArguments& parsed, int rank = 0);

/// One flag of a tool's own table as typed: its row and its value words (none for a switch).
struct ToolFlag {
  const FlagSpec* flag = nullptr;
  std::vector<std::string> values;
};

/// The command line of a program other than pretrain_difflm (generate_difflm, convert_checkpoint,
/// preprocess_data, ...): `args` lexed against that program's own `table` by the code that lexes
/// pretrain_difflm's (`--flag value`, `--flag=value`, unknown flags named with the nearest known
/// one, stray words) and each value checked by its row's kind, choices and range (a Float value
/// must also be finite), with pretrain_difflm's messages; no @file expansion.
/// Returns the occurrences in command-line order; throws ConfigError listing every problem.
std::vector<ToolFlag> parse_tool_flags(std::span<const FlagSpec> table,
                                       const std::vector<std::string>& args);
/// The same, appending the problems to `errors` instead of throwing; returns the occurrences
/// that are fine (a program can then add its own problems, such as missing required flags).
std::vector<ToolFlag> parse_tool_flags(std::span<const FlagSpec> table, const std::vector<std::string>& args,
                                       std::vector<std::string>& errors);

/// The @file-expanded command line (argparse's fromfile_prefix_chars); throws ConfigError on an
/// unreadable file.
std::vector<std::string> expand_flag_files(const std::vector<std::string>& args);

}  // namespace megadlm::training
