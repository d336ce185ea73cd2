#include "megadlm/diffusion/forward_process.h"
#include <algorithm>
#include <cmath>
#include "megadlm/core/error.h"
#include "megadlm/core/philox.h"

namespace megadlm {

namespace {

uint32_t lo32(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v)); }
uint32_t hi32(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v) >> 32); }

constexpr double kLladaEps = 1e-3;

// Noises one sample of `len` clean tokens in place of `input`, writing mask bits and weights.
// Training noise uses three purposes with c1 = 0; evaluation noise one purpose, EvalNoise, with
// c1 = 1 (t), 2 (mask), 3 (fallback): fixed masks per validation sample (docs/compat.md,
// "validation samples").
struct NoiseKeys {
  PhiloxKey time, mask, fallback;
  uint32_t time_c1 = 0, mask_c1 = 0, fallback_c1 = 0;
};

NoiseKeys noise_keys(uint64_t seed, bool training) {
  if (training)
    return {PhiloxKey::make(seed, RngPurpose::DiffusionTime), PhiloxKey::make(seed, RngPurpose::DiffusionMask),
            PhiloxKey::make(seed, RngPurpose::DiffusionFallback)};
  const PhiloxKey k = PhiloxKey::make(seed, RngPurpose::EvalNoise);
  return {k, k, k, 1, 2, 3};
}

void noise_sample(const int32_t* clean, int64_t len, int64_t g, const DiffusionConfig& cfg,
                  const NoiseKeys& keys, int32_t* input, uint8_t* mask, float* weight) {
  const float t_raw =
      uniform_from_u32(philox(keys.time, 0, keys.time_c1, lo32(g), hi32(g)).w[0]);
  double t = t_raw;
  double p_mask = t;
  if (cfg.loss_weight == DlmLossWeight::InvT) {
    t = t_raw + 1.0 / 16777216.0;  // (0, 1]: 1/t stays finite
    p_mask = t;
  } else if (cfg.loss_weight == DlmLossWeight::InvTEps) {
    p_mask = (1.0 - kLladaEps) * t + kLladaEps;
  }
  int64_t n = 0;
  for (int64_t i = 0; i < len; ++i) {
    const float u = uniform_from_u32(philox(keys.mask, lo32(i), keys.mask_c1, lo32(g), hi32(g)).w[0]);
    mask[i] = u < p_mask ? 1 : 0;
    n += mask[i];
  }
  const int64_t need = std::min<int64_t>(cfg.min_masked, len);
  for (uint32_t k = 0; n < need; ++k) {
    const float u = uniform_from_u32(philox(keys.fallback, k, keys.fallback_c1, lo32(g), hi32(g)).w[0]);
    const int64_t j = std::min<int64_t>(static_cast<int64_t>(u * static_cast<double>(len)), len - 1);
    if (!mask[j]) {
      mask[j] = 1;
      ++n;
    }
  }
  double w = 0;
  switch (cfg.loss_weight) {
    case DlmLossWeight::ExactRatio: w = n > 0 ? static_cast<double>(len) / static_cast<double>(n) : 0; break;
    case DlmLossWeight::InvT: w = 1.0 / t; break;
    case DlmLossWeight::InvTEps: w = 1.0 / p_mask; break;
  }
  for (int64_t i = 0; i < len; ++i) {
    input[i] = mask[i] ? static_cast<int32_t>(cfg.mask_token) : clean[i];
    weight[i] = mask[i] ? static_cast<float>(w) : 0.0f;
  }
}

}  // namespace

int64_t varilen_length(int64_t first_sample, int64_t seq, const DiffusionConfig& config,
                       const BatchContext& ctx) {
  if (!ctx.training || !ctx.bidirectional || config.mode != RunningMode::DiffLMNoShift ||
      config.varilen_prob <= 0.0f || seq < 2)
    return seq;
  // Keyed by the global micro-batch index, so every rank and every DP layout with the same
  // micro-batch size agrees (MegaDLMs keys numpy by iteration*num_accum + index, which depends on
  // the DP size; see docs/compat.md).
  const int64_t mb = first_sample / std::max<int64_t>(ctx.micro_batch_size, 1);
  PhiloxWords w = philox(PhiloxKey::make(ctx.seed, RngPurpose::Varilen), lo32(mb), hi32(mb), 0, 0);
  if (uniform_from_u32(w.w[0]) >= config.varilen_prob) return seq;
  const double u = uniform53(w.w[1], w.w[2]);
  return 1 + std::min<int64_t>(static_cast<int64_t>(u * static_cast<double>(seq - 1)), seq - 2);
}

