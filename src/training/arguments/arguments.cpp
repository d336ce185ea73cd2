// Command-line parsing (argparse semantics plus @file expansion; the lexing itself is CLI11 in
// command_line.cpp), the argument state, and the start-up / dry-run reports. The rules that
// combine flags live in argument_rules.cpp.
#include "megadlm/training/arguments/arguments.h"
#include <cstdio>
#include <sstream>
#include "megadlm/parallel/rank_layout.h"
#include "megadlm/training/arguments/checkpoint_args.h"
#include "megadlm/training/arguments/flags.h"
#include "megadlm/training/layout_plan.h"
#include "megadlm/training/memory_plan.h"
#include "training/arguments/argument_safety.h"
#include "training/arguments/argument_state.h"
#include "training/arguments/command_line.h"
#include "training/arguments/logging_rules.h"

namespace megadlm {

namespace {

std::string config_error_message(const std::vector<std::string>& errors,
                                 const std::vector<std::string>& not_supported) {
  std::string msg;
  if (!errors.empty()) {
    msg += "invalid command line (" + std::to_string(errors.size()) +
           (errors.size() == 1 ? " problem):\n" : " problems):\n");
    for (const std::string& e : errors) msg += "  " + e + "\n";
  }
  if (!not_supported.empty()) {
    msg += "not supported yet by megadlm (" + std::to_string(not_supported.size()) +
           (not_supported.size() == 1 ? " item; `--dry-run` accepts it):\n"
                                      : " items; `--dry-run` accepts them):\n");
    for (const std::string& e : not_supported) msg += "  " + e + "\n";
  }
  if (!msg.empty()) msg.pop_back();
  return msg;
}

}  // namespace

// User errors: the message is for the person who typed the command line, so it carries no
// source location (unlike MDLM_CHECK's programmer errors).
ConfigError::ConfigError(std::vector<std::string> errors, std::vector<std::string> not_supported)
    : Error(config_error_message(errors, not_supported)),
      errors_(std::move(errors)),
      not_supported_(std::move(not_supported)) {}

}  // namespace megadlm

