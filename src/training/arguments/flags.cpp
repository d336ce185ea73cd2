// Queries over the flag table (lookup, nearest-name suggestion, self-check) and the documents
// generated from it (--help, docs/flags.md). The table itself is data in flag_table.cpp.
#include "megadlm/training/arguments/flags.h"
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include "training/arguments/argument_safety.h"
#include "training/arguments/flag_value.h"

namespace megadlm::training {

namespace detail {

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) out.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

bool word_in(std::string_view list, std::string_view value) {
  for (const std::string& w : split_words(list))
    if (w == value) return true;
  return false;
}

namespace {

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

bool parse_float(const std::string& s, double& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  // Python's float() takes decimal and exponent forms, inf and nan; reject C's hex floats.
  if (s.find_first_of("xX") != std::string::npos) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno == ERANGE && std::isfinite(v) && v != 0.0) return false;
  if (end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

std::string quoted_choices(std::string_view choices) {
  std::string out;
  for (const std::string& w : split_words(choices)) out += (out.empty() ? "" : ", ") + w;
  return out;
}

std::string kind_word(FlagKind kind) {
  switch (kind) {
    case FlagKind::Int:
    case FlagKind::IntList: return "an integer";
    case FlagKind::Float:
    case FlagKind::FloatList: return "a number";
    default: return "a string";
  }
}

}  // namespace

bool parse_flag_value(const FlagSpec& flag, const std::vector<std::string>& tokens, FlagValue& out,
                      std::string& error) {
  const std::string name(flag.name);
  auto bad = [&](const std::string& token, const std::string& valid) {
    error = "`" + name + " " + token + "`: invalid value; valid: " + valid;
    return false;
  };
  auto check_choice = [&](const std::string& token) {
    if (flag.choices.empty() || word_in(flag.choices, token)) return true;
    return bad(token, quoted_choices(flag.choices));
  };
  switch (flag.kind) {
    case FlagKind::StoreTrue:
    case FlagKind::StoreFalse:
      if (!tokens.empty()) {
        error = "`" + name + "` takes no value (got `" + tokens[0] + "`)";
        return false;
      }
      out = flag.kind == FlagKind::StoreTrue;
      return true;
    case FlagKind::Int:
    case FlagKind::Float:
    case FlagKind::String: {
      if (tokens.size() != 1) {
        error = "`" + name + "` expects one value (" + kind_word(flag.kind) + "), got " +
                std::to_string(tokens.size());
        return false;
      }
      const std::string& t = tokens[0];
      if (flag.kind == FlagKind::Int) {
        int64_t v = 0;
        if (!parse_int(t, v)) return bad(t, "an integer");
        if (!check_choice(std::to_string(v))) return false;
        out = v;
      } else if (flag.kind == FlagKind::Float) {
        double v = 0;
        if (!parse_float(t, v)) return bad(t, "a number");
        out = v;
      } else {
        if (!check_choice(t)) return false;
        out = t;
      }
      return true;
    }
    case FlagKind::IntList:
    case FlagKind::FloatList:
    case FlagKind::StringList: {
      if (tokens.empty() && flag.nargs == Nargs::Plus) {
        error = "`" + name + "` expects one or more values (" + kind_word(flag.kind) + ")";
        return false;
      }
      if (flag.kind == FlagKind::IntList) {
        std::vector<int64_t> v;
        for (const std::string& t : tokens) {
          int64_t x = 0;
          if (!parse_int(t, x)) return bad(t, "integers");
          v.push_back(x);
        }
        out = v;
      } else if (flag.kind == FlagKind::FloatList) {
        std::vector<double> v;
        for (const std::string& t : tokens) {
          double x = 0;
          if (!parse_float(t, x)) return bad(t, "numbers");
          v.push_back(x);
        }
        out = v;
      } else {
        for (const std::string& t : tokens)
          if (!check_choice(t)) return false;
        out = tokens;
      }
      return true;
    }
  }
  error = "internal: unknown flag kind";
  return false;
}

FlagValue default_flag_value(const FlagSpec& flag) {
  const bool is_bool = flag.kind == FlagKind::StoreTrue || flag.kind == FlagKind::StoreFalse;
  if (flag.default_value == nullptr) {
    if (is_bool) return flag.kind == FlagKind::StoreFalse;
    return std::monostate{};
  }
  std::string text(flag.default_value);
  if (text == "None") return std::monostate{};
  FlagValue v;
  std::string error;
  std::vector<std::string> tokens;
  if (flag.kind == FlagKind::String) {
    tokens.push_back(text);  // may be "" or contain spaces
  } else if (!is_bool) {
    tokens = split_words(text);
  }
  if (is_bool) return text == "true";
  if (!parse_flag_value(flag, tokens, v, error)) return std::monostate{};
  return v;
}

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest %e representation that round-trips.
  char buf[64];
  for (int p = 0; p <= 17; ++p) {
    std::snprintf(buf, sizeof(buf), "%.*e", p, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s(buf);
  const bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  const size_t epos = s.find('e');
  std::string mant = s.substr(0, epos);
  const int exp10 = std::atoi(s.c_str() + epos + 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp10 < -4 || exp10 >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out.append(1, '.').append(digits, 1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += e;
  } else if (exp10 < 0) {
    out = std::string("0.").append(static_cast<size_t>(-exp10 - 1), '0').append(digits);
  } else {
    const size_t int_len = static_cast<size_t>(exp10) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len).append(1, '.').append(digits, int_len);
    }
  }
  return neg ? "-" + out : out;
}

std::string python_repr(const FlagValue& value) {
  struct Visitor {
    std::string operator()(std::monostate) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return python_float_repr(v); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
      return out + "]";
    }
    std::string operator()(const std::vector<double>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_float_repr(v[i]);
      return out + "]";
    }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", '" : "'") + v[i] + "'";
      return out + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

namespace {

struct CommandLineText {
  std::string operator()(std::monostate) const { return "None"; }
  std::string operator()(bool) const { return ""; }
  std::string operator()(int64_t v) const { return std::to_string(v); }
  std::string operator()(double v) const { return python_float_repr(v); }
  std::string operator()(const std::string& s) const {
    return s.find(' ') == std::string::npos && !s.empty() ? s : "\"" + s + "\"";
  }
  template <typename T>
  std::string operator()(const std::vector<T>& v) const {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ' ';
      out += (*this)(v[i]);
    }
    return out;
  }
};

}  // namespace

std::string command_line_text(const FlagValue& value) {
  return std::visit(CommandLineText{}, value);
}

}  // namespace detail

