// LLaDA's sampler (include/megadlm/diffusion/sampler.h; docs/generation.md). The canvas and the
// per-row choices live on the host; the model's logits stay on its device and are reduced there
// by ops::sample_proposals, so a step moves two numbers per masked position.
#include "megadlm/diffusion/sampler.h"
#include <algorithm>
#include <cmath>
#include <numeric>
#include "megadlm/core/error.h"
#include "megadlm/ops/sampling.h"

namespace megadlm {

const char* remasking_name(Remasking r) {
  return r == Remasking::LowConfidence ? "low_confidence" : "random";
}

const char* kv_cache_mode_name(KvCacheMode m) {
  return m == KvCacheMode::None ? "none" : m == KvCacheMode::Prefix ? "prefix" : "dual";
}

Tensor LogitsModel::cached_logits(const CanvasBatch&, const std::vector<int32_t>&, int64_t, int64_t, bool) {
  MDLM_FAIL("this model has no key/value cache (`--kv-cache` needs one)");
}

void LogitsModel::exact_cache_reset(int64_t, int64_t) {
  MDLM_FAIL("this model has no exact key/value cache (block decoding with `--kv-cache exact` needs one)");
}

Tensor LogitsModel::exact_cache_logits(const CanvasBatch&, int64_t, const std::vector<int32_t>&, bool,
                                       const std::vector<int32_t>&) {
  MDLM_FAIL("this model has no exact key/value cache (block decoding with `--kv-cache exact` needs one)");
}

std::string LogitsModel::exact_cache_graphs_unsupported() const {
  return "`--cuda-graphs`: this model has no CUDA graphs of its cached steps";
}

void LogitsModel::set_exact_cache_graphs(bool on) {
  if (on) MDLM_FAIL(exact_cache_graphs_unsupported());
}

std::vector<std::string> sampler_config_problems(const SamplerConfig& c, int64_t vocab) {
  std::vector<std::string> out;
  auto flag = [](const char* f, auto v) { return std::string("`") + f + " " + std::to_string(v) + "`"; };
  if (c.gen_length < 1) out.push_back(flag("--gen-length", c.gen_length) + " must be >= 1");
  if (c.block_length < 1) out.push_back(flag("--block-length", c.block_length) + " must be >= 1");
  if (c.steps < 1) out.push_back(flag("--steps", c.steps) + " must be >= 1");
  if (c.gen_length >= 1 && c.block_length >= 1) {
    if (c.gen_length % c.block_length != 0) {
      out.push_back(flag("--gen-length", c.gen_length) + " is not a multiple of " +
                    flag("--block-length", c.block_length));
    } else if (c.steps >= 1 && c.steps % (c.gen_length / c.block_length) != 0) {
      out.push_back(flag("--steps", c.steps) + " is not a multiple of the number of blocks " +
                    std::to_string(c.gen_length / c.block_length) +
                    " (--gen-length / --block-length): every block gets the same steps");
    }
  }
  if (!(c.temperature >= 0) || !std::isfinite(c.temperature))
    out.push_back("`--temperature " + std::to_string(c.temperature) + "` must be >= 0");
  if (!(c.cfg_scale >= 0) || !std::isfinite(c.cfg_scale))
    out.push_back("`--cfg-scale " + std::to_string(c.cfg_scale) + "` must be >= 0");
  if (!(c.confidence_threshold >= 0) || c.confidence_threshold > 1)
    out.push_back("`--confidence-threshold " + std::to_string(c.confidence_threshold) + "` must be in [0, 1]");
  if (vocab <= 0) return out;  // the model is not known yet: structural checks only
  if (c.mask_token < 0 || c.mask_token >= vocab)
    out.push_back("the mask token " + std::to_string(c.mask_token) + " is outside the model's vocabulary [0, " +
                  std::to_string(vocab) + "); give `--mask-token-id`");
  if ((c.stop_at_eos || c.logits_eos_inf) && (c.eos_token < 0 || c.eos_token >= vocab))
    out.push_back("stopping at EOS and `--logits-eos-inf` need an EOS id in [0, " + std::to_string(vocab) +
                  "), got " + std::to_string(c.eos_token) + " (the tokenizer has none: give `--eos-token-id`)");
  if ((c.stop_at_eos || c.logits_eos_inf) && c.eos_token >= 0 && c.eos_token == c.mask_token)
    out.push_back("the EOS id equals the mask token " + std::to_string(c.mask_token));
  return out;
}

std::vector<std::string> request_problems(const std::vector<GenerationRequest>& requests, const SamplerConfig& c,
                                          int64_t vocab, int64_t max_positions) {
  std::vector<std::string> out;
  constexpr size_t kShown = 8;  // per kind of problem; then how many more
  size_t bad_ids = 0, masks = 0;
  size_t longest = 0, too_long = 0;
  const GenerationRequest* longest_request = nullptr;
  for (const GenerationRequest& r : requests) {
    const std::string name = "prompt " + std::to_string(r.sample_index);
    for (size_t p = 0; p < r.prompt.size(); ++p) {
      const int32_t id = r.prompt[p];
      if (vocab > 0 && (id < 0 || id >= vocab)) {
        if (bad_ids++ < kShown)
          out.push_back(name + " holds token id " + std::to_string(id) + " at position " + std::to_string(p) +
                        ", outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
        break;
      }
      if (c.mask_token >= 0 && id == c.mask_token) {
        if (masks++ < kShown)
          out.push_back(name + " holds the mask token " + std::to_string(c.mask_token) + " at position " +
                        std::to_string(p) + " (of " + std::to_string(r.prompt.size()) +
                        "): the sampler would fill it as a generated position and leave one of the " +
                        "--gen-length positions masked; remove it from the prompt (or, if " +
                        std::to_string(c.mask_token) + " is not the model's mask token, give that with --mask-token)");
        break;
      }
    }
    if (max_positions > 0 && static_cast<int64_t>(r.prompt.size()) + c.gen_length > max_positions) ++too_long;
    if (longest_request == nullptr || r.prompt.size() > longest) {
      longest = r.prompt.size();
      longest_request = &r;
    }
  }
  if (bad_ids > kShown) out.push_back("... and " + std::to_string(bad_ids - kShown) + " more prompts with ids outside the vocabulary");
  if (masks > kShown) out.push_back("... and " + std::to_string(masks - kShown) + " more prompts holding the mask token");
  if (max_positions > 0 && c.gen_length > max_positions) {
    out.push_back("`--gen-length " + std::to_string(c.gen_length) + "` is more than the model's " +
                  std::to_string(max_positions) + " positions (its --max-position-embeddings), before any prompt "
                  "token; valid: the prompt's length plus --gen-length at most " + std::to_string(max_positions));
  } else if (too_long > 0 && longest_request != nullptr) {
    const int64_t L = static_cast<int64_t>(longest);
    out.push_back("prompt " + std::to_string(longest_request->sample_index) + " (" + std::to_string(L) +
                  " tokens) plus `--gen-length " + std::to_string(c.gen_length) + "` needs " +
                  std::to_string(L + c.gen_length) + " positions; the model has " + std::to_string(max_positions) +
                  " (its --max-position-embeddings)" +
                  (too_long > 1 ? ", and " + std::to_string(too_long - 1) + " other prompt(s) are too long too" : "") +
                  "; valid: `--gen-length` at most " + std::to_string(max_positions - L) + " with this prompt" +
                  (max_positions > c.gen_length
                       ? ", or prompts of at most " + std::to_string(max_positions - c.gen_length) + " tokens"
                       : std::string()));
  }
  return out;
}

std::vector<int64_t> transfer_schedule(int64_t masked, int64_t steps) {
  std::vector<int64_t> c(static_cast<size_t>(steps), masked / steps);
  for (int64_t i = 0; i < masked % steps; ++i) ++c[static_cast<size_t>(i)];
  return c;
}

CanvasBatch pad_block_canvas(const CanvasBatch& c, int64_t multiple, std::vector<int32_t>& rows) {
  MDLM_CHECK(!c.block_ranges.empty() && c.seq % 2 == 0 && multiple >= 1,
             "pad_block_canvas: a block-diffusion canvas (block ranges, even seq) and a multiple >= 1");
  const int64_t L = c.seq / 2, Lp = (L + multiple - 1) / multiple * multiple;
  if (Lp == L) return c;
  CanvasBatch p;
  p.batch = c.batch;
  p.seq = 2 * Lp;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t half = 0; half < 2; ++half) {
      const auto first = static_cast<ptrdiff_t>(b * c.seq + half * L);
      p.tokens.insert(p.tokens.end(), c.tokens.begin() + first, c.tokens.begin() + first + L);
      p.positions.insert(p.positions.end(), c.positions.begin() + first, c.positions.begin() + first + L);
      // Token 0 at position 0: valid for every model (learned position tables end at
      // max_positions, which L + padding could pass).
      p.tokens.insert(p.tokens.end(), static_cast<size_t>(Lp - L), 0);
      p.positions.insert(p.positions.end(), static_cast<size_t>(Lp - L), 0);
    }
    // [4, L] per row: doc start, doc end, block start, block end of each half position.
    for (int64_t k = 0; k < 4; ++k) {
      const auto first = static_cast<ptrdiff_t>(b * 4 * L + k * L);
      p.block_ranges.insert(p.block_ranges.end(), c.block_ranges.begin() + first, c.block_ranges.begin() + first + L);
      const int32_t pad_range = static_cast<int32_t>(k % 2 == 0 ? L : Lp);  // [L, Lp): document and block
      p.block_ranges.insert(p.block_ranges.end(), static_cast<size_t>(Lp - L), pad_range);
    }
  }
  for (int32_t& r : rows) {
    const int64_t b = r / c.seq, i = r % c.seq;
    r = static_cast<int32_t>(b * p.seq + (i < L ? i : Lp + (i - L)));
  }
  return p;
}

