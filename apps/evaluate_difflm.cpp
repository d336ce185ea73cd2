// evaluate_difflm: likelihood evaluation of a masked-diffusion LM (diffusion/likelihood.h;
// docs/evaluation.md). Thin by design: model loading, estimators and tokenizers are library calls.
//
//   evaluate_difflm --load CKPT --task elbo (--data-path PREFIX | --text-jsonl FILE) [--mc-num D]
//       Monte-Carlo ELBO per token under the fixed evaluation noise (D draws; default 1)
//   evaluate_difflm --load CKPT --task loglik --requests-jsonl FILE [--mc-num 128 --mc-batch-size 16]
//       log p(continuation | context) per request, LLaDA's estimator; requests as lm-evaluation-
//       harness `loglikelihood` arguments: {"arguments": [context, continuation]} (or "args", or
//       {"context": ..., "continuation": ...}, or token ids "context_ids" / "continuation_ids")
//   evaluate_difflm --load CKPT --task multiple-choice --task-jsonl FILE
//       accuracy (acc) and length-normalised accuracy (acc_norm) over {"context", "choices",
//       "gold"} documents, one loglik request per choice (context, target_delimiter + choice)
//   evaluate_difflm --load CKPT --task harness --requests-jsonl FILE [--block-length K]
//       lm-evaluation-harness style requests, one a line: {"request_type": "loglikelihood",
//       "arguments": [context, continuation]} -> {"loglikelihood", "is_greedy"};
//       {"request_type": "generate_until", "arguments": [context, {"until": [...],
//       "max_gen_toks": N}]} -> {"generated_text"} (greedy, one token a step: the full-sequence
//       sampler, or for block-diffusion checkpoints block decoding with the exact cache, which
//       stops after the block where an `until` string appears)
// Block-diffusion checkpoints (--dlm-block-size recorded) get the block estimators
// (docs/evaluation.md "Block-diffusion models"). Every summary reports examples_per_second.
// Per-request results go to --output (JSONL) or stdout; the summary line goes to stderr and, with
// --summary-json FILE, to that file. Exit codes: 0 success; 2 invalid arguments or a reported
// error; 3 unexpected failure.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include "inference_cli.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/data/indexed_dataset.h"
#include "megadlm/diffusion/block_sampler.h"
#include "megadlm/diffusion/likelihood.h"

using namespace megadlm;
using nlohmann::json;

namespace {

const char* kUsage =
    "usage: evaluate_difflm (--load DIR | --hf-dir DIR) --task elbo|loglik|multiple-choice|harness ...\n"
    "  elbo:            (--data-path PREFIX | --text-jsonl FILE) [--seq-length S] [--max-samples N] [--mc-num D]\n"
    "  loglik:          --requests-jsonl FILE [--mc-num N] [--mc-batch-size B] [--cfg-scale W] [--check-greedy]\n"
    "  multiple-choice: --task-jsonl FILE [--target-delimiter STR] [--mc-num N] [--mc-batch-size B]\n"
    "  harness:         --requests-jsonl FILE [--mc-num N] [--mc-batch-size B] [--block-length K]\n"
    "LLaDA's estimators (get_log_likelihood.py, eval_llada.py); docs/evaluation.md.";

std::vector<apps::CliFlag> flags() {
  std::vector<apps::CliFlag> f = apps::common_inference_flags();
  const std::vector<apps::CliFlag> own = {
      {.name = "--task", .value = "NAME", .help = "what to evaluate", .choices = "elbo loglik multiple-choice harness",
       .required = true},
      {"--data-path", "PREFIX", "elbo: a Megatron indexed dataset PREFIX.bin/.idx (documents concatenated in order)"},
      {"--text-jsonl", "FILE", "elbo: JSONL with \"text\" per line (tokenized, EOD appended when the tokenizer has one)"},
      {"--seq-length", "S", "elbo: tokens scored per sample (default: the checkpoint's --seq-length)"},
      {"--max-samples", "N", "elbo: score at most N samples"},
      {"--micro-batch-size", "B", "elbo: samples per forward pass (default 4)"},
      {"--requests-jsonl", "FILE", "loglik: one (context, continuation) request per line; harness: lm-eval requests"},
      {"--block-length", "K", "harness generate_until: the sampler's block length (full-sequence models: divides every "
                              "max_gen_toks, default one block; block-diffusion models: default the checkpoint's block size)"},
      {"--task-jsonl", "FILE", "multiple-choice: one {\"context\", \"choices\", \"gold\"} document per line"},
      {"--target-delimiter", "STR", "multiple-choice: between context and choice (lm-eval's default \" \")"},
      {"--mc-num", "N", "Monte-Carlo samples per request (loglik default 128; elbo: noise draws, default 1)"},
      {"--mc-batch-size", "B", "loglik: rows evaluated together, LLaDA's batch_size (default 16); divides --mc-num"},
      {"--cfg-scale", "W", "classifier-free guidance for the likelihood (default 0)"},
      {"--check-greedy", nullptr, "loglik: also report is_greedy (Ly extra forward passes per request)"},
      {"--output", "FILE", "per-request JSONL results (default: stdout)"},
      {"--summary-json", "FILE", "write the summary as one JSON object"},
      {"--batch-invariant", nullptr, "CUDA: generate_difflm's batch-invariant kernels (docs/generation.md): a row's "
                                     "logits do not depend on the other rows of its forward; slower (default: off)"},
      {"--cuda-graphs", nullptr, "CUDA, --task harness on a block-diffusion checkpoint: generate_until's block "
                                 "decoding steps captured once per block as CUDA graphs and replayed "
                                 "(docs/generation.md, \"CUDA graphs\"); the same tokens (default: off)"},
  };
  f.insert(f.end() - 1, own.begin(), own.end());
  return f;
}

std::vector<json> read_jsonl(const std::string& flag, const std::string& path, std::vector<std::string>& errors) {
  std::vector<json> out;
  std::ifstream in(path);
  if (!in) {
    errors.push_back("`" + flag + " " + path + "`: cannot read the file");
    return out;
  }
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception& e) {
      errors.push_back(path + " line " + std::to_string(n) + ": not JSON (" + e.what() + ")");
    }
  }
  return out;
}

