#include "megadlm/data/gpt_dataset.h"
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <ostream>
#include <sstream>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/core/logging.h"

namespace megadlm::data {

namespace {

// ------------------------------------------------------------------------------ small helpers

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// Python's round() on a double: half to even (std::nearbyint in the default rounding mode).
int64_t py_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

void log_line(const GptDatasetOptions& o, const std::string& s) {
  if (o.log != nullptr) *o.log << s << "\n";
}

// --------------------------------------------------------- .npy files (the index cache format)
// numpy's format 1.0: magic, version, header length, a Python-literal header padded to 64 bytes.

template <typename T>
const char* npy_descr();
template <> const char* npy_descr<int16_t>() { return "<i2"; }
template <> const char* npy_descr<int32_t>() { return "<i4"; }
template <> const char* npy_descr<int64_t>() { return "<i8"; }

template <typename T>
void write_npy(const std::string& path, const std::vector<T>& v, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(v.size()) / cols;
  // (Appends, not operator+: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string.)
  std::string shape;
  shape.append("(").append(std::to_string(rows));
  if (cols == 1) shape.append(",)");
  else shape.append(", ").append(std::to_string(cols)).append(")");
  std::string header;
  header.append("{'descr': '").append(npy_descr<T>()).append("', 'fortran_order': False, 'shape': ");
  header.append(shape).append(", }");
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) MDLM_FAIL("cannot write the dataset index cache file ", tmp, " (--data-cache-path)");
    const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
    f.write(magic, 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    f.write(reinterpret_cast<const char*>(&len), 2);
    f << header;
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
    if (!f) MDLM_FAIL("write failed: ", tmp, " (--data-cache-path)");
  }
  std::filesystem::rename(tmp, path);  // readers never see a half-written file
}

/// Reads an .npy written by write_npy; false if it is missing or does not hold `count` T's.
template <typename T>
bool read_npy(const std::string& path, std::vector<T>& v, int64_t count) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  char magic[8];
  uint16_t len = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0 || !f.read(reinterpret_cast<char*>(&len), 2))
    return false;
  std::string header(len, '\0');
  if (!f.read(header.data(), len) || header.find(npy_descr<T>()) == std::string::npos) return false;
  v.resize(static_cast<size_t>(count));
  if (!f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(T)))) return false;
  f.peek();
  return f.eof();  // exactly `count` elements: a longer file was written for other parameters
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) MDLM_FAIL("cannot write the dataset index cache file ", tmp, " (--data-cache-path)");
  }
  std::filesystem::rename(tmp, path);
}

std::vector<double> normalize(const std::vector<double>& w) {
  double sum = 0;
  for (double x : w) sum += x;
  std::vector<double> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = w[i] / sum;
  return out;
}

// A cached index file that fails its check: which file, and what is wrong with it.
struct CacheDamage {
  std::string file, what;
};

void report_damage(const GptDatasetOptions& o, const CacheDamage& d) {
  const std::string msg = "the dataset index cache file " + d.file + " (--data-cache-path) is damaged: " +
                          d.what + "; rebuilding the indices" + (o.write_cache ? " and rewriting the file" : "");
  logging::warn(msg);
  log_line(o, " > " + msg);
}

}  // namespace

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  return "?";
}

// -------------------------------------------------------------------------- NumpyRandomState

uint64_t NumpyRandomState::interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int s = 1; s <= 32; s <<= 1) mask |= mask >> s;  // smallest 2^k - 1 >= max
  uint64_t v;
  if (max <= 0xffffffffull) {
    do v = static_cast<uint64_t>(mt_()) & mask; while (v > max);
  } else {
    do {
      const uint64_t hi = mt_();
      v = ((hi << 32) | mt_()) & mask;
    } while (v > max);
  }
  return v;
}

// ------------------------------------------------------------------------- split and blend

