// Internal to training/: the lexing half of parse_arguments. `@file` expansion, then CLI11 driven
// by the flag table (one CLI11 option per row, of the row's arity) splits the words into flag
// occurrences; nothing here converts or checks values (flag_value.h does, so every message keeps
// its wording). Unknown flags and stray words come back as messages in command-line order.
#pragma once
#include <filesystem>
#include <string>
#include <vector>
#include "megadlm/training/arguments/flags.h"

namespace megadlm::training::detail {

/// Replaces every `@path` word by the words of that file, recursively (argparse's
/// fromfile_prefix_chars, anywhere on the line). Files hold whitespace-separated words; `#` at
/// the start of a word comments out the rest of its line; "..." and '...' group words with
/// spaces. A nested @file's relative path is relative to the file that names it; `base` is that
/// directory for the top level ("" = the working directory). Problems (missing or unreadable
/// file, a directory, a NUL byte, an unterminated quote, nesting deeper than 16) go to `errors`,
/// each naming the file (and line); the other words are kept.
std::vector<std::string> expand_flag_files(const std::vector<std::string>& words,
                                           std::vector<std::string>& errors,
                                           const std::filesystem::path& base = {});

/// One flag as typed: `--flag v1 v2`, `--flag=v1`, or a bare `--flag`.
struct FlagOccurrence {
  const FlagSpec* flag = nullptr;
  /// The value words, none for a bare flag. A boolean flag written `--flag=x` has {"x"} (an
  /// error for the caller to report).
  std::vector<std::string> values;
  /// Messages about words before this occurrence that are not flags of the table, in order.
  std::vector<std::string> errors_before;
};

struct LexedCommandLine {
  std::vector<FlagOccurrence> occurrences;  ///< every table flag given, in command-line order
  std::vector<std::string> trailing_errors; ///< problems after the last occurrence
};

/// Splits expanded words into flag occurrences with CLI11 (no prefix abbreviations, `--flag=value`,
/// lists up to the next flag, negative numbers as values, repeated flags kept as separate
/// occurrences so that the last one can win). Words that are not table flags give "unknown flag
/// `--x`; did you mean `--y`?" (the values after an unknown flag are skipped with it) or
/// "unexpected argument `w`: values must follow a flag". `table` is pretrain_difflm's flag table
/// unless a tool lexes its own (parse_tool_flags).
LexedCommandLine lex_command_line(const std::vector<std::string>& words,
                                  std::span<const FlagSpec> table = flag_table());

}  // namespace megadlm::training::detail