/// lm-eval's pair encoding (docs/evaluation.md): trailing spaces of the context move to the
/// continuation; context + continuation is tokenized as one text and the continuation is what
/// follows the context's own tokens.
std::pair<std::vector<int32_t>, std::vector<int32_t>> encode_pair(const data::Tokenizer& tok, std::string context,
                                                                  std::string continuation) {
  const size_t end = context.find_last_not_of(' ');
  const size_t keep = end == std::string::npos ? 0 : end + 1;
  continuation = context.substr(keep) + continuation;
  context.resize(keep);
  const std::vector<int32_t> whole = tok.encode(context + continuation);
  std::vector<int32_t> ctx = tok.encode(context);
  const size_t n = std::min(ctx.size(), whole.size());
  return {std::vector<int32_t>(whole.begin(), whole.begin() + static_cast<int64_t>(n)),
          std::vector<int32_t>(whole.begin() + static_cast<int64_t>(n), whole.end())};
}

/// A request from one JSONL object (text through the tokenizer, or token ids).
bool request_of(const json& j, const data::Tokenizer* tok, LikelihoodRequest& r, std::string& error) {
  if (j.contains("context_ids") && j.contains("continuation_ids")) {
    r.context = j.at("context_ids").get<std::vector<int32_t>>();
    r.continuation = j.at("continuation_ids").get<std::vector<int32_t>>();
    return true;
  }
  std::string ctx, cont;
  if (j.contains("arguments") || j.contains("args")) {
    const json& a = j.contains("arguments") ? j.at("arguments") : j.at("args");
    if (!a.is_array() || a.size() != 2) {
      error = "\"arguments\" must be [context, continuation]";
      return false;
    }
    ctx = a[0].get<std::string>();
    cont = a[1].get<std::string>();
  } else if (j.contains("context") && j.contains("continuation")) {
    ctx = j.at("context").get<std::string>();
    cont = j.at("continuation").get<std::string>();
  } else {
    error = "needs \"arguments\": [context, continuation], \"context\" + \"continuation\", or token ids";
    return false;
  }
  if (tok == nullptr) {
    error = "text requests need a tokenizer (`--tokenizer-type`)";
    return false;
  }
  std::tie(r.context, r.continuation) = encode_pair(*tok, ctx, cont);
  return true;
}

size_t utf8_chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

using Clock = std::chrono::steady_clock;

/// examples_per_second and seconds of a task that started at `t0` and scored `examples`.
void add_rate(json& s, double examples, Clock::time_point t0) {
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  s["seconds"] = sec;
  s["examples_per_second"] = sec > 0 ? examples / sec : 0.0;
}