CanvasBatch build_canvas(const std::vector<std::vector<int32_t>>& prompts, int64_t gen_length,
                         int32_t mask_token, int32_t pad_token, std::vector<int64_t>& prompt_start) {
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  CanvasBatch c;
  c.batch = static_cast<int64_t>(prompts.size());
  c.seq = static_cast<int64_t>(longest) + gen_length;
  const size_t n = static_cast<size_t>(c.batch * c.seq);
  c.tokens.assign(n, mask_token);
  c.positions.assign(n, 0);
  bool padded = false;
  for (const auto& p : prompts) padded = padded || p.size() != longest;
  if (padded) c.document_ids.assign(n, 1);
  prompt_start.assign(prompts.size(), 0);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const int64_t pad = static_cast<int64_t>(longest - prompts[b].size());
    prompt_start[b] = pad;
    const size_t row = b * static_cast<size_t>(c.seq);
    for (int64_t i = 0; i < c.seq; ++i) {
      const size_t k = row + static_cast<size_t>(i);
      if (i < pad) {
        c.tokens[k] = pad_token;
        c.positions[k] = static_cast<int32_t>(i);
        c.document_ids[k] = 0;
      } else {
        if (i < static_cast<int64_t>(longest)) c.tokens[k] = prompts[b][static_cast<size_t>(i - pad)];
        c.positions[k] = static_cast<int32_t>(i - pad);
      }
    }
  }
  return c;
}

