// Generic safety rules over the flag table (argument_safety.h): finite, in-range numbers (the
// table's `range` column) and usable output paths. Rule ids: M-2 for ranges unless a flag's
// range is an older rule of its own (kRangeRule below), M-30 for output paths.
#include "training/arguments/argument_safety.h"
#include <unistd.h>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include "training/arguments/rules_common.h"

namespace megadlm::training::detail {

namespace {

// Ranges that Megatron's validate_args (V-*), MegaDLMs (D-*) or an earlier megadlm rule already
// named: their messages keep that id.
const std::map<std::string, std::string>& range_rules() {
  static const std::map<std::string, std::string> kRangeRule = {
      {"lr", "V-60"},          {"min_lr", "V-60"},           {"lr_warmup_fraction", "V-60"},
      {"lr_warmup_init", "V-60"}, {"rotary_percent", "M-14"}, {"attention_dropout", "M-15"},
      {"hidden_dropout", "M-15"}, {"difflm_varilen_prob", "D-7"}};
  return kRangeRule;
}

bool parse_bound(std::string_view text, double& out) {
  std::string t(text);
  while (!t.empty() && t.front() == ' ') t.erase(t.begin());
  while (!t.empty() && t.back() == ' ') t.pop_back();
  if (t == "inf" || t == "+inf") {
    out = INFINITY;
    return true;
  }
  if (t == "-inf") {
    out = -INFINITY;
    return true;
  }
  if (t.empty()) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() && std::isfinite(out);
}

std::string bound_text(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Whole numbers print as integers ("0", "1"), the way the table writes them.
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return python_float_repr(v);
}

bool is_number_kind(FlagKind k) {
  return k == FlagKind::Int || k == FlagKind::Float || k == FlagKind::IntList || k == FlagKind::FloatList;
}

// The numbers a value holds (lists: every element).
std::vector<double> numbers_of(const FlagValue& v) {
  if (const auto* x = std::get_if<double>(&v)) return {*x};
  if (const auto* x = std::get_if<int64_t>(&v)) return {static_cast<double>(*x)};
  if (const auto* x = std::get_if<std::vector<double>>(&v)) return *x;
  if (const auto* x = std::get_if<std::vector<int64_t>>(&v)) return {x->begin(), x->end()};
  return {};
}

}  // namespace

bool ValueRange::contains(double v) const {
  if (std::isnan(v)) return false;
  const bool above = low_open ? v > low : v >= low;
  const bool below = high_open ? v < high : v <= high;
  return above && below;
}

std::string ValueRange::text() const {
  if (std::isinf(high) && high > 0 && !std::isinf(low))
    return std::string(low_open ? "> " : ">= ").append(bound_text(low));
  return std::string("in ").append(low_open ? "(" : "[").append(bound_text(low)).append(", ")
      .append(bound_text(high)).append(high_open ? ")" : "]");
}

std::optional<ValueRange> parse_value_range(std::string_view text, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<ValueRange> {
    if (error) *error = "range \"" + std::string(text) + "\" " + why;
    return std::nullopt;
  };
  if (text.size() < 5) return fail("is not an interval like [0, 1) or (0, inf)");
  const char open = text.front(), close = text.back();
  if ((open != '[' && open != '(') || (close != ']' && close != ')'))
    return fail("must start with [ or ( and end with ] or )");
  const std::string_view inner = text.substr(1, text.size() - 2);
  const size_t comma = inner.find(',');
  if (comma == std::string_view::npos || inner.find(',', comma + 1) != std::string_view::npos)
    return fail("needs exactly two bounds separated by a comma");
  ValueRange r;
  r.low_open = open == '(';
  r.high_open = close == ')';
  if (!parse_bound(inner.substr(0, comma), r.low) || !parse_bound(inner.substr(comma + 1), r.high))
    return fail("has a bound that is not a number or inf");
  if (!(r.low <= r.high)) return fail("has its lower bound above its upper bound");
  if ((std::isinf(r.low) && !r.low_open) || (std::isinf(r.high) && !r.high_open))
    return fail("must leave an infinite bound open (flag values are finite)");
  return r;
}

std::vector<std::string> check_flag_ranges(std::span<const FlagSpec> table) {
  std::vector<std::string> problems;
  for (const FlagSpec& f : table) {
    if (f.range.empty()) continue;
    const std::string n(f.name);
    std::string error;
    const std::optional<ValueRange> r = parse_value_range(f.range, &error);
    if (!r) {
      problems.push_back(n + ": " + error);
      continue;
    }
    if (!is_number_kind(f.kind)) {
      problems.push_back(n + ": a range on a flag that takes no number");
      continue;
    }
    for (double v : numbers_of(default_flag_value(f)))
      if (!r->contains(v))
        problems.push_back(n + ": default " + python_float_repr(v) + " is outside its range " +
                           std::string(f.range));
  }
  return problems;
}

std::string value_range_problem(const FlagSpec& f, const FlagValue& value, const std::string& shown) {
  if (!is_number_kind(f.kind)) return "";
  const std::vector<double> values = numbers_of(value);
  if (values.empty()) return "";
  std::optional<ValueRange> range;
  if (!f.range.empty()) range = parse_value_range(f.range);
  const bool floating = f.kind == FlagKind::Float || f.kind == FlagKind::FloatList;
  bool finite = true, inside = true;
  for (double v : values) {
    finite = finite && std::isfinite(v);
    inside = inside && (!range || range->contains(v));
  }
  // nan and inf parse (Python's float() takes them) but no hyper-parameter means them: a
  // NaN learning rate trains NaN weights to the end, an infinite --clip-grad turns clipping off.
  if (floating && !finite) {
    std::string message = shown + " must be a finite number";
    if (range) message.append(1, ' ').append(range->text());  // (appends: GCC 12's -Wrestrict)
    return message;
  }
  if (inside) return "";
  const std::string text = range->text();
  return shown + (text.rfind("in ", 0) == 0 ? " must lie " : " must be ") + text;
}

void check_value_ranges(const ArgState& a, Diagnostics& d) {
  for (const FlagSpec* f : a.given_flags()) {
    const std::string dest = flag_dest(*f);
    const std::string problem = value_range_problem(*f, a.value(dest), a.flag_value(dest));
    if (problem.empty()) continue;
    const auto rule_it = range_rules().find(dest);
    d.error(rule_it == range_rules().end() ? "M-2" : rule_it->second, problem);
  }
}

namespace {

// Why `path` cannot serve as a directory (or, with `file`, as a file to append to) of this
// process; "" when it can. A missing path is fine when its nearest existing ancestor is a
// writable directory (it is created when first written).
std::string path_problem(const std::string& path, bool file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  const fs::file_status st = fs::status(p, ec);
  if (fs::exists(st)) {
    if (!file && !fs::is_directory(st)) return path + " exists and is not a directory";
    if (file && fs::is_directory(st)) return path + " is a directory, not a file";
    const int mode = file ? W_OK : (W_OK | X_OK);
    if (::access(path.c_str(), mode) != 0)
      return path + " is not writable by this process (" + std::strerror(errno) + ")";
    return "";
  }
  // The first ancestor that exists decides whether the path can be created.
  fs::path up = p.has_parent_path() ? p.parent_path() : fs::path(".");
  while (!up.empty() && !fs::exists(up, ec)) {
    if (!up.has_parent_path() || up.parent_path() == up) break;
    up = up.parent_path();
  }
  if (up.empty()) up = ".";
  if (!fs::exists(up, ec)) return path + " cannot be created (" + up.string() + " does not exist)";
  if (!fs::is_directory(up, ec))
    return path + " cannot be created: " + up.string() + " is not a directory";
  if (::access(up.c_str(), W_OK | X_OK) != 0)
    return path + " cannot be created: " + up.string() + " is not writable by this process (" +
           std::strerror(errno) + ")";
  return "";
}

}  // namespace

void check_output_paths(const ArgState& a, bool dry_run, Diagnostics& d) {
  if (dry_run) return;
  for (const char* dest : {"save", "non_persistent_global_ckpt_dir", "data_cache_path", "collective_log_dir", "save_gradients"}) {
    if (!a.is_set(dest) || a.s(dest).empty()) continue;
    const std::string why = path_problem(a.s(dest), /*file=*/false);
    if (!why.empty()) d.error("M-30", a.flag_value(dest) + " cannot be used: " + why);
  }
  if (a.is_set("metrics_jsonl") && !a.s("metrics_jsonl").empty()) {
    const std::string why = path_problem(a.s("metrics_jsonl"), /*file=*/true);
    if (!why.empty()) d.error("M-30", a.flag_value("metrics_jsonl") + " cannot be used: " + why);
  }
}

}  // namespace megadlm::training::detail