// ---- tasks -------------------------------------------------------------------------------

json run_elbo(const apps::Cli& cli, LogitsModel& model, const RunConfig& cfg, const data::Tokenizer* tok,
              uint64_t seed, std::vector<std::string>& errors, apps::JsonlOutput& out) {
  const int64_t seq = cli.integer("--seq-length", cfg.model.seq_length, errors);
  const int64_t max_samples = cli.integer("--max-samples", -1, errors);
  const int64_t draws = cli.integer("--mc-num", 1, errors);
  const int64_t mbs = cli.integer("--micro-batch-size", 4, errors);
  if (seq < 1 || draws < 1 || mbs < 1) errors.push_back("`--seq-length`, `--mc-num` and `--micro-batch-size` must be >= 1");
  if (cli.has("--data-path") == cli.has("--text-jsonl"))
    errors.push_back("--task elbo needs exactly one of `--data-path PREFIX` and `--text-jsonl FILE`");
  std::vector<int32_t> stream;
  if (errors.empty() && cli.has("--data-path")) {
    const data::IndexedDataset ds(cli.get("--data-path"));
    ds.check_token_ids(cfg.model.vocab_size);
    for (int64_t i = 0; i < ds.num_sequences(); ++i) {
      const std::vector<int32_t> s = ds.sequence(i);
      stream.insert(stream.end(), s.begin(), s.end());
    }
  } else if (errors.empty()) {
    if (tok == nullptr) errors.push_back("`--text-jsonl` needs a tokenizer (`--tokenizer-type`)");
    for (const json& j : read_jsonl("--text-jsonl", cli.get("--text-jsonl"), errors)) {
      if (!j.contains("text") || tok == nullptr) continue;
      const std::vector<int32_t> ids = tok->encode(j.at("text").get<std::string>());
      stream.insert(stream.end(), ids.begin(), ids.end());
      if (tok->eod() >= 0) stream.push_back(tok->eod());
    }
  }
  if (!errors.empty()) throw ConfigError(errors, {});
  // Megatron's GPT samples without shuffling: sample i = tokens [i*S, i*S + S]; difflm-noshift
  // scores tokens 1..S of each, so every token after the first is scored once.
  int64_t samples = stream.size() > 1 ? (static_cast<int64_t>(stream.size()) - 1) / seq : 0;
  if (max_samples >= 0) samples = std::min(samples, max_samples);
  if (samples == 0) MDLM_FAIL("the data holds ", stream.size(), " tokens: fewer than one sample of --seq-length ", seq, " + 1");
  const Clock::time_point t0 = Clock::now();
  ElboResult total;
  total.per_draw.assign(static_cast<size_t>(draws), 0.0);
  std::vector<double> draw_tokens(static_cast<size_t>(draws), 0.0);
  for (int64_t first = 0; first < samples; first += mbs) {
    std::vector<std::vector<int32_t>> batch;
    for (int64_t i = first; i < std::min(samples, first + mbs); ++i)
      batch.emplace_back(stream.begin() + i * seq, stream.begin() + i * seq + seq + 1);
    for (int64_t d = 0; d < draws; ++d) {
      const ElboResult r = monte_carlo_elbo(model, batch, first, cfg.diffusion, seed + static_cast<uint64_t>(d), 1);
      total.nll_sum += r.nll_sum;
      if (d == 0) {  // the same for every draw (the clean half never sees the noise)
        total.ar_nll_sum += r.ar_nll_sum;
        total.ar_tokens += r.ar_tokens;
      }
      total.tokens += r.tokens;
      total.per_draw[static_cast<size_t>(d)] += r.nll_sum;
      draw_tokens[static_cast<size_t>(d)] += r.tokens;
    }
  }
  for (int64_t d = 0; d < draws; ++d) total.per_draw[static_cast<size_t>(d)] /= draw_tokens[static_cast<size_t>(d)];
  json s;
  s["task"] = "elbo";
  s["elbo_per_token"] = total.per_token();
  s["ppl_upper_bound"] = std::exp(std::min(50.0, total.per_token()));
  s["samples"] = samples;
  s["seq_length"] = seq;
  s["draws"] = draws;
  s["tokens"] = total.tokens / static_cast<double>(draws);
  s["per_draw"] = total.per_draw;
  s["loss_weight"] = dlm_loss_weight_name(cfg.diffusion.loss_weight);
  if (cfg.diffusion.block_diffusion()) s["block_size"] = cfg.diffusion.block_size;
  if (total.ar_tokens > 0) {  // the causal clean half's exact autoregressive NLL
    s["ar_nll_per_token"] = total.ar_nll_sum / total.ar_tokens;
    s["ar_tokens"] = total.ar_tokens;
  }
  add_rate(s, static_cast<double>(samples), t0);
  out.write(s);
  return s;
}