std::optional<CompactCanvas> compact_rows(const CanvasBatch& c, const std::vector<int32_t>& rows) {
  if (c.document_ids.empty() || c.batch <= 0 || c.seq <= 0) return std::nullopt;
  const int64_t S = c.seq;
  std::vector<int64_t> live_start(static_cast<size_t>(c.batch), 0);
  for (int64_t b = 0; b < c.batch; ++b) {
    const int32_t* ids = c.document_ids.data() + b * S;
    int runs = 1;
    for (int64_t i = 1; i < S; ++i) {
      if (ids[i] == ids[i - 1]) continue;
      if (++runs > 2) return std::nullopt;
      live_start[static_cast<size_t>(b)] = i;
    }
  }
  CompactCanvas out;
  out.rows.reserve(rows.size());
  for (const int32_t r : rows) {
    if (r < 0 || r >= c.batch * S) return std::nullopt;
    const int64_t b = r / S, i = r % S, p = live_start[static_cast<size_t>(b)];
    if (i < p) return std::nullopt;  // a requested token of the first document: not padding
    out.rows.push_back(static_cast<int32_t>(b * S + i - p));
  }
  CanvasBatch& d = out.canvas;
  d.batch = c.batch;
  d.seq = S;
  d.tokens.resize(c.tokens.size());
  d.positions.resize(c.positions.size());
  d.document_ids.resize(c.document_ids.size());
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t p = live_start[static_cast<size_t>(b)], live = S - p;
    out.lengths.push_back(static_cast<int32_t>(live));
    for (int64_t i = 0; i < S; ++i) {
      const size_t from = static_cast<size_t>(b * S + (i < live ? p + i : i - live));
      const size_t to = static_cast<size_t>(b * S + i);
      d.tokens[to] = c.tokens[from];
      d.positions[to] = c.positions[from];
      d.document_ids[to] = i < live ? 0 : 1;
    }
  }
  return out;
}

