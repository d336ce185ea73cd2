// What the inference programs share (generate_difflm, evaluate_difflm, generate_bench) on top of
// every program's command line (tool_cli.h): the flags they all have (model source, device,
// tokenizer, mask token, seed), reading prompts from JSONL, and writing JSONL results to a file
// or stdout. The spellings follow pretrain_difflm's where a flag means the same (--load,
// --ckpt-step, --tokenizer-type, --tokenizer-model, --mask-token, --seed, --device).
#pragma once
#include <cstdint>
#include <fstream>
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
#include "tool_cli.h"

namespace megadlm::apps {

/// The flags every inference program has (--help last: programs insert theirs before it).
std::vector<CliFlag> common_inference_flags();

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
