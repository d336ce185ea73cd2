// The command line and main() of every program except pretrain_difflm (convert_checkpoint,
// preprocess_data, activation_memory, and the inference programs of inference_cli.h): a flag
// table per program (CliFlag rows: name, value kind, choices, default, range, help), lexed and
// checked by the training flag machinery (training::parse_tool_flags: unknown flags with the
// nearest known one, bad values naming the flag and what is valid, every problem at once), its
// --help generated from the same rows, and one main() around the program's body (tool_main).
// These programs are not Megatron's pretrain scripts, so their flags are not rows of
// pretrain_difflm's table; where a flag means the same, its spelling (and, for preprocess_data,
// Megatron's tools/preprocess_data.py) is kept.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>
#include "megadlm/training/arguments/arguments.h"

namespace megadlm::apps {

struct CliFlag {
  const char* name;
  /// Placeholder of the value in --help ("N", "DIR"); nullptr for a switch. A flag with
  /// `choices` shows them instead ("fp32|bf16").
  const char* value;
  const char* help;
  bool repeatable = false;  ///< may be given more than once (all() has every value)
  /// How the value is checked when parsed: String, Int, Float, or StringList (one or more words
  /// up to the next flag). Ignored for a switch.
  training::FlagKind kind = training::FlagKind::String;
  std::string_view choices = {};  ///< space-separated valid values ("" = any)
  /// Typed as on the command line; what get() and friends return when the flag is absent, shown
  /// in --help, and checked against `choices` and `range` when the table is built.
  const char* default_value = nullptr;
  std::string_view range = {};  ///< number flags: the valid interval, "[1, 4096]", "(0, inf)"
  bool required = false;   ///< a command line without it is refused (unless it asks for --help)
};

/// A program's command line: what tool_main needs besides argv.
struct ToolSpec {
  std::string program;
  std::string usage;  ///< the first lines of --help
  std::vector<CliFlag> flags;
  /// Words after the first `--` belong to the program (Cli::rest()), not to its table
  /// (activation_memory passes them to pretrain_difflm's parser).
  bool rest_after_dashes = false;
};

class Cli {
 public:
  /// Throws Error when the table contradicts itself (a default outside its choices or range,
  /// a duplicate name): a programming error, found by the program's first run.
  explicit Cli(ToolSpec spec);

  /// Parses argv with training::parse_tool_flags over this program's rows; throws ConfigError
  /// listing every problem: unknown flags with the nearest known one, missing or malformed
  /// values, values outside the choices or the range, a value given to a switch, a flag given
  /// twice that is not repeatable, and (without --help) every required flag that is missing.
  void parse(int argc, char** argv);

  bool has(const std::string& flag) const { return values_.count(flag) != 0; }
  /// The value given last, else the row's default, else "".
  std::string get(const std::string& flag) const;
  std::string get(const std::string& flag, const std::string& fallback) const {
    return has(flag) ? values_.at(flag).back() : fallback;
  }
  /// Every value: each occurrence of a repeatable flag, or the words of a list flag (its default's
  /// words when absent).
  std::vector<std::string> all(const std::string& flag) const;
  /// The value (or default) of an Int / Float row: checked when parsed, so this cannot fail on
  /// user input (an internal Error when the flag has neither value nor default).
  int64_t integer(const std::string& flag) const;
  double number(const std::string& flag) const;
  /// An untyped (String) flag read as an integer; a malformed value is recorded in `errors`
  /// (and `fallback` returned).
  int64_t integer(const std::string& flag, int64_t fallback, std::vector<std::string>& errors) const;
  double number(const std::string& flag, double fallback, std::vector<std::string>& errors) const;
  /// The words after `--` (ToolSpec::rest_after_dashes).
  const std::vector<std::string>& rest() const { return rest_; }

  std::string help() const;

 private:
  const CliFlag& row(const std::string& flag) const;

  ToolSpec spec_;
  std::vector<training::FlagSpec> table_;  ///< one row per flag, for the parser
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> rest_;
};

/// The whole main() of such a program around `body`: parses argv against `spec`, prints the
/// help for --help / -h (exit 0), runs `body` (its return value is the exit code) and turns
/// what escapes it into the exit codes these programs share: "error: invalid arguments:" and 2
/// for a ConfigError, "error:" and 2 for another megadlm Error, "error: unexpected failure:" and
/// 3 for anything else.
int tool_main(int argc, char** argv, ToolSpec spec, const std::function<int(const Cli&)>& body);

}  // namespace megadlm::apps
