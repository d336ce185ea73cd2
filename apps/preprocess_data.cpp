// preprocess_data: JSON lines -> Megatron indexed dataset (PREFIX_<key>_document.bin/.idx), as
// Megatron's tools/preprocess_data.py names and writes them. Flags are Megatron's:
//
//   preprocess_data --input corpus.jsonl --output-prefix out/corpus
//     --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json --append-eod --workers 8
//
// Worker threads tokenize batches of lines; the writer keeps the input order, so the output is
// identical for any --workers. Progress and throughput go to stderr (core/logging) every
// --log-interval lines.
// The output is written to temporary files next to it and renamed into place only when every
// line has been tokenized: a failed run leaves an earlier dataset of the same prefix untouched.
// Documents follow Megatron's encoder: a `text` list is one document with one sequence per
// non-empty element; --append-eod extends the last sequence, and a document without tokens
// (empty text) has no sequence at all (no EOD-only document).
// Exit codes: 0 success, 2 a reported error (bad flag, unreadable input, bad JSON line), 3 an
// unexpected failure. The flags are the table in flags() below (tool_cli.h parses them and prints
// --help from them).
#include <fcntl.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/core/logging.h"
#include "megadlm/data/indexed_dataset.h"
#include "megadlm/data/tokenizer.h"
#include "tool_cli.h"

using namespace megadlm;

