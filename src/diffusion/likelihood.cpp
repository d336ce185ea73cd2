// Likelihood estimators (include/megadlm/diffusion/likelihood.h; docs/evaluation.md). The masks
// are built on the host; logits stay on the model's device, where guidance is combined and the
// per-token cross-entropy computed, so only one number per masked token comes back.
#include "megadlm/diffusion/likelihood.h"
#include <algorithm>
#include <cmath>
#include <numeric>
#include "megadlm/core/error.h"
#include "megadlm/core/philox.h"
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/elementwise.h"

namespace megadlm {

namespace {

uint32_t lo32(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v)); }

// u + f32(w + 1) * (c - u) on the device, each operation rounded to the logits' dtype (f32 on
// the CPU: the formula of ops/sampling.h). Overwrites `uncond`.
Tensor guide(const Tensor& cond, Tensor uncond, double cfg_scale, const Stream& s) {
  Tensor d = Tensor::empty(cond.shape(), cond.dtype(), s);
  ops::copy(uncond, d, s);
  ops::scale_inplace(d, -1.0f, s);  // exact
  ops::add(cond, d, d, s);          // c - u
  ops::scale_inplace(d, static_cast<float>(cfg_scale + 1.0), s);
  ops::add(uncond, d, uncond, s);
  return uncond;
}

// Per-token cross-entropy (host, double) of `rows` of `canvas` against `targets`; with guidance
// the canvas holds the unconditional copy in its second half, rows offset by half its tokens.
std::vector<double> token_losses(LogitsModel& model, const CanvasBatch& canvas, std::vector<int32_t> rows,
                                 const std::vector<int32_t>& targets, double cfg_scale) {
  const Stream& s = model.stream();
  const size_t n = targets.size();
  if (n == 0) return {};
  const bool cfg = cfg_scale > 0;
  if (cfg) {
    const int32_t half = static_cast<int32_t>(canvas.batch / 2 * canvas.seq);
    for (size_t k = 0; k < n; ++k) rows.push_back(rows[k] + half);
  }
  Tensor all = model.logits(canvas, rows);
  Tensor logits = cfg ? guide(all.narrow(0, static_cast<int64_t>(n)), all.narrow(static_cast<int64_t>(n), static_cast<int64_t>(n)),
                              cfg_scale, s)
                      : all;
  Tensor t = Tensor::from_ints(targets, {static_cast<int64_t>(n)});
  if (!s.device().is_cpu()) t = t.to(s.device(), s);
  Tensor losses = Tensor::empty({static_cast<int64_t>(n)}, DType::F32, s);
  ops::cross_entropy_forward(logits, t, losses, s);
  const std::vector<float> h = losses.to_floats(s);
  return std::vector<double>(h.begin(), h.end());
}

}  // namespace

std::vector<std::string> likelihood_config_problems(const LikelihoodConfig& c, int64_t vocab) {
  std::vector<std::string> out;
  if (c.mc_batch < 1) out.push_back("`--mc-batch-size " + std::to_string(c.mc_batch) + "` must be >= 1");
  if (c.mc_num < 1 || (c.mc_batch >= 1 && c.mc_num % c.mc_batch != 0))
    out.push_back("`--mc-num " + std::to_string(c.mc_num) + "` must be a positive multiple of `--mc-batch-size " +
                  std::to_string(c.mc_batch) + "`");
  if (!(c.cfg_scale >= 0) || !std::isfinite(c.cfg_scale))
    out.push_back("`--cfg-scale " + std::to_string(c.cfg_scale) + "` must be >= 0");
  if (vocab > 0 && (c.mask_token < 0 || c.mask_token >= vocab))
    out.push_back("the mask token " + std::to_string(c.mask_token) + " is outside the model's vocabulary [0, " +
                  std::to_string(vocab) + "); give `--mask-token-id`");
  return out;
}