SplitMatrix parse_split(const std::string& split) {
  // Megatron reads the numbers with the pattern [.0-9]+, which drops a minus sign ("100,-5,5"
  // becomes 100, 5, 5) and skips a "nan": the splits would not be what was typed. Each word
  // between separators (commas, slashes as in Megatron's legacy --split, whitespace) is read
  // whole and must be a finite number >= 0.
  const std::string valid = "; valid: 1 to 3 finite proportions >= 0 for train, valid and test, not all 0 "
                            "(example: 969,30,1)";
  std::vector<double> v;
  std::vector<std::string> words;
  std::string word;
  for (size_t i = 0; i <= split.size(); ++i) {
    const char c = i < split.size() ? split[i] : ',';
    if (c == ',' || c == '/' || std::isspace(static_cast<unsigned char>(c))) {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word.push_back(c);
    }
  }
  for (const std::string& w : words) {
    char* end = nullptr;
    const double x = std::strtod(w.c_str(), &end);
    if (end == w.c_str() || *end != '\0')
      MDLM_FAIL("--split \"", split, "\": cannot read \"", w, "\" as a number", valid);
    if (!std::isfinite(x))
      MDLM_FAIL("--split \"", split, "\": the proportion \"", w, "\" is not a finite number", valid);
    if (x < 0)
      MDLM_FAIL("--split \"", split, "\": the proportion \"", w, "\" is negative", valid);
    v.push_back(x);
  }
  if (v.empty() || v.size() > 3)
    MDLM_FAIL("--split \"", split, "\": expected 1 to 3 proportions for train, valid and test "
              "(example: 969,30,1), found ", v.size());
  v.resize(3, 0.0);
  double sum = 0;
  for (double x : v) sum += x;
  if (!(sum > 0)) MDLM_FAIL("--split \"", split, "\": the proportions add up to 0", valid);
  if (!std::isfinite(sum))
    MDLM_FAIL("--split \"", split, "\": the proportions add up to more than the largest number", valid);
  for (double& x : v) x /= sum;
  SplitMatrix m;
  double at = 0;
  for (int s = 0; s < 3; ++s) {
    const double end = at + v[static_cast<size_t>(s)];
    if (end > at) m[static_cast<size_t>(s)] = std::make_pair(at, end);
    at = end;
  }
  return m;
}

Blend parse_blend(const std::vector<std::string>& values, const std::string& flag) {
  Blend b;
  if (values.empty()) MDLM_FAIL(flag, " needs a dataset prefix or `weight prefix` pairs");
  auto as_number = [](const std::string& s, double& out) {
    char* end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return !s.empty() && end != s.c_str() && *end == '\0';
  };
  if (values.size() % 2 == 1) {  // prefixes only (Megatron: any odd count)
    // Unless it starts with a weight: then a weight or a prefix is missing, and Megatron would
    // go looking for a dataset named like the weight. Say so before any file is opened.
    double w = 0;
    if (values.size() > 1 && as_number(values[0], w))
      MDLM_FAIL(flag, ": ", values.size(), " words starting with the weight ", values[0],
                ": a weighted blend is `weight prefix` pairs, an even count (is a weight or a "
                "prefix missing?)");
    b.prefixes = values;
    return b;
  }
  std::vector<std::string> bad;
  int parsed = 0;
  for (size_t i = 0; i < values.size(); i += 2) {
    double w = 0;
    if (as_number(values[i], w)) {
      ++parsed;
      if (!(w > 0) || !std::isfinite(w))
        MDLM_FAIL(flag, ": blend weight ", values[i], " of ", values[i + 1], " must be a positive number");
      b.weights.push_back(w);
      b.prefixes.push_back(values[i + 1]);
    } else {
      bad.push_back(values[i]);
    }
  }
  if (parsed == 0) {  // an even number of prefixes, no weights
    b.prefixes = values;
    b.weights.clear();
    return b;
  }
  if (!bad.empty()) {
    std::string list;
    for (const auto& s : bad) {
      if (!list.empty()) list += ", ";
      list.append("\"").append(s).append("\"");
    }
    MDLM_FAIL(flag, ": unparsable blend weight(s) ", list, "; a blend is `weight prefix weight "
              "prefix ...` (e.g. `0.3 /data/a_text_document 0.7 /data/b_text_document`) "
              "or prefixes only");
  }
  // The weights are normalised by their sum: a sum that overflows (1e308 1e308) would turn
  // every weight into 0 and the error would come from the sample counts.
  double sum = 0;
  for (double w : b.weights) sum += w;
  if (!std::isfinite(sum)) {
    std::string list;
    for (size_t i = 0; i < b.weights.size(); ++i) {
      if (!list.empty()) list += ", ";
      list.append(values[2 * i]).append(" (").append(b.prefixes[i]).append(")");
    }
    MDLM_FAIL(flag, ": the blend weights ", list, " add up to more than the largest number a double "
              "holds; scale them down (only their ratios matter, e.g. 1 and 1 for two equal weights)");
  }
  return b;
}

