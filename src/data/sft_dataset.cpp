// Supervised fine-tuning data (include/megadlm/data/sft_dataset.h).
#include "megadlm/data/sft_dataset.h"
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/core/philox.h"

namespace megadlm::data {

namespace {

using nlohmann::json;

std::string render_prompt(const json& j, const std::string& tmpl) {
  std::vector<std::pair<std::string, std::string>> turns;
  if (j.contains("messages")) {
    const json& m = j.at("messages");
    for (size_t i = 0; i + 1 < m.size(); ++i) turns.push_back({m[i].at("role").get<std::string>(), m[i].at("content").get<std::string>()});
  } else {
    turns.push_back({"user", j.at("prompt").get<std::string>()});
  }
  std::string out;
  if (tmpl == "llada") {
    out = "<|startoftext|>";
    for (const auto& [role, content] : turns)
      out += "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + content + "<|eot_id|>";
    return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  if (!j.contains("messages")) return turns[0].second;
  for (const auto& [role, content] : turns) out += role + ": " + content + "\n";
  return out + "assistant: ";
}

std::string response_text(const json& j) {
  if (!j.contains("messages")) return j.at("response").get<std::string>();
  const json& m = j.at("messages");
  if (!m.is_array() || m.size() < 2) throw std::runtime_error("\"messages\" needs a prompt turn and the response turn");
  const json& last = m.back();
  if (last.at("role").get<std::string>() != "assistant")
    throw std::runtime_error("the last message must be the assistant's (the response to learn)");
  return last.at("content").get<std::string>();
}

}  // namespace

SftDataset::SftDataset(const std::vector<std::string>& files, const Tokenizer* tok, const SftOptions& o) : options_(o) {
  MDLM_CHECK(o.seq_length >= 2, "SFT needs --seq-length >= 2, got ", o.seq_length);
  if (o.chat_template != "plain" && o.chat_template != "llada")
    MDLM_FAIL("`--sft-chat-template ", o.chat_template, "`: valid: plain, llada");
  if (o.eos < 0)
    MDLM_FAIL("supervised fine-tuning pads responses with EOS: the tokenizer (`--tokenizer-type`) must have an "
              "end-of-document token");
  for (const std::string& path : files) {
    std::ifstream in(path);
    if (!in) MDLM_FAIL("--sft-data-path ", path, ": cannot read the file");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      Example e;
      try {
        const json j = json::parse(line);
        if (j.contains("prompt_ids")) {
          e.prompt = j.at("prompt_ids").get<std::vector<int32_t>>();
          e.response = j.at("response_ids").get<std::vector<int32_t>>();
        } else {
          if (tok == nullptr) throw std::runtime_error("text records need a tokenizer (`--tokenizer-type`)");
          e.prompt = tok->encode(render_prompt(j, o.chat_template));
          e.response = tok->encode(response_text(j));
        }
      } catch (const std::exception& ex) {
        MDLM_FAIL("--sft-data-path ", path, " line ", n, ": ", ex.what(),
                  " (expected {\"prompt\", \"response\"}, {\"prompt_ids\", \"response_ids\"} or {\"messages\": [...]})");
      }
      e.response.push_back(o.eos);
      if (static_cast<int64_t>(e.prompt.size()) >= o.seq_length) {
        ++dropped_;
        continue;
      }
      const size_t room = static_cast<size_t>(o.seq_length) - e.prompt.size();
      if (e.response.size() > room) {
        e.response.resize(room);
        ++truncated_;
      }
      examples_.push_back(std::move(e));
    }
  }
  if (examples_.empty())
    MDLM_FAIL("--sft-data-path: no usable example (", dropped_, " dropped: prompt longer than --seq-length ",
              o.seq_length, ")");
}

const std::vector<int64_t>& SftDataset::epoch_order(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  const PhiloxKey key = PhiloxKey::make(options_.seed, RngPurpose::SftShuffle);
  std::vector<std::pair<uint64_t, int64_t>> keys;
  for (int64_t e = 0; e < num_examples(); ++e) {
    const PhiloxWords w = philox(key, static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32),
                                 static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32));
    keys.push_back({(static_cast<uint64_t>(w.w[0]) << 32) | w.w[1], e});
  }
  std::sort(keys.begin(), keys.end());
  std::vector<int64_t> order;
  for (const auto& k : keys) order.push_back(k.second);
  return orders_.emplace(epoch, std::move(order)).first->second;
}

int64_t SftDataset::example_of(int64_t index) const {
  MDLM_CHECK(index >= 0, "SFT sample index ", index);
  return epoch_order(index / num_examples())[static_cast<size_t>(index % num_examples())];
}

std::vector<int32_t> SftDataset::sample(int64_t index) const {
  const Example& e = examples_[static_cast<size_t>(example_of(index))];
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(options_.seq_length + 1));
  out.push_back(options_.eos);  // token 0: dropped by difflm-noshift
  out.insert(out.end(), e.prompt.begin(), e.prompt.end());
  out.insert(out.end(), e.response.begin(), e.response.end());
  out.resize(static_cast<size_t>(options_.seq_length + 1), options_.eos);  // LLaDA's EOS padding
  return out;
}

int64_t SftDataset::prompt_length(int64_t index) const {
  return static_cast<int64_t>(examples_[static_cast<size_t>(example_of(index))].prompt.size());
}

}  // namespace megadlm::data
