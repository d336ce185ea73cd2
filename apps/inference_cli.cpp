// The inference programs' shared command line, prompts and JSONL output (inference_cli.h).
#include "inference_cli.h"
#include <filesystem>
#include <iostream>

namespace megadlm::apps {

using nlohmann::json;

std::vector<CliFlag> common_inference_flags() {
  return {
      {"--load", "DIR", "megadlm checkpoint directory (its latest checkpoint; any saved parallel layout)"},
      {"--ckpt-step", "N", "load iteration N instead of the latest"},
      {"--hf-dir", "DIR", "a Hugging Face Qwen2/Qwen3 folder instead of --load (as convert_checkpoint --from-hf reads it)"},
      {.name = "--device", .value = "D", .help = "where to run: cuda (bf16) when a GPU is visible, else cpu (fp32)",
       .choices = "cpu cuda"},
      {.name = "--tokenizer-type", .value = "TYPE",
       .help = "the tokenizer (default: the checkpoint's, or the --hf-dir's tokenizer.json)",
       .choices = data::kTokenizerTypes},
      {"--tokenizer-model", "PATH", "tokenizer.json (or its folder) / SentencePiece .model"},
      {"--vocab-file", "PATH", "GPT2BPETokenizer vocab.json"},
      {"--merge-file", "PATH", "GPT2BPETokenizer merges.txt"},
      {"--mask-token", "ID", "the mask token id (default: the checkpoint's --mask-token)"},
      {"--mask-token-id", "ID", "same as --mask-token"},
      {"--seed", "N", "seed of every random number (default 1234)"},
      {"--help", nullptr, "print this help and exit"},
  };
}

training::InferenceSource inference_source(const Cli& cli, std::vector<std::string>& errors) {
  training::InferenceSource src;
  src.load = cli.get("--load");
  src.hf_dir = cli.get("--hf-dir");
  if (cli.has("--ckpt-step")) src.ckpt_step = cli.integer("--ckpt-step", 0, errors);
  if (src.load.empty() == src.hf_dir.empty())
    errors.push_back("give the model with exactly one of `--load DIR` (a megadlm checkpoint) and `--hf-dir DIR`");
  if (src.ckpt_step && !src.hf_dir.empty()) errors.push_back("`--ckpt-step` applies to `--load` only");
  return src;
}

Device inference_device(const Cli& cli, std::vector<std::string>& errors) {
  const std::string d = cli.get("--device", cuda_device_count() > 0 ? "cuda" : "cpu");
  if (d == "cpu") return Device::cpu();  // the table allows cpu and cuda
  if (cuda_device_count() == 0) errors.push_back("`--device cuda`: no GPU is visible (or this build has no CUDA)");
  return Device::cuda(0);
}

std::unique_ptr<data::Tokenizer> inference_tokenizer(const Cli& cli, const RunConfig& cfg, const std::string& hf_dir) {
  data::TokenizerConfig t;
  t.type = cli.get("--tokenizer-type", cfg.data.tokenizer_type);
  t.model = cli.get("--tokenizer-model", cli.has("--tokenizer-type") ? "" : cfg.data.tokenizer_model);
  t.vocab_file = cli.get("--vocab-file");
  t.merge_file = cli.get("--merge-file");
  t.vocab_size = cfg.model.vocab_size;
  if (t.type.empty() && !hf_dir.empty() && std::filesystem::exists(std::filesystem::path(hf_dir) / "tokenizer.json")) {
    t.type = "HuggingFaceTokenizer";
    t.model = hf_dir;
  }
  if (t.type.empty()) return nullptr;
  return data::load_tokenizer(t);
}

int64_t inference_mask_token(const Cli& cli, const RunConfig& cfg, std::vector<std::string>& errors) {
  if (cli.has("--mask-token") && cli.has("--mask-token-id"))
    errors.push_back("give one of `--mask-token` and `--mask-token-id` (they are the same flag)");
  const std::string flag = cli.has("--mask-token-id") ? "--mask-token-id" : "--mask-token";
  return cli.integer(flag, cfg.diffusion.mask_token, errors);
}

bool read_prompts_jsonl(const std::string& path, std::vector<Prompt>& out, std::vector<std::string>& errors) {
  std::ifstream in(path);
  if (!in) {
    errors.push_back("`--prompts-jsonl " + path + "`: cannot read the file");
    return false;
  }
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const json j = json::parse(line);
      Prompt p;
      if (j.contains("prompt_ids")) {
        p.ids = j.at("prompt_ids").get<std::vector<int32_t>>();
      } else if (j.contains("prompt")) {
        p.text = j.at("prompt").get<std::string>();
        p.has_text = true;
      } else {
        errors.push_back(path + " line " + std::to_string(n) + ": needs \"prompt\" or \"prompt_ids\"");
        continue;
      }
      out.push_back(std::move(p));
    } catch (const json::exception& e) {
      errors.push_back(path + " line " + std::to_string(n) + ": not a JSON object with \"prompt\" (" + e.what() + ")");
    }
  }
  return true;
}

void encode_prompts(std::vector<Prompt>& prompts, const data::Tokenizer* tok, std::vector<std::string>& errors) {
  for (Prompt& p : prompts) {
    if (!p.has_text) continue;
    if (tok == nullptr) {
      errors.push_back("prompt \"" + p.text.substr(0, 40) + "\" is text but there is no tokenizer: give "
                       "`--tokenizer-type` (and `--tokenizer-model`), or \"prompt_ids\" in the JSONL");
      continue;
    }
    p.ids = tok->encode(p.text);
  }
}

JsonlOutput::JsonlOutput(const Cli& cli, const std::string& flag, std::vector<std::string>& errors) : out_(&std::cout) {
  if (!cli.has(flag)) return;
  file_.open(cli.get(flag));
  if (!file_) errors.push_back("`" + flag + " " + cli.get(flag) + "`: cannot create the file");
  out_ = &file_;
}

}  // namespace megadlm::apps