// ------------------------------------------------------------------- files holding the blends

namespace {

// The whole file; `flag` and `path` name it in the errors.
std::string read_blend_file(const char* flag, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    MDLM_FAIL(flag, " ", path, ": is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) MDLM_FAIL(flag, " ", path, ": cannot read the file (", std::strerror(errno), ")");
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) MDLM_FAIL(flag, " ", path, ": error while reading the file");
  return text.str();
}

// Python's str.split(): the words between runs of whitespace.
std::vector<std::string> whitespace_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

}  // namespace

std::vector<std::string> read_data_args_file(const std::string& path) {
  const char* const flag = "--data-args-path";
  std::vector<std::string> words = whitespace_words(read_blend_file(flag, path));
  if (words.empty())
    MDLM_FAIL(flag, " ", path, ": the file is empty; it should hold what --data-path takes: a "
              "dataset prefix, prefixes, or `weight prefix` pairs");
  return words;
}

std::array<std::optional<std::vector<std::string>>, 3> read_per_split_data_args_file(
    const std::string& path) {
  const char* const flag = "--per-split-data-args-path";
  const std::string text = read_blend_file(flag, path);
  const char* const expected =
      "a JSON object with the keys \"train\", \"valid\" and \"test\", each a list of prefixes "
      "and weights (what --train-data-path takes), one string of them, or null (no data for "
      "that split), e.g. {\"train\": [\"0.7\", \"/data/a\", \"0.3\", \"/data/b\"], "
      "\"valid\": \"/data/c\", \"test\": null}";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    MDLM_FAIL(flag, " ", path, ": not valid JSON (", e.what(), "); expected ", expected);
  }
  if (!j.is_object())
    MDLM_FAIL(flag, " ", path, ": holds a JSON ", j.type_name(), "; expected ", expected);
  std::array<std::optional<std::vector<std::string>>, 3> lists;
  for (int s = 0; s < 3; ++s) {
    const char* const key = split_name(static_cast<Split>(s));
    const auto it = j.find(key);
    // Megatron reads every key (a KeyError otherwise): a missing one is more likely a typo
    // ("validation") than a wish to skip the split, which null says.
    if (it == j.end())
      MDLM_FAIL(flag, " ", path, ": no \"", key, "\" key; expected ", expected);
    const nlohmann::json& v = *it;
    if (v.is_null()) {
      if (s == 0)
        MDLM_FAIL(flag, " ", path, ": \"train\" is null; the training split needs a dataset "
                  "prefix or `weight prefix` pairs");
      continue;
    }
    std::vector<std::string> words;
    if (v.is_string()) {
      words = whitespace_words(v.get<std::string>());
    } else if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i].is_string()) words.push_back(v[i].get<std::string>());
        else if (v[i].is_number()) words.push_back(v[i].dump());  // a weight, as Megatron allows
        else
          MDLM_FAIL(flag, " ", path, ": \"", key, "\"[", i, "] is a JSON ", v[i].type_name(),
                    "; the list holds dataset prefixes (strings) and weights (numbers or strings)");
      }
    } else {
      MDLM_FAIL(flag, " ", path, ": \"", key, "\" is a JSON ", v.type_name(), "; expected a "
                "list of prefixes and weights, one string of them, or null (no ", key, " data)");
    }
    if (words.empty())
      MDLM_FAIL(flag, " ", path, ": \"", key, "\" is empty; give a dataset prefix or `weight "
                "prefix` pairs", s == 0 ? "" : ", or null for no " + std::string(key) + " data");
    lists[static_cast<size_t>(s)] = std::move(words);
  }
  return lists;
}