namespace {

// The stratified masks of `ly` answer positions: k from counter {k_c0, 0, g, r}; answer
// position a (of this group) ranks by the key of counter {a0 + a, 1 + m, g, r}.
std::vector<std::vector<uint8_t>> stratified_masks(uint64_t seed, int64_t index, int64_t repeat, int64_t ly,
                                                   int64_t batch, int64_t k_c0, int64_t a0,
                                                   std::vector<int64_t>& counts) {
  const PhiloxKey key = PhiloxKey::make(seed, RngPurpose::LikelihoodMC);
  const PhiloxWords w = philox(key, lo32(k_c0), 0, lo32(index), lo32(repeat));
  const double u = uniform53(w.w[0], w.w[1]);
  const int64_t k = 1 + std::min<int64_t>(static_cast<int64_t>(u * static_cast<double>(ly)), ly - 1);
  counts.assign(static_cast<size_t>(batch), 0);
  std::vector<std::vector<uint8_t>> masks(static_cast<size_t>(batch), std::vector<uint8_t>(static_cast<size_t>(ly), 0));
  std::vector<std::pair<double, int64_t>> keys(static_cast<size_t>(ly));
  for (int64_t m = 0; m < batch; ++m) {
    // nearbyint rounds half to even in the default rounding mode, as torch.round does.
    const double x = std::nearbyint(static_cast<double>(k) + static_cast<double>(m) * (static_cast<double>(ly) / static_cast<double>(batch)));
    const int64_t n = ((static_cast<int64_t>(x) - 1) % ly + ly) % ly + 1;
    counts[static_cast<size_t>(m)] = n;
    for (int64_t a = 0; a < ly; ++a) {
      const PhiloxWords p = philox(key, lo32(a0 + a), static_cast<uint32_t>(1 + m), lo32(index), lo32(repeat));
      keys[static_cast<size_t>(a)] = {uniform53(p.w[0], p.w[1]), a};
    }
    std::sort(keys.begin(), keys.end());  // by key, then position
    for (int64_t i = 0; i < n; ++i) masks[static_cast<size_t>(m)][static_cast<size_t>(keys[static_cast<size_t>(i)].second)] = 1;
  }
  return masks;
}

// The doubled rows [x_t | x_0] of a request: `noisy` (n tokens) then the clean sequence.
void append_doubled_row(CanvasBatch& c, const std::vector<int32_t>& noisy, const std::vector<int32_t>& clean,
                        const std::vector<int32_t>& ranges) {
  const int64_t n = static_cast<int64_t>(clean.size());
  c.tokens.insert(c.tokens.end(), noisy.begin(), noisy.end());
  c.tokens.insert(c.tokens.end(), clean.begin(), clean.end());
  for (int half = 0; half < 2; ++half)
    for (int64_t i = 0; i < n; ++i) c.positions.push_back(static_cast<int32_t>(i));  // both halves 0..n-1
  c.block_ranges.insert(c.block_ranges.end(), ranges.begin(), ranges.end());
  ++c.batch;
}

// [first, last) answer-relative positions of each block holding answer positions.
std::vector<std::pair<int64_t, int64_t>> answer_blocks(int64_t lc, int64_t ly, int64_t block) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t a = 0; a < ly;) {
    const int64_t end = std::min(ly, ((lc + a) / block + 1) * block - lc);
    out.emplace_back(a, end);
    a = end;
  }
  return out;
}

