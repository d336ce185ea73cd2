// Supervised fine-tuning noise (include/megadlm/diffusion/sft_process.h).
#include "megadlm/diffusion/sft_process.h"
#include "megadlm/core/error.h"
#include "megadlm/core/philox.h"

namespace megadlm {

namespace {
uint32_t lo32(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v)); }
uint32_t hi32(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v) >> 32); }
constexpr double kLladaEps = 1e-3;
}  // namespace

HostMicroBatch build_sft_micro_batch(const std::vector<std::vector<int32_t>>& samples,
                                     const std::vector<int64_t>& prompt_lengths, int64_t first_sample,
                                     const DiffusionConfig& cfg, const BatchContext& ctx) {
  MDLM_CHECK(!samples.empty() && samples.size() == prompt_lengths.size(),
             "build_sft_micro_batch: ", samples.size(), " samples and ", prompt_lengths.size(), " prompt lengths");
  MDLM_CHECK(cfg.mode == RunningMode::DiffLMNoShift, "supervised fine-tuning needs --model-running-mode difflm-noshift");
  const int64_t len = static_cast<int64_t>(samples[0].size()) - 1;
  MDLM_CHECK(len >= 1, "build_sft_micro_batch: samples need at least 2 tokens");
  // Training: the pre-training purposes (c1 = 0); evaluation: EvalNoise with c1 = 1 (t), 2 (mask).
  const PhiloxKey time_key = PhiloxKey::make(ctx.seed, ctx.training ? RngPurpose::DiffusionTime : RngPurpose::EvalNoise);
  const PhiloxKey mask_key = PhiloxKey::make(ctx.seed, ctx.training ? RngPurpose::DiffusionMask : RngPurpose::EvalNoise);
  const uint32_t time_c1 = ctx.training ? 0 : 1, mask_c1 = ctx.training ? 0 : 2;
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
    const int64_t prompt = prompt_lengths[static_cast<size_t>(b)];
    MDLM_CHECK(prompt >= 0 && prompt < len, "sample ", first_sample + b, ": prompt of ", prompt,
               " tokens leaves no response in ", len);
    const int64_t g = first_sample + b;
    const double t = uniform_from_u32(philox(time_key, 0, time_c1, lo32(g), hi32(g)).w[0]);
    const double p = (1.0 - kLladaEps) * t + kLladaEps;
    const int64_t answer = len - prompt;
    const double weight = cfg.sft_loss_norm == SftLossNorm::AnswerLength ? 1.0 / (p * static_cast<double>(answer)) : 1.0 / p;
    mb.loss_tokens += cfg.sft_loss_norm == SftLossNorm::AnswerLength ? 1.0 : static_cast<double>(answer);
    for (int64_t i = 0; i < len; ++i) {
      const size_t k = static_cast<size_t>(b * len + i);
      const int32_t clean = w[static_cast<size_t>(i + 1)];
      bool masked = false;
      if (i >= prompt) {  // the prompt is never noised
        const float u = uniform_from_u32(philox(mask_key, lo32(i), mask_c1, lo32(g), hi32(g)).w[0]);
        masked = u < p;
      }
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
