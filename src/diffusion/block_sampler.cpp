// Block decoding and the causal variant's autoregressive decoding (diffusion/block_sampler.h;
// docs/generation.md, "Block decoding"). The canvas and the per-row choices live on the host;
// the logits stay on the model's device and are reduced there by ops::sample_proposals.
#include "megadlm/diffusion/block_sampler.h"
#include <algorithm>
#include <cmath>
#include "megadlm/core/error.h"
#include "megadlm/ops/sampling.h"

namespace megadlm {

const char* decode_mode_name(DecodeMode m) {
  return m == DecodeMode::Full ? "full" : m == DecodeMode::Block ? "block" : "ar";
}

std::vector<std::string> block_decoding_problems(const SamplerConfig& c, const BlockDecoding& d, int64_t vocab) {
  std::vector<std::string> out = sampler_config_problems(c, vocab);
  const char* mode = d.autoregressive ? "`--decode ar`" : "`--decode block`";
  if (c.cfg_scale > 0)
    out.push_back(std::string("`--cfg-scale` is for the full-sequence sampler (`--decode full`), not ") + mode);
  if (c.kv_cache != KvCacheMode::None)
    out.push_back(std::string("`--kv-cache ") + kv_cache_mode_name(c.kv_cache) + "` is the full-sequence sampler's "
                  "approximate cache; " + mode + " takes `--kv-cache exact` (default) or `none`");
  if (d.cuda_graphs && d.autoregressive)
    out.push_back("`--cuda-graphs` captures block decoding's steps, which repeat one shape for a whole block; "
                  "`--decode ar` writes a new cache column every token (each graph would run once): use "
                  "`--decode block`, or drop --cuda-graphs");
  if (d.cuda_graphs && !d.exact_cache)
    out.push_back("`--cuda-graphs` captures the steps of the exact cache (`--kv-cache exact`); `--kv-cache none` "
                  "recomputes the growing canvas through the uncached forward, which is not captured");
  if (d.autoregressive && !d.causal_clean)
    out.push_back("`--decode ar` needs a model whose clean stream is causal (trained with "
                  "`--dlm-bd-clean-attention causal`); this one's is block-causal, which has no exact "
                  "autoregressive mode: use `--decode block`");
  return out;
}

BlockLayout block_layout(const std::vector<int64_t>& lengths, int64_t gen_length, int64_t block) {
  MDLM_CHECK(block >= 1 && gen_length >= 0, "block layout: block ", block, ", gen length ", gen_length);
  BlockLayout l;
  int64_t longest = 0, last = 0;
  for (const int64_t p : lengths) longest = std::max(longest, p);
  l.first_block = longest / block;
  for (const int64_t p : lengths) {
    l.pad.push_back(block * (l.first_block - p / block));
    l.end.push_back(l.pad.back() + p + gen_length);
    last = std::max(last, l.end.back());
  }
  l.seq = (last + block - 1) / block * block;
  return l;
}

namespace {

constexpr int32_t kLeftPad = 0, kLive = 1, kRightPad = 2, kUnwritten = 3;  // documents

struct Row {
  size_t request = 0;
  int64_t pad = 0, prompt = 0, end = 0;  // left pad columns, prompt length, end column
  std::vector<int32_t> x;                // tokens [seq]
  bool finished = false;
  GenerationResult result;
  int32_t doc(int64_t c) const { return c < pad ? kLeftPad : c < end ? kLive : kRightPad; }
  int32_t position(int64_t c) const { return c < pad ? static_cast<int32_t>(c) : c < end ? static_cast<int32_t>(c - pad) : 0; }
};

struct Candidate {
  int64_t col;
  int32_t token;
  double conf;
};

// Columns [c0, c1) of every row as the model's input, with the queries' documents.
CanvasBatch window(const std::vector<Row>& rows, int64_t c0, int64_t c1) {
  CanvasBatch w;
  w.batch = static_cast<int64_t>(rows.size());
  w.seq = c1 - c0;
  for (const Row& r : rows)
    for (int64_t c = c0; c < c1; ++c) {
      w.tokens.push_back(r.x[static_cast<size_t>(c)]);
      w.positions.push_back(r.position(c));
      w.document_ids.push_back(r.doc(c));
    }
  return w;
}

// The cache's key documents once columns [0, written) hold keys: the row's documents there,
// kUnwritten after.
std::vector<int32_t> key_documents(const std::vector<Row>& rows, int64_t seq, int64_t written) {
  std::vector<int32_t> k;
  k.reserve(rows.size() * static_cast<size_t>(seq));
  for (const Row& r : rows)
    for (int64_t c = 0; c < seq; ++c) k.push_back(c < written ? r.doc(c) : kUnwritten);
  return k;
}

// Training's doubled rows [x_t | x_0] over columns [0, L), both copies the current tokens, with
// their document and block ranges (blocks of B columns, cut at the documents).
CanvasBatch doubled(const std::vector<Row>& rows, int64_t L, int64_t B) {
  CanvasBatch d;
  d.batch = static_cast<int64_t>(rows.size());
  d.seq = 2 * L;
  for (const Row& r : rows) {
    for (int copy = 0; copy < 2; ++copy)
      for (int64_t c = 0; c < L; ++c) {
        d.tokens.push_back(r.x[static_cast<size_t>(c)]);
        d.positions.push_back(r.position(c));
      }
    std::vector<int32_t> ranges(static_cast<size_t>(4 * L));
    for (int64_t c = 0; c < L; ++c) {
      const int64_t ds = r.doc(c) == kLeftPad ? 0 : r.doc(c) == kLive ? r.pad : r.end;
      const int64_t de = r.doc(c) == kLeftPad ? r.pad : r.doc(c) == kLive ? std::min(r.end, L) : L;
      const int64_t bs = std::max(ds, c / B * B), be = std::min(de, (c / B + 1) * B);
      ranges[static_cast<size_t>(c)] = static_cast<int32_t>(ds);
      ranges[static_cast<size_t>(L + c)] = static_cast<int32_t>(de);
      ranges[static_cast<size_t>(2 * L + c)] = static_cast<int32_t>(bs);
      ranges[static_cast<size_t>(3 * L + c)] = static_cast<int32_t>(be);
    }
    d.block_ranges.insert(d.block_ranges.end(), ranges.begin(), ranges.end());
  }
  return d;
}

// Proposals (token, confidence) for the flat `rows` of `logits`' forward, keyed per row.
void propose(const LogitsModel& model, const Tensor& logits, const std::vector<int32_t>& keys,
             const ops::ProposalArgs& pa, std::vector<int32_t>& tok, std::vector<double>& conf) {
  const Stream& stream = model.stream();
  const int64_t n = static_cast<int64_t>(keys.size() / 2);
  MDLM_CHECK(logits.rows() == n && logits.cols() == model.vocab_size(), "the model returned logits ", logits.str(),
             " for ", n, " positions of a vocabulary of ", model.vocab_size());
  Tensor keys_t = Tensor::from_ints(keys, {n, 2});
  if (!stream.device().is_cpu()) keys_t = keys_t.to(stream.device(), stream);
  Tensor tokens = Tensor::empty({n}, DType::I32, stream);
  Tensor confidence = Tensor::empty({n}, DType::F64, stream);
  ops::sample_proposals(logits, Tensor(), keys_t, pa, tokens, confidence, stream);
  Tensor th = tokens.to(Device::cpu(), stream), ch = confidence.to(Device::cpu(), stream);
  stream.synchronize();
  tok.assign(th.data<int32_t>(), th.data<int32_t>() + n);
  conf.assign(ch.data<double>(), ch.data<double>() + n);
}

}  // namespace

std::vector<GenerationResult> generate_blocks(LogitsModel& model, const std::vector<GenerationRequest>& requests,
                                              const SamplerConfig& cfg, const BlockDecoding& dec,
                                              const GenerationFinished& on_finished) {
  const int64_t inputs = model.input_vocab_size();
  std::vector<std::string> problems = block_decoding_problems(cfg, dec, inputs);
  if (dec.autoregressive)
    for (const GenerationRequest& r : requests)
      if (r.prompt.empty())
        problems.push_back("prompt " + std::to_string(r.sample_index) +
                           " is empty: `--decode ar` needs at least one prompt token to predict from");
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
  MDLM_CHECK(!dec.exact_cache || model.supports_exact_cache(),
             "`--kv-cache exact`: this model has no exact key/value cache (give `--kv-cache none`)");
  if (dec.cuda_graphs) {
    const std::string why = model.exact_cache_graphs_unsupported();
    MDLM_CHECK(why.empty(), why);
  }
  model.set_exact_cache_graphs(dec.cuda_graphs);
  std::vector<GenerationResult> results(requests.size());
  if (requests.empty()) return results;

  const int32_t mask = static_cast<int32_t>(cfg.mask_token);
  const int64_t G = cfg.gen_length;
  const int64_t B = dec.autoregressive ? 1 : cfg.block_length;
  std::vector<int64_t> lengths;
  for (const GenerationRequest& r : requests) lengths.push_back(static_cast<int64_t>(r.prompt.size()));
  BlockLayout layout;
  if (dec.autoregressive) {  // plain left padding: every prompt ends at column Pmax
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    layout.seq = longest + G;
    layout.first_block = longest;
    for (const int64_t p : lengths) {
      layout.pad.push_back(longest - p);
      layout.end.push_back(longest + G);
    }
  } else {
    layout = block_layout(lengths, G, B);
  }
  const int64_t seq = layout.seq, J = layout.first_block;
  std::vector<Row> rows(requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    Row& row = rows[r];
    row.request = r;
    row.pad = layout.pad[r];
    row.prompt = lengths[r];
    row.end = layout.end[r];
    row.x.assign(static_cast<size_t>(seq), 0);
    for (int64_t p = 0; p < row.prompt; ++p) row.x[static_cast<size_t>(row.pad + p)] = requests[r].prompt[static_cast<size_t>(p)];
    for (int64_t c = row.pad + row.prompt; c < row.end; ++c) row.x[static_cast<size_t>(c)] = mask;
  }
  // upto: the end column of the tokens kept (the row's end, or the last committed block's).
  auto finish = [&](Row& row, bool stopped, int64_t upto = -1) {
    GenerationResult& out = results[row.request];
    out = row.result;
    const int64_t last = upto < 0 ? row.end : std::max(row.pad + row.prompt, std::min(upto, row.end));
    out.tokens.assign(row.x.begin() + row.pad + row.prompt, row.x.begin() + last);
    if (stopped) {
      auto eos = std::find(out.tokens.begin(), out.tokens.end(), static_cast<int32_t>(cfg.eos_token));
      out.tokens.erase(eos + 1, out.tokens.end());
    }
    out.stopped_at_eos = stopped;
    row.finished = true;
    if (on_finished) on_finished(row.request, out);
  };
  auto has_eos = [&](const Row& row, int64_t upto) {
    const auto first = row.x.begin() + row.pad + row.prompt, last = row.x.begin() + std::min(upto, row.end);
    return first < last && std::find(first, last, static_cast<int32_t>(cfg.eos_token)) != last;
  };
  auto all_finished = [&] {
    return std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.finished; });
  };
  auto count_forward = [&] {
    for (Row& r : rows)
      if (!r.finished) ++r.result.forwards;
  };
  // A forward whose logits nobody reads still needs one row for the output layer.
  const std::vector<int32_t> one_row = {0};

  ops::ProposalArgs pa;
  pa.temperature = cfg.temperature;
  pa.seed = cfg.seed;
  pa.suppress_token = cfg.logits_eos_inf ? static_cast<int32_t>(cfg.eos_token) : -1;
  pa.confidence = cfg.remasking == Remasking::Random ? ops::ProposalConfidence::Random
                                                     : ops::ProposalConfidence::Softmax;
  if (dec.exact_cache) model.exact_cache_reset(static_cast<int64_t>(rows.size()), seq);

  if (dec.autoregressive) {
    // Column c is decoded from the logits of column c - 1 (the clean stream's next-token head).
    for (int64_t c = J; c < seq && !all_finished(); ++c) {
      std::vector<int32_t> query, keys;
      std::vector<size_t> who;
      for (size_t r = 0; r < rows.size(); ++r) {
        if (rows[r].finished) continue;
        who.push_back(r);
        keys.push_back(static_cast<int32_t>(requests[r].sample_index));
        keys.push_back(static_cast<int32_t>(c - J));
      }
      Tensor logits;
      if (dec.exact_cache) {
        const int64_t c0 = c == J ? 0 : c - 1;  // the prefill, then the previous token's column
        const int64_t width = c - c0;
        for (size_t r : who) query.push_back(static_cast<int32_t>(static_cast<int64_t>(r) * width + width - 1));
        logits = model.exact_cache_logits(window(rows, c0, c), c0, key_documents(rows, seq, c), true, query);
      } else {
        for (size_t r : who) query.push_back(static_cast<int32_t>(static_cast<int64_t>(r) * 2 * c + 2 * c - 1));
        logits = model.logits(doubled(rows, c, std::max<int64_t>(c, 1)), query);
      }
      count_forward();
      std::vector<int32_t> tok;
      std::vector<double> conf;
      pa.step = static_cast<uint32_t>(c - J);
      propose(model, logits, keys, pa, tok, conf);
      for (size_t k = 0; k < who.size(); ++k) {
        Row& row = rows[who[k]];
        row.x[static_cast<size_t>(c)] = tok[k];
        ++row.result.steps;
        if (cfg.stop_at_eos && tok[k] == static_cast<int32_t>(cfg.eos_token)) finish(row, true);
      }
    }
    for (Row& row : rows)
      if (!row.finished) finish(row, false);
    return results;
  }

  const int64_t nblocks = seq / B;
  const bool threshold = cfg.confidence_threshold > 0;
  const int64_t steps_per_block = cfg.steps / (G / B);
  // The causal clean stream of columns [c0, c1) into the cache: one forward where the cache's
  // causal windows allow it (from column 0, or an even width), else column by column.
  auto causal_update = [&](int64_t c0, int64_t c1) {
    if (c0 == 0 || (c1 - c0) % 2 == 0) {
      model.exact_cache_logits(window(rows, c0, c1), c0, key_documents(rows, seq, c1), true, one_row);
      count_forward();
      return;
    }
    for (int64_t c = c0; c < c1; ++c) {
      model.exact_cache_logits(window(rows, c, c + 1), c, key_documents(rows, seq, c + 1), true, one_row);
      count_forward();
    }
  };
  // Prefill: the prompt's complete blocks [0, JB) under the clean-stream rule.
  if (dec.exact_cache && J > 0) {
    if (dec.causal_clean) {
      causal_update(0, J * B);
    } else {
      for (int64_t j = 0; j < J; ++j) {
        model.exact_cache_logits(window(rows, j * B, (j + 1) * B), j * B, key_documents(rows, seq, (j + 1) * B),
                                 false, one_row);
        count_forward();
      }
    }
  }
  for (int64_t j = J; j < nblocks && !all_finished(); ++j) {
    const int64_t b0 = j * B, b1 = (j + 1) * B, k = j - J;
    auto masked_in_block = [&](const Row& row) {
      int64_t m = 0;
      for (int64_t c = b0; c < std::min(b1, row.end); ++c) m += row.x[static_cast<size_t>(c)] == mask;
      return m;
    };
    std::vector<std::vector<int64_t>> schedule(rows.size());
    for (size_t r = 0; r < rows.size(); ++r)
      schedule[r] = transfer_schedule(masked_in_block(rows[r]), steps_per_block);
    for (int64_t i = 0;; ++i) {
      if (threshold ? i >= B : i >= steps_per_block) break;
      // Rows that commit this step: those with a mask left (threshold) or a nonzero count.
      std::vector<size_t> work;
      for (size_t r = 0; r < rows.size(); ++r) {
        if (rows[r].finished || masked_in_block(rows[r]) == 0) continue;
        if (!threshold && schedule[r][static_cast<size_t>(i)] == 0) continue;
        work.push_back(r);
      }
      if (work.empty()) {
        if (threshold) break;
        continue;  // nobody commits this step: the reference runs no forward
      }
      std::vector<int32_t> query, keys;
      std::vector<std::pair<size_t, int64_t>> where;  // (row, column)
      for (size_t r : work) {
        const Row& row = rows[r];
        for (int64_t c = b0; c < std::min(b1, row.end); ++c) {
          if (row.x[static_cast<size_t>(c)] != mask) continue;
          query.push_back(static_cast<int32_t>(dec.exact_cache ? static_cast<int64_t>(r) * B + (c - b0)
                                                               : static_cast<int64_t>(r) * 2 * b1 + c));
          keys.push_back(static_cast<int32_t>(requests[r].sample_index));
          keys.push_back(static_cast<int32_t>(c - row.pad - row.prompt));
          where.push_back({r, c});
        }
      }
      Tensor logits = dec.exact_cache
                          ? model.exact_cache_logits(window(rows, b0, b1), b0, key_documents(rows, seq, b1), false, query)
                          : model.logits(doubled(rows, b1, B), query);
      count_forward();
      std::vector<int32_t> tok;
      std::vector<double> conf;
      pa.step = static_cast<uint32_t>(k * (threshold ? B : steps_per_block) + i);
      propose(model, logits, keys, pa, tok, conf);
      std::vector<std::vector<Candidate>> per_row(rows.size());
      for (size_t q = 0; q < where.size(); ++q) per_row[where[q].first].push_back({where[q].second, tok[q], conf[q]});
      for (size_t r : work) {
        std::vector<Candidate>& c = per_row[r];
        std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.conf > b.conf; });
        size_t take = 0;
        if (threshold) {
          while (take < c.size() && (take == 0 || c[take].conf >= cfg.confidence_threshold)) ++take;
        } else {
          take = std::min<size_t>(c.size(), static_cast<size_t>(schedule[r][static_cast<size_t>(i)]));
        }
        for (size_t q = 0; q < take; ++q) rows[r].x[static_cast<size_t>(c[q].col)] = c[q].token;
        ++rows[r].result.steps;
      }
    }
    if (cfg.stop_at_eos)
      for (Row& row : rows)
        if (!row.finished && has_eos(row, b1)) finish(row, true);
    if (dec.stop_after_block)
      for (Row& row : rows) {
        if (row.finished) continue;
        const int64_t last = std::max(row.pad + row.prompt, std::min(b1, row.end));
        const std::vector<int32_t> generated(row.x.begin() + row.pad + row.prompt, row.x.begin() + last);
        if (dec.stop_after_block(row.request, generated)) finish(row, false, b1);
      }
    // The finished block's clean keys and values (the clean-stream rule) for the blocks after it.
    if (dec.exact_cache && j + 1 < nblocks && !all_finished()) {
      if (dec.causal_clean) {
        causal_update(b0, b1);
      } else {
        model.exact_cache_logits(window(rows, b0, b1), b0, key_documents(rows, seq, b1), false, one_row);
        count_forward();
      }
    }
  }
  for (Row& row : rows)
    if (!row.finished) finish(row, false);
  return results;
}

}  // namespace megadlm
