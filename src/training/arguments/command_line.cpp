// @file expansion and CLI11 lexing driven by the flag table (see command_line.h). CLI11 is used
// header-only and this file is compiled with hidden visibility (src/CMakeLists.txt), so
// libmegadlm does not export CLI11's inline code.
//
// How the table becomes a CLI11 App: every row is an option without a bound variable, whose
// callback runs once per occurrence (trigger_on_parse) and records the raw words: booleans take
// 0 words, single values 0 or 1 (0 is reported as "expects a value" by the caller, as argparse
// does, instead of CLI11 swallowing the next flag), lists any number up to the next flag. Unknown
// words land in CLI11's extras; each callback notes how many extras existed when it ran, which
// places every extra between the occurrences around it. That order lets an unknown flag take its
// values with it, and lets a negative number CLI11 reads as a short option ("-.5", "-inf") become
// the value of the flag right before it.
// Hidden visibility for CLI11; the functions this file defines stay visible (tests call them).
#pragma GCC visibility push(default)
#include "training/arguments/command_line.h"
#pragma GCC visibility pop
#include <CLI/CLI.hpp>
#include <cctype>
#include <fstream>

namespace megadlm::training::detail {

namespace {

constexpr int kMaxFileDepth = 16;

// What CLI11 records for an option given without a value (its default_str); no user types it.
const std::string kNoValue = std::string("\x01megadlm:no-value\x01");

// Whitespace-separated words of an @file; '#' at the start of a word comments out the rest of
// the line; "..." and '...' group words that contain spaces (e.g. --split "969, 30, 1").
bool read_flag_file(const std::filesystem::path& path, std::vector<std::string>& out,
                    std::string& error) {
  const std::string shown = "`@" + path.string() + "`";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    error = "flag file " + shown + " is a directory; @ takes a file of flags";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot read flag file " + shown + " (does it exist?)";
    return false;
  }
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = "flag file " + shown + " line " + std::to_string(line_no);
    if (line.find('\0') != std::string::npos) {
      error = where + ": contains a NUL byte (a binary file, or UTF-16 text? flag files are text)";
      return false;
    }
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i >= line.size() || line[i] == '#') break;
      std::string word;
      while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) {
        const char c = line[i];
        if (c == '"' || c == '\'') {
          const size_t close = line.find(c, i + 1);
          if (close == std::string::npos) {
            error = where + ": unterminated quote";
            return false;
          }
          word += line.substr(i + 1, close - i - 1);
          i = close + 1;
        } else {
          word += c;
          ++i;
        }
      }
      out.push_back(word);
    }
  }
  if (in.bad()) {
    error = "cannot read flag file " + shown + " (read error after line " + std::to_string(line_no) + ")";
    return false;
  }
  return true;
}

void expand(const std::vector<std::string>& in, const std::filesystem::path& base, int depth,
            std::vector<std::string>& out, std::vector<std::string>& errors) {
  for (const std::string& tok : in) {
    if (tok.size() < 2 || tok[0] != '@') {
      out.push_back(tok);
      continue;
    }
    if (depth >= kMaxFileDepth) {
      errors.push_back("`" + tok + "`: @file nesting deeper than " +
                       std::to_string(kMaxFileDepth) + " levels (does a file include itself?)");
      continue;
    }
    std::filesystem::path p(tok.substr(1));
    if (p.is_relative() && !base.empty()) p = base / p;
    std::vector<std::string> words;
    std::string error;
    if (!read_flag_file(p, words, error)) {
      errors.push_back(error);
      continue;
    }
    expand(words, p.parent_path(), depth + 1, out, errors);
  }
}

// argparse's idea of a negative number (plus inf and nan): a value, not an option.
bool looks_like_number(const std::string& t) {
  if (t.size() < 2 || t[0] != '-') return false;
  const char c = t[1];
  return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || t == "-inf" || t == "-nan";
}

bool looks_like_flag(const std::string& t) {
  return t.size() >= 2 && t[0] == '-' && !looks_like_number(t);
}

bool is_list(const FlagSpec& f) {
  return f.kind == FlagKind::IntList || f.kind == FlagKind::FloatList || f.kind == FlagKind::StringList;
}

// One occurrence as CLI11's callback saw it, with the number of extras recorded before it.
struct Event {
  FlagOccurrence occurrence;
  size_t extras_before = 0;
};

