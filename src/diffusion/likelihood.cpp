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

std::vector<std::vector<uint8_t>> likelihood_masks(uint64_t seed, int64_t index, int64_t repeat, int64_t ly,
                                                   int64_t batch, std::vector<int64_t>& counts) {
  const PhiloxKey key = PhiloxKey::make(seed, RngPurpose::LikelihoodMC);
  const PhiloxWords w = philox(key, 0, 0, lo32(index), lo32(repeat));
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
      const PhiloxWords p = philox(key, lo32(a), static_cast<uint32_t>(1 + m), lo32(index), lo32(repeat));
      keys[static_cast<size_t>(a)] = {uniform53(p.w[0], p.w[1]), a};
    }
    std::sort(keys.begin(), keys.end());  // by key, then position
    for (int64_t i = 0; i < n; ++i) masks[static_cast<size_t>(m)][static_cast<size_t>(keys[static_cast<size_t>(i)].second)] = 1;
  }
  return masks;
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
    const HostMicroBatch mb = build_micro_batch(samples, first_index, diffusion, ctx);
    CanvasBatch c;
    c.batch = mb.batch;
    c.seq = mb.seq;
    c.tokens = mb.input_ids;
    c.positions = mb.positions;
    std::vector<int32_t> rows, targets;
    std::vector<double> weight;
    for (size_t k = 0; k < mb.loss_weights.size(); ++k) {
      if (mb.loss_weights[k] == 0.0f) continue;
      rows.push_back(static_cast<int32_t>(k));
      targets.push_back(mb.labels[k]);
      weight.push_back(mb.loss_weights[k]);
    }
    const std::vector<double> ce = token_losses(model, c, rows, targets, 0.0);
    double sum = 0;
    for (size_t k = 0; k < ce.size(); ++k) sum += ce[k] * weight[k];
    out.nll_sum += sum;
    out.tokens += mb.loss_tokens;
    out.per_draw.push_back(mb.loss_tokens > 0 ? sum / mb.loss_tokens : 0.0);
  }
  return out;
}

}  // namespace megadlm
