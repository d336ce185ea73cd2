// Internal to training/: the value a flag holds after parsing (argparse's attribute), and the
// conversions between command-line text, values, and Megatron's printed form. Shared by the flag
// table's self-check (flags.cpp) and the parser (arguments.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>
#include "megadlm/training/arguments/flags.h"

namespace megadlm::training::detail {

/// monostate = Python's None.
using FlagValue = std::variant<std::monostate, bool, int64_t, double, std::string,
                               std::vector<int64_t>, std::vector<double>, std::vector<std::string>>;

/// Splits on ASCII whitespace.
std::vector<std::string> split_words(std::string_view text);

/// Whether `value` is one of the space-separated words of `list`.
bool word_in(std::string_view list, std::string_view value);

/// Converts the command-line tokens given to `flag` (none for StoreTrue/StoreFalse) into its
/// value. On failure returns false and sets `error` to a message naming the flag, the value and
/// what would be valid.
bool parse_flag_value(const FlagSpec& flag, const std::vector<std::string>& tokens, FlagValue& out,
                      std::string& error);

/// The flag's default value (the table self-check guarantees that it parses).
FlagValue default_flag_value(const FlagSpec& flag);

/// How Megatron's argument dump prints a value: None, True, 1e-05, ['p2p'], plain strings.
std::string python_repr(const FlagValue& value);

/// Python's repr() of a float: shortest round-trip digits, exponent form below 1e-4 or from 1e16.
std::string python_float_repr(double x);

/// "`text`" (built by appending: GCC 12's -Wrestrict misfires on "literal" + std::string).
inline std::string backticked(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  return out.append(1, '`').append(text).append(1, '`');
}

/// How the value would be typed after the flag ("2 4", "p2p", "0.1"); "" for booleans.
std::string command_line_text(const FlagValue& value);

}  // namespace megadlm::training::detail
