// generate_difflm: completions from a masked-diffusion LM with LLaDA's sampler
// (diffusion/sampler.h; docs/generation.md). Thin by design: the model loading, the sampler and
// the tokenizers are library calls.
//
//   generate_difflm --load CKPT --prompt "The capital of France is" --gen-length 64 --steps 64
//                   --block-length 32 [--remasking low_confidence|random] [--temperature T]
//                   [--cfg-scale W] [--output out.jsonl]
//   generate_difflm --hf-dir HF_MODEL --prompts-jsonl prompts.jsonl --batch-size 16 ...
//
//   generate_difflm --load BD_CKPT --prompt "..." --gen-length 256 --steps 256 [--decode block|ar]
//                   [--kv-cache exact|none] [--confidence-threshold P]
// --batch-invariant (any decoding): CUDA kernels whose rows do not depend on the batch
// (ops::set_batch_invariant; docs/generation.md, "Batch-invariant mode").
// --cuda-graphs (block decoding, CUDA): each block's steps replay a CUDA graph of the model's
// forward (model/exact_cache_graphs.h; docs/generation.md, "CUDA graphs").
// A block-diffusion checkpoint (--attention-mask-type block_causal) decodes block by block with
// an exact key/value cache by default (diffusion/block_sampler.h), its block size the
// checkpoint's --dlm-block-size; other checkpoints run LLaDA's full-sequence sampler.
//
// Output: one JSON object per prompt, in input order, to --output (or stdout):
//   {"index", "prompt", "prompt_ids", "text", "token_ids", "steps", "forwards", "stopped_at_eos"}
// `token_ids` are the generated tokens (all G, or up to and including the first EOS when stopping
// at EOS); `text` is their decoding up to the first EOS; `steps` counts the forward passes that
// proposed its tokens, `forwards` every forward it took part in (block decoding's prefill and
// cache updates too; 0 for the full sampler). The log ends with the tokens per forward.
// Exit codes: 0 success; 2 invalid arguments or a reported error; 3 unexpected failure.
#include <chrono>
#include <map>
#include <iostream>
#include <nlohmann/json.hpp>
#include "inference_cli.h"
#include "megadlm/diffusion/block_sampler.h"
#include "megadlm/diffusion/sampler.h"
#include "megadlm/ops/gemm.h"

using namespace megadlm;
using nlohmann::json;

