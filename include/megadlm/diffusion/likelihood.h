// Likelihood evaluation of a masked-diffusion LM (docs/evaluation.md):
//   * the conditional log-likelihood log p(y | c) as LLaDA estimates it
//     (get_log_likelihood.py / eval_llada.py), with classifier-free guidance;
//   * the Monte-Carlo ELBO per token of whole sequences: the training objective under the
//     fixed evaluation noise of diffusion/forward_process, averaged over noise draws.
//
// LLaDA's estimator, for a request of answer length Ly and a mini-batch of B rows, repeated
// mc_num / B times (repeat r of request g):
//   k       = 1 + floor(U * Ly),  U = uniform53 of words (0, 1) of philox(key(seed, LikelihoodMC),
//                                                                  {0, 0, g, r})
//   n_m     = round_half_even(k + m * Ly / B) (in double), then ((n_m - 1) mod Ly) + 1, m < B
//   mask of row m: the n_m answer positions a with the smallest keys uniform53 of
//             philox(key(seed, LikelihoodMC), {a, 1 + m, g, r}) (lower a on ties): exactly n_m
//             positions uniformly at random, the context untouched
//   score_m = sum over masked a of CE_a * Ly / n_m;   estimate_r = (1/B) sum_m score_m
//   log p(y | c) ~= -(mean over r of estimate_r)
// The random numbers replace torch's randint/randperm by counter-based draws (promise 1 of
// docs/architecture.md): the same request gives the same masks in any order or batch, and
// tests/golden/llada_reference.py reproduces them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "megadlm/diffusion/diffusion_config.h"
#include "megadlm/diffusion/sampler.h"

namespace megadlm {

struct LikelihoodConfig {
  int64_t mc_num = 128;    ///< --mc-num: Monte-Carlo samples in all (a multiple of mc_batch)
  int64_t mc_batch = 16;   ///< --mc-batch-size: rows evaluated together (LLaDA's batch_size)
  double cfg_scale = 0.0;  ///< --cfg-scale
  int64_t mask_token = -1;
  uint64_t seed = 0;
  /// Block diffusion (--dlm-block-size of the checkpoint, > 0): the block estimator below, on
  /// the model's doubled [x_t | x_0] rows. 0: a full-sequence model.
  int64_t block_size = 0;
};

/// Every problem with `config`, by flag; vocab <= 0 skips the vocabulary checks.
std::vector<std::string> likelihood_config_problems(const LikelihoodConfig& config, int64_t vocab);

struct LikelihoodRequest {
  std::vector<int32_t> context, continuation;
  int64_t index = 0;  ///< keys the request's random numbers (its index in the input)
};

struct LikelihoodResult {
  double loglikelihood = 0;        ///< -(mean of the estimates)
  std::vector<double> estimates;   ///< one negative-log-likelihood estimate per repeat
  double standard_error = 0;       ///< of the mean of the estimates (0 with one repeat)
};

/// The masks of repeat `repeat` of request `index`: masks[m][a] for row m and answer position
/// a, and the counts n_m (the layout above).
std::vector<std::vector<uint8_t>> likelihood_masks(uint64_t seed, int64_t index, int64_t repeat,
                                                   int64_t answer_length, int64_t batch,
                                                   std::vector<int64_t>& counts);

/// Block diffusion (config.block_size = B > 0; docs/evaluation.md "Block-diffusion models"):
/// log p(y | c) = sum over the blocks j holding answer positions of log p(y_j | c, y_<j), blocks
/// at absolute multiples of B from the first context token. Each block term is LLaDA's
/// estimator with the clean prefix given: block j (Ly_j answer positions, answer-relative
/// index a) draws k_j = 1 + floor(U * Ly_j), U = uniform53 of philox(key(seed, LikelihoodMC),
/// {j, 0, g, r}) words (0, 1), and row m masks the n_{j,m} (stratified as above with Ly_j) of
/// its positions with the smallest keys philox({a, 1 + m, g, r}). All blocks share one forward
/// per row: [x_t | x_0] with x_t = [c ; y masked], x_0 = [c ; y], the model's block-diffusion
/// attention (a noisy block sees itself and the clean blocks before it), both halves at
/// positions 0..n-1 (the training batch's layout, forward_process.h).
///   estimate_r = (1/B) sum_m sum_j sum over masked a of CE_a * Ly_j / n_{j,m}
/// With one block holding the whole answer this is exactly the full-sequence estimator above
/// (same draws). No classifier-free guidance.
std::vector<int32_t> block_likelihood_ranges(int64_t length, int64_t block_size);

/// LLaDA's estimate of log p(continuation | context) (above; the block estimator when
/// config.block_size > 0).
LikelihoodResult conditional_loglikelihood(LogitsModel& model, const LikelihoodRequest& request,
                                           const LikelihoodConfig& config);

/// Whether greedy decoding from [context ; M^Ly] (one token per step, the most confident first:
/// LLaDA's suffix_greedy_prediction) reproduces the continuation. Block diffusion: every answer
/// block, decoded greedily (one token a step, the most confident first, lower position on ties)
/// after the true clean prefix, reproduces its tokens: all blocks decode in the same doubled
/// forwards, max_j Ly_j of them.
bool greedy_reproduces(LogitsModel& model, const LikelihoodRequest& request, const LikelihoodConfig& config);

struct ElboResult {
  double nll_sum = 0;               ///< sum over draws and tokens of loss weight * CE
  double tokens = 0;                ///< loss tokens over all draws (the normaliser)
  std::vector<double> per_draw;     ///< ELBO per token of each draw
  /// Block diffusion with a causal clean half (--dlm-ar-loss-weight > 0): the clean half's exact
  /// next-token NLL (tokens 2..S of each sample given the ones before), summed, and its count.
  double ar_nll_sum = 0, ar_tokens = 0;
  double per_token() const { return tokens > 0 ? nll_sum / tokens : 0.0; }
};

/// Monte-Carlo ELBO per token of `samples` (each S+1 tokens, Megatron's GPT sample; sample i has
/// global index first_index + i) under the evaluation noise of build_micro_batch (training
/// false); draw d uses seed + d. Equals the trainer's validation loss of the same samples and
/// seed for one draw. Block diffusion (diffusion.block_size > 0): the training batch's doubled
/// rows and per-block noise, the diffusion term alone (the clean half's next-token loss, if the
/// checkpoint trained one, is not part of the ELBO): the block-wise NELBO per token.
ElboResult monte_carlo_elbo(LogitsModel& model, const std::vector<std::vector<int32_t>>& samples,
                            int64_t first_index, const DiffusionConfig& diffusion, uint64_t seed,
                            int64_t draws);

}  // namespace megadlm