// ------------------------------------------------------------------------------------------ lookup

const FlagSpec* find_flag(std::string_view name) {
  for (const FlagSpec& f : flag_table())
    if (f.name == name) return &f;
  return nullptr;
}

std::string flag_dest(const FlagSpec& flag) {
  if (!flag.dest.empty()) return std::string(flag.dest);
  std::string d(flag.name.substr(2));
  std::replace(d.begin(), d.end(), '-', '_');
  return d;
}

bool flag_takes_value(const FlagSpec& flag) {
  return flag.kind != FlagKind::StoreTrue && flag.kind != FlagKind::StoreFalse;
}

namespace {

size_t lcs_length(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::span<const std::pair<std::string_view, std::string_view>> flag_aliases() {
  // Without these, edit distance alone offered `--error-injection-rate` for `--learning-rate`.
  static constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
      // learning rate and its schedule
      {"--learning-rate", "--lr"},
      {"--max-learning-rate", "--lr"},
      {"--max-lr", "--lr"},
      {"--min-learning-rate", "--min-lr"},
      {"--end-learning-rate", "--min-lr"},
      {"--warmup-steps", "--lr-warmup-iters"},
      {"--num-warmup-steps", "--lr-warmup-iters"},
      {"--warmup-iters", "--lr-warmup-iters"},
      {"--warmup-ratio", "--lr-warmup-fraction"},
      {"--lr-scheduler-type", "--lr-decay-style"},
      {"--lr-scheduler", "--lr-decay-style"},
      {"--lr-schedule", "--lr-decay-style"},
      {"--decay-steps", "--lr-decay-iters"},
      // optimizer
      {"--max-grad-norm", "--clip-grad"},
      {"--grad-clip", "--clip-grad"},
      {"--gradient-clipping", "--clip-grad"},
      {"--clip-grad-norm", "--clip-grad"},
      {"--adam-epsilon", "--adam-eps"},
      {"--beta1", "--adam-beta1"},
      {"--beta2", "--adam-beta2"},
      {"--optim", "--optimizer"},
      // length of the run and batches
      {"--max-steps", "--train-iters"},
      {"--num-train-steps", "--train-iters"},
      {"--train-steps", "--train-iters"},
      {"--total-steps", "--train-iters"},
      {"--num-iterations", "--train-iters"},
      {"--per-device-train-batch-size", "--micro-batch-size"},
      {"--train-micro-batch-size-per-gpu", "--micro-batch-size"},
      {"--train-batch-size", "--global-batch-size"},
      {"--total-batch-size", "--global-batch-size"},
      {"--gradient-accumulation-steps", "--global-batch-size"},
      // model shape (Hugging Face config names)
      {"--num-hidden-layers", "--num-layers"},
      {"--n-layers", "--num-layers"},
      {"--n-layer", "--num-layers"},
      {"--d-model", "--hidden-size"},
      {"--hidden-dim", "--hidden-size"},
      {"--n-embd", "--hidden-size"},
      {"--num-heads", "--num-attention-heads"},
      {"--n-heads", "--num-attention-heads"},
      {"--n-head", "--num-attention-heads"},
      {"--num-key-value-heads", "--num-query-groups"},
      {"--n-kv-heads", "--num-query-groups"},
      {"--intermediate-size", "--ffn-hidden-size"},
      {"--ffn-dim", "--ffn-hidden-size"},
      {"--max-seq-length", "--seq-length"},
      {"--max-seq-len", "--seq-length"},
      {"--seq-len", "--seq-length"},
      {"--sequence-length", "--seq-length"},
      {"--context-length", "--seq-length"},
      {"--rope-theta", "--rotary-base"},
      {"--rms-norm-eps", "--norm-epsilon"},
      {"--layer-norm-eps", "--norm-epsilon"},
      {"--layernorm-epsilon", "--norm-epsilon"},
      {"--initializer-range", "--init-method-std"},
      {"--num-local-experts", "--num-experts"},
      {"--num-experts-per-tok", "--moe-router-topk"},
      {"--gradient-checkpointing", "--recompute-activations"},
      {"--bfloat16", "--bf16"},
      // parallel sizes
      {"--tp", "--tensor-model-parallel-size"},
      {"--pp", "--pipeline-model-parallel-size"},
      {"--cp", "--context-parallel-size"},
      {"--ep", "--expert-model-parallel-size"},
      // files and intervals
      {"--output-dir", "--save"},
      {"--save-dir", "--save"},
      {"--checkpoint-dir", "--save"},
      {"--resume-from-checkpoint", "--load"},
      {"--save-steps", "--save-interval"},
      {"--eval-steps", "--eval-interval"},
      {"--logging-steps", "--log-interval"},
      {"--logging-dir", "--tensorboard-dir"},
      {"--dataset", "--data-path"},
      {"--tokenizer-name", "--tokenizer-model"},
      {"--tokenizer-path", "--tokenizer-model"},
  };
  return kAliases;
}

std::string nearest_flag(std::string_view unknown_as_typed, std::span<const FlagSpec> table) {
  std::string unknown(unknown_as_typed);
  std::replace(unknown.begin(), unknown.end(), '_', '-');
  auto in_table = [&](std::string_view name) {
    return std::any_of(table.begin(), table.end(), [&](const FlagSpec& f) { return f.name == name; });
  };
  if (unknown != unknown_as_typed && in_table(unknown)) return unknown;  // --global_batch_size
  for (const auto& [alias, flag] : flag_aliases())
    if (alias == unknown && in_table(flag)) return std::string(flag);
  // Plain edit distance ties "--tensor-parallel-size" between --tensor-model-parallel-size
  // (6 insertions) and --context-parallel-size (6 edits); the longest-common-subsequence ratio
  // (what difflib uses) prefers the flag that contains everything the user typed.
  std::string_view best;
  double best_ratio = 0.0;
  size_t best_dist = 0;
  for (const FlagSpec& f : table) {
    const double ratio = 2.0 * static_cast<double>(lcs_length(unknown, f.name)) /
                         static_cast<double>(unknown.size() + f.name.size());
    const size_t dist = edit_distance(unknown, f.name);
    if (best.empty() || ratio > best_ratio || (ratio == best_ratio && dist < best_dist)) {
      best = f.name;
      best_ratio = ratio;
      best_dist = dist;
    }
  }
  return best_ratio >= 0.6 ? std::string(best) : std::string();
}

const char* flag_group_title(FlagGroup group) {
  switch (group) {
    case FlagGroup::Parallel: return "parallelism";
    case FlagGroup::Model: return "model architecture";
    case FlagGroup::MoE: return "mixture of experts";
    case FlagGroup::Training: return "training";
    case FlagGroup::LearningRate: return "learning rate";
    case FlagGroup::Precision: return "mixed precision";
    case FlagGroup::Data: return "data and tokenizer";
    case FlagGroup::Checkpoint: return "checkpointing";
    case FlagGroup::Logging: return "evaluation and logging";
    case FlagGroup::Diffusion: return "diffusion LM (MegaDLMs)";
    case FlagGroup::Megadlm: return "megadlm";
    case FlagGroup::Other: return "other Megatron-LM flags";
    case FlagGroup::kCount: break;
  }
  return "?";
}

const char* flag_status_name(FlagStatus status) {
  switch (status) {
    case FlagStatus::Implemented: return "implemented";
    case FlagStatus::NotYet: return "not supported yet";
    case FlagStatus::Ignored: return "ignored";
    case FlagStatus::Removed: return "removed";
  }
  return "?";
}

// ------------------------------------------------------------------------------------ self-check

std::vector<std::string> check_flag_table(std::span<const FlagSpec> table) {
  std::vector<std::string> problems;
  std::set<std::string_view> names;
  std::map<std::string, const FlagSpec*> first_of_dest;
  for (const FlagSpec& f : table) {
    const std::string n(f.name);
    if (!names.insert(f.name).second) problems.push_back(n + ": duplicate flag");
    if (f.name.size() < 3 || f.name.substr(0, 2) != "--" || f.name[2] == '-')
      problems.push_back(n + ": flags are spelled --kebab-case");
    for (char c : f.name.substr(2))
      if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
            c == '-' || c == '_'))
        problems.push_back(n + ": unexpected character in flag name");
    if (f.help.empty()) problems.push_back(n + ": no help text");
    if (f.kind == FlagKind::StoreFalse && f.dest.empty())
      problems.push_back(n + ": a store_false flag must name its dest");
    if (f.status == FlagStatus::Removed && f.hint.empty())
      problems.push_back(n + ": a removed flag needs a replacement hint");
    const std::string dest = flag_dest(f);
    auto [it, inserted] = first_of_dest.emplace(dest, &f);
    if (!inserted && (it->second->kind != f.kind ||
                      detail::python_repr(detail::default_flag_value(*it->second)) !=
                          detail::python_repr(detail::default_flag_value(f))))
      problems.push_back(n + ": shares dest '" + dest + "' with " + std::string(it->second->name) +
                         " but not its kind and default");
    for (const std::string& v : detail::split_words(f.not_yet))
      if (!detail::word_in(f.choices, v))
        problems.push_back(n + ": not-yet value '" + v + "' is not among its choices");
    // The default must parse and lie in the flag's own choices (MegaDLMs' `--base-model` default
    // Qwen_2 was not).
    if (f.default_value != nullptr && std::string_view(f.default_value) != "None") {
      const bool is_bool = f.kind == FlagKind::StoreTrue || f.kind == FlagKind::StoreFalse;
      if (is_bool) {
        problems.push_back(n + ": boolean flags take their natural default or None");
      } else {
        std::vector<std::string> tokens = f.kind == FlagKind::String
                                              ? std::vector<std::string>{f.default_value}
                                              : detail::split_words(f.default_value);
        detail::FlagValue v;
        std::string error;
        if (!detail::parse_flag_value(f, tokens, v, error))
          problems.push_back(n + ": default '" + std::string(f.default_value) +
                             "' is not a valid value: " + error);
        else if (f.kind == FlagKind::String && detail::word_in(f.not_yet, f.default_value))
          problems.push_back(n + ": default is a not-yet value");
      }
    }
  }
  for (std::string& p : detail::check_flag_ranges(table)) problems.push_back(std::move(p));
  return problems;
}

