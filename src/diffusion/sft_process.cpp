// Supervised fine-tuning noise (include/megadlm/diffusion/sft_process.h).
#include "megadlm/diffusion/sft_process.h"
#include <algorithm>
#include "megadlm/core/error.h"
#include "megadlm/core/philox.h"
#include "block_rows.h"

namespace megadlm {

namespace {
uint32_t lo32(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v)); }
uint32_t hi32(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v) >> 32); }
constexpr double kLladaEps = 1e-3;

// The noise streams: training uses the pre-training purposes (c1 = 0); evaluation EvalNoise with
// c1 = 1 (t) and 2 (mask), as forward_process does.
struct SftNoise {
  PhiloxKey time, mask;
  uint32_t time_c1 = 0, mask_c1 = 0;
  explicit SftNoise(const BatchContext& ctx)
      : time(PhiloxKey::make(ctx.seed, ctx.training ? RngPurpose::DiffusionTime : RngPurpose::EvalNoise)),
        mask(PhiloxKey::make(ctx.seed, ctx.training ? RngPurpose::DiffusionMask : RngPurpose::EvalNoise)),
        time_c1(ctx.training ? 0 : 1),
        mask_c1(ctx.training ? 0 : 2) {}
  /// p = (1 - eps) t + eps of noise group k (a block, or 0 for the whole sample) of sample g.
  double p(int64_t k, int64_t g) const {
    const double t = uniform_from_u32(philox(time, lo32(k), time_c1, lo32(g), hi32(g)).w[0]);
    return (1.0 - kLladaEps) * t + kLladaEps;
  }
  /// Whether response position i of sample g is masked at rate p.
  bool masked(int64_t i, int64_t g, double p) const {
    return uniform_from_u32(philox(mask, lo32(i), mask_c1, lo32(g), hi32(g)).w[0]) < p;
  }
};

// Prompt length P of sample b, checked against the L input tokens.
int64_t checked_prompt(const std::vector<int64_t>& prompt_lengths, int64_t b, int64_t len, int64_t first_sample) {
  const int64_t prompt = prompt_lengths[static_cast<size_t>(b)];
  MDLM_CHECK(prompt >= 0 && prompt < len, "sample ", first_sample + b, ": prompt of ", prompt,
             " tokens leaves no response in ", len);
  return prompt;
}

// Block diffusion SFT (sft_process.h): each row becomes [x_t | x_0], one document, blocks of B
// from the first prompt token; masks on the response only, at the rate of the token's block.
HostMicroBatch build_block_sft_micro_batch(const std::vector<std::vector<int32_t>>& samples,
                                           const std::vector<int64_t>& prompt_lengths, int64_t first_sample,
                                           const DiffusionConfig& cfg, const BatchContext& ctx) {
  const int64_t L = static_cast<int64_t>(samples[0].size()) - 1, B = cfg.block_size;
  HostMicroBatch mb = block_rows::allocate(static_cast<int64_t>(samples.size()), L, B, first_sample,
                                           "block diffusion fine-tuning");
  const SftNoise noise(ctx);
  const bool per_block = cfg.t_granularity == BlockTimeGranularity::Block;
  const bool answer_len = cfg.sft_loss_norm == SftLossNorm::AnswerLength;
  const bool ar = cfg.ar_loss_weight > 0.0f;
  const double scale = ar ? static_cast<double>(cfg.diffusion_loss_scale) : 1.0;
  std::vector<double> p(static_cast<size_t>(L / B));
  for (int64_t b = 0; b < mb.batch; ++b) {
    const std::vector<int32_t>& w = samples[static_cast<size_t>(b)];
    MDLM_CHECK(static_cast<int64_t>(w.size()) == L + 1, "build_sft_micro_batch: sample of ", w.size(),
               " tokens, expected ", L + 1);
    const int32_t* clean = w.data() + 1;
    const int64_t prompt = checked_prompt(prompt_lengths, b, L, first_sample);
    const int64_t g = first_sample + b, answer = L - prompt;
    // answer_len: the sample's terms are divided by its answer length and it counts once;
    // token: they are summed and it counts its answer length.
    const double norm = answer_len ? 1.0 / static_cast<double>(answer) : 1.0;
    mb.loss_tokens += answer_len ? 1.0 : static_cast<double>(answer);
    for (int64_t k = 0; k < L / B; ++k) p[static_cast<size_t>(k)] = noise.p(per_block ? k : 0, g);
    const size_t row = static_cast<size_t>(b * 2 * L);
    // One document (the row: prompt, response, EOS padding); blocks at multiples of B, the
    // alignment block decoding uses (docs/generation.md).
    block_rows::set_document(&mb.block_ranges[static_cast<size_t>(b * 4 * L)], L, 0, L, B,
                             [&](int64_t i, int64_t block) {
      const size_t noisy = row + static_cast<size_t>(i), copy = row + static_cast<size_t>(L + i);
      const double pk = p[static_cast<size_t>(block)];
      const bool masked = i >= prompt && noise.masked(i, g, pk);  // the prompt is never noised
      mb.input_ids[noisy] = masked ? static_cast<int32_t>(cfg.mask_token) : clean[i];
      mb.labels[noisy] = clean[i];
      mb.noise_mask[noisy] = masked ? 1 : 0;
      mb.loss_weights[noisy] = masked ? static_cast<float>(scale * norm / pk) : 0.0f;
      mb.input_ids[copy] = clean[i];
      mb.positions[noisy] = mb.positions[copy] = static_cast<int32_t>(i);
      // The causal variant: clean position i predicts token i + 1 when that is a response token.
      const bool next = ar && i + 1 < L && i + 1 >= prompt;
      mb.labels[copy] = next ? clean[i + 1] : clean[i];
      mb.loss_weights[copy] = next ? static_cast<float>(static_cast<double>(cfg.ar_loss_weight) * norm) : 0.0f;
    });
  }
  return mb;
}

}  // namespace