// --------------------------------------------------------------------------------- GptDataset

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, Split split, int64_t begin,
                       int64_t end, std::optional<int64_t> num_samples, const GptDatasetOptions& options)
    : data_(std::move(data)), split_(split), begin_(begin), end_(end), num_samples_(num_samples),
      options_(options) {
  MDLM_CHECK(options_.seq_length > 1, "GPT samples need --seq-length > 1, got ", options_.seq_length);
  MDLM_CHECK(begin >= 0 && begin <= end && end <= data_->num_sequences(), "split range [", begin,
             ", ", end, ") outside the ", data_->num_sequences(), " sequences of ", data_->prefix());
  if (begin == end)
    MDLM_FAIL(data_->prefix(), ": the ", split_name(split), " split gets no sequences (",
              data_->num_sequences(), " sequences in all); give more data or change --split");
  build();
}

std::string GptDataset::description() const {
  nlohmann::ordered_json j;
  j["format"] = "megadlm GPT indices 1";
  j["class"] = "GPTDataset";
  j["dataset_path"] = data_->prefix();
  j["idx_sequences"] = data_->num_sequences();
  j["idx_documents"] = data_->num_documents();
  j["idx_tokens"] = data_->num_tokens();
  j["index_split"] = split_name(split_);
  j["sequence_range"] = {begin_, end_};
  j["num_samples"] = num_samples_ ? nlohmann::ordered_json(*num_samples_) : nlohmann::ordered_json();
  j["random_seed"] = options_.seed;
  j["sequence_length"] = options_.seq_length;
  j["add_extra_token_to_sequence"] = true;
  return j.dump(2);
}