// ------------------------------------------------------------------------------- help and docs

namespace {

std::string metavar(const FlagSpec& f) {
  std::string choice_list;
  for (const std::string& w : detail::split_words(f.choices)) choice_list += (choice_list.empty() ? "" : "|") + w;
  switch (f.kind) {
    case FlagKind::StoreTrue:
    case FlagKind::StoreFalse: return "";
    case FlagKind::Int: return f.choices.empty() ? "INT" : "{" + choice_list + "}";
    case FlagKind::Float: return "FLOAT";
    case FlagKind::String: return f.choices.empty() ? "STR" : "{" + choice_list + "}";
    case FlagKind::IntList: return f.nargs == Nargs::Plus ? "INT [INT ...]" : "[INT ...]";
    case FlagKind::FloatList: return f.nargs == Nargs::Plus ? "FLOAT [FLOAT ...]" : "[FLOAT ...]";
    case FlagKind::StringList: {
      const std::string one = f.choices.empty() ? "STR" : "{" + choice_list + "}";
      return f.nargs == Nargs::Plus ? one + " [" + one + " ...]" : "[" + one + " ...]";
    }
  }
  return "";
}

std::string default_text(const FlagSpec& f) {
  if (!f.default_doc.empty()) return std::string(f.default_doc);
  return detail::python_repr(detail::default_flag_value(f));
}

std::string status_note(const FlagSpec& f) {
  std::string note;
  if (f.status == FlagStatus::NotYet) note = "not supported yet: a non-default value is rejected";
  if (f.status == FlagStatus::Ignored) note = "ignored: accepted with a warning, has no effect";
  if (f.status == FlagStatus::Removed) note = "removed from Megatron-LM: " + std::string(f.hint);
  if ((f.status == FlagStatus::Ignored || f.status == FlagStatus::NotYet) && !f.hint.empty())
    note += " (" + std::string(f.hint) + ")";
  if (!f.not_yet.empty()) {
    std::string values;
    for (const std::string& w : detail::split_words(f.not_yet)) values += (values.empty() ? "" : ", ") + w;
    note = "not supported yet: " + values;
  }
  return note;
}

// Greedy word wrap with a hanging indent.
std::string wrap(const std::string& text, size_t indent, size_t width) {
  std::string out, line;
  for (const std::string& w : detail::split_words(text)) {
    if (!line.empty() && indent + line.size() + 1 + w.size() > width) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + w;
  }
  if (!line.empty()) out += std::string(indent, ' ') + line + "\n";
  return out;
}

std::string markdown_cell(std::string text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else out += c;
  }
  return out;
}

}  // namespace