namespace {

// One row of the batch while it is being generated.
struct Row {
  size_t request = 0;       // index into the requests
  int64_t start = 0;        // column of its first prompt token
  std::vector<int32_t> x;   // its canvas [seq]
  std::vector<uint8_t> prompt_index;  // LLaDA's prompt_index: prompt tokens that are not M
  int64_t steps = 0;
};

struct Candidate {
  int64_t pos;   // column in the canvas
  int32_t token;
  double conf;
};

// The canvas for the forward pass: the live rows, then (guidance) the same rows with their
// prompt tokens replaced by M.
CanvasBatch forward_canvas(const std::vector<Row*>& rows, int64_t seq, const CanvasBatch& layout,
                           const std::vector<size_t>& layout_row, bool cfg, int32_t mask) {
  CanvasBatch c;
  const int64_t live = static_cast<int64_t>(rows.size());
  c.batch = cfg ? 2 * live : live;
  c.seq = seq;
  c.tokens.resize(static_cast<size_t>(c.batch * seq));
  c.positions.resize(c.tokens.size());
  if (!layout.document_ids.empty()) c.document_ids.resize(c.tokens.size());
  for (int copy = 0; copy < (cfg ? 2 : 1); ++copy) {
    for (int64_t r = 0; r < live; ++r) {
      const size_t dst = static_cast<size_t>((copy * live + r) * seq);
      const size_t src = layout_row[static_cast<size_t>(r)] * static_cast<size_t>(seq);
      const Row& row = *rows[static_cast<size_t>(r)];
      for (int64_t i = 0; i < seq; ++i) {
        const size_t k = static_cast<size_t>(i);
        c.tokens[dst + k] = copy == 1 && row.prompt_index[k] ? mask : row.x[k];
        c.positions[dst + k] = layout.positions[src + k];
        if (!c.document_ids.empty()) c.document_ids[dst + k] = layout.document_ids[src + k];
      }
    }
  }
  return c;
}

}  // namespace

