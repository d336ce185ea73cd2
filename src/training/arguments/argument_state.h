// Internal to training/: the parsed flag values (Megatron's `args` namespace, keyed by dest)
// while they are resolved and validated, and the diagnostics collected on the way. The parser
// (arguments.cpp) fills it; the rules (argument_rules.cpp) resolve derived values, check every
// rule and build the typed RunConfig.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/training/arguments/arguments.h"
#include "training/arguments/flag_value.h"

namespace megadlm::training::detail {

struct Diagnostics {
  std::vector<std::string> errors;         ///< violated rules: "message [rule id]"
  std::vector<std::string> not_supported;  ///< valid, but this build cannot run it
  std::vector<std::string> warnings;

  void error(const std::string& rule, const std::string& message) {
    errors.push_back(message + " [" + rule + "]");
  }
  void unsupported(const std::string& message) { not_supported.push_back(message); }
  void warn(const std::string& message) { warnings.push_back(message); }
};

class ArgState {
 public:
  explicit ArgState(const LaunchInfo& launch);

  const LaunchInfo& launch() const { return launch_; }

  /// Records a value typed on the command line (last one wins, as in argparse).
  void set_given(const FlagSpec& flag, FlagValue value);
  /// Sets a resolved or derived value (dests without a flag, e.g. padded_vocab_size, included).
  void set(const std::string& dest, FlagValue value) { values_[dest] = std::move(value); }

  const std::map<std::string, FlagValue>& values() const { return values_; }
  /// Flags as typed, in order of first appearance, each once.
  const std::vector<const FlagSpec*>& given_flags() const { return given_order_; }
  bool was_given(const std::string& dest) const { return given_.count(dest) != 0; }
  /// True unless the value is None.
  bool is_set(const std::string& dest) const;

  const FlagValue& value(const std::string& dest) const;
  int64_t i(const std::string& dest) const;             ///< int value; None reads as 0
  std::optional<int64_t> oi(const std::string& dest) const;
  double f(const std::string& dest) const;              ///< float value; None reads as 0
  std::optional<double> of(const std::string& dest) const;
  bool b(const std::string& dest) const;                ///< bool value; None reads as false
  std::string s(const std::string& dest) const;         ///< string value; None reads as ""
  std::vector<int64_t> ints(const std::string& dest) const;
  std::vector<std::string> strings(const std::string& dest) const;

  /// "`--tensor-model-parallel-size`": the spelling the user typed, else the table's first.
  std::string flag(const std::string& dest) const;
  /// "`--tensor-model-parallel-size 3`", "`--sequence-parallel`", "`--no-rope-fusion`".
  std::string flag_value(const std::string& dest) const;

 private:
  LaunchInfo launch_;
  std::map<std::string, FlagValue> values_;
  std::map<std::string, const FlagSpec*> given_;     ///< dest -> flag as typed (last)
  std::map<std::string, const FlagSpec*> primary_;   ///< dest -> first table row with it
  std::vector<const FlagSpec*> given_order_;
};

/// Checks every flag's status (removed, not yet, ignored), resolves derived values (world and
/// data-parallel size, ffn, kv channels, padded vocabulary, batch sizes, LR horizon, device,
/// masks...) and checks every rule of docs/rules.md that applies, plus megadlm's own
/// (ids M-*). Never throws on user input: everything goes into `diag`.
void resolve_and_validate(ArgState& args, bool dry_run, Diagnostics& diag);

/// The typed configs from resolved values (call only when resolve_and_validate found no error):
/// the one place where flag values reach RunConfig (run_config.cpp).
RunConfig build_run_config(const ArgState& args);

}  // namespace megadlm::training::detail