LikelihoodResult block_loglikelihood(LogitsModel& model, const LikelihoodRequest& req, const LikelihoodConfig& cfg) {
  MDLM_CHECK(cfg.cfg_scale == 0.0, "`--cfg-scale ", cfg.cfg_scale, "`: classifier-free guidance is not defined for "
             "block-diffusion models here; leave it at 0");
  LikelihoodResult out;
  const int64_t lc = static_cast<int64_t>(req.context.size()), ly = static_cast<int64_t>(req.continuation.size());
  if (ly == 0) return out;
  const int64_t n = lc + ly, batch = cfg.mc_batch;
  std::vector<int32_t> clean = req.context;
  clean.insert(clean.end(), req.continuation.begin(), req.continuation.end());
  const std::vector<int32_t> ranges = block_likelihood_ranges(n, cfg.block_size);
  const auto blocks = answer_blocks(lc, ly, cfg.block_size);
  for (int64_t r = 0; r < cfg.mc_num / batch; ++r) {
    std::vector<std::vector<uint8_t>> mask(static_cast<size_t>(batch), std::vector<uint8_t>(static_cast<size_t>(ly), 0));
    std::vector<std::vector<double>> wgt(static_cast<size_t>(batch), std::vector<double>(static_cast<size_t>(ly), 0.0));
    for (size_t j = 0; j < blocks.size(); ++j) {
      const auto [a0, a1] = blocks[j];
      std::vector<int64_t> counts;
      const auto m_j = stratified_masks(cfg.seed, req.index, r, a1 - a0, batch, static_cast<int64_t>(j), a0, counts);
      for (int64_t m = 0; m < batch; ++m)
        for (int64_t a = a0; a < a1; ++a) {
          mask[static_cast<size_t>(m)][static_cast<size_t>(a)] = m_j[static_cast<size_t>(m)][static_cast<size_t>(a - a0)];
          wgt[static_cast<size_t>(m)][static_cast<size_t>(a)] =
              static_cast<double>(a1 - a0) / static_cast<double>(counts[static_cast<size_t>(m)]);
        }
    }
    CanvasBatch c;
    c.seq = 2 * n;
    std::vector<int32_t> rows, targets;
    std::vector<double> weight;
    for (int64_t m = 0; m < batch; ++m) {
      std::vector<int32_t> noisy = clean;
      for (int64_t a = 0; a < ly; ++a) {
        if (!mask[static_cast<size_t>(m)][static_cast<size_t>(a)]) continue;
        noisy[static_cast<size_t>(lc + a)] = static_cast<int32_t>(cfg.mask_token);
        rows.push_back(static_cast<int32_t>(m * 2 * n + lc + a));
        targets.push_back(req.continuation[static_cast<size_t>(a)]);
        weight.push_back(wgt[static_cast<size_t>(m)][static_cast<size_t>(a)]);
      }
      append_doubled_row(c, noisy, clean, ranges);
    }
    const std::vector<double> ce = token_losses(model, c, rows, targets, 0.0);
    double total = 0;
    for (size_t k = 0; k < ce.size(); ++k) total += ce[k] * weight[k];
    out.estimates.push_back(total / static_cast<double>(batch));
  }
  return out;
}

bool block_greedy_reproduces(LogitsModel& model, const LikelihoodRequest& req, const LikelihoodConfig& cfg) {
  const int64_t lc = static_cast<int64_t>(req.context.size()), ly = static_cast<int64_t>(req.continuation.size());
  const int64_t n = lc + ly, vocab = model.vocab_size();
  std::vector<int32_t> clean = req.context;
  clean.insert(clean.end(), req.continuation.begin(), req.continuation.end());
  const std::vector<int32_t> ranges = block_likelihood_ranges(n, cfg.block_size);
  const auto blocks = answer_blocks(lc, ly, cfg.block_size);
  std::vector<int32_t> noisy = clean;
  for (int64_t a = 0; a < ly; ++a) noisy[static_cast<size_t>(lc + a)] = static_cast<int32_t>(cfg.mask_token);
  for (;;) {
    std::vector<int32_t> rows;
    for (int64_t i = lc; i < n; ++i)
      if (noisy[static_cast<size_t>(i)] == cfg.mask_token) rows.push_back(static_cast<int32_t>(i));
    if (rows.empty()) return true;
    CanvasBatch c;
    c.seq = 2 * n;
    append_doubled_row(c, noisy, clean, ranges);
    const Tensor l = model.logits(c, rows).to(Device::cpu(), DType::F32, model.stream());
    model.stream().synchronize();
    // Per block: the most confident masked position (probability of its argmax; lower position on ties).
    std::vector<int64_t> best(blocks.size(), -1), best_tok(blocks.size(), 0);
    std::vector<double> best_conf(blocks.size(), -1.0);
    for (size_t k = 0; k < rows.size(); ++k) {
      const float* v = l.data<float>() + k * static_cast<size_t>(vocab);
      int64_t arg = 0;
      double sum = 0;
      for (int64_t t = 1; t < vocab; ++t)
        if (v[t] > v[arg]) arg = t;
      for (int64_t t = 0; t < vocab; ++t) sum += std::exp(static_cast<double>(v[t]) - v[arg]);
      const double conf = 1.0 / sum;
      const int64_t a = rows[k] - lc;
      size_t j = 0;
      while (blocks[j].second <= a) ++j;
      if (conf > best_conf[j]) {
        best_conf[j] = conf;
        best[j] = rows[k];
        best_tok[j] = arg;
      }
    }
    for (size_t j = 0; j < blocks.size(); ++j) {
      if (best[j] < 0) continue;
      if (best_tok[j] != clean[static_cast<size_t>(best[j])]) return false;  // decoded tokens never change
      noisy[static_cast<size_t>(best[j])] = static_cast<int32_t>(best_tok[j]);
    }
  }
}

}  // namespace

