// The programs' shared command line and main() (tool_cli.h).
#include "tool_cli.h"
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace megadlm::apps {

namespace {

std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  std::istringstream in{std::string(text)};
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

Cli::Cli(ToolSpec spec) : spec_(std::move(spec)) {
  const bool has_help = std::any_of(spec_.flags.begin(), spec_.flags.end(),
                                    [](const CliFlag& f) { return std::string_view(f.name) == "--help"; });
  if (!has_help) spec_.flags.push_back({"--help", nullptr, "print this help and exit"});
  // The names and help are string literals (or views of pretrain_difflm's table), so the rows
  // may view them.
  for (const CliFlag& f : spec_.flags) {
    training::FlagSpec row;
    row.name = f.name;
    row.kind = f.value != nullptr ? f.kind : training::FlagKind::StoreTrue;
    row.help = f.help;
    row.choices = f.choices;
    row.default_value = f.default_value;
    row.range = f.range;
    table_.push_back(row);
  }
  const std::vector<std::string> problems = training::check_flag_table(table_);
  if (!problems.empty()) {
    std::string msg = "internal: the flag table of " + spec_.program + " contradicts itself:";
    for (const std::string& p : problems) msg += "\n  " + p;
    throw Error(msg);
  }
}

void Cli::parse(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (spec_.rest_after_dashes) {
    const auto dashes = std::find(args.begin(), args.end(), "--");
    if (dashes != args.end()) {
      rest_.assign(dashes + 1, args.end());
      args.erase(dashes, args.end());
    }
  }
  std::vector<std::string> errors;
  for (const training::ToolFlag& t : training::parse_tool_flags(table_, args, errors)) {
    const std::string name(t.flag->name);
    const CliFlag& f = spec_.flags[static_cast<size_t>(t.flag - table_.data())];
    auto& slot = values_[name];
    if (!slot.empty() && !f.repeatable) errors.push_back("`" + name + "` given twice");
    if (f.value == nullptr) slot.push_back("1");
    else if (f.kind == training::FlagKind::StringList) slot = t.values;
    else slot.push_back(t.values.at(0));
  }
  // A required flag typed with a bad value has its error already.
  const auto typed = [&](const std::string& name) {
    return std::any_of(args.begin(), args.end(),
                       [&](const std::string& w) { return w == name || w.rfind(name + "=", 0) == 0; });
  };
  if (!has("--help")) {
    for (const CliFlag& f : spec_.flags)
      if (f.required && !has(f.name) && !typed(f.name))
        errors.push_back("missing required flag `" + std::string(f.name) + (f.value ? std::string(" ") + f.value : "") +
                         "`");
  }
  if (!errors.empty()) throw ConfigError(errors, {});
}

const CliFlag& Cli::row(const std::string& flag) const {
  for (const CliFlag& f : spec_.flags)
    if (flag == f.name) return f;
  throw Error("internal: " + spec_.program + " has no flag `" + flag + "`");
}

std::string Cli::get(const std::string& flag) const {
  if (has(flag)) return values_.at(flag).back();
  const CliFlag& f = row(flag);
  return f.default_value != nullptr ? f.default_value : "";
}

std::vector<std::string> Cli::all(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it != values_.end()) return it->second;
  const CliFlag& f = row(flag);
  return f.default_value != nullptr ? words(f.default_value) : std::vector<std::string>{};
}

int64_t Cli::integer(const std::string& flag) const {
  const std::string v = get(flag);
  if (row(flag).kind != training::FlagKind::Int || v.empty())
    throw Error("internal: `" + flag + "` is no integer flag with a value or a default");
  return std::strtoll(v.c_str(), nullptr, 10);
}

double Cli::number(const std::string& flag) const {
  const std::string v = get(flag);
  const training::FlagKind k = row(flag).kind;
  if ((k != training::FlagKind::Float && k != training::FlagKind::Int) || v.empty())
    throw Error("internal: `" + flag + "` is no number flag with a value or a default");
  return std::strtod(v.c_str(), nullptr);
}

int64_t Cli::integer(const std::string& flag, int64_t fallback, std::vector<std::string>& errors) const {
  if (!has(flag)) return fallback;
  const std::string v = get(flag);
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') {
    errors.push_back("`" + flag + " " + v + "`: expected an integer");
    return fallback;
  }
  return x;
}

double Cli::number(const std::string& flag, double fallback, std::vector<std::string>& errors) const {
  if (!has(flag)) return fallback;
  const std::string v = get(flag);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') {
    errors.push_back("`" + flag + " " + v + "`: expected a number");
    return fallback;
  }
  return x;
}

std::string Cli::help() const {
  std::ostringstream os;
  os << spec_.usage << "\n\nflags:\n";
  for (const CliFlag& f : spec_.flags) {
    std::string left = std::string("  ") + f.name;
    if (!f.choices.empty()) {
      std::string list;
      for (const std::string& w : words(f.choices)) list += (list.empty() ? "" : "|") + w;
      left += " " + list;
    } else if (f.value != nullptr) {
      left += std::string(" ") + f.value;
    }
    os << left << (left.size() < 34 ? std::string(34 - left.size(), ' ') : "\n" + std::string(34, ' ')) << f.help;
    if (f.default_value != nullptr) os << " (default: " << f.default_value << ")";
    if (!f.range.empty()) os << " (valid: " << f.range << ")";
    if (f.repeatable) os << " (repeatable)";
    if (f.required) os << " (required)";
    os << "\n";
  }
  return os.str();
}

int tool_main(int argc, char** argv, ToolSpec spec, const std::function<int(const Cli&)>& body) {
  try {
    Cli cli(std::move(spec));
    cli.parse(argc, argv);
    if (cli.has("--help")) {
      std::cout << cli.help();
      return 0;
    }
    return body(cli);
  } catch (const ConfigError& e) {
    std::cout.flush();  // the error comes last in `> log 2>&1`
    std::cerr << "error: invalid arguments:\n" << e.what() << "\n";
    return 2;
  } catch (const Error& e) {
    std::cout.flush();  // the error comes last in `> log 2>&1`
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cout.flush();  // the error comes last in `> log 2>&1`
    std::cerr << "error: unexpected failure: " << e.what() << "\n";
    return 3;
  }
}

}  // namespace megadlm::apps