// Runs CLI11 over words that contain no "--" (CLI11 reads everything after "--" as positional).
void lex_segment(const std::vector<std::string>& words, std::span<const FlagSpec> table,
                 LexedCommandLine& out, std::vector<std::string>& pending) {
  CLI::App app;
  app.set_help_flag();  // the table's --help row is the help flag
  app.allow_extras();
  std::vector<Event> events;
  for (const FlagSpec& f : table) {
    const FlagSpec* spec = &f;
    const std::string names = f.name == "--help" ? "-h,--help" : std::string(f.name);
    CLI::Option* opt = app.add_option(names, [&events, &app, spec](const CLI::results_t& results) {
      Event e;
      e.occurrence.flag = spec;
      for (const std::string& r : results)
        if (r != kNoValue) e.occurrence.values.push_back(r);
      e.extras_before = app.remaining_size();
      events.push_back(std::move(e));
      return true;
    });
    opt->default_str(kNoValue)->trigger_on_parse()->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    if (!flag_takes_value(f)) {
      opt->expected(0, 0);
    } else if (is_list(f)) {
      opt->expected(0, -1)->allow_extra_args(true);
    } else {
      opt->expected(0, 1);
    }
  }
  std::vector<std::string> reversed(words.rbegin(), words.rend());  // CLI11 parses from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    pending.push_back(std::string("internal: CLI11 could not lex the command line: ") + e.what());
    return;
  }

  // Walk occurrences and extras in command-line order.
  const std::vector<std::string> extras = app.remaining();
  enum class Prev { Start, Occurrence, OccurrenceValue, UnknownFlag, UnknownValue, Stray };
  Prev prev = Prev::Start;
  FlagOccurrence* last = nullptr;
  size_t next_event = 0;
  auto flush_event = [&]() {
    Event& e = events[next_event++];
    e.occurrence.errors_before = std::move(pending);
    pending.clear();
    out.occurrences.push_back(std::move(e.occurrence));
    last = &out.occurrences.back();
    prev = Prev::Occurrence;
  };
  for (size_t j = 0; j < extras.size(); ++j) {
    while (next_event < events.size() && events[next_event].extras_before <= j) flush_event();
    const std::string& w = extras[j];
    const bool after_flag = prev == Prev::Occurrence || prev == Prev::OccurrenceValue;
    if (after_flag && flag_takes_value(*last->flag) && !looks_like_flag(w) &&
        (is_list(*last->flag) || last->values.empty())) {
      last->values.push_back(w);  // "-.5" / "-inf" after a flag that wants a value
      prev = Prev::OccurrenceValue;
    } else if (looks_like_flag(w)) {
      const std::string name = w.substr(0, w.find('='));
      std::string msg = "unknown flag `" + name + "`";
      const std::string near = nearest_flag(name, table);
      if (!near.empty()) msg += "; did you mean `" + near + "`?";
      pending.push_back(msg);
      prev = Prev::UnknownFlag;
    } else if (prev == Prev::UnknownFlag || prev == Prev::UnknownValue) {
      prev = Prev::UnknownValue;  // a value of the unknown flag: reported with it
    } else {
      pending.push_back("unexpected argument `" + w + "`: values must follow a flag");
      prev = Prev::Stray;
    }
  }
  while (next_event < events.size()) flush_event();
}

}  // namespace

std::vector<std::string> expand_flag_files(const std::vector<std::string>& words,
                                           std::vector<std::string>& errors,
                                           const std::filesystem::path& base) {
  std::vector<std::string> out;
  expand(words, base, 0, out, errors);
  return out;
}

LexedCommandLine lex_command_line(const std::vector<std::string>& words,
                                  std::span<const FlagSpec> table) {
  LexedCommandLine out;
  std::vector<std::string> pending;
  size_t start = 0;
  while (true) {
    size_t end = start;
    while (end < words.size() && words[end] != "--") ++end;
    lex_segment(std::vector<std::string>(words.begin() + static_cast<std::ptrdiff_t>(start),
                                         words.begin() + static_cast<std::ptrdiff_t>(end)),
                table, out, pending);
    if (end == words.size()) break;
    pending.push_back("unexpected argument `--`: values must follow a flag");
    start = end + 1;
  }
  out.trailing_errors = std::move(pending);
  return out;
}

}  // namespace megadlm::training::detail