namespace {

const char* kUsage =
    "usage: generate_difflm (--load DIR | --hf-dir DIR) (--prompt TEXT ... | --prompts-jsonl FILE)\n"
    "                       [--gen-length G] [--steps S] [--block-length K] [--remasking low_confidence|random]\n"
    "                       [--temperature T] [--cfg-scale W] [--batch-size B] [--output FILE] ...\n"
    "LLaDA's sampler (generate.py): G masked tokens after the prompt, decoded in G/K semi-autoregressive\n"
    "blocks with S/(G/K) steps each; block-diffusion checkpoints: block decoding with an exact cache\n"
    "(--decode block|ar|full, --kv-cache exact|none); docs/generation.md.";

std::vector<apps::CliFlag> flags() {
  std::vector<apps::CliFlag> f = apps::common_inference_flags();
  const std::vector<apps::CliFlag> own = {
      {"--prompt", "TEXT", "a prompt (tokenized with the tokenizer)", true},
      {"--prompts-jsonl", "FILE", "one JSON object per line with \"prompt\" (text) or \"prompt_ids\" (token ids)"},
      {"--output", "FILE", "write the JSONL completions here (default: stdout)"},
      {"--gen-length", "G", "tokens to generate (LLaDA gen_length; default 128)"},
      {"--steps", "S", "sampling steps in all (default 128; block decoding: G); a multiple of G/K"},
      {"--block-length", "K", "semi-autoregressive block length (default: G; block decoding: the checkpoint's "
                              "--dlm-block-size); divides G"},
      {.name = "--remasking", .value = "MODE", .help = "which masked positions are decoded first",
       .choices = "low_confidence random", .default_value = "low_confidence"},
      {"--temperature", "T", "Gumbel-max sampling temperature in float64 (default 0: greedy)"},
      {"--cfg-scale", "W", "classifier-free guidance scale (default 0: off); the unconditional canvas has the prompt masked"},
      {"--batch-size", "B", "prompts per forward batch (left padded; every row equals its run alone; default 1)"},
      {"--eos-token-id", "ID", "EOS id (default: the tokenizer's end-of-document token)"},
      {"--no-stop-at-eos", nullptr, "generate all G tokens even after an EOS (the reference's full output)"},
      {"--logits-eos-inf", nullptr, "never propose EOS (LLaDA's logits_eos_inf)"},
      {"--confidence-threshold", "P", "fast decoding: per step unmask every position of the block with confidence "
                                      ">= P (at least one); not the reference sampler (default 0: off)"},
      {"--kv-cache", "MODE", "full sampler: Fast-dLLM's approximate key/value cache, none (default), prefix (recompute "
                             "the block and what follows) or dual (the block only), not the reference sampler; "
                             "block/ar decoding: exact (default: committed blocks cached exactly) or none (recompute "
                             "everything each step; the same tokens)"},
      {.name = "--decode", .value = "MODE",
       .help = "block (default for block-diffusion checkpoints: block by block with an exact cache), "
               "ar (autoregressive, for the causal-clean-half model), or full (LLaDA's full-sequence "
               "sampler, the default otherwise)",
       .choices = "block ar full"},
      {"--batch-invariant", nullptr, "CUDA: kernels whose per-row reduction order does not depend on the batch "
                                     "(one cuBLASLt algorithm per GEMM shape for every M, no split-K, no cuDNN "
                                     "attention), so a prompt gives the same tokens alone and in any batch; slower; "
                                     "CPU rows are batch-invariant already (default: off)"},
      {"--cuda-graphs", nullptr, "CUDA, block decoding with the exact cache: each block's steps captured once as a "
                                 "CUDA graph of the model's forward and replayed (no per-kernel launch cost); the same "
                                 "tokens, bit for bit (default: off)"},
  };
  f.insert(f.end() - 1, own.begin(), own.end());
  return f;
}

std::vector<apps::Prompt> read_prompts(const apps::Cli& cli, const data::Tokenizer* tok, std::vector<std::string>& errors) {
  std::vector<apps::Prompt> out;
  for (const std::string& p : cli.all("--prompt")) out.push_back({p, true, {}});
  if (cli.has("--prompts-jsonl") && !apps::read_prompts_jsonl(cli.get("--prompts-jsonl"), out, errors)) return out;
  if (out.empty()) errors.push_back("no prompt: give `--prompt TEXT` or `--prompts-jsonl FILE`");
  apps::encode_prompts(out, tok, errors);
  return out;
}

int run(const apps::Cli& cli) {
  std::vector<std::string> errors;
  const training::InferenceSource src = apps::inference_source(cli, errors);
  const Device device = apps::inference_device(cli, errors);
  SamplerConfig sc;
  sc.gen_length = cli.integer("--gen-length", 128, errors);
  sc.steps = cli.integer("--steps", 128, errors);
  sc.block_length = cli.integer("--block-length", sc.gen_length, errors);
  sc.temperature = cli.number("--temperature", 0.0, errors);
  sc.cfg_scale = cli.number("--cfg-scale", 0.0, errors);
  sc.confidence_threshold = cli.number("--confidence-threshold", 0.0, errors);
  sc.seed = static_cast<uint64_t>(cli.integer("--seed", 1234, errors));
  sc.logits_eos_inf = cli.has("--logits-eos-inf");
  if (cli.get("--remasking") == "random") sc.remasking = Remasking::Random;  // the table checked the choices
  const std::string decode_flag = cli.get("--decode");
  const std::string kv_cache = cli.get("--kv-cache", "");
  if (kv_cache == "prefix") sc.kv_cache = KvCacheMode::Prefix;
  else if (kv_cache == "dual") sc.kv_cache = KvCacheMode::Dual;
  else if (!kv_cache.empty() && kv_cache != "none" && kv_cache != "exact")
    errors.push_back("`--kv-cache " + kv_cache + "`: valid: none, prefix, dual (full sampler), exact, none "
                     "(block and ar decoding)");
  // Process-wide, before the model runs anything (the GEMM algorithms are cached per mode).
  const bool batch_invariant = cli.has("--batch-invariant");
  ops::set_batch_invariant(batch_invariant);
  const bool cuda_graphs = cli.has("--cuda-graphs");
  if (cuda_graphs && device.is_cpu())
    errors.push_back("`--cuda-graphs` captures CUDA work; the model runs on the CPU (give `--device cuda`)");
  if (cuda_graphs && decode_flag == "full")
    errors.push_back("`--cuda-graphs` captures block decoding's steps; the full-sequence sampler (`--decode full`) "
                     "runs the whole canvas uncached and is not captured");
  const int64_t batch_size = cli.integer("--batch-size", 1, errors);
  if (batch_size < 1) errors.push_back("`--batch-size` must be >= 1");
  if (!cli.has("--prompt") && !cli.has("--prompts-jsonl"))
    errors.push_back("no prompt: give `--prompt TEXT` or `--prompts-jsonl FILE`");
  // Before the model is loaded, where the values do not depend on it (block decoding's block size
  // and default steps come from the checkpoint); the rest once the model says which sampler runs.
  if (decode_flag == "full" || (decode_flag != "ar" && cli.has("--steps") && cli.has("--block-length")))
    for (const std::string& p : sampler_config_problems(sc, 0)) errors.push_back(p);
  if (!errors.empty()) throw ConfigError(errors, {});

  // The model, then what depends on it (vocabulary, mask token, tokenizer, decoding).
  training::InferenceModel model(src, device);
  const RunConfig& cfg = model.config();
  if (cfg.diffusion.mode == RunningMode::Vanilla)
    errors.push_back(model.description() + " is an autoregressive model (--model-running-mode vanilla); "
                     "generate_difflm samples masked-diffusion models");
  // Block diffusion checkpoints record their block size and clean-half rule.
  const bool bd_model = cfg.model.attention_mask == AttentionMaskType::BlockCausal && cfg.diffusion.block_size > 0;
  const DecodeMode decode = decode_flag == "block" ? DecodeMode::Block
                            : decode_flag == "ar"  ? DecodeMode::Ar
                            : decode_flag == "full" ? DecodeMode::Full
                            : bd_model ? DecodeMode::Block : DecodeMode::Full;
  BlockDecoding bdec;
  bdec.autoregressive = decode == DecodeMode::Ar;
  bdec.causal_clean = cfg.model.block_diffusion_causal_clean;
  bdec.cuda_graphs = cuda_graphs;
  if (cuda_graphs && decode == DecodeMode::Full)  // a full-sequence checkpoint's default sampler
    errors.push_back("`--cuda-graphs` captures block decoding's steps; " + model.description() +
                     " is decoded by the full-sequence sampler, which is not captured");
  else if (cuda_graphs) {
    const std::string why = model.exact_cache_graphs_unsupported();
    if (!why.empty()) errors.push_back(why);
  }
  if (decode == DecodeMode::Full) {
    if (kv_cache == "exact")
      errors.push_back("`--kv-cache exact` is block decoding's cache; the full-sequence sampler (`--decode full`) "
                       "takes none, prefix or dual");
  } else {
    if (!bd_model)
      errors.push_back(std::string("`--decode ") + decode_mode_name(decode) + "` needs a block-diffusion checkpoint "
                       "(trained with `--attention-mask-type block_causal --dlm-block-size B`); " +
                       model.description() + " is a full-sequence model: use `--decode full`");
    bdec.exact_cache = kv_cache != "none";
    if (decode == DecodeMode::Ar) {
      // One token a forward: no blocks or step budget.
      sc.block_length = sc.gen_length;
      sc.steps = sc.gen_length;
    } else if (bd_model && !cli.has("--block-length")) {
      sc.block_length = cfg.diffusion.block_size;
    }
    if (!cli.has("--steps") && decode == DecodeMode::Block && sc.block_length > 0 && sc.gen_length % sc.block_length == 0)
      sc.steps = sc.gen_length;  // one committed token a step by default (LLaDA2 / SDAR: steps = block size)
  }
  if (bd_model && decode == DecodeMode::Block && sc.block_length != cfg.diffusion.block_size)
    std::cerr << "note: decoding with blocks of " << sc.block_length << " a model trained with blocks of "
              << cfg.diffusion.block_size << " (--dlm-block-size)\n";
  sc.mask_token = apps::inference_mask_token(cli, cfg, errors);
  const std::unique_ptr<data::Tokenizer> tok = apps::inference_tokenizer(cli, cfg, src.hf_dir);
  sc.eos_token = cli.integer("--eos-token-id", tok ? tok->eod() : -1, errors);
  if (!cli.has("--eos-token-id") && sc.eos_token >= 0 && sc.eos_token == sc.mask_token) {
    std::cerr << "note: the tokenizer's end-of-document id " << sc.eos_token
              << " is the mask token: not stopping at EOS (give --eos-token-id)\n";
    sc.eos_token = -1;
  }
  sc.stop_at_eos = !cli.has("--no-stop-at-eos") && sc.eos_token >= 0;
  const std::vector<std::string> config_problems = decode == DecodeMode::Full
                                                       ? sampler_config_problems(sc, model.input_vocab_size())
                                                       : block_decoding_problems(sc, bdec, model.input_vocab_size());
  for (const std::string& p : config_problems) errors.push_back(p);
  const std::vector<apps::Prompt> prompts = read_prompts(cli, tok.get(), errors);
  // Every prompt is checked before anything is generated (ids in the vocabulary, no mask token,
  // prompt + --gen-length within the model's positions, learned or RoPE): generate() would
  // refuse a bad one only when its batch comes.
  if (errors.empty()) {
    std::vector<GenerationRequest> all;
    for (size_t i = 0; i < prompts.size(); ++i) all.push_back({prompts[i].ids, static_cast<int64_t>(i)});
    for (const std::string& p : request_problems(all, sc, model.input_vocab_size(), model.max_positions()))
      errors.push_back(p);
    if (decode == DecodeMode::Ar)
      for (size_t i = 0; i < prompts.size(); ++i)
        if (prompts[i].ids.empty())
          errors.push_back("prompt " + std::to_string(i) + " is empty: `--decode ar` needs a prompt token to start from");
  }
  if (!errors.empty()) throw ConfigError(errors, {});

  apps::JsonlOutput out(cli, "--output", errors);
  if (!errors.empty()) throw ConfigError(errors, {});
  std::cerr << " > model: " << model.description() << " on " << device.str() << "\n"
            << " > decode: " << decode_mode_name(decode)
            << (decode == DecodeMode::Full ? std::string()
                                           : std::string(", kv cache ") + (bdec.exact_cache ? "exact" : "none") +
                                                 (bdec.causal_clean ? ", causal clean stream" : ", block-causal clean stream"))
            << (batch_invariant ? ", batch-invariant kernels" : "") << (cuda_graphs ? ", CUDA graphs" : "") << "\n"
            << " > sampler: gen length " << sc.gen_length << ", steps " << sc.steps << ", block length "
            << sc.block_length << ", remasking " << remasking_name(sc.remasking) << ", temperature "
            << sc.temperature << ", cfg scale " << sc.cfg_scale << ", mask token " << sc.mask_token
            << (sc.stop_at_eos ? ", stop at EOS " + std::to_string(sc.eos_token) : std::string())
            << (sc.confidence_threshold > 0 ? ", confidence threshold " + std::to_string(sc.confidence_threshold)
                                            : std::string())
            << (sc.kv_cache != KvCacheMode::None ? std::string(", kv cache ") + kv_cache_mode_name(sc.kv_cache)
                                                 : std::string())
            << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  int64_t generated = 0, steps = 0, forwards = 0;
  // Rows are written in input order, each as soon as it and every row before it are finished
  // (a row of a batch that stops at EOS can be done blocks before the others), and flushed: a
  // run that is stopped keeps every row it finished.
  size_t next = 0;
  std::map<size_t, GenerationResult> pending;
  auto write_row = [&](size_t i, const GenerationResult& r) {
    const apps::Prompt& p = prompts[i];
    std::vector<int32_t> shown = r.tokens;
    const auto eos = std::find(shown.begin(), shown.end(), static_cast<int32_t>(sc.eos_token));
    if (sc.eos_token >= 0) shown.erase(eos, shown.end());
    json j;
    j["index"] = i;
    j["prompt"] = p.has_text ? json(p.text) : json(nullptr);
    j["prompt_ids"] = p.ids;
    // Well-formed UTF-8 even where the ids end inside a character (U+FFFD there); the ids
    // themselves are exact.
    j["text"] = tok ? json(tok->decode(shown)) : json(nullptr);
    j["token_ids"] = r.tokens;
    j["steps"] = r.steps;
    j["forwards"] = r.forwards;
    j["stopped_at_eos"] = r.stopped_at_eos;
    out.write(j);
    out.flush();
    generated += static_cast<int64_t>(r.tokens.size());
    steps += r.steps;
    forwards += r.forwards;
  };
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(batch_size)) {
    std::vector<GenerationRequest> batch;
    for (size_t i = first; i < std::min(prompts.size(), first + static_cast<size_t>(batch_size)); ++i)
      batch.push_back({prompts[i].ids, static_cast<int64_t>(i)});
    const GenerationFinished done = [&](size_t k, const GenerationResult& r) {
      pending.emplace(first + k, r);
      for (auto it = pending.find(next); it != pending.end(); it = pending.find(next)) {
        write_row(next++, it->second);
        pending.erase(it);
      }
    };
    if (decode == DecodeMode::Full) generate(model, batch, sc, done);
    else generate_blocks(model, batch, sc, bdec, done);
  }
  MDLM_CHECK(next == prompts.size() && pending.empty(), "wrote ", next, " of ", prompts.size(), " rows");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << " > generated " << generated << " tokens for " << prompts.size() << " prompts in " << s
            << " s (" << (s > 0 ? static_cast<double>(generated) / s : 0.0) << " tokens/s)\n"
            << " > tokens per forward: " << (steps > 0 ? static_cast<double>(generated) / static_cast<double>(steps) : 0.0)
            << " (" << generated << " committed tokens in " << steps << " decoding forwards per request"
            << (forwards > 0 ? ", " + std::to_string(forwards) + " forwards with the prefill and cache updates"
                             : std::string())
            << ")\n";
  if (cuda_graphs) {
    const GraphSchedule& g = model.exact_cache_graph_schedule();
    std::cerr << " > cuda graphs: " << g.captures() << " captures, " << g.replays() << " replays, " << g.eager()
              << " eager forwards (the first of each shape; docs/generation.md, \"CUDA graphs\")\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return apps::tool_main(argc, argv, {"generate_difflm", kUsage, flags()}, run);
}
