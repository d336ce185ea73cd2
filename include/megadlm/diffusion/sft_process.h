// The noising of supervised fine-tuning (LLaDA's SFT recipe; docs/finetuning.md):
// prompt tokens always visible, masking on the response (and its EOS padding) only.
//
// A sample is S+1 tokens whose tokens 1..S are the model's input (difflm-noshift; token 0 is a
// filler), the first P_b of them the prompt. Per sample b with global index g:
//   t_b = U[0,1) from philox(seed, DiffusionTime, {0, 0, g}),  p_b = (1 - 1e-3) t_b + 1e-3
//   m_{b,i} = [i >= P_b] * [U from philox(seed, DiffusionMask, {i, 0, g}) < p_b]
//   (the same counters as pre-training; evaluation uses EvalNoise with c1 = 1 / 2, as there)
// No at-least-one rule: a sample may have no masked token (it then adds nothing), as in LLaDA.
// answer_length_b = S - P_b (the EOS padding included: it is how the model learns to stop).
// Loss weight of a masked token and the sample's share of the normaliser (loss = sum w CE / sum n):
//   answer_len: w = 1 / (p_b * answer_length_b), n = 1   -> (1/B) sum_b [sum CE/p_b] / answer_length_b
//   token:      w = 1 / p_b,                     n = answer_length_b
// Block diffusion (config.block_size = B > 0; docs/finetuning.md, "Block diffusion"): the row of
// L = S input tokens becomes [x_t | x_0] (seq 2L, both halves at positions 0..L-1), one document,
// blocks [kB, (k+1)B) counted from the first prompt token (the alignment of block decoding).
//   t_{b,k} from philox(seed, DiffusionTime, {k, 0, g}) per block k (t_granularity Block), or
//   k = 0 for every block (Sequence: the full-sequence SFT's t); p_{b,k} = (1 - 1e-3) t_{b,k} + 1e-3
//   m_{b,i} = [i >= P_b] * [U from philox(seed, DiffusionMask, {i, 0, g}) < p_{b,block(i)}]
//   a masked noisy token weighs 1/p of its block, then divided by answer_length_b (answer_len)
//   or not (token); normaliser share n as above. The clean half is never scored, except with
//   ar_loss_weight a > 0 (the causal clean half): clean position i predicts token i + 1 when
//   P_b <= i + 1 < L, weight a (/ answer_length_b with answer_len), and the diffusion weights are
//   scaled by diffusion_loss_scale; n is unchanged, so the loss is s * (diffusion term) +
//   a * (next-token term), each per answer token.
// The noisy half with t_granularity Sequence is exactly the full-sequence SFT micro-batch.
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/diffusion/forward_process.h"

namespace megadlm {

/// The micro-batch of SFT `samples` (each S+1 tokens) with prompt lengths `prompt_lengths`
/// (in input tokens, 0 <= P_b < S); samples[b] has global index first_sample + b.
HostMicroBatch build_sft_micro_batch(const std::vector<std::vector<int32_t>>& samples,
                                     const std::vector<int64_t>& prompt_lengths, int64_t first_sample,
                                     const DiffusionConfig& config, const BatchContext& ctx);

}  // namespace megadlm
