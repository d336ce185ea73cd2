// generate_bench: the generation benchmark of scripts/bench_generate.sh (docs/generation.md):
// the model loaded once, then every (decoding mode, batch size) pair timed after an untimed
// warm-up (the first batch at two steps a block: the CUDA context, cuBLASLt plans and the memory
// pool for every shape of the run), with how often each fast mode
// changes the completions of the exact sampler at the same batch size.
//
//   generate_bench --load CKPT --prompts-jsonl P --gen-length 256 --steps 256 --block-length 32
//                  --batch-sizes 1,16 --modes exact,threshold,dual,dual+threshold
//                  [--threshold 0.9] [--batch1-prompts N] [--completions-dir D] --output rows.jsonl
//
// Modes: exact (LLaDA's sampler), threshold (--confidence-threshold), prefix / dual (--kv-cache),
// and A+B combinations. Rows, one JSON object a line: {"impl": "megadlm MODE", "batch_size",
// "tokens", "prompts", "seconds", "tokens_per_s", "forwards_per_prompt"}, then per fast mode
// {"agreement": "MODE vs exact, batch B", "prompts_identical", "prompts", "tokens_changed",
// "tokens"}. Prompts: generate_difflm's JSONL ("prompt_ids", or "prompt" text with a tokenizer).
// Never stops at EOS (every run makes G tokens).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include "inference_cli.h"
#include "megadlm/core/profiler.h"
#include "megadlm/diffusion/sampler.h"

using namespace megadlm;
using nlohmann::json;