namespace {

struct Options {
  std::string input, output_prefix;
  std::vector<std::string> json_keys;
  data::TokenizerConfig tokenizer;
  bool append_eod = false;
  int workers = 1;
  int64_t log_interval = 100000;
};

const char* kUsage =
    "usage: preprocess_data --input FILE.jsonl --output-prefix PREFIX --tokenizer-type TYPE\n"
    "                       [--tokenizer-model PATH] [--vocab-file F --merge-file F] [--vocab-size N]\n"
    "                       [--json-keys text ...] [--append-eod] [--workers N] [--log-interval N]\n"
    "Writes PREFIX_<key>_document.bin/.idx per JSON key (Megatron's MMIDIDX format); the flags are\n"
    "Megatron's tools/preprocess_data.py's. Exit codes: 0 success, 2 a reported error (bad flag,\n"
    "unreadable input, bad JSON line), 3 an unexpected failure.";

std::vector<apps::CliFlag> flags() {
  using training::FlagKind;
  return {
      {.name = "--input", .value = "FILE", .help = "the JSON lines to tokenize, one document a line", .required = true},
      {.name = "--output-prefix", .value = "PREFIX", .help = "writes PREFIX_<key>_document.bin/.idx",
       .required = true},
      {.name = "--tokenizer-type", .value = "TYPE", .help = "the tokenizer", .choices = data::kTokenizerTypes,
       .required = true},
      {.name = "--tokenizer-model", .value = "PATH",
       .help = "tokenizer.json (or its folder) for HuggingFaceTokenizer; the .model file for the SentencePiece types"},
      {.name = "--vocab-file", .value = "PATH", .help = "GPT-2 vocab.json (encoder.json) for GPT2BPETokenizer"},
      {.name = "--merge-file", .value = "PATH", .help = "GPT-2 merges.txt (vocab.bpe) for GPT2BPETokenizer"},
      {.name = "--vocab-size", .value = "N", .help = "NullTokenizer: the vocabulary (ids below N; EOD is N - 1)",
       .kind = FlagKind::Int, .range = "[1, 2147483647]"},
      {.name = "--json-keys", .value = "KEY ...", .help = "the fields of each line to tokenize, one dataset each",
       .kind = FlagKind::StringList, .default_value = "text"},
      {.name = "--append-eod", .value = nullptr, .help = "end every document that has tokens with the EOD token"},
      {.name = "--workers", .value = "N", .help = "tokenizing threads (the output is the same for any N)",
       .kind = FlagKind::Int, .default_value = "1", .range = "[1, 4096]"},
      {.name = "--log-interval", .value = "N", .help = "report progress every N documents (0: only at the end)",
       .kind = FlagKind::Int, .default_value = "100000", .range = "[0, inf)"},
      {.name = "--partitions", .value = "N", .help = "accepted for compatibility: 1 only (use --workers)",
       .kind = FlagKind::Int, .default_value = "1"},
      {.name = "--split-sentences", .value = nullptr,
       .help = "not supported: megadlm keeps one sequence per document (or per list element)"},
      {.name = "--keep-newlines", .value = nullptr, .help = "accepted for compatibility and ignored"},
  };
}

Options options(const apps::Cli& cli) {
  std::vector<std::string> errors;
  if (cli.integer("--partitions") != 1)
    errors.push_back("`--partitions " + cli.get("--partitions") + "`: only 1 is supported (use --workers)");
  if (cli.has("--split-sentences"))
    errors.push_back("`--split-sentences` is not supported (one sequence per document or list element)");
  if (!errors.empty()) throw ConfigError(errors, {});
  Options o;
  o.input = cli.get("--input");
  o.output_prefix = cli.get("--output-prefix");
  o.json_keys = cli.all("--json-keys");
  o.tokenizer.type = cli.get("--tokenizer-type");
  o.tokenizer.model = cli.get("--tokenizer-model");
  o.tokenizer.vocab_file = cli.get("--vocab-file");
  o.tokenizer.merge_file = cli.get("--merge-file");
  if (cli.has("--vocab-size")) o.tokenizer.vocab_size = cli.integer("--vocab-size");
  o.append_eod = cli.has("--append-eod");
  o.workers = static_cast<int>(cli.integer("--workers"));
  o.log_interval = cli.integer("--log-interval");
  return o;
}

// The tokens of one JSON key of a line, Megatron's way: a string is one sequence, a list of
// strings one sequence per element; empty sequences are dropped, and --append-eod goes on the
// last sequence only when the document has tokens.
std::vector<std::vector<int32_t>> encode_field(const data::Tokenizer& tok, const nlohmann::json& field,
                                               bool append_eod, uint64_t& bytes) {
  std::vector<std::vector<int32_t>> sequences;
  auto add = [&](const std::string& text) {
    std::vector<int32_t> ids = tok.encode(text);
    bytes += text.size();
    if (!ids.empty()) sequences.push_back(std::move(ids));
  };
  if (field.is_string()) {
    add(field.get_ref<const std::string&>());
  } else {
    for (const nlohmann::json& element : field) add(element.get_ref<const std::string&>());
  }
  if (append_eod && !sequences.empty()) sequences.back().push_back(tok.eod());
  return sequences;
}

bool string_or_strings(const nlohmann::json& v) {
  if (v.is_string()) return true;
  if (!v.is_array()) return false;
  for (const nlohmann::json& e : v)
    if (!e.is_string()) return false;
  return true;
}

// fsync of a file or directory, so that a rename publishes data that is on disk.
void sync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MDLM_FAIL("cannot open ", path, " to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) MDLM_FAIL("fsync of ", path, " failed: ", std::strerror(err));
}

// The output files of one key: written under a temporary prefix, renamed into place by
// commit(), removed by the destructor when the run did not get that far.
struct StagedOutput {
  std::string prefix, temp_prefix;
  bool committed = false;
  StagedOutput(std::string final_prefix)
      : prefix(std::move(final_prefix)), temp_prefix(prefix + ".tmp-" + std::to_string(::getpid())) {}
  ~StagedOutput() {
    if (committed) return;
    std::error_code ec;
    std::filesystem::remove(temp_prefix + ".bin", ec);
    std::filesystem::remove(temp_prefix + ".idx", ec);
  }
  // .bin first, .idx last: a reader opening the pair between the two renames sees sizes that
  // disagree and says so (data/indexed_dataset.h checks them), never a silently mixed dataset.
  void commit() {
    for (const char* ext : {".bin", ".idx"}) {
      sync_path(temp_prefix + ext);
      std::filesystem::rename(temp_prefix + ext, prefix + ext);
    }
    const std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
    sync_path(dir.empty() ? std::string(".") : dir.string());
    committed = true;
  }
};

// A batch of input lines and, once a worker is done, their token ids per key.
struct Batch {
  int64_t first_line = 0;
  std::vector<std::string> lines;
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> ids;  // [line][key][sequence]
  uint64_t bytes = 0;                                  // text bytes tokenized
  std::string error;
  bool done = false;
};

int run(const apps::Cli& cli) {
  const Options o = options(cli);
  const auto tok = data::load_tokenizer(o.tokenizer);
  logging::info("preprocess_data: ", tok->describe());
  if (o.append_eod && tok->eod() < 0)
    MDLM_FAIL("--append-eod: the tokenizer has no end-of-document token");
  std::ifstream in(o.input, std::ios::binary);
  if (!in) MDLM_FAIL("cannot open --input ", o.input);
  const data::IndexDType dtype = data::optimal_index_dtype(tok->vocab_size());
  std::vector<std::unique_ptr<StagedOutput>> outputs;
  std::vector<std::unique_ptr<data::IndexedDatasetWriter>> writers;
  for (const std::string& key : o.json_keys) {
    outputs.push_back(std::make_unique<StagedOutput>(o.output_prefix + "_" + key + "_document"));
    writers.push_back(std::make_unique<data::IndexedDatasetWriter>(outputs.back()->temp_prefix, dtype));
    logging::info("preprocess_data: writing ", outputs.back()->prefix, ".bin/.idx (",
                  data::index_dtype_name(dtype), ")");
  }

  // Reader (this thread) -> queue of batches -> workers tokenize in place -> writer in order.
  constexpr size_t kBatchLines = 256;
  const size_t max_in_flight = static_cast<size_t>(o.workers) * 4;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Batch>> todo, in_order;
  bool input_done = false;
  auto work = [&] {
    for (;;) {
      std::shared_ptr<Batch> b;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !todo.empty() || input_done; });
        if (todo.empty()) return;
        b = todo.front();
        todo.pop_front();
      }
      try {
        b->ids.resize(b->lines.size());
        for (size_t l = 0; l < b->lines.size(); ++l) {
          const std::string& line = b->lines[l];
          if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
          nlohmann::json j;
          try {
            j = nlohmann::json::parse(line);
          } catch (const std::exception& e) {
            MDLM_FAIL(o.input, ":", b->first_line + static_cast<int64_t>(l) + 1, ": not a JSON object (", e.what(), ")");
          }
          for (const std::string& key : o.json_keys) {
            if (!j.is_object() || !j.contains(key) || !string_or_strings(j[key]))
              MDLM_FAIL(o.input, ":", b->first_line + static_cast<int64_t>(l) + 1,
                        ": no field \"", key, "\" holding a string or a list of strings (--json-keys)");
            b->ids[l].push_back(encode_field(*tok, j[key], o.append_eod, b->bytes));
          }
        }
      } catch (const std::exception& e) {
        b->error = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        b->done = true;
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w) threads.emplace_back(work);
  // Whatever happens below, the workers are told to stop and joined.
  struct Joiner {
    std::function<void()> f;
    ~Joiner() { f(); }
  } joiner{[&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      input_done = true;
      todo.clear();
    }
    cv.notify_all();
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }};

  const auto t0 = std::chrono::steady_clock::now();
  int64_t docs = 0, tokens = 0, next_log = o.log_interval;
  uint64_t bytes = 0;
  auto report = [&](const char* what) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char line[256];
    std::snprintf(line, sizeof line, "preprocess_data: %s %lld documents, %lld tokens, %.1f MB of text in %.1f s "
                  "(%.2f MB/s, %.0f tokens/s, %.0f docs/s)", what, static_cast<long long>(docs),
                  static_cast<long long>(tokens), static_cast<double>(bytes) / 1e6, s,
                  static_cast<double>(bytes) / 1e6 / std::max(s, 1e-9),
                  static_cast<double>(tokens) / std::max(s, 1e-9), static_cast<double>(docs) / std::max(s, 1e-9));
    logging::info(line);
  };
  // Writes finished batches at the head of the queue (input order).
  auto drain = [&](bool wait) {
    for (;;) {
      std::shared_ptr<Batch> b;
      {
        std::unique_lock<std::mutex> lock(mu);
        if (in_order.empty()) return;
        if (wait) cv.wait(lock, [&] { return in_order.front()->done; });
        if (!in_order.front()->done) return;
        b = in_order.front();
        in_order.pop_front();
      }
      if (!b->error.empty()) MDLM_FAIL(b->error);
      for (const auto& per_key : b->ids) {
        if (per_key.empty()) continue;
        for (size_t k = 0; k < per_key.size(); ++k) {
          for (const std::vector<int32_t>& sequence : per_key[k]) {
            writers[k]->add_sequence(sequence);
            tokens += static_cast<int64_t>(sequence.size());
          }
          writers[k]->end_document();
        }
        ++docs;
      }
      bytes += b->bytes;
      if (o.log_interval > 0 && docs >= next_log) {
        report("processed");
        next_log = docs + o.log_interval;
      }
      if (!wait) continue;
      wait = in_order.size() >= max_in_flight;
    }
  };
  int64_t line_no = 0;
  auto batch = std::make_shared<Batch>();
  std::string line;
  auto submit = [&] {
    if (batch->lines.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      todo.push_back(batch);
      in_order.push_back(batch);
    }
    cv.notify_all();
    batch = std::make_shared<Batch>();
    batch->first_line = line_no;
    bool full;
    {
      std::lock_guard<std::mutex> lock(mu);
      full = in_order.size() >= max_in_flight;
    }
    drain(full);
  };
  while (std::getline(in, line)) {
    batch->lines.push_back(std::move(line));
    ++line_no;
    if (batch->lines.size() == kBatchLines) submit();
  }
  submit();
  {
    std::lock_guard<std::mutex> lock(mu);
    input_done = true;
  }
  cv.notify_all();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (in_order.empty()) break;
    }
    drain(true);
  }
  if (docs == 0) MDLM_FAIL(o.input, ": no documents (empty input)");
  for (auto& w : writers) w->finalize();
  for (auto& out : outputs) out->commit();
  report("done:");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return apps::tool_main(argc, argv, {"preprocess_data", kUsage, flags()}, run);
}
