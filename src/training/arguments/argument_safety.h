// Internal to training/: the validation rules that keep bad values and unusable paths from ever
// reaching a run: every number flag finite and inside the range its table row states,
// and the output directories (--save, --data-cache-path, ...) usable before anything starts.
// The rules are generic over the flag table; argument_safety.cpp has them.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include "training/arguments/argument_state.h"

namespace megadlm::training::detail {

/// An interval of the real line as a flag table row writes it: "[0, 1)", "(0, inf)", "[1, inf)".
struct ValueRange {
  double low = 0, high = 0;
  bool low_open = false, high_open = false;

  bool contains(double v) const;
  /// How a message says it: ">= 0", "> 0", "in [0, 1)".
  std::string text() const;
};

/// Parses a table range; nullopt (with `error` set) when it is not "[a, b]"-style with a <= b.
std::optional<ValueRange> parse_value_range(std::string_view text, std::string* error = nullptr);

/// Table self-check: every range parses, belongs to a number flag, and holds the flag's default.
std::vector<std::string> check_flag_ranges(std::span<const FlagSpec> table);

/// Why `value`, a value of `flag` shown as `shown` ("`--workers 0`"), breaks the row's range or,
/// for a Float (list), is not finite; "" when it does neither. One message for the whole value.
std::string value_range_problem(const FlagSpec& flag, const FlagValue& value, const std::string& shown);

/// Every Float (and FloatList) value typed on the command line must be finite; every number
/// flag with a range must lie in it. One error per flag, naming it, its value and the range.
void check_value_ranges(const ArgState& a, Diagnostics& d);

/// The directories a run writes into must be usable now, not at the first save: --save,
/// --non-persistent-global-ckpt-dir and --data-cache-path are directories this process can
/// write (or can be created below a writable directory), the --metrics-jsonl file can be
/// appended to. Skipped with --dry-run (a laptop checking a cluster layout has no /lustre).
void check_output_paths(const ArgState& a, bool dry_run, Diagnostics& d);

}  // namespace megadlm::training::detail