void GptDataset::build() {
  const int64_t S = options_.seq_length;
  int64_t tokens = 0;
  for (int64_t i = begin_; i < end_; ++i) tokens += data_->sequence_length(i);
  if (tokens < 2)
    MDLM_FAIL(data_->prefix(), ": the ", split_name(split_), " split (sequences [", begin_, ", ",
              end_, ")) holds ", tokens, " token(s); a sample needs at least 2");
  num_epochs_ = 1;
  if (num_samples_) {
    const int64_t wanted = *num_samples_ * S + 1;
    for (int64_t have = tokens; have < wanted; have += tokens) ++num_epochs_;
  }
  const int64_t built = (num_epochs_ * tokens - 1) / S;

  std::string base, desc;
  if (!options_.cache_dir.empty()) {
    desc = description();
    base = (std::filesystem::path(options_.cache_dir) /
            (hex16(fnv1a64(desc)) + "-GPTDataset-" + split_name(split_))).string();
    if (read_text(base + "-description.json") == desc &&
        read_npy(base + "-document_index.npy", document_index_, num_epochs_ * (end_ - begin_)) &&
        read_npy(base + "-sample_index.npy", sample_index_, 2 * (built + 1)) &&
        read_npy(base + "-shuffle_index.npy", shuffle_index_, built)) {
      const std::optional<std::pair<std::string, std::string>> damage = check_indices(built);
      if (!damage) {
        from_cache_ = true;
        log_line(options_, " > loaded the GPTDataset " + std::string(split_name(split_)) +
                               " indices of " + data_->prefix() + " from " + base + "-*");
        return;
      }
      report_damage(options_, {base + "-" + damage->first, damage->second});
    }
  }

  // Separate the final epoch when it would contribute fewer than 80% of an epoch's samples.
  bool separate_final = false;
  int64_t sans_final = built;
  if (num_epochs_ > 1) {
    sans_final = ((num_epochs_ - 1) * tokens - 1) / S;
    const int64_t from_final = *num_samples_ - sans_final;
    const int64_t per_epoch = (tokens - 1) / S;
    separate_final = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  NumpyRandomState rng(options_.seed);
  auto epochs_of_documents = [&](int64_t epochs) {
    std::vector<int32_t> d;
    d.reserve(static_cast<size_t>(epochs * (end_ - begin_)));
    for (int64_t e = 0; e < epochs; ++e)
      for (int64_t i = begin_; i < end_; ++i) d.push_back(static_cast<int32_t>(i));
    rng.shuffle(d);
    return d;
  };
  if (separate_final) {
    document_index_ = epochs_of_documents(num_epochs_ - 1);
    std::vector<int32_t> last = epochs_of_documents(1);
    document_index_.insert(document_index_.end(), last.begin(), last.end());
  } else {
    document_index_ = epochs_of_documents(num_epochs_);
  }

  // Sample k starts at stream position k*S: the (entry, offset) of the document holding it.
  sample_index_.assign(static_cast<size_t>(2 * (built + 1)), 0);
  int64_t entry = 0, doc_start = 0;
  for (int64_t k = 0; k <= built; ++k) {
    const int64_t p = k * S;
    while (doc_start + data_->sequence_length(document_index_[static_cast<size_t>(entry)]) <= p) {
      doc_start += data_->sequence_length(document_index_[static_cast<size_t>(entry)]);
      ++entry;
    }
    sample_index_[static_cast<size_t>(2 * k)] = entry;
    sample_index_[static_cast<size_t>(2 * k + 1)] = p - doc_start;
  }

  shuffle_index_.resize(static_cast<size_t>(built));
  for (int64_t i = 0; i < built; ++i) shuffle_index_[static_cast<size_t>(i)] = i;
  if (separate_final) {
    std::vector<int64_t> first(shuffle_index_.begin(), shuffle_index_.begin() + sans_final);
    std::vector<int64_t> last(shuffle_index_.begin() + sans_final, shuffle_index_.end());
    rng.shuffle(first);
    rng.shuffle(last);
    std::copy(first.begin(), first.end(), shuffle_index_.begin());
    std::copy(last.begin(), last.end(), shuffle_index_.begin() + sans_final);
  } else {
    rng.shuffle(shuffle_index_);
  }

  if (!options_.cache_dir.empty() && options_.write_cache) {
    std::filesystem::create_directories(options_.cache_dir);
    write_npy(base + "-document_index.npy", document_index_, 1);
    write_npy(base + "-sample_index.npy", sample_index_, 2);
    write_npy(base + "-shuffle_index.npy", shuffle_index_, 1);
    write_text(base + "-description.json", desc);  // last: its presence marks a complete cache
    log_line(options_, " > built and cached the GPTDataset " + std::string(split_name(split_)) +
                           " indices of " + data_->prefix() + " (" + std::to_string(built) +
                           " samples, " + std::to_string(num_epochs_) + " epoch(s)) in " + base + "-*");
  } else {
    log_line(options_, " > built the GPTDataset " + std::string(split_name(split_)) + " indices of " +
                           data_->prefix() + " (" + std::to_string(built) + " samples, " +
                           std::to_string(num_epochs_) + " epoch(s))" +
                           (options_.cache_dir.empty() ? "; not cached (no --data-cache-path)" : ""));
  }
}

// The indices read from the cache, checked against what build() makes of this dataset's
// sequences: every document index entry in [begin, end) and each sequence there once per epoch;
// the sample index a pair (entry, offset) per sample, entries not decreasing, each offset inside
// its sequence, and sample k starting at stream position k*S; the shuffle index a permutation.
// Then sample() reads only inside the data. nullopt when all holds, else (file, what is wrong).
std::optional<std::pair<std::string, std::string>> GptDataset::check_indices(int64_t built) const {
  using Damage = std::optional<std::pair<std::string, std::string>>;
  auto at = [](const char* what, int64_t i, int64_t v) {
    return std::string(what) + std::to_string(i) + " = " + std::to_string(v);
  };
  const int64_t S = options_.seq_length;
  std::vector<int64_t> seen(static_cast<size_t>(end_ - begin_), 0);
  for (size_t i = 0; i < document_index_.size(); ++i) {
    const int64_t d = document_index_[i];
    if (d < begin_ || d >= end_)
      return Damage({"document_index.npy", at("entry ", static_cast<int64_t>(i), d) + " is outside the split's "
                     "sequences [" + std::to_string(begin_) + ", " + std::to_string(end_) + ")"});
    if (++seen[static_cast<size_t>(d - begin_)] > num_epochs_)
      return Damage({"document_index.npy", "sequence " + std::to_string(d) + " appears more than once per epoch (" +
                     std::to_string(num_epochs_) + " epoch(s)), at " + at("entry ", static_cast<int64_t>(i), d)});
  }
  const int64_t entries = static_cast<int64_t>(document_index_.size());
  int64_t entry = 0, entry_start = 0;  // stream position of the start of `entry`
  for (int64_t k = 0; k <= built; ++k) {
    const int64_t e = sample_index_[static_cast<size_t>(2 * k)], off = sample_index_[static_cast<size_t>(2 * k + 1)];
    if (e < entry || e >= entries)
      return Damage({"sample_index.npy", "sample " + std::to_string(k) + " starts in document index entry " +
                     std::to_string(e) + (e < entry ? ", before the previous sample's " + std::to_string(entry)
                                                    : ", past the " + std::to_string(entries) + " entries")});
    for (; entry < e; ++entry) entry_start += data_->sequence_length(document_index_[static_cast<size_t>(entry)]);
    const int64_t len = data_->sequence_length(document_index_[static_cast<size_t>(e)]);
    if (off < 0 || off >= len)
      return Damage({"sample_index.npy", "sample " + std::to_string(k) + " starts at offset " + std::to_string(off) +
                     " of a sequence of " + std::to_string(len) + " tokens"});
    if (entry_start + off != k * S)
      return Damage({"sample_index.npy", "sample " + std::to_string(k) + " starts at token " +
                     std::to_string(entry_start + off) + " of the epochs, not at " + std::to_string(k * S) +
                     " (sample x --seq-length)"});
  }
  std::vector<uint8_t> used(static_cast<size_t>(built), 0);
  for (int64_t i = 0; i < built; ++i) {
    const int64_t k = shuffle_index_[static_cast<size_t>(i)];
    if (k < 0 || k >= built)
      return Damage({"shuffle_index.npy", at("entry ", i, k) + " is outside the " + std::to_string(built) + " samples"});
    if (used[static_cast<size_t>(k)]++)
      return Damage({"shuffle_index.npy", at("entry ", i, k) + " repeats a sample (not a permutation)"});
  }
  return std::nullopt;
}

std::vector<int32_t> GptDataset::sample(int64_t index) const {
  MDLM_CHECK(index >= 0 && index < size(), data_->prefix(), " (", split_name(split_),
             "): sample ", index, " out of range [0, ", size(), ")");
  const int64_t k = shuffle_index_[static_cast<size_t>(index)];
  int64_t entry = sample_index_[static_cast<size_t>(2 * k)];
  int64_t offset = sample_index_[static_cast<size_t>(2 * k + 1)];
  const int64_t need = options_.seq_length + 1;
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(need));
  while (static_cast<int64_t>(out.size()) < need) {
    MDLM_CHECK(entry < static_cast<int64_t>(document_index_.size()), data_->prefix(),
               ": sample ", index, " runs past the document index");
    const int64_t seq = document_index_[static_cast<size_t>(entry)];
    const int64_t take = std::min<int64_t>(data_->sequence_length(seq) - offset,
                                           need - static_cast<int64_t>(out.size()));
    const size_t before = out.size();
    data_->read(seq, offset, take, out);
    if (options_.vocab_size > 0) {
      for (size_t t = before; t < out.size(); ++t)
        if (out[t] >= options_.vocab_size)
          MDLM_FAIL(data_->bin_path(), ": token id ", out[t], " at token ",
                    offset + static_cast<int64_t>(t - before), " of sequence ", seq,
                    " is outside the vocabulary [0, ", options_.vocab_size, ")");
    }
    ++entry;
    offset = 0;
  }
  return out;
}