LikelihoodConfig likelihood_config(const apps::Cli& cli, int64_t mask, uint64_t seed, std::vector<std::string>& errors) {
  LikelihoodConfig lc;
  lc.mc_num = cli.integer("--mc-num", 128, errors);
  lc.mc_batch = cli.integer("--mc-batch-size", std::min<int64_t>(16, lc.mc_num), errors);
  lc.cfg_scale = cli.number("--cfg-scale", 0.0, errors);
  lc.mask_token = mask;
  lc.seed = seed;
  return lc;
}

json run_loglik(const apps::Cli& cli, LogitsModel& model, const data::Tokenizer* tok, const LikelihoodConfig& lc,
                std::vector<std::string>& errors, apps::JsonlOutput& out) {
  if (!cli.has("--requests-jsonl")) errors.push_back("--task loglik needs `--requests-jsonl FILE`");
  std::vector<LikelihoodRequest> reqs;
  const std::string path = cli.get("--requests-jsonl");
  for (const json& j : read_jsonl("--requests-jsonl", path, errors)) {
    LikelihoodRequest r;
    std::string error;
    if (!request_of(j, tok, r, error)) errors.push_back(path + " request " + std::to_string(reqs.size()) + ": " + error);
    r.index = static_cast<int64_t>(reqs.size());
    reqs.push_back(std::move(r));
  }
  if (!errors.empty()) throw ConfigError(errors, {});
  const Clock::time_point t0 = Clock::now();
  double sum = 0;
  for (const LikelihoodRequest& r : reqs) {
    const LikelihoodResult res = conditional_loglikelihood(model, r, lc);
    json j;
    j["index"] = r.index;
    j["loglikelihood"] = res.loglikelihood;
    j["standard_error"] = res.standard_error;
    j["is_greedy"] = cli.has("--check-greedy") ? json(greedy_reproduces(model, r, lc)) : json(false);
    j["context_tokens"] = r.context.size();
    j["continuation_tokens"] = r.continuation.size();
    out.write(j);
    sum += res.loglikelihood;
  }
  json s;
  s["task"] = "loglik";
  s["requests"] = reqs.size();
  s["mean_loglikelihood"] = reqs.empty() ? 0.0 : sum / static_cast<double>(reqs.size());
  s["mc_num"] = lc.mc_num;
  s["mc_batch_size"] = lc.mc_batch;
  if (lc.block_size > 0) s["block_size"] = lc.block_size;
  add_rate(s, static_cast<double>(reqs.size()), t0);
  return s;
}

