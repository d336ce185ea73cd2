// Supervised fine-tuning data (docs/finetuning.md): prompt/response pairs
// from JSONL, rendered with a chat template, tokenized into a prompt span and a response span,
// right padded with EOS to the sequence length, served as Megatron-style S+1-token samples whose
// first token is a filler (difflm-noshift trains on tokens 1..S).
//
// Records (one JSON object per line):
//   {"prompt": "...", "response": "..."}                 text through the tokenizer
//   {"prompt_ids": [...], "response_ids": [...]}         token ids as they are
//   {"messages": [{"role": "user", "content": ...}, ..., {"role": "assistant", "content": ...}]}
//       chat: every message but the last forms the prompt, the last (an assistant's) the response
// Templates (--sft-chat-template):
//   plain: prompt = the prompt text (messages: "role: content\n" each, then "assistant: ");
//          response = the response text
//   llada: LLaDA's chat format, prompt = "<|startoftext|>" + for each message
//          "<|start_header_id|>ROLE<|end_header_id|>\n\n" + content + "<|eot_id|>", then
//          "<|start_header_id|>assistant<|end_header_id|>\n\n"; response = the response text
//          (the special tokens must be tokens of the tokenizer to stay atomic)
// Every response ends with the EOS id. Sequences longer than S keep the whole prompt and cut the
// response; examples whose prompt alone fills S are dropped (counted). Sample i is example
// perm_e[i mod N] of epoch e = i / N, where perm_e orders the examples by Philox keys
// (seed, SftShuffle, {example, epoch}): a pure function of (seed, i), as Megatron's data order is.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>
#include "megadlm/data/sample_source.h"
#include "megadlm/data/tokenizer.h"

namespace megadlm::data {

struct SftOptions {
  int64_t seq_length = 0;          ///< S: tokens the model sees per sample
  std::string chat_template = "plain";
  uint64_t seed = 1234;
  int32_t eos = -1;                ///< response terminator and padding (the tokenizer's EOD)
};

class SftDataset final : public SampleSource {
 public:
  /// Reads and tokenizes every file; throws naming the file and line of a bad record.
  SftDataset(const std::vector<std::string>& files, const Tokenizer* tokenizer, const SftOptions& options);

  std::vector<int32_t> sample(int64_t index) const override;
  int32_t eod_token() const override { return options_.eos; }
  int64_t prompt_length(int64_t index) const override;

  int64_t num_examples() const { return static_cast<int64_t>(examples_.size()); }
  int64_t dropped() const { return dropped_; }      ///< prompt alone longer than S
  int64_t truncated() const { return truncated_; }  ///< response cut at S
  /// Prompt and response tokens of example `e` (before padding), for tests and logs.
  const std::vector<int32_t>& prompt_tokens(int64_t e) const { return examples_[static_cast<size_t>(e)].prompt; }
  const std::vector<int32_t>& response_tokens(int64_t e) const { return examples_[static_cast<size_t>(e)].response; }
  /// The example sample `index` shows.
  int64_t example_of(int64_t index) const;

 private:
  struct Example {
    std::vector<int32_t> prompt, response;  // response ends with EOS (unless cut)
  };
  const std::vector<int64_t>& epoch_order(int64_t epoch) const;

  SftOptions options_;
  std::vector<Example> examples_;
  int64_t dropped_ = 0, truncated_ = 0;
  mutable std::mutex mutex_;
  mutable std::map<int64_t, std::vector<int64_t>> orders_;
};

}  // namespace megadlm::data