std::vector<int32_t> block_likelihood_ranges(int64_t n, int64_t block) {
  MDLM_CHECK(n >= 1 && block >= 1, "block ranges of ", n, " tokens in blocks of ", block);
  std::vector<int32_t> r(static_cast<size_t>(4 * n));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t start = j / block * block;
    r[static_cast<size_t>(j)] = 0;  // one document: the request
    r[static_cast<size_t>(n + j)] = static_cast<int32_t>(n);
    r[static_cast<size_t>(2 * n + j)] = static_cast<int32_t>(start);
    r[static_cast<size_t>(3 * n + j)] = static_cast<int32_t>(std::min(start + block, n));
  }
  return r;
}

std::vector<std::vector<uint8_t>> likelihood_masks(uint64_t seed, int64_t index, int64_t repeat, int64_t ly,
                                                   int64_t batch, std::vector<int64_t>& counts) {
  return stratified_masks(seed, index, repeat, ly, batch, 0, 0, counts);
}

LikelihoodResult conditional_loglikelihood(LogitsModel& model, const LikelihoodRequest& req,
                                           const LikelihoodConfig& cfg) {
  const std::vector<std::string> problems = likelihood_config_problems(cfg, model.input_vocab_size());
  if (!problems.empty()) {
    std::string msg = "invalid likelihood configuration:";
    for (const std::string& p : problems) msg += "\n  " + p;
    MDLM_FAIL(msg);
  }
  LikelihoodResult out;
  const int64_t lc = static_cast<int64_t>(req.context.size()), ly = static_cast<int64_t>(req.continuation.size());
  if (ly == 0) return out;  // log p(empty | c) = 0
  if (cfg.block_size > 0) out = block_loglikelihood(model, req, cfg);
  else {
  const int64_t seq = lc + ly, batch = cfg.mc_batch;
  const int32_t mask = static_cast<int32_t>(cfg.mask_token);
  const bool guided = cfg.cfg_scale > 0;
  for (int64_t r = 0; r < cfg.mc_num / batch; ++r) {
    std::vector<int64_t> counts;
    const auto masks = likelihood_masks(cfg.seed, req.index, r, ly, batch, counts);
    CanvasBatch c;
    c.batch = guided ? 2 * batch : batch;
    c.seq = seq;
    std::vector<int32_t> rows, targets;
    std::vector<double> weight;
    for (int64_t copy = 0; copy < (guided ? 2 : 1); ++copy) {
      for (int64_t m = 0; m < batch; ++m) {
        for (int64_t i = 0; i < seq; ++i) {
          const bool answer = i >= lc;
          const bool masked = answer && masks[static_cast<size_t>(m)][static_cast<size_t>(i - lc)];
          // The unconditional copy has every context position masked (classifier-free guidance).
          int32_t tok = answer ? req.continuation[static_cast<size_t>(i - lc)] : req.context[static_cast<size_t>(i)];
          if (masked || (copy == 1 && !answer)) tok = mask;
          c.tokens.push_back(tok);
          c.positions.push_back(static_cast<int32_t>(i));
          if (copy == 0 && masked) {
            rows.push_back(static_cast<int32_t>(m * seq + i));
            targets.push_back(req.continuation[static_cast<size_t>(i - lc)]);
            weight.push_back(static_cast<double>(ly) / static_cast<double>(counts[static_cast<size_t>(m)]));
          }
        }
      }
    }
    const std::vector<double> ce = token_losses(model, c, rows, targets, cfg.cfg_scale);
    double total = 0;
    for (size_t k = 0; k < ce.size(); ++k) total += ce[k] * weight[k];
    out.estimates.push_back(total / static_cast<double>(batch));
  }
  }
  const double n = static_cast<double>(out.estimates.size());
  const double mean = std::accumulate(out.estimates.begin(), out.estimates.end(), 0.0) / n;
  out.loglikelihood = -mean;
  if (out.estimates.size() > 1) {
    double var = 0;
    for (double e : out.estimates) var += (e - mean) * (e - mean);
    out.standard_error = std::sqrt(var / (n - 1) / n);
  }
  return out;
}