json run_multiple_choice(const apps::Cli& cli, LogitsModel& model, const data::Tokenizer* tok,
                         const LikelihoodConfig& lc, std::vector<std::string>& errors, apps::JsonlOutput& out) {
  if (!cli.has("--task-jsonl")) errors.push_back("--task multiple-choice needs `--task-jsonl FILE`");
  const std::string path = cli.get("--task-jsonl");
  const std::string delimiter = cli.get("--target-delimiter", " ");
  struct Doc {
    std::vector<LikelihoodRequest> choices;
    std::vector<size_t> lengths;  // characters (token count for id choices), for acc_norm
    int64_t gold = 0;
  };
  std::vector<Doc> docs;
  int64_t next_index = 0;
  for (const json& j : read_jsonl("--task-jsonl", path, errors)) {
    const std::string where = path + " document " + std::to_string(docs.size());
    Doc d;
    try {
      d.gold = j.contains("gold") ? j.at("gold").get<int64_t>() : j.at("label").get<int64_t>();
      if (j.contains("choices_ids")) {
        const auto ctx = j.at("context_ids").get<std::vector<int32_t>>();
        for (const auto& c : j.at("choices_ids")) {
          d.choices.push_back({ctx, c.get<std::vector<int32_t>>(), next_index++});
          d.lengths.push_back(d.choices.back().continuation.size());
        }
      } else {
        if (tok == nullptr) {
          errors.push_back(where + ": text choices need a tokenizer (`--tokenizer-type`)");
          continue;
        }
        const std::string ctx = j.contains("context") ? j.at("context").get<std::string>() : j.at("query").get<std::string>();
        for (const auto& c : j.at("choices")) {
          LikelihoodRequest r;
          const std::string cont = delimiter + c.get<std::string>();
          std::tie(r.context, r.continuation) = encode_pair(*tok, ctx, cont);
          r.index = next_index++;
          d.choices.push_back(std::move(r));
          d.lengths.push_back(utf8_chars(cont));
        }
      }
    } catch (const json::exception& e) {
      errors.push_back(where + ": needs \"context\", \"choices\" and \"gold\" (" + e.what() + ")");
      continue;
    }
    if (d.choices.empty() || d.gold < 0 || d.gold >= static_cast<int64_t>(d.choices.size()))
      errors.push_back(where + ": gold index " + std::to_string(d.gold) + " is not one of its " +
                       std::to_string(d.choices.size()) + " choices");
    docs.push_back(std::move(d));
  }
  if (docs.empty()) errors.push_back(path + ": no document");
  if (!errors.empty()) throw ConfigError(errors, {});
  const Clock::time_point t0 = Clock::now();
  int64_t correct = 0, correct_norm = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const Doc& d = docs[i];
    std::vector<double> ll;
    for (const LikelihoodRequest& r : d.choices) ll.push_back(conditional_loglikelihood(model, r, lc).loglikelihood);
    size_t best = 0, best_norm = 0;
    for (size_t c = 1; c < ll.size(); ++c) {
      if (ll[c] > ll[best]) best = c;
      if (ll[c] / std::max<double>(1.0, static_cast<double>(d.lengths[c])) >
          ll[best_norm] / std::max<double>(1.0, static_cast<double>(d.lengths[best_norm])))
        best_norm = c;
    }
    correct += static_cast<int64_t>(best) == d.gold;
    correct_norm += static_cast<int64_t>(best_norm) == d.gold;
    json j;
    j["doc"] = i;
    j["loglikelihoods"] = ll;
    j["pred"] = best;
    j["pred_norm"] = best_norm;
    j["gold"] = d.gold;
    out.write(j);
  }
  json s;
  s["task"] = "multiple-choice";
  s["documents"] = docs.size();
  s["acc"] = static_cast<double>(correct) / static_cast<double>(docs.size());
  s["acc_norm"] = static_cast<double>(correct_norm) / static_cast<double>(docs.size());
  s["mc_num"] = lc.mc_num;
  if (lc.block_size > 0) s["block_size"] = lc.block_size;
  add_rate(s, static_cast<double>(docs.size()), t0);
  return s;
}

// ---- harness: lm-evaluation-harness style requests ----------------------------------------

struct HarnessRequest {
  std::string type;               // loglikelihood | generate_until
  LikelihoodRequest ll;           // loglikelihood
  std::vector<int32_t> prompt;    // generate_until
  std::vector<std::string> until;
  int64_t max_gen_toks = 256;     // lm-eval's default
  json passthrough;               // doc_id, idx, ... copied to the result
};

bool harness_request_of(const json& j, const data::Tokenizer* tok, HarnessRequest& h, std::string& error) {
  h.type = j.value("request_type", j.value("type", std::string()));
  for (const char* k : {"doc_id", "idx", "task_name", "metadata"})
    if (j.contains(k)) h.passthrough[k] = j.at(k);
  if (h.type == "loglikelihood") return request_of(j, tok, h.ll, error);
  if (h.type != "generate_until") {
    error = "\"request_type\": \"" + h.type + "\": valid: loglikelihood, generate_until";
    return false;
  }
  std::string ctx;
  json gen = json::object();
  if (j.contains("arguments") || j.contains("args")) {
    const json& a = j.contains("arguments") ? j.at("arguments") : j.at("args");
    if (!a.is_array() || a.size() != 2 || !a[0].is_string() || !a[1].is_object()) {
      error = "generate_until \"arguments\" must be [context, {\"until\": [...], \"max_gen_toks\": N}]";
      return false;
    }
    ctx = a[0].get<std::string>();
    gen = a[1];
  } else if (j.contains("context")) {
    ctx = j.at("context").get<std::string>();
    gen = j;
  } else {
    error = "generate_until needs \"arguments\": [context, {\"until\", \"max_gen_toks\"}] or \"context\"";
    return false;
  }
  if (gen.contains("until")) {
    const json& u = gen.at("until");
    if (u.is_string()) h.until.push_back(u.get<std::string>());
    else h.until = u.get<std::vector<std::string>>();
  }
  if (gen.contains("max_gen_toks")) h.max_gen_toks = gen.at("max_gen_toks").get<int64_t>();
  if (h.max_gen_toks < 1) {
    error = "\"max_gen_toks\": " + std::to_string(h.max_gen_toks) + " must be >= 1";
    return false;
  }
  if (tok == nullptr) {
    error = "generate_until requests need a tokenizer (`--tokenizer-type`)";
    return false;
  }
  h.prompt = tok->encode(ctx);
  return true;
}