// ----------------------------------------------------------------------------- BlendedDataset

void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index) {
  const size_t n = weights.size();
  std::vector<int64_t> taken(n, 0);
  dataset_index.resize(static_cast<size_t>(size));
  dataset_sample_index.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    const double at = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * at - static_cast<double>(taken[0]);
    for (size_t d = 1; d < n; ++d) {
      const double e = weights[d] * at - static_cast<double>(taken[d]);
      if (e > best_error) {
        best_error = e;
        best = d;
      }
    }
    dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    dataset_sample_index[static_cast<size_t>(i)] = taken[best]++;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const GptDataset>> datasets,
                               std::vector<double> weights, int64_t size,
                               const GptDatasetOptions& options)
    : datasets_(std::move(datasets)), weights_(normalize(weights)), options_(options) {
  MDLM_CHECK(!datasets_.empty() && datasets_.size() == weights_.size() && datasets_.size() < 32767,
             "a blend needs 1 to 32766 datasets with one weight each");
  std::string base, desc;
  if (!options_.cache_dir.empty()) {
    nlohmann::ordered_json j;
    j["format"] = "megadlm blend indices 1";
    j["class"] = "BlendedDataset";
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    for (const auto& d : datasets_)
      parts.push_back({{"dataset_path", d->indexed().prefix()}, {"size", d->size()},
                       {"epochs", d->num_epochs()}});
    j["datasets"] = parts;
    j["split"] = split_name(datasets_[0]->split());
    j["weights"] = weights_;
    j["size"] = size;
    desc = j.dump(2);
    base = (std::filesystem::path(options_.cache_dir) /
            (hex16(fnv1a64(desc)) + "-BlendedDataset-" + split_name(datasets_[0]->split()))).string();
  }
  bool hit = !base.empty() && read_text(base + "-description.json") == desc &&
             read_npy(base + "-dataset_index.npy", dataset_index_, size) &&
             read_npy(base + "-dataset_sample_index.npy", dataset_sample_index_, size);
  if (hit) {
    // What build_blending_indices makes: dataset ids in range, each dataset's samples taken in
    // order 0, 1, 2, ..., and no dataset asked for more samples than it has (the check below
    // would blame the weights for a damaged file).
    std::vector<int64_t> taken(datasets_.size(), 0);
    for (int64_t i = 0; i < size && hit; ++i) {
      const int64_t d = dataset_index_[static_cast<size_t>(i)], k = dataset_sample_index_[static_cast<size_t>(i)];
      std::optional<CacheDamage> damage;
      if (d < 0 || d >= static_cast<int64_t>(datasets_.size()))
        damage = CacheDamage{base + "-dataset_index.npy", "entry " + std::to_string(i) + " = " + std::to_string(d) +
                             " is not one of the " + std::to_string(datasets_.size()) + " datasets"};
      else if (k != taken[static_cast<size_t>(d)] || k >= datasets_[static_cast<size_t>(d)]->size())
        damage = CacheDamage{base + "-dataset_sample_index.npy",
                             "entry " + std::to_string(i) + " = " + std::to_string(k) + " is not sample " +
                                 std::to_string(taken[static_cast<size_t>(d)]) + " of dataset " + std::to_string(d) +
                                 " (" + std::to_string(datasets_[static_cast<size_t>(d)]->size()) + " samples)"};
      else
        ++taken[static_cast<size_t>(d)];
      if (damage) {
        report_damage(options_, *damage);
        hit = false;
      }
    }
  }
  if (!hit) {
    build_blending_indices(weights_, size, dataset_index_, dataset_sample_index_);
    if (!base.empty() && options_.write_cache) {
      std::filesystem::create_directories(options_.cache_dir);
      write_npy(base + "-dataset_index.npy", dataset_index_, 1);
      write_npy(base + "-dataset_sample_index.npy", dataset_sample_index_, 1);
      write_text(base + "-description.json", desc);
    }
  }
  // Megatron's check: no dataset may be asked for more samples than it built.
  std::vector<int64_t> used(datasets_.size(), 0);
  for (int16_t d : dataset_index_) ++used[static_cast<size_t>(d)];
  for (size_t d = 0; d < datasets_.size(); ++d)
    if (used[d] > datasets_[d]->size())
      MDLM_FAIL("the ", split_name(datasets_[0]->split()), " blend draws ", used[d], " samples from ",
                datasets_[d]->indexed().prefix(), " which has ", datasets_[d]->size(),
                "; use --renormalize-blend-weights");
  log_line(options_, std::string(" > ") + (hit ? "loaded" : "built") + " the " +
                         split_name(datasets_[0]->split()) + " blend of " +
                         std::to_string(datasets_.size()) + " datasets (" + std::to_string(size) +
                         " samples)");
}

