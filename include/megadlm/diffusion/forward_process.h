// The forward (noising) process and loss weighting of masked-diffusion training, and the
// autoregressive alternative: turns raw dataset samples into the micro-batch the model sees.
// The only place that knows what "diffusion" means (docs/architecture.md).
//
// difflm-noshift (LLaDA's forward process as MegaDLMs trains it; our fixed-length rule in
// docs/compat.md):
//   sample w_0..w_S (S+1 tokens) -> clean x = w_1..w_S (length S; MegaDLMs uses S-1)
//   varilen (training, no_mask only): with probability p the whole micro-batch is cut to
//     l ~ U{1..S-1} tokens (MegaDLMs' U{2..S} before its unshift)
//   per sample b with global index g:
//     t_b      = U[0,1) from philox(seed, DiffusionTime, {0, 0, g})
//     m_{b,i}  = U[0,1) from philox(seed, DiffusionMask, {i, 0, g}) < p(t_b)
//     if sum_i m < min_masked: mask further positions j = floor(U * l) from
//        philox(seed, DiffusionFallback, {k, 0, g}), k = 0, 1, ... (MegaDLMs: one position)
//     weight of a masked token: l / n_b (exact_ratio), 1/t (inv_t), 1/((1-1e-3)t+1e-3) (inv_t_eps)
//   input = mask token where m = 1, else x; label = x; loss weight = loss_mask * m * weight.
// Evaluation (ctx.training false) draws t, masks and fallbacks from the EvalNoise purpose with
// the same counters (c1 = 1, 2, 3 for t, mask, fallback) keyed by the validation sample index,
// so every evaluation of the same held-out samples sees the same masks and numbers compare.
// block diffusion (config.block_size = B > 0; docs/training_objectives.md): the row becomes
//   [x_t | x_0] (seq 2L, both halves at the same positions), blocks of B from each row or
//   document start, one t per block k from philox(seed, DiffusionTime, {k, 0, g}) (or k = 0 for
//   the whole row with t_granularity Sequence), masks and fallbacks as above; the noisy half's
//   masked tokens weigh w of their block, the clean half nothing (or, with ar_loss_weight > 0,
//   the next token at that weight); block_ranges holds each position's document and block.
// vanilla: input w_0..w_{S-1}, label w_1..w_S, loss weight = loss_mask, causal attention.
// Documents (Megatron's --reset-position-ids / --reset-attention-mask): an EOD token ends its
// document; with reset_position_ids positions restart at 0 after each EOD of the input, and
// with per_document_attention each input token gets the index of its document within the row
// (document_ids), which the attention uses to keep documents apart.
// Every random number is a pure function of (seed, global sample index, position): identical
// on every rank and for every parallel layout, and after a resume.
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/diffusion/diffusion_config.h"
#include "megadlm/model/micro_batch.h"

namespace megadlm {

struct BatchContext {
  uint64_t seed = 1234;
  int64_t micro_batch_size = 1;   ///< samples per micro-batch (keys the varilen draw)
  bool training = true;           ///< varilen only while training
  bool bidirectional = true;      ///< varilen only with --attention-mask-type no_mask
  int32_t eod_token = -1;         ///< for --eod-mask-loss (-1: none)
  bool eod_mask_loss = false;
  bool reset_position_ids = false;     ///< positions restart after each EOD
  bool per_document_attention = false; ///< fill document_ids (packed per-document attention)
};

/// Micro-batch from `samples` (each S+1 tokens, Megatron's GPT sample); samples[b] has global
/// index first_sample + b.
HostMicroBatch build_micro_batch(const std::vector<std::vector<int32_t>>& samples,
                                 int64_t first_sample, const DiffusionConfig& config,
                                 const BatchContext& ctx);

/// The varilen decision for the micro-batch starting at global sample `first_sample`: the
/// truncated length in [1, seq-1], or seq when not truncated.
int64_t varilen_length(int64_t first_sample, int64_t seq, const DiffusionConfig& config,
                       const BatchContext& ctx);

}  // namespace megadlm
