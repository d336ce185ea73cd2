// What the inference programs share (generate_difflm, evaluate_difflm, generate_bench): the small
// command line (a flag table per program: name, whether it takes a value, help; lexed by the
// training flag machinery, training::parse_tool_flags, with every problem reported at once), the
// flags they all have (model source, device, tokenizer, mask token, seed), their main() around
// the program's body (inference_main), reading prompts from JSONL, and writing JSONL results to a
// file or stdout. These programs are not Megatron's pretrain scripts, so their flags are not rows
// of pretrain_difflm's table; the spellings follow pretrain_difflm's where a flag means the same
// (--load, --ckpt-step, --tokenizer-type, --tokenizer-model, --mask-token, --seed, --device).
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>
#include "megadlm/core/device.h"
#include "megadlm/core/error.h"
#include "megadlm/data/tokenizer.h"
#include "megadlm/training/arguments/arguments.h"
#include "megadlm/training/inference_model.h"

namespace megadlm::apps {

struct CliFlag {
  const char* name;
  const char* value;  ///< placeholder of the value ("N", "DIR"), nullptr for a switch
  const char* help;
  bool repeatable = false;
};

/// The flags every inference program has (--help last: programs insert theirs before it).
std::vector<CliFlag> common_inference_flags();

class Cli {
 public:
  Cli(std::string program, std::string usage, std::vector<CliFlag> flags);

  /// Parses argv with the training flag machinery (training::parse_tool_flags over this
  /// program's rows); throws ConfigError listing every problem (unknown flags with the nearest
  /// known one, missing values, a value given to a switch, a flag given twice that is not
  /// repeatable).
  void parse(int argc, char** argv);

  bool has(const std::string& flag) const { return values_.count(flag) != 0; }
  std::string get(const std::string& flag, const std::string& fallback = "") const {
    auto it = values_.find(flag);
    return it == values_.end() ? fallback : it->second.back();
  }
  std::vector<std::string> all(const std::string& flag) const {
    auto it = values_.find(flag);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  /// An integer flag; a malformed value is recorded in `errors` (and `fallback` returned).
  int64_t integer(const std::string& flag, int64_t fallback, std::vector<std::string>& errors) const;
  double number(const std::string& flag, double fallback, std::vector<std::string>& errors) const;

  std::string help() const;

 private:
  std::string program_, usage_;
  std::vector<CliFlag> flags_;
  std::vector<training::FlagSpec> table_;  ///< one row per flag, for the parser
  std::map<std::string, std::vector<std::string>> values_;
};

/// The whole main() of an inference program around `body`: parses argv against `flags`, prints
/// the help for --help (exit 0), runs `body` (its return value is the exit code) and turns what
/// escapes it into the exit codes these programs share: "error: invalid arguments:" and 2 for a
/// ConfigError, "error:" and 2 for another megadlm Error, "error: unexpected failure:" and 3 for
/// anything else.
int inference_main(int argc, char** argv, const std::string& program, const std::string& usage,
                   std::vector<CliFlag> flags, const std::function<int(const Cli&)>& body);

/// The model source and device the common flags name; problems go to `errors`.
training::InferenceSource inference_source(const Cli& cli, std::vector<std::string>& errors);
Device inference_device(const Cli& cli, std::vector<std::string>& errors);

/// The tokenizer the flags name, else the checkpoint's, else the --hf-dir's tokenizer.json;
/// null when there is none (prompts must then be token ids).
std::unique_ptr<data::Tokenizer> inference_tokenizer(const Cli& cli, const RunConfig& cfg, const std::string& hf_dir);

/// The mask token: the flag, else the checkpoint's; -1 when neither knows it.
int64_t inference_mask_token(const Cli& cli, const RunConfig& cfg, std::vector<std::string>& errors);

/// A prompt as given: text (tokenized later) or token ids.
struct Prompt {
  std::string text;
  bool has_text = false;
  std::vector<int32_t> ids;
};

/// Appends the prompts of a --prompts-jsonl file to `prompts`: one JSON object a non-blank line,
/// with "prompt_ids" (token ids) or "prompt" (text); every bad line goes to `errors`. False (and
/// the error) when the file cannot be read.
bool read_prompts_jsonl(const std::string& path, std::vector<Prompt>& prompts, std::vector<std::string>& errors);

/// Fills the ids of the text prompts with `tok`; a text prompt without a tokenizer goes to
/// `errors`.
void encode_prompts(std::vector<Prompt>& prompts, const data::Tokenizer* tok, std::vector<std::string>& errors);

/// Where a program's JSONL results go: the file `flag` names (created or truncated when this is
/// made, so make it only once the arguments are known good), else stdout.
class JsonlOutput {
 public:
  /// A file that cannot be created goes to `errors` (rows written then are lost; check errors).
  JsonlOutput(const Cli& cli, const std::string& flag, std::vector<std::string>& errors);
  JsonlOutput(const JsonlOutput&) = delete;
  JsonlOutput& operator=(const JsonlOutput&) = delete;
  /// One row, one line (buffered until flush()). Strings that are not UTF-8 (a --prompt given
  /// in another encoding) are written with U+FFFD rather than stopping the run.
  void write(const nlohmann::json& row) {
    *out_ << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  void flush() { out_->flush(); }

 private:
  std::ofstream file_;
  std::ostream* out_;
};

}  // namespace megadlm::apps
