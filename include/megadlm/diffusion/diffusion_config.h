// How training examples are noised and scored (MegaDLMs' difflm objective: docs/compat.md).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megadlm {

enum class RunningMode {
  DiffLMNoShift,  ///< --model-running-mode difflm-noshift: masked diffusion (default)
  Vanilla,        ///< --model-running-mode vanilla: autoregressive next-token training
};

/// Per-token loss weight of a masked token (`--dlm-loss-weight`, docs/flags.md).
enum class DlmLossWeight {
  ExactRatio,  ///< 1 / (n_masked / L): MegaDLMs (default)
  InvT,        ///< 1 / t
  InvTEps,     ///< 1 / ((1 - eps) t + eps), eps = 1e-3: LLaDA
};

/// How supervised fine-tuning normalises the loss (--dlm-sft-loss-norm; docs/finetuning.md).
enum class SftLossNorm {
  AnswerLength,  ///< answer_len: (1/B) sum_b [sum_masked CE / p_b] / answer_length_b (LLaDA)
  Token,         ///< token: sum_b sum_masked CE / p_b over sum_b answer_length_b (SMDM)
};

/// How block diffusion draws the noise level (--dlm-t-granularity).
enum class BlockTimeGranularity {
  Block,     ///< one t per block (BD3-LM, Fast-dLLM v2), the default
  Sequence,  ///< one t per sequence, shared by its blocks (Megatron-Bridge's sbd, LLaDA2 SFT)
};

struct DiffusionConfig {
  RunningMode mode = RunningMode::DiffLMNoShift;
  int64_t mask_token = 151656;       ///< --mask-token (MegaDLMs default: Qwen2.5 <|video_pad|>)
  float varilen_prob = 0.01f;        ///< --difflm-varilen-prob
  DlmLossWeight loss_weight = DlmLossWeight::ExactRatio;
  int min_masked = 1;                ///< --dlm-min-masked: at least this many masks per sequence
  bool sft = false;                  ///< supervised fine-tuning (--sft-data-path): diffusion/sft_process.h
  SftLossNorm sft_loss_norm = SftLossNorm::AnswerLength;
  /// Block diffusion (--attention-mask-type block_causal --dlm-block-size B): 0 for the
  /// full-sequence objective. diffusion/forward_process.h says what the micro-batch becomes.
  int64_t block_size = 0;
  BlockTimeGranularity t_granularity = BlockTimeGranularity::Block;
  /// The causal-clean-half variant (--dlm-bd-clean-attention causal): the clean half also
  /// carries a next-token loss of this weight (--dlm-ar-loss-weight), and the diffusion term is
  /// scaled by diffusion_loss_scale (--dlm-diffusion-loss-scale); the row's normaliser is then
  /// its masked count plus its next-token count (Megatron-Bridge's sbd_block_diff). 0: no AR loss.
  float ar_loss_weight = 0.0f;
  float diffusion_loss_scale = 1.0f;
  /// Block-size warm-up (--dlm-block-size-schedule): (size, until) pairs, sizes and iterations
  /// increasing; block size `size` while the iteration count is below `until`, block_size after
  /// the last. Empty: block_size from the first iteration.
  std::vector<std::pair<int64_t, int64_t>> block_size_schedule;
  /// Set when --finetune started this objective from a checkpoint trained with another one
  /// (e.g. an AR model adapted to block diffusion): that objective, directory and iteration.
  std::string adapted_from;
  bool block_diffusion() const { return block_size > 0; }
  /// The block size of the training step that starts after `iteration` completed iterations.
  int64_t block_size_at(int64_t iteration) const;
};

/// Parses --dlm-block-size-schedule's values ("SIZE:ITER" each). Returns an empty string and
/// fills `out`, or the reason the entry is malformed (sizes/iterations not positive integers).
std::string parse_block_size_schedule(const std::vector<std::string>& values,
                                      std::vector<std::pair<int64_t, int64_t>>& out);

const char* running_mode_name(RunningMode m);
const char* dlm_loss_weight_name(DlmLossWeight w);
const char* block_time_granularity_name(BlockTimeGranularity g);

}  // namespace megadlm