bool greedy_reproduces(LogitsModel& model, const LikelihoodRequest& req, const LikelihoodConfig& cfg) {
  const int64_t ly = static_cast<int64_t>(req.continuation.size());
  if (ly == 0) return true;
  if (cfg.block_size > 0) return block_greedy_reproduces(model, req, cfg);
  SamplerConfig sc;
  sc.gen_length = sc.steps = sc.block_length = ly;
  sc.mask_token = cfg.mask_token;
  sc.cfg_scale = cfg.cfg_scale;
  sc.seed = cfg.seed;
  const std::vector<GenerationResult> r = generate(model, {{req.context, req.index}}, sc);
  return r[0].tokens == req.continuation;
}

ElboResult monte_carlo_elbo(LogitsModel& model, const std::vector<std::vector<int32_t>>& samples,
                            int64_t first_index, const DiffusionConfig& diffusion, uint64_t seed, int64_t draws) {
  MDLM_CHECK(diffusion.mode == RunningMode::DiffLMNoShift, "the ELBO is defined for masked-diffusion models");
  ElboResult out;
  for (int64_t d = 0; d < draws; ++d) {
    BatchContext ctx;
    ctx.seed = seed + static_cast<uint64_t>(d);
    ctx.training = false;  // evaluation noise, no varilen
    DiffusionConfig elbo = diffusion;
    elbo.ar_loss_weight = 0.0f;  // block diffusion: the ELBO is the noisy half's term alone
    const HostMicroBatch mb = build_micro_batch(samples, first_index, elbo, ctx);
    CanvasBatch c;
    c.batch = mb.batch;
    c.seq = mb.seq;
    c.tokens = mb.input_ids;
    c.positions = mb.positions;
    c.block_ranges = mb.block_ranges;  // the doubled [x_t | x_0] rows of block diffusion
    std::vector<int32_t> rows, targets;
    std::vector<double> weight;
    for (size_t k = 0; k < mb.loss_weights.size(); ++k) {
      if (mb.loss_weights[k] == 0.0f) continue;
      rows.push_back(static_cast<int32_t>(k));
      targets.push_back(mb.labels[k]);
      weight.push_back(mb.loss_weights[k]);
    }
    // A causal clean half (trained with the next-token loss): its exact autoregressive NLL, in
    // the same forward (the clean half never sees the noise: once, with draw 0).
    const size_t diffusion_rows = rows.size();
    const bool ar = d == 0 && diffusion.block_diffusion() && diffusion.ar_loss_weight > 0.0f;
    const int64_t L = mb.seq / 2;
    for (int64_t b = 0; ar && b < mb.batch; ++b)
      for (int64_t i = 0; i + 1 < L; ++i) {  // clean copy of position i predicts token i + 1
        rows.push_back(static_cast<int32_t>(b * 2 * L + L + i));
        targets.push_back(samples[static_cast<size_t>(b)][static_cast<size_t>(i + 2)]);
      }
    const std::vector<double> ce = token_losses(model, c, rows, targets, 0.0);
    double sum = 0;
    for (size_t k = 0; k < diffusion_rows; ++k) sum += ce[k] * weight[k];
    for (size_t k = diffusion_rows; k < ce.size(); ++k) out.ar_nll_sum += ce[k];
    out.ar_tokens += static_cast<double>(ce.size() - diffusion_rows);
    out.nll_sum += sum;
    out.tokens += mb.loss_tokens;
    out.per_draw.push_back(mb.loss_tokens > 0 ? sum / mb.loss_tokens : 0.0);
  }
  return out;
}

}  // namespace megadlm