namespace megadlm::training {

namespace detail {

// ---------------------------------------------------------------------------------- ArgState

ArgState::ArgState(const LaunchInfo& launch) : launch_(launch) {
  for (const FlagSpec& f : flag_table()) {
    const std::string dest = flag_dest(f);
    if (primary_.emplace(dest, &f).second) values_[dest] = default_flag_value(f);
  }
}

void ArgState::set_given(const FlagSpec& flag, FlagValue value) {
  const std::string dest = flag_dest(flag);
  bool seen = false;
  for (const FlagSpec* g : given_order_) seen = seen || g == &flag;
  if (!seen) given_order_.push_back(&flag);
  given_[dest] = &flag;
  values_[dest] = std::move(value);
}

bool ArgState::is_set(const std::string& dest) const {
  return !std::holds_alternative<std::monostate>(value(dest));
}

const FlagValue& ArgState::value(const std::string& dest) const {
  static const FlagValue kNone;
  auto it = values_.find(dest);
  return it == values_.end() ? kNone : it->second;
}

int64_t ArgState::i(const std::string& dest) const { return oi(dest).value_or(0); }

std::optional<int64_t> ArgState::oi(const std::string& dest) const {
  if (auto* v = std::get_if<int64_t>(&value(dest))) return *v;
  return std::nullopt;
}

double ArgState::f(const std::string& dest) const { return of(dest).value_or(0.0); }

std::optional<double> ArgState::of(const std::string& dest) const {
  if (auto* v = std::get_if<double>(&value(dest))) return *v;
  if (auto* v = std::get_if<int64_t>(&value(dest))) return static_cast<double>(*v);
  return std::nullopt;
}

bool ArgState::b(const std::string& dest) const {
  auto* v = std::get_if<bool>(&value(dest));
  return v != nullptr && *v;
}

std::string ArgState::s(const std::string& dest) const {
  auto* v = std::get_if<std::string>(&value(dest));
  return v == nullptr ? std::string() : *v;
}

std::vector<int64_t> ArgState::ints(const std::string& dest) const {
  auto* v = std::get_if<std::vector<int64_t>>(&value(dest));
  return v == nullptr ? std::vector<int64_t>{} : *v;
}

std::vector<std::string> ArgState::strings(const std::string& dest) const {
  auto* v = std::get_if<std::vector<std::string>>(&value(dest));
  return v == nullptr ? std::vector<std::string>{} : *v;
}

std::string ArgState::flag(const std::string& dest) const {
  auto it = given_.find(dest);
  if (it != given_.end()) return backticked(it->second->name);
  auto p = primary_.find(dest);
  if (p != primary_.end()) return backticked(p->second->name);
  return backticked(dest);
}

std::string ArgState::flag_value(const std::string& dest) const {
  const FlagValue& v = value(dest);
  if (std::holds_alternative<bool>(v)) return flag(dest);
  const std::string text = command_line_text(v);
  const std::string f = flag(dest);
  if (text.empty()) return f;  // an empty list
  return f.substr(0, f.size() - 1) + " " + text + "`";
}

}  // namespace detail

namespace {

using detail::ArgState;
using detail::FlagValue;

// The value of one occurrence, converted and checked by its row; false (and the message in
// `errors`) when it has none where one is needed, or one that does not parse.
bool occurrence_value(const detail::FlagOccurrence& occ, FlagValue& value,
                      std::vector<std::string>& errors) {
  const FlagSpec& spec = *occ.flag;
  const bool is_list = spec.kind == FlagKind::IntList || spec.kind == FlagKind::FloatList ||
                       spec.kind == FlagKind::StringList;
  if (flag_takes_value(spec) && !is_list && occ.values.empty()) {
    errors.push_back(detail::backticked(spec.name) + " expects a value");
    return false;
  }
  std::string error;
  if (!detail::parse_flag_value(spec, occ.values, value, error)) {
    errors.push_back(error);
    return false;
  }
  return true;
}

}  // namespace

std::vector<ToolFlag> parse_tool_flags(std::span<const FlagSpec> table,
                                       const std::vector<std::string>& args) {
  std::vector<std::string> errors;
  std::vector<ToolFlag> out = parse_tool_flags(table, args, errors);
  if (!errors.empty()) throw ConfigError(std::move(errors), {});
  return out;
}

std::vector<ToolFlag> parse_tool_flags(std::span<const FlagSpec> table, const std::vector<std::string>& args,
                                       std::vector<std::string>& errors) {
  const detail::LexedCommandLine lexed = detail::lex_command_line(args, table);
  std::vector<ToolFlag> out;
  for (const detail::FlagOccurrence& occ : lexed.occurrences) {
    errors.insert(errors.end(), occ.errors_before.begin(), occ.errors_before.end());
    FlagValue v;
    if (!occurrence_value(occ, v, errors)) continue;
    std::string typed(occ.flag->name);
    for (const std::string& w : occ.values) typed.append(1, ' ').append(w);
    const std::string problem = detail::value_range_problem(*occ.flag, v, detail::backticked(typed));
    if (!problem.empty()) {
      errors.push_back(problem);
      continue;
    }
    out.push_back({occ.flag, occ.values});
  }
  errors.insert(errors.end(), lexed.trailing_errors.begin(), lexed.trailing_errors.end());
  return out;
}

std::vector<std::string> expand_flag_files(const std::vector<std::string>& args) {
  std::vector<std::string> errors;
  std::vector<std::string> tokens = detail::expand_flag_files(args, errors);
  if (!errors.empty()) throw ConfigError(std::move(errors), {});
  return tokens;
}

ParsedArguments parse_arguments(const std::vector<std::string>& argv, const LaunchInfo& launch) {
  std::vector<std::string> errors;
  std::vector<std::string> tokens = detail::expand_flag_files(argv, errors);
  tokens = with_checkpoint_args(tokens, errors);  // before validation, as Megatron

  // CLI11 splits the words into flag occurrences (training/arguments/command_line.h); their values
  // are converted and checked here, in command-line order, so that every problem is reported.
  const detail::LexedCommandLine lexed = detail::lex_command_line(tokens);
  ArgState state(launch);
  bool help = false, help_markdown = false;
  for (const detail::FlagOccurrence& occ : lexed.occurrences) {
    errors.insert(errors.end(), occ.errors_before.begin(), occ.errors_before.end());
    const FlagSpec& spec = *occ.flag;
    if (spec.name == "--help") {
      help = true;
      continue;
    }
    if (spec.name == "--help-markdown") help_markdown = true;
    FlagValue v;
    if (!occurrence_value(occ, v, errors)) continue;
    state.set_given(spec, std::move(v));  // a repeated flag: the last one wins (argparse)
  }
  errors.insert(errors.end(), lexed.trailing_errors.begin(), lexed.trailing_errors.end());

  ParsedArguments out;
  out.rank = launch.rank;
  if (help || help_markdown) {
    out.help = help;
    out.help_markdown = help_markdown;
    return out;
  }
  if (!errors.empty()) throw ConfigError(std::move(errors), {});

  // --plan is a dry run that also ranks layouts (training/layout_plan.h).
  const bool dry_run = state.b("dry_run") || state.b("plan");
  detail::Diagnostics diag;
  detail::resolve_and_validate(state, dry_run, diag);
  detail::check_logging(state, diag);
  // The one place where a dry run and a real run part: a violated rule refuses both; a valid
  // setting this build cannot run yet (context/expert parallelism, FSDP parameter sharding,
  // not-yet flags) refuses only a real run, so that --dry-run can still check such a layout and
  // print its groups. (Rules about the launch itself, M-1, M-4 and M-8, look at dry_run too.)
  const bool refused = !diag.errors.empty() || (!dry_run && !diag.not_supported.empty());
  if (refused) throw ConfigError(std::move(diag.errors), std::move(diag.not_supported));

  out.config = detail::build_run_config(state);
  out.dry_run = dry_run;
  out.plan = state.b("plan");
  for (const FlagSpec* f : state.given_flags()) out.given.insert(flag_dest(*f));
  out.warnings = std::move(diag.warnings);
  out.not_supported = std::move(diag.not_supported);
  for (const auto& [dest, value] : state.values()) {
    if (dest == "help" || dest == "help_markdown") continue;
    out.values[dest] = detail::python_repr(value);
  }
  return out;
}

std::string format_arguments(const ParsedArguments& parsed) {
  std::ostringstream os;
  os << "------------------------ arguments ------------------------\n";
  for (const auto& [name, value] : parsed.values) {
    const size_t dots = name.size() < 48 ? 48 - name.size() : 0;
    os << "  " << name << " " << std::string(dots, '.') << " " << value << "\n";
  }
  os << "-------------------- end of arguments ---------------------\n";
  return os.str();
}

std::string format_dry_run_report(const ParsedArguments& parsed, int rank) {
  std::ostringstream os;
  os << format_arguments(parsed);
  for (const std::string& w : parsed.warnings) os << "warning: " << w << "\n";
  if (parsed.not_supported.empty()) {
    os << "megadlm supports everything this configuration needs.\n";
  } else {
    os << "valid configuration; not supported yet by megadlm (" << parsed.not_supported.size()
       << (parsed.not_supported.size() == 1 ? " item):\n" : " items):\n");
    for (const std::string& n : parsed.not_supported) os << "  " << n << "\n";
  }
  os << parallel::format_layout(parsed.config.parallel, rank);
  try {
    const MemoryPlan plan =
        plan_memory(parsed.config, plan_device(parsed.config, true, parsed.given.count("device") > 0));
    os << format_memory_plan(plan, parsed.config);
  } catch (const std::exception& e) {
    os << "memory plan: not available for this configuration (" << e.what() << ")\n";
  }
  try {
    // The --plan cost model for this one layout, so a recipe's dry run states its speed too.
    const RunConfig& c = parsed.config;
    const StepTime t = estimate_step_time(c);
    const double tokens = static_cast<double>(c.training.global_batch_size) * static_cast<double>(c.model.seq_length);
    const double step_s = t.total_ms() / 1e3;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "estimated step on H200s (the --plan cost model, docs/planner.md): %.1f ms (compute %.1f, "
                  "TP/CP %.1f, pipeline %.1f, data-parallel %.1f, optimizer %.1f) = %.0f tokens/s per GPU, "
                  "%.2f B tokens per day on %d GPUs\n",
                  t.total_ms(), t.compute_ms, t.tp_cp_ms, t.pipeline_ms, t.data_parallel_ms, t.optimizer_ms,
                  tokens / step_s / c.parallel.world_size, tokens / step_s * 86400.0 / 1e9, c.parallel.world_size);
    os << buf;
  } catch (const std::exception& e) {
    os << "estimated step: not available for this configuration (" << e.what() << ")\n";
  }
  return os.str();
}

}  // namespace megadlm::training