std::vector<GenerationResult> generate(LogitsModel& model, const std::vector<GenerationRequest>& requests,
                                       const SamplerConfig& cfg, const GenerationFinished& on_finished) {
  const int64_t vocab = model.vocab_size(), inputs = model.input_vocab_size();
  const std::vector<std::string> problems = sampler_config_problems(cfg, inputs);
  if (!problems.empty()) {
    std::string msg = "invalid sampler configuration:";
    for (const std::string& p : problems) msg += "\n  " + p;
    MDLM_FAIL(msg);
  }
  const std::vector<std::string> bad = request_problems(requests, cfg, inputs, model.max_positions());
  if (!bad.empty()) {
    std::string msg = "invalid prompts:";
    for (const std::string& p : bad) msg += "\n  " + p;
    MDLM_FAIL(msg);
  }
  std::vector<GenerationResult> results(requests.size());
  if (requests.empty()) return results;
  const int32_t mask = static_cast<int32_t>(cfg.mask_token);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t r = 0; r < requests.size(); ++r) prompts.push_back(requests[r].prompt);
  std::vector<int64_t> start;
  // Pads are never attended to by real tokens; any valid id works.
  const CanvasBatch layout = build_canvas(prompts, cfg.gen_length, mask, 0, start);
  const int64_t seq = layout.seq, gen0 = seq - cfg.gen_length;  // first generated column
  const bool cfg_on = cfg.cfg_scale > 0;
  const bool threshold = cfg.confidence_threshold > 0;
  const bool cached = cfg.kv_cache != KvCacheMode::None;
  MDLM_CHECK(!cached || model.supports_kv_cache(), "`--kv-cache ", kv_cache_mode_name(cfg.kv_cache),
             "`: this model has no key/value cache");
  const int64_t blocks = cfg.gen_length / cfg.block_length;
  const int64_t steps_per_block = cfg.steps / blocks;
  const std::vector<int64_t> schedule = transfer_schedule(cfg.block_length, steps_per_block);

  std::vector<Row> rows(requests.size());
  std::vector<size_t> layout_row(requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    Row& row = rows[r];
    row.request = r;
    row.start = start[r];
    row.x.assign(layout.tokens.begin() + static_cast<int64_t>(r) * seq,
                 layout.tokens.begin() + static_cast<int64_t>(r + 1) * seq);
    row.prompt_index.assign(static_cast<size_t>(seq), 0);
    for (int64_t i = row.start; i < gen0; ++i) row.prompt_index[static_cast<size_t>(i)] = row.x[static_cast<size_t>(i)] != mask;
    layout_row[r] = r;
  }
  auto finish = [&](Row& row, bool stopped) {
    GenerationResult& out = results[row.request];
    out.tokens.assign(row.x.begin() + gen0, row.x.end());
    if (stopped) {
      auto eos = std::find(out.tokens.begin(), out.tokens.end(), static_cast<int32_t>(cfg.eos_token));
      out.tokens.erase(eos + 1, out.tokens.end());
    }
    out.steps = row.steps;
    out.stopped_at_eos = stopped;
    if (on_finished) on_finished(row.request, out);
  };

  const Stream& stream = model.stream();
  ops::ProposalArgs pa;
  pa.temperature = cfg.temperature;
  pa.cfg_scale = static_cast<float>(cfg.cfg_scale);
  pa.seed = cfg.seed;
  pa.suppress_token = cfg.logits_eos_inf ? static_cast<int32_t>(cfg.eos_token) : -1;
  pa.confidence = cfg.remasking == Remasking::Random ? ops::ProposalConfidence::Random
                                                     : ops::ProposalConfidence::Softmax;
  for (int64_t q = 0; q < blocks && !rows.empty(); ++q) {
    const int64_t block_end = gen0 + (q + 1) * cfg.block_length;
    const int64_t block_start = block_end - cfg.block_length;
    // With the cache: the columns a cached step recomputes; `refreshed` once the block's first
    // step (the refresh) has run.
    const int64_t col0 = block_start, col1 = cfg.kv_cache == KvCacheMode::Dual ? block_end : seq;
    bool refreshed = false;
    for (int64_t i = 0;; ++i) {
      // Rows with work this step: all of them in the exact sampler (every row transfers c_i),
      // those whose block still holds a mask with the threshold.
      std::vector<size_t> work;
      for (size_t r = 0; r < rows.size(); ++r) {
        bool masked = !threshold;
        for (int64_t p = block_end - cfg.block_length; p < block_end && !masked; ++p)
          masked = rows[r].x[static_cast<size_t>(p)] == mask;
        if (masked) work.push_back(r);
      }
      // The threshold sampler decodes at least one position per step, so a block takes at most
      // K steps (a proposal of the mask token itself leaves its position masked).
      if (threshold ? work.empty() || i >= cfg.block_length : i >= steps_per_block) break;
      if (!threshold && schedule[static_cast<size_t>(i)] == 0) continue;  // the reference transfers nothing
      const uint32_t t = static_cast<uint32_t>(q * (threshold ? cfg.block_length : steps_per_block) + i);
      std::vector<Row*> batch;
      std::vector<size_t> batch_layout;
      if (cached) {  // the cache holds every row of the block: all stay in the forward
        work.resize(rows.size());
        std::iota(work.begin(), work.end(), size_t{0});
      }
      for (size_t r : work) {
        batch.push_back(&rows[r]);
        batch_layout.push_back(layout_row[r]);
      }
      // Masked positions before the end of the block (the prompt may hold M too, as in LLaDA).
      std::vector<int32_t> query, keys;
      std::vector<std::pair<size_t, int64_t>> where;  // (row of the batch, column)
      const int64_t live = static_cast<int64_t>(batch.size());
      for (size_t r = 0; r < batch.size(); ++r) {
        // A cached step sees only its recomputed columns (Fast-dLLM: the block's masks).
        const int64_t first = cached && refreshed ? std::max(batch[r]->start, col0) : batch[r]->start;
        for (int64_t p = first; p < block_end; ++p) {
          if (batch[r]->x[static_cast<size_t>(p)] != mask) continue;
          query.push_back(static_cast<int32_t>(static_cast<int64_t>(r) * seq + p));
          keys.push_back(static_cast<int32_t>(requests[batch[r]->request].sample_index));
          keys.push_back(static_cast<int32_t>(p - gen0));
          where.push_back({r, p});
        }
      }
      const size_t n = query.size();
      if (cfg_on)
        for (size_t k = 0; k < n; ++k) query.push_back(query[k] + static_cast<int32_t>(live * seq));
      const CanvasBatch canvas = forward_canvas(batch, seq, layout, batch_layout, cfg_on, mask);
      Tensor all = cached ? model.cached_logits(canvas, query, col0, col1, !refreshed) : model.logits(canvas, query);
      refreshed = true;
      MDLM_CHECK(all.rows() == static_cast<int64_t>(query.size()) && all.cols() == vocab,
                 "the model returned logits ", all.str(), " for ", query.size(),
                 " positions of a vocabulary of ", vocab);
      Tensor cond = cfg_on ? all.narrow(0, static_cast<int64_t>(n)) : all;
      Tensor uncond = cfg_on ? all.narrow(static_cast<int64_t>(n), static_cast<int64_t>(n)) : Tensor();
      Tensor keys_t = Tensor::from_ints(keys, {static_cast<int64_t>(n), 2});
      if (!stream.device().is_cpu()) keys_t = keys_t.to(stream.device(), stream);
      Tensor tokens = Tensor::empty({static_cast<int64_t>(n)}, DType::I32, stream);
      Tensor conf = Tensor::empty({static_cast<int64_t>(n)}, DType::F64, stream);
      pa.step = t;
      ops::sample_proposals(cond, uncond, keys_t, pa, tokens, conf, stream);
      Tensor tokens_h = tokens.to(Device::cpu(), stream);
      Tensor conf_h = conf.to(Device::cpu(), stream);
      stream.synchronize();
      const int32_t* tok = tokens_h.data<int32_t>();
      const double* cf = conf_h.data<double>();

      // Per row: the most confident candidates take their proposals.
      std::vector<std::vector<Candidate>> per_row(batch.size());
      for (size_t k = 0; k < n; ++k) per_row[where[k].first].push_back({where[k].second, tok[k], cf[k]});
      for (size_t r = 0; r < batch.size(); ++r) {
        std::vector<Candidate>& c = per_row[r];
        std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.conf > b.conf; });
        size_t take = 0;
        if (threshold) {
          while (take < c.size() && (take == 0 || c[take].conf >= cfg.confidence_threshold)) ++take;
        } else {
          take = std::min<size_t>(c.size(), static_cast<size_t>(schedule[static_cast<size_t>(i)]));
        }
        for (size_t k = 0; k < take; ++k) batch[r]->x[static_cast<size_t>(c[k].pos)] = c[k].token;
        ++batch[r]->steps;
      }
    }
    if (cfg.stop_at_eos) {
      std::vector<Row> still;
      std::vector<size_t> still_layout;
      for (size_t r = 0; r < rows.size(); ++r) {
        const auto first = rows[r].x.begin() + gen0, last = rows[r].x.begin() + block_end;
        if (std::find(first, last, static_cast<int32_t>(cfg.eos_token)) != last) {
          finish(rows[r], true);
        } else {
          still.push_back(std::move(rows[r]));
          still_layout.push_back(layout_row[r]);
        }
      }
      rows = std::move(still);
      layout_row = std::move(still_layout);
    }
  }
  for (Row& row : rows) finish(row, false);
  return results;
}

}  // namespace megadlm