std::vector<int32_t> BlendedDataset::sample(int64_t index) const {
  MDLM_CHECK(index >= 0 && index < size(), "blended ", split_name(datasets_[0]->split()),
             " dataset: sample ", index, " out of range [0, ", size(), ")");
  const size_t i = static_cast<size_t>(index);
  return datasets_[static_cast<size_t>(dataset_index_[i])]->sample(dataset_sample_index_[i]);
}

// ------------------------------------------------------------------------------ the builder

SplitDatasets build_gpt_datasets(const DataSources& sources,
                                 const std::array<std::optional<int64_t>, 3>& num_samples,
                                 const GptDatasetOptions& options) {
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened;
  auto open = [&](const std::string& prefix) {
    auto it = opened.find(prefix);
    if (it != opened.end()) return it->second;
    auto d = std::make_shared<const IndexedDataset>(prefix);
    if (options.vocab_size > 0) d->check_token_ids(options.vocab_size, 4ull << 30);
    log_line(options, " > " + prefix + ": " + std::to_string(d->num_documents()) + " documents, " +
                          std::to_string(d->num_sequences()) + " sequences, " +
                          std::to_string(d->num_tokens()) + " tokens (" +
                          index_dtype_name(d->dtype()) + ")");
    opened.emplace(prefix, d);
    return std::shared_ptr<const IndexedDataset>(d);
  };
  // One blend cut into the splits of `matrix`; only the splits in `wanted` are built.
  auto build_blend = [&](const Blend& blend, const SplitMatrix& matrix, SplitDatasets& out,
                         const std::array<bool, 3>& wanted) {
    const bool weighted = !blend.weights.empty();
    const std::vector<double> w = weighted ? normalize(blend.weights) : std::vector<double>{};
    std::array<std::vector<std::shared_ptr<const GptDataset>>, 3> mid;
    std::array<std::vector<int64_t>, 3> requested;  // samples each dataset was asked for
    for (size_t b = 0; b < blend.prefixes.size(); ++b) {
      auto data = open(blend.prefixes[b]);
      const int64_t n = data->num_sequences();
      for (size_t s = 0; s < 3; ++s) {
        if (!wanted[s] || !matrix[s]) continue;
        const int64_t beg = py_round(matrix[s]->first * static_cast<double>(n));
        const int64_t end = py_round(matrix[s]->second * static_cast<double>(n));
        std::optional<int64_t> want;
        if (blend.prefixes.size() == 1 && !weighted) {
          want = num_samples[s];
        } else if (weighted) {  // 0.5% margin so the blend is satisfied
          want = static_cast<int64_t>(std::ceil(static_cast<double>(*num_samples[s]) * w[b] * 1.005));
          requested[s].push_back(*want);
        }
        mid[s].push_back(std::make_shared<const GptDataset>(data, static_cast<Split>(s), beg, end, want, options));
      }
    }
    for (size_t s = 0; s < 3; ++s) {
      if (mid[s].empty()) continue;
      if (blend.prefixes.size() == 1 && !weighted) {
        out.splits[s] = mid[s][0];
        continue;
      }
      std::vector<double> ws;
      int64_t size = *num_samples[s];
      if (weighted) {
        ws = w;
        // Megatron-Core (MegaDLMs' version): the weights become the requested sample counts
        // (weight x samples x 1.005, rounded up), not the larger counts the datasets built
        // (whole epochs), which would flatten a 0.3/0.7 blend towards the datasets' sizes.
        if (options.renormalize_blend_weights) {
          ws.clear();
          for (int64_t n : requested[s]) ws.push_back(static_cast<double>(n));
        }
      } else {
        int64_t total = 0;
        for (const auto& d : mid[s]) {
          ws.push_back(static_cast<double>(d->size()));
          total += d->size();
        }
        size = std::min(size, total);
      }
      out.splits[s] = std::make_shared<const BlendedDataset>(mid[s], ws, size, options);
    }
  };

  SplitDatasets out;
  std::array<bool, 3> wanted{};
  for (size_t s = 0; s < 3; ++s) wanted[s] = num_samples[s].has_value();
  if (sources.blend) {
    build_blend(*sources.blend, parse_split(sources.split), out, wanted);
  } else {
    for (size_t s = 0; s < 3; ++s) {
      if (!sources.per_split[s] || !wanted[s]) continue;
      SplitMatrix only;
      only[s] = std::make_pair(0.0, 1.0);
      std::array<bool, 3> one{};
      one[s] = true;
      build_blend(*sources.per_split[s], only, out, one);
    }
  }
  return out;
}

}  // namespace megadlm::data