/// The sampler's settings for a generate_until request (docs/evaluation.md). Full-sequence
/// models: LLaDA's sampler over max_gen_toks, one token a step, in blocks of --block-length (default
/// one block). Block-diffusion models: block decoding (block_sampler.h) in blocks of the
/// checkpoint's --dlm-block-size (or --block-length), one token a step, over max_gen_toks rounded
/// up to whole blocks; the result keeps the first max_gen_toks tokens.
SamplerConfig harness_sampler_config(const HarnessRequest& h, int64_t block_length, const LikelihoodConfig& lc,
                                     const data::Tokenizer& tok, const RunConfig& cfg) {
  SamplerConfig sc;
  if (cfg.diffusion.block_diffusion()) {
    sc.block_length = block_length > 0 ? block_length : cfg.diffusion.block_size;
    sc.gen_length = (h.max_gen_toks + sc.block_length - 1) / sc.block_length * sc.block_length;
  } else {
    sc.gen_length = h.max_gen_toks;
    sc.block_length = block_length > 0 ? block_length : h.max_gen_toks;
  }
  sc.steps = sc.gen_length;  // one token a step: the reference's setting
  sc.mask_token = lc.mask_token;
  sc.seed = lc.seed;
  sc.eos_token = tok.eod() != lc.mask_token ? tok.eod() : -1;
  sc.stop_at_eos = sc.eos_token >= 0;
  return sc;
}

/// Block decoding for the harness: the exact cache, the checkpoint's clean-stream rule.
BlockDecoding harness_block_decoding(const RunConfig& cfg, bool cuda_graphs) {
  BlockDecoding d;
  d.causal_clean = cfg.model.block_diffusion_causal_clean;
  d.exact_cache = true;
  d.cuda_graphs = cuda_graphs;
  return d;
}

/// The generated ids up to the first EOS, decoded and cut at the first occurrence of any stop
/// string (lm-eval's generate_until); `cut` says whether a stop string was found.
std::string harness_text(const data::Tokenizer& tok, std::vector<int32_t> ids, int64_t eos,
                         const std::vector<std::string>& until, bool* cut = nullptr) {
  if (eos >= 0) ids.erase(std::find(ids.begin(), ids.end(), static_cast<int32_t>(eos)), ids.end());
  std::string text = tok.decode(ids);
  bool found = false;
  for (const std::string& u : until) {
    const size_t at = u.empty() ? std::string::npos : text.find(u);
    if (at != std::string::npos) {
      text.resize(at);
      found = true;
    }
  }
  if (cut != nullptr) *cut = found;
  return text;
}