namespace {

const char* kUsage =
    "usage: generate_bench (--load DIR | --hf-dir DIR) --prompts-jsonl FILE --output FILE\n"
    "                      [--gen-length G] [--steps S] [--block-length K] [--batch-sizes 1,16]\n"
    "                      [--modes exact,threshold,prefix,dual,dual+threshold] [--threshold P]\n"
    "Tokens/s of generate_difflm's decoding modes on one model load, and how often the fast modes\n"
    "change the exact sampler's completions (scripts/bench_generate.sh).";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

struct Run {
  std::vector<std::vector<int32_t>> tokens;
  int64_t generated = 0, forwards = 0;
  double seconds = 0;
};

std::vector<apps::CliFlag> flags() {
  std::vector<apps::CliFlag> out = apps::common_inference_flags();
  const std::vector<apps::CliFlag> own = {
      {"--prompts-jsonl", "FILE", "one JSON object per line with \"prompt_ids\" (token ids) or \"prompt\" (text)"},
      {"--output", "FILE", "the result rows (JSONL)"},
      {"--completions-dir", "DIR", "also write each run's completions to DIR/MODE.bB.jsonl"},
      {"--gen-length", "G", "tokens to generate (default 256)"},
      {"--steps", "S", "sampling steps (default 256)"},
      {"--block-length", "K", "block length (default 32)"},
      {"--batch-sizes", "LIST", "comma-separated batch sizes (default 1,16)"},
      {"--batch1-prompts", "N", "time batch size 1 on the first N prompts only (default: all)"},
      {"--modes", "LIST", "comma-separated: exact, threshold, prefix, dual, or A+B (default exact,threshold,dual,dual+threshold)"},
      {"--threshold", "P", "the threshold of the threshold modes (default 0.9)"},
  };
  out.insert(out.end() - 1, own.begin(), own.end());  // before --help
  return out;
}

int run(const apps::Cli& cli) {
  std::vector<std::string> errors;
  const training::InferenceSource src = apps::inference_source(cli, errors);
  const Device device = apps::inference_device(cli, errors);
  SamplerConfig base;
  base.gen_length = cli.integer("--gen-length", 256, errors);
  base.steps = cli.integer("--steps", 256, errors);
  base.block_length = cli.integer("--block-length", 32, errors);
  base.seed = static_cast<uint64_t>(cli.integer("--seed", 1234, errors));
  const double threshold = cli.number("--threshold", 0.9, errors);
  std::vector<int64_t> batch_sizes;
  for (const std::string& b : split(cli.get("--batch-sizes", "1,16"), ',')) {
    batch_sizes.push_back(std::atoll(b.c_str()));
    if (batch_sizes.back() < 1) errors.push_back("`--batch-sizes`: " + b + " is not a batch size");
  }
  const int64_t batch1_prompts = cli.integer("--batch1-prompts", 0, errors);
  std::map<std::string, SamplerConfig> modes;
  std::vector<std::string> order;
  for (const std::string& m : split(cli.get("--modes", "exact,threshold,dual,dual+threshold"), ',')) {
    SamplerConfig c = base;
    for (const std::string& part : split(m, '+')) {
      if (part == "threshold") c.confidence_threshold = threshold;
      else if (part == "prefix") c.kv_cache = KvCacheMode::Prefix;
      else if (part == "dual") c.kv_cache = KvCacheMode::Dual;
      else if (part != "exact") errors.push_back("`--modes`: " + part + " is not exact, threshold, prefix or dual");
    }
    modes[m] = c;
    order.push_back(m);
  }
  if (!modes.count("exact")) errors.push_back("`--modes` must include exact (the agreement is measured against it)");
  if (!cli.has("--prompts-jsonl") || !cli.has("--output")) errors.push_back("give `--prompts-jsonl` and `--output`");
  for (const std::string& p : sampler_config_problems(base, 0)) errors.push_back(p);
  if (!errors.empty()) throw ConfigError(errors, {});

  training::InferenceModel model(src, device);
  base.mask_token = apps::inference_mask_token(cli, model.config(), errors);
  for (auto& [name, c] : modes) c.mask_token = base.mask_token;
  for (const std::string& p : sampler_config_problems(modes["exact"], model.input_vocab_size())) errors.push_back(p);
  // generate_difflm's prompt file; text prompts need the tokenizer, loaded only for them.
  std::vector<apps::Prompt> prompts;
  apps::read_prompts_jsonl(cli.get("--prompts-jsonl"), prompts, errors);
  if (prompts.empty()) errors.push_back("no prompt in `--prompts-jsonl`");
  std::unique_ptr<data::Tokenizer> tok;
  if (std::any_of(prompts.begin(), prompts.end(), [](const apps::Prompt& p) { return p.has_text; }))
    tok = apps::inference_tokenizer(cli, model.config(), src.hf_dir);
  apps::encode_prompts(prompts, tok.get(), errors);
  if (!errors.empty()) throw ConfigError(errors, {});
  std::cerr << " > model: " << model.description() << " on " << device.str() << "; " << prompts.size()
            << " prompts, gen length " << base.gen_length << ", steps " << base.steps << ", block length "
            << base.block_length << "\n";

  apps::JsonlOutput out(cli, "--output", errors);
  if (!errors.empty()) throw ConfigError(errors, {});
  const std::string completions = cli.get("--completions-dir");
  if (!completions.empty()) std::filesystem::create_directories(completions);
  for (const int64_t bs : batch_sizes) {
    const size_t n = bs == 1 && batch1_prompts > 0 ? std::min(prompts.size(), static_cast<size_t>(batch1_prompts))
                                                   : prompts.size();
    auto requests = [&](size_t first) {
      std::vector<GenerationRequest> r;
      for (size_t i = first; i < std::min(n, first + static_cast<size_t>(bs)); ++i)
        r.push_back({prompts[i].ids, static_cast<int64_t>(i)});
      return r;
    };
    std::map<std::string, Run> runs;
    for (const std::string& name : order) {
      const SamplerConfig& c = modes[name];
      // Warm-up, untimed: the first batch with two steps a block (a refresh and a cached step
      // in every block), so every shape of the timed run has met its kernels and plans.
      SamplerConfig warm = c;
      warm.steps = std::min(c.steps, 2 * (c.gen_length / c.block_length));
      generate(model, requests(0), warm);
      model.stream().synchronize();
      Run run;
      // MEGADLM_PROFILE_GENERATION=1: each timed run inside cudaProfilerStart/Stop (an external
      // profiler or tools/cupti_trace then sees the steady state only, not the load and warm-up).
      const bool profiled = std::getenv("MEGADLM_PROFILE_GENERATION") != nullptr;
      if (profiled) cuda_profiler_range(device, true);
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t first = 0; first < n; first += static_cast<size_t>(bs)) {
        for (GenerationResult& r : generate(model, requests(first), c)) {
          run.generated += static_cast<int64_t>(r.tokens.size());
          run.forwards += r.steps;
          run.tokens.push_back(std::move(r.tokens));
        }
      }
      model.stream().synchronize();
      if (profiled) cuda_profiler_range(device, false);
      run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      json row = {{"impl", "megadlm " + name}, {"batch_size", bs}, {"tokens", run.generated},
                  {"prompts", n}, {"seconds", run.seconds},
                  {"tokens_per_s", static_cast<double>(run.generated) / run.seconds},
                  {"forwards_per_prompt", static_cast<double>(run.forwards) / static_cast<double>(n)}};
      out.write(row);
      out.flush();
      std::cerr << row.dump() << "\n";
      if (!completions.empty()) {
        std::ofstream f(completions + "/" + name + ".b" + std::to_string(bs) + ".jsonl");
        for (size_t i = 0; i < run.tokens.size(); ++i) f << json({{"index", i}, {"token_ids", run.tokens[i]}}).dump() << "\n";
      }
      runs[name] = std::move(run);
    }
    const Run& exact = runs["exact"];
    for (const std::string& name : order) {
      if (name == "exact") continue;
      const Run& r = runs[name];
      int64_t same = 0, changed = 0, tokens = 0;
      for (size_t i = 0; i < n; ++i) {
        same += r.tokens[i] == exact.tokens[i];
        for (size_t k = 0; k < exact.tokens[i].size(); ++k) changed += r.tokens[i][k] != exact.tokens[i][k];
        tokens += static_cast<int64_t>(exact.tokens[i].size());
      }
      json row = {{"agreement", name + " vs exact, batch " + std::to_string(bs)}, {"prompts_identical", same},
                  {"prompts", n}, {"tokens_changed", changed}, {"tokens", tokens}};
      out.write(row);
      out.flush();
      std::cerr << row.dump() << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return apps::tool_main(argc, argv, {"generate_bench", kUsage, flags()}, run);
}
