#include "megadlm/diffusion/forward_process.h"
#include <algorithm>
#include <cmath>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/core/philox.h"
#include "block_rows.h"

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

// Noises one sample of `len` clean tokens in place of `input`, writing mask bits and weights.
// Position i belongs to noise group group[i] in [0, groups) (null: every position in group 0),
// and each group draws its own t from counter c0 = group: the full-sequence objective has one
// group, block diffusion one per block (or one per sequence with --dlm-t-granularity sequence).
void noise_sample(const int32_t* clean, int64_t len, int64_t g, const DiffusionConfig& cfg,
                  const NoiseKeys& keys, const int32_t* group, int64_t groups, int32_t* input,
                  uint8_t* mask, float* weight) {
  std::vector<double> t(static_cast<size_t>(groups)), p_mask(static_cast<size_t>(groups));
  for (int64_t k = 0; k < groups; ++k) {
    const float t_raw = uniform_from_u32(
        philox(keys.time, static_cast<uint32_t>(k), keys.time_c1, lo32(g), hi32(g)).w[0]);
    double tk = t_raw, pk = t_raw;
    if (cfg.loss_weight == DlmLossWeight::InvT) {
      tk = t_raw + 1.0 / 16777216.0;  // (0, 1]: 1/t stays finite
      pk = tk;
    } else if (cfg.loss_weight == DlmLossWeight::InvTEps) {
      pk = (1.0 - kLladaEps) * tk + kLladaEps;
    }
    t[static_cast<size_t>(k)] = tk;
    p_mask[static_cast<size_t>(k)] = pk;
  }
  const auto group_of = [&](int64_t i) { return group != nullptr ? static_cast<size_t>(group[i]) : size_t{0}; };
  int64_t n = 0;
  for (int64_t i = 0; i < len; ++i) {
    const float u = uniform_from_u32(philox(keys.mask, lo32(i), keys.mask_c1, lo32(g), hi32(g)).w[0]);
    mask[i] = u < p_mask[group_of(i)] ? 1 : 0;
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
  // exact_ratio: each group's length over its masked count (the whole row for one group).
  std::vector<int64_t> group_len(static_cast<size_t>(groups), 0), group_masked(static_cast<size_t>(groups), 0);
  for (int64_t i = 0; i < len; ++i) {
    ++group_len[group_of(i)];
    group_masked[group_of(i)] += mask[i];
  }
  std::vector<double> w(static_cast<size_t>(groups), 0.0);
  for (size_t k = 0; k < w.size(); ++k) {
    switch (cfg.loss_weight) {
      case DlmLossWeight::ExactRatio:
        w[k] = group_masked[k] > 0 ? static_cast<double>(group_len[k]) / static_cast<double>(group_masked[k]) : 0;
        break;
      case DlmLossWeight::InvT: w[k] = 1.0 / t[k]; break;
      case DlmLossWeight::InvTEps: w[k] = 1.0 / p_mask[k]; break;
    }
  }
  for (int64_t i = 0; i < len; ++i) {
    input[i] = mask[i] ? static_cast<int32_t>(cfg.mask_token) : clean[i];
    weight[i] = mask[i] ? static_cast<float>(w[group_of(i)]) : 0.0f;
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

namespace {

// Block diffusion (see forward_process.h): each row of L clean tokens becomes [x_t | x_0].
// Loss: the noisy half's masked tokens, weight of their block; the AR variant adds the clean
// half's next-token cross entropy and counts masked + next-token positions in the normaliser.
HostMicroBatch build_block_diffusion_micro_batch(const std::vector<std::vector<int32_t>>& samples,
                                                 int64_t first_sample, const DiffusionConfig& config,
                                                 const BatchContext& ctx) {
  const int64_t L = static_cast<int64_t>(samples[0].size()) - 1, B = config.block_size;
  HostMicroBatch mb =
      block_rows::allocate(static_cast<int64_t>(samples.size()), L, B, first_sample, "block diffusion");
  const NoiseKeys keys = noise_keys(ctx.seed, ctx.training);
  std::vector<int32_t> group(static_cast<size_t>(L));
  double loss_tokens = 0;
  for (int64_t b = 0; b < mb.batch; ++b) {
    const int32_t* clean = samples[static_cast<size_t>(b)].data() + 1;  // w_1..w_L, as difflm-noshift
    const size_t row = static_cast<size_t>(b * 2 * L);
    int32_t* ranges = &mb.block_ranges[static_cast<size_t>(b * 4 * L)];
    // Documents: runs closed by an EOD when attention is per document, else the whole row.
    int64_t doc_start = 0, blocks = 0;
    for (int64_t i = 0; i < L; ++i) {
      const bool closes = ctx.eod_token >= 0 && clean[i] == ctx.eod_token;
      if (i == L - 1 || (ctx.per_document_attention && closes)) {
        // Noise groups: the row's blocks numbered across its documents (or one group).
        const int64_t first_block = blocks;
        block_rows::set_document(ranges, L, doc_start, i + 1, B, [&](int64_t j, int64_t block) {
          blocks = std::max(blocks, first_block + block + 1);
          group[static_cast<size_t>(j)] = config.t_granularity == BlockTimeGranularity::Block
                                              ? static_cast<int32_t>(first_block + block) : 0;
        });
        doc_start = i + 1;
      }
    }
    int32_t doc_pos_start = 0;
    for (int64_t i = 0; i < L; ++i) {
      const int32_t pos = static_cast<int32_t>(ctx.reset_position_ids ? i - doc_pos_start : i);
      mb.positions[row + static_cast<size_t>(i)] = pos;          // x_t and x_0 share positions
      mb.positions[row + static_cast<size_t>(L + i)] = pos;
      if (ctx.eod_token >= 0 && clean[i] == ctx.eod_token) doc_pos_start = static_cast<int32_t>(i + 1);
    }
    const int64_t groups = config.t_granularity == BlockTimeGranularity::Block ? blocks : 1;
    noise_sample(clean, L, first_sample + b, config, keys, group.data(), groups, &mb.input_ids[row],
                 &mb.noise_mask[row], &mb.loss_weights[row]);
    const bool ar = config.ar_loss_weight > 0.0f;
    for (int64_t i = 0; i < L; ++i) {
      const size_t noisy = row + static_cast<size_t>(i), copy = row + static_cast<size_t>(L + i);
      mb.input_ids[copy] = clean[i];  // the clean copy x_0
      mb.labels[noisy] = clean[i];
      const bool keep = !(ctx.eod_mask_loss && clean[i] == ctx.eod_token);
      if (!keep) mb.loss_weights[noisy] = 0.0f;
      if (!ar) {
        mb.labels[copy] = clean[i];  // weight 0: never scored
        loss_tokens += keep ? 1.0 : 0.0;
        continue;
      }
      // The AR variant: the clean copy of position i predicts token i + 1 (none after the last).
      mb.loss_weights[noisy] *= config.diffusion_loss_scale;
      loss_tokens += mb.noise_mask[noisy] && keep ? 1.0 : 0.0;
      const bool next = i + 1 < L && !(ctx.eod_mask_loss && clean[i] == ctx.eod_token);
      mb.labels[copy] = i + 1 < L ? clean[i + 1] : clean[i];
      mb.loss_weights[copy] = next ? config.ar_loss_weight : 0.0f;
      loss_tokens += next ? 1.0 : 0.0;
    }
  }
  mb.loss_tokens = loss_tokens;
  return mb;
}

}  // namespace

HostMicroBatch build_micro_batch(const std::vector<std::vector<int32_t>>& samples,
                                 int64_t first_sample, const DiffusionConfig& config,
                                 const BatchContext& ctx) {
  MDLM_CHECK(!samples.empty(), "build_micro_batch: no samples");
  const int64_t full = static_cast<int64_t>(samples[0].size()) - 1;  // S
  MDLM_CHECK(full >= 1, "build_micro_batch: samples need at least 2 tokens");
  for (const auto& s : samples)
    MDLM_CHECK(static_cast<int64_t>(s.size()) == full + 1, "build_micro_batch: sample of ",
               s.size(), " tokens, expected ", full + 1);

  const bool diffusion = config.mode == RunningMode::DiffLMNoShift;
  if (diffusion && config.block_diffusion())
    return build_block_diffusion_micro_batch(samples, first_sample, config, ctx);
  HostMicroBatch mb;
  mb.batch = static_cast<int64_t>(samples.size());
  mb.first_sample = first_sample;
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
      noise_sample(clean, len, first_sample + b, config, keys, nullptr, 1, &mb.input_ids[row],
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