HostMicroBatch build_micro_batch(const std::vector<std::vector<int32_t>>& samples,
                                 int64_t first_sample, const DiffusionConfig& config,
                                 const BatchContext& ctx) {
  MDLM_CHECK(!samples.empty(), "build_micro_batch: no samples");
  const int64_t full = static_cast<int64_t>(samples[0].size()) - 1;  // S
  MDLM_CHECK(full >= 1, "build_micro_batch: samples need at least 2 tokens");
  for (const auto& s : samples)
    MDLM_CHECK(static_cast<int64_t>(s.size()) == full + 1, "build_micro_batch: sample of ",
               s.size(), " tokens, expected ", full + 1);

  HostMicroBatch mb;
  mb.batch = static_cast<int64_t>(samples.size());
  mb.first_sample = first_sample;
  const bool diffusion = config.mode == RunningMode::DiffLMNoShift;
  const int64_t len = diffusion ? varilen_length(first_sample, full, config, ctx) : full;
  mb.seq = len;
  const size_t n = static_cast<size_t>(mb.batch * len);
  mb.input_ids.resize(n);
  mb.labels.resize(n);
  mb.loss_weights.resize(n);
  mb.positions.resize(n);
  mb.noise_mask.assign(n, 0);
  if (ctx.per_document_attention) mb.document_ids.assign(n, 0);
  const NoiseKeys keys = noise_keys(ctx.seed, ctx.training);
  double loss_tokens = 0;
  for (int64_t b = 0; b < mb.batch; ++b) {
    const int32_t* w = samples[static_cast<size_t>(b)].data();
    const size_t row = static_cast<size_t>(b * len);
    // The model's input tokens: w_1..w_len (diffusion, before noising) or w_0..w_{len-1}.
    const int32_t* in = diffusion ? w + 1 : w;
    int32_t doc = 0, start = 0;
    for (int64_t i = 0; i < len; ++i) {
      const size_t k = row + static_cast<size_t>(i);
      mb.positions[k] = static_cast<int32_t>(ctx.reset_position_ids ? i - start : i);
      if (ctx.per_document_attention) mb.document_ids[k] = doc;
      if (in[i] == ctx.eod_token && ctx.eod_token >= 0) {  // the EOD closes its document
        ++doc;
        start = static_cast<int32_t>(i + 1);
      }
    }
    if (diffusion) {
      const int32_t* clean = w + 1;  // no shift: input and label are the same token w_{i+1}
      noise_sample(clean, len, first_sample + b, config, keys, &mb.input_ids[row],
                   &mb.noise_mask[row], &mb.loss_weights[row]);
      for (int64_t i = 0; i < len; ++i) {
        mb.labels[row + static_cast<size_t>(i)] = clean[i];
        const bool keep = !(ctx.eod_mask_loss && clean[i] == ctx.eod_token);
        if (!keep) mb.loss_weights[row + static_cast<size_t>(i)] = 0.0f;
        loss_tokens += keep ? 1.0 : 0.0;
      }
    } else {
      for (int64_t i = 0; i < len; ++i) {
        const size_t k = row + static_cast<size_t>(i);
        mb.input_ids[k] = w[i];
        mb.labels[k] = w[i + 1];
        const bool keep = !(ctx.eod_mask_loss && w[i] == ctx.eod_token);  // Megatron: input == EOD
        mb.loss_weights[k] = keep ? 1.0f : 0.0f;
        loss_tokens += keep ? 1.0 : 0.0;
      }
    }
  }
  mb.loss_tokens = loss_tokens;
  return mb;
}

}  // namespace megadlm
