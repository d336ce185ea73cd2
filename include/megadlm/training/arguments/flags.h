// The flag table: one immutable list that defines every command-line flag pretrain_difflm
// accepts (Megatron-LM / MegaDLMs spellings, plus megadlm's own). The
// parser, `--help`, `--help-markdown` and docs/flags.md are all generated from it.
// This header knows flag *spellings*; the typed configs never do. Parsing and validation live in
// training/arguments/arguments.h.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megadlm::training {

/// How a flag takes its value (argparse action / type).
enum class FlagKind {
  StoreTrue,   ///< `--x`: sets dest to True; takes no value
  StoreFalse,  ///< `--no-x`: sets dest (named explicitly) to False; takes no value
  Int,         ///< one integer
  Float,       ///< one real number
  String,      ///< one string (checked against `choices` when given)
  IntList,     ///< one or more (nargs '+') or zero or more (nargs '*') integers
  FloatList,
  StringList,  ///< each element checked against `choices` when given
};

enum class Nargs { Plus, Star };  ///< list flags only: '+' needs at least one value

/// What megadlm does with a flag.
enum class FlagStatus {
  Implemented,  ///< honoured (parallel-layout flags: validated and used by --dry-run layouts)
  NotYet,       ///< parsed and validated; a non-default value is rejected as "not supported yet"
  Ignored,      ///< accepted with one warning: it has no effect in megadlm
  Removed,      ///< removed from Megatron-LM: always an error, with the replacement hint
};

/// Sections of `--help` and docs/flags.md, in print order.
enum class FlagGroup {
  Parallel,
  Model,
  MoE,
  Training,
  LearningRate,
  Precision,
  Data,
  Checkpoint,
  Logging,
  Diffusion,
  Megadlm,
  Other,
  kCount,
};

/// One row of the table. Strings are views into static storage.
struct FlagSpec {
  std::string_view name;          ///< "--tensor-model-parallel-size" (kebab-case, no abbreviations)
  FlagKind kind = FlagKind::StoreTrue;
  FlagGroup group = FlagGroup::Other;
  FlagStatus status = FlagStatus::Implemented;
  /// Attribute name; empty = snake_case of `name` (StoreFalse flags always name it).
  std::string_view dest;
  /// Default as it would be typed on the command line; nullptr = the kind's natural default
  /// (False for StoreTrue, True for StoreFalse, None otherwise); "None" = None for any kind.
  /// Lists are whitespace separated. Checked against `choices` by check_flag_table().
  const char* default_value = nullptr;
  std::string_view choices;       ///< space-separated allowed values ("" = any)
  std::string_view not_yet;       ///< space-separated choices that parse but are not supported yet
  Nargs nargs = Nargs::Plus;
  std::string_view help;
  /// Removed: the replacement ("use `--micro-batch-size` instead"). Ignored: why it has no effect.
  /// NotYet: what megadlm lacks (added to the "not supported yet" message).
  std::string_view hint;
  /// Shown instead of the default in --help when the default is derived ("4 × hidden-size").
  std::string_view default_doc;
  /// Number flags: the valid values as an interval, "[0, 1)", "(0, inf)", "[0, inf)" (checked
  /// by argument validation, shown in --help). Every Float value must also be finite, range or
  /// not (nan and inf parse, as in Python, and are then rejected naming the flag).
  std::string_view range;
};

/// Every flag, grouped, in --help order. The only global of this module (immutable).
std::span<const FlagSpec> flag_table();

/// The row for an exact flag name ("--seed"), or nullptr. No prefix matching (argparse's
/// allow_abbrev=False).
const FlagSpec* find_flag(std::string_view name);

/// The snake_case attribute name a flag writes (its dest).
std::string flag_dest(const FlagSpec& flag);

/// Whether the flag consumes values on the command line.
bool flag_takes_value(const FlagSpec& flag);

/// Other trainers' spellings of Megatron's flags (Hugging Face's TrainingArguments and model
/// configurations, common training scripts) and the flag each means: ("--learning-rate", "--lr").
std::span<const std::pair<std::string_view, std::string_view>> flag_aliases();

/// The flag `unknown` most likely meant, or "" when nothing is reasonably close. Underscores
/// count as dashes; a known alias (flag_aliases) comes first, when its flag is in `table`; then
/// the closest name (longest-common-subsequence ratio, ties broken by edit distance).
std::string nearest_flag(std::string_view unknown, std::span<const FlagSpec> table = flag_table());

/// Section title of a group ("parallelism", ...).
const char* flag_group_title(FlagGroup group);
const char* flag_status_name(FlagStatus status);

/// Self-check of the table: unique names, dests consistent across aliases, every default
/// parses and lies in its own choices (the MegaDLMs `--base-model Qwen_2`
/// lesson: its default was not among its choices), not_yet values are choices, StoreFalse flags
/// name their dest. Empty = consistent.
std::vector<std::string> check_flag_table(std::span<const FlagSpec> table = flag_table());

/// `--help` text, generated from the table.
std::string format_help(std::string_view program = "pretrain_difflm");

/// docs/flags.md, generated from the table; first line is the "autogenerated" marker.
std::string format_flags_markdown();

}  // namespace megadlm::training