HostMicroBatch build_sft_micro_batch(const std::vector<std::vector<int32_t>>& samples,
                                     const std::vector<int64_t>& prompt_lengths, int64_t first_sample,
                                     const DiffusionConfig& cfg, const BatchContext& ctx) {
  MDLM_CHECK(!samples.empty() && samples.size() == prompt_lengths.size(),
             "build_sft_micro_batch: ", samples.size(), " samples and ", prompt_lengths.size(), " prompt lengths");
  MDLM_CHECK(cfg.mode == RunningMode::DiffLMNoShift, "supervised fine-tuning needs --model-running-mode difflm-noshift");
  const int64_t len = static_cast<int64_t>(samples[0].size()) - 1;
  MDLM_CHECK(len >= 1, "build_sft_micro_batch: samples need at least 2 tokens");
  if (cfg.block_diffusion()) return build_block_sft_micro_batch(samples, prompt_lengths, first_sample, cfg, ctx);
  const SftNoise noise(ctx);
  HostMicroBatch mb;
  mb.batch = static_cast<int64_t>(samples.size());
  mb.seq = len;
  mb.first_sample = first_sample;
  const size_t n = static_cast<size_t>(mb.batch * len);
  mb.input_ids.resize(n);
  mb.labels.resize(n);
  mb.loss_weights.assign(n, 0.0f);
  mb.positions.resize(n);
  mb.noise_mask.assign(n, 0);
  for (int64_t b = 0; b < mb.batch; ++b) {
    const std::vector<int32_t>& w = samples[static_cast<size_t>(b)];
    MDLM_CHECK(static_cast<int64_t>(w.size()) == len + 1, "build_sft_micro_batch: sample of ", w.size(),
               " tokens, expected ", len + 1);
    const int64_t prompt = checked_prompt(prompt_lengths, b, len, first_sample);
    const int64_t g = first_sample + b;
    const double p = noise.p(0, g);
    const int64_t answer = len - prompt;
    const double weight = cfg.sft_loss_norm == SftLossNorm::AnswerLength ? 1.0 / (p * static_cast<double>(answer)) : 1.0 / p;
    mb.loss_tokens += cfg.sft_loss_norm == SftLossNorm::AnswerLength ? 1.0 : static_cast<double>(answer);
    for (int64_t i = 0; i < len; ++i) {
      const size_t k = static_cast<size_t>(b * len + i);
      const int32_t clean = w[static_cast<size_t>(i + 1)];
      const bool masked = i >= prompt && noise.masked(i, g, p);  // the prompt is never noised
      mb.input_ids[k] = masked ? static_cast<int32_t>(cfg.mask_token) : clean;
      mb.labels[k] = clean;
      mb.noise_mask[k] = masked ? 1 : 0;
      mb.loss_weights[k] = masked ? static_cast<float>(weight) : 0.0f;
      mb.positions[k] = static_cast<int32_t>(i);
    }
  }
  return mb;
}

}  // namespace megadlm