json run_harness(const apps::Cli& cli, LogitsModel& model, const RunConfig& cfg, const data::Tokenizer* tok,
                 const LikelihoodConfig& lc, std::vector<std::string>& errors, apps::JsonlOutput& out) {
  if (!cli.has("--requests-jsonl")) errors.push_back("--task harness needs `--requests-jsonl FILE`");
  const std::string path = cli.get("--requests-jsonl");
  const int64_t block_length = cli.integer("--block-length", 0, errors);
  std::vector<HarnessRequest> reqs;
  for (const json& j : read_jsonl("--requests-jsonl", path, errors)) {
    HarnessRequest h;
    std::string error;
    const std::string where = path + " request " + std::to_string(reqs.size());
    try {
      if (!harness_request_of(j, tok, h, error)) errors.push_back(where + ": " + error);
    } catch (const json::exception& e) {
      errors.push_back(where + ": " + e.what());
    }
    h.ll.index = static_cast<int64_t>(reqs.size());
    const bool bd = cfg.diffusion.block_diffusion();
    if (h.type == "generate_until" && error.empty() && tok != nullptr && block_length >= 0 &&
        (bd || block_length == 0 || h.max_gen_toks % block_length == 0)) {
      const SamplerConfig sc = harness_sampler_config(h, block_length, lc, *tok, cfg);
      std::vector<std::string> problems =
          bd ? block_decoding_problems(sc, harness_block_decoding(cfg, cli.has("--cuda-graphs")), model.input_vocab_size()) : std::vector<std::string>{};
      for (const std::string& p : request_problems({{h.prompt, static_cast<int64_t>(reqs.size())}}, sc,
                                                   model.input_vocab_size(), model.max_positions()))
        problems.push_back(p);
      for (std::string msg : problems) {  // the sampler names its flag; here it is the request's max_gen_toks
        for (size_t at; (at = msg.find("`--gen-length")) != std::string::npos;) msg.replace(at, 13, "`max_gen_toks");
        if (sc.gen_length != h.max_gen_toks)
          msg += " (\"max_gen_toks\": " + std::to_string(h.max_gen_toks) + " rounded up to whole blocks of " +
                 std::to_string(sc.block_length) + ")";
        errors.push_back(where + ": " + msg);
      }
    }
    if (h.type == "generate_until" && !bd && block_length > 0 && h.max_gen_toks % block_length != 0)
      errors.push_back(where + ": \"max_gen_toks\": " + std::to_string(h.max_gen_toks) +
                       " is not a multiple of `--block-length " + std::to_string(block_length) + "`");
    reqs.push_back(std::move(h));
  }
  if (block_length < 0) errors.push_back("`--block-length " + std::to_string(block_length) + "` must be >= 1");
  if (reqs.empty() && errors.empty()) errors.push_back(path + ": no request");
  if (!errors.empty()) throw ConfigError(errors, {});
  const Clock::time_point t0 = Clock::now();
  int64_t n_ll = 0, n_gen = 0, gen_forwards = 0, gen_steps = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const HarnessRequest& h = reqs[i];
    json j = h.passthrough;
    j["index"] = i;
    j["request_type"] = h.type;
    if (h.type == "loglikelihood") {
      const LikelihoodResult res = conditional_loglikelihood(model, h.ll, lc);
      const bool greedy = greedy_reproduces(model, h.ll, lc);
      j["loglikelihood"] = res.loglikelihood;
      j["is_greedy"] = greedy;
      j["result"] = json::array({res.loglikelihood, greedy});  // what lm-eval's LM.loglikelihood returns
      j["standard_error"] = res.standard_error;
      ++n_ll;
    } else {
      const SamplerConfig sc = harness_sampler_config(h, block_length, lc, *tok, cfg);
      const std::vector<GenerationRequest> one = {{h.prompt, static_cast<int64_t>(i)}};
      std::vector<int32_t> ids;
      if (cfg.diffusion.block_diffusion()) {
        // Block decoding stops after the block where a stop string (within max_gen_toks) appears.
        BlockDecoding bdec = harness_block_decoding(cfg, cli.has("--cuda-graphs"));
        bdec.stop_after_block = [&](size_t, const std::vector<int32_t>& generated) {
          bool cut = false;
          const size_t n = std::min(generated.size(), static_cast<size_t>(h.max_gen_toks));
          harness_text(*tok, std::vector<int32_t>(generated.begin(), generated.begin() + static_cast<int64_t>(n)),
                       sc.eos_token, h.until, &cut);
          return cut;
        };
        const GenerationResult r = generate_blocks(model, one, sc, bdec)[0];
        ids = r.tokens;
        j["forwards"] = r.forwards;
        gen_forwards += r.forwards;
        gen_steps += r.steps;
      } else {
        ids = generate(model, one, sc)[0].tokens;
      }
      if (static_cast<int64_t>(ids.size()) > h.max_gen_toks) ids.resize(static_cast<size_t>(h.max_gen_toks));
      bool cut = false;
      const std::string text = harness_text(*tok, ids, sc.eos_token, h.until, &cut);
      if (sc.eos_token >= 0) ids.erase(std::find(ids.begin(), ids.end(), static_cast<int32_t>(sc.eos_token)), ids.end());
      j["generated_text"] = text;
      j["result"] = text;
      j["generated_tokens"] = ids.size();
      j["generated_ids"] = ids;
      j["stopped_at_until"] = cut;
      ++n_gen;
    }
    out.write(j);
  }
  json s;
  s["task"] = "harness";
  s["requests"] = reqs.size();
  s["loglikelihood_requests"] = n_ll;
  s["generate_until_requests"] = n_gen;
  if (cfg.diffusion.block_diffusion() && n_gen > 0) {  // block decoding, exact cache
    s["decode"] = "block";
    s["generate_until_forwards"] = gen_forwards;
    s["generate_until_decoding_forwards"] = gen_steps;
  }
  s["mc_num"] = lc.mc_num;
  if (lc.block_size > 0) s["block_size"] = lc.block_size;
  add_rate(s, static_cast<double>(reqs.size()), t0);
  return s;
}