std::string format_help(std::string_view program) {
  std::ostringstream os;
  os << "usage: " << program << " [FLAG ...] [@FILE ...]\n\n"
     << "Trains a masked-diffusion (or autoregressive) language model. Flags are Megatron-LM /\n"
     << "MegaDLMs flags with their meanings and defaults; @FILE reads more flags from a file\n"
     << "(whitespace separated, # starts a comment). See docs/flags.md for the same list.\n";
  for (int g = 0; g < static_cast<int>(FlagGroup::kCount); ++g) {
    os << "\n" << flag_group_title(static_cast<FlagGroup>(g)) << ":\n";
    for (const FlagSpec& f : flag_table()) {
      if (static_cast<int>(f.group) != g) continue;
      std::string head = "  " + std::string(f.name);
      if (f.name == "--help") head = "  -h, --help";
      const std::string mv = metavar(f);
      if (!mv.empty()) head += " " + mv;
      os << head << "\n";
      std::string body(f.help);
      if (!f.range.empty()) body += " Valid: " + std::string(f.range) + ".";
      if (flag_takes_value(f) || f.default_value != nullptr) body += " (default: " + default_text(f) + ")";
      const std::string note = status_note(f);
      if (!note.empty()) body += " [" + note + "]";
      os << wrap(body, 8, 100);
    }
  }
  return os.str();
}