int run(const apps::Cli& cli) {
  std::vector<std::string> errors;
  const training::InferenceSource src = apps::inference_source(cli, errors);
  const Device device = apps::inference_device(cli, errors);
  const std::string task = cli.get("--task");  // required, one of the table's choices
  const uint64_t seed = static_cast<uint64_t>(cli.integer("--seed", 1234, errors));
  if (task != "elbo") {
    for (const std::string& p : likelihood_config_problems(likelihood_config(cli, 0, seed, errors), 0))
      errors.push_back(p);
  }
  if (cli.has("--cuda-graphs") && device.is_cpu())
    errors.push_back("`--cuda-graphs` captures CUDA work; the model runs on the CPU (give `--device cuda`)");
  if (cli.has("--cuda-graphs") && task != "harness")
    errors.push_back("`--cuda-graphs` applies to block decoding (`--task harness` generate_until requests on a "
                     "block-diffusion checkpoint); `--task " + task + "` runs no decoding");
  if (!errors.empty()) throw ConfigError(errors, {});
  ops::set_batch_invariant(cli.has("--batch-invariant"));  // before the model runs anything

  training::InferenceModel model(src, device);
  const RunConfig& cfg = model.config();
  if (cfg.diffusion.mode == RunningMode::Vanilla)
    errors.push_back(model.description() + " is an autoregressive model; evaluate_difflm scores masked-diffusion models");
  if (cli.has("--cuda-graphs") && !cfg.diffusion.block_diffusion())
    errors.push_back("`--cuda-graphs` captures block decoding's steps; " + model.description() +
                     " is a full-sequence model, whose generate_until requests run the full-sequence sampler");
  const int64_t mask = apps::inference_mask_token(cli, cfg, errors);
  const std::unique_ptr<data::Tokenizer> tok = apps::inference_tokenizer(cli, cfg, src.hf_dir);
  apps::JsonlOutput out(cli, "--output", errors);
  std::cerr << " > model: " << model.description() << " on " << device.str()
            << (ops::batch_invariant() ? ", batch-invariant kernels" : "") << "\n";
  json summary;
  if (task == "elbo") {
    if (mask < 0 || mask >= model.input_vocab_size())
      errors.push_back("the mask token " + std::to_string(mask) + " is outside the model's vocabulary [0, " +
                       std::to_string(model.input_vocab_size()) + "); give `--mask-token-id`");
    RunConfig c = cfg;
    if (mask >= 0) c.diffusion.mask_token = mask;
    summary = run_elbo(cli, model, c, tok.get(), seed, errors, out);
  } else {
    LikelihoodConfig lc = likelihood_config(cli, mask, seed, errors);
    lc.block_size = cfg.diffusion.block_size;
    for (const std::string& p : likelihood_config_problems(lc, model.input_vocab_size())) errors.push_back(p);
    if (lc.block_size > 0 && lc.cfg_scale > 0)
      errors.push_back("`--cfg-scale " + cli.get("--cfg-scale") + "`: classifier-free guidance is not defined for "
                       "block-diffusion checkpoints (--dlm-block-size " + std::to_string(lc.block_size) + "); leave it at 0");
    if (task == "loglik") summary = run_loglik(cli, model, tok.get(), lc, errors, out);
    else if (task == "harness") summary = run_harness(cli, model, cfg, tok.get(), lc, errors, out);
    else summary = run_multiple_choice(cli, model, tok.get(), lc, errors, out);
  }
  out.flush();
  std::cerr << " > " << summary.dump() << "\n";
  if (cli.has("--summary-json")) {
    std::ofstream s(cli.get("--summary-json"));
    s << summary.dump(2) << "\n";
    if (!s) MDLM_FAIL("`--summary-json ", cli.get("--summary-json"), "`: write failed");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return apps::tool_main(argc, argv, {"evaluate_difflm", kUsage, flags()}, run);
}