std::string format_flags_markdown() {
  std::ostringstream os;
  os << "<!-- autogenerated by scripts/gen_flags_doc.sh, do not edit -->\n"
     << "# pretrain_difflm flags\n\n"
     << "Generated from the flag table in `src/training/arguments/flag_table.cpp`; the same table drives the\n"
     << "parser and `--help`. Flags keep their Megatron-LM / MegaDLMs spellings, defaults and\n"
     << "meanings; where megadlm differs, `docs/compat.md` says why. Values are validated before\n"
     << "anything starts; each error names the rule it breaks (`docs/rules.md`). Flags may also come\n"
     << "from files: `pretrain_difflm @configs/tiny_dlm.args`.\n\n"
     << "Status:\n\n"
     << "- **implemented**: honoured. The parallel sizes are implemented at every size a layout\n"
     << "  validates for (`docs/parallelism/`); `--dry-run --world-size N` checks a layout without\n"
     << "  running it.\n"
     << "- **not supported yet**: parsed and validated; a non-default value is rejected with\n"
     << "  \"`--flag VALUE` is not supported yet by megadlm\" (listed, not rejected, by `--dry-run`).\n"
     << "- **ignored**: accepted with one warning; it has no effect in megadlm.\n"
     << "- **removed**: removed from Megatron-LM; always an error naming the replacement.\n";
  for (int g = 0; g < static_cast<int>(FlagGroup::kCount); ++g) {
    os << "\n## " << flag_group_title(static_cast<FlagGroup>(g)) << "\n\n"
       << "| Flag | Value | Default | Status | Description |\n"
       << "|---|---|---|---|---|\n";
    for (const FlagSpec& f : flag_table()) {
      if (static_cast<int>(f.group) != g) continue;
      std::string status = flag_status_name(f.status);
      if (!f.not_yet.empty()) {
        std::string values;
        for (const std::string& w : detail::split_words(f.not_yet))
          values += (values.empty() ? "" : ", ") + w;
        status += "; not yet: " + values;
      }
      std::string description(f.help);
      if (!f.range.empty()) description += " Valid: " + std::string(f.range) + ".";
      if (!f.hint.empty()) description += " *" + std::string(f.hint) + ".*";
      const std::string mv = metavar(f);
      os << "| `" << f.name << "` | " << (mv.empty() ? std::string() : detail::backticked(markdown_cell(mv)))
         << " | `" << markdown_cell(default_text(f)) << "` | " << status << " | "
         << markdown_cell(description) << " |\n";
    }
  }
  return os.str();
}

}  // namespace megadlm::training
