// Block decoding of a block-diffusion model (--attention-mask-type block_causal --dlm-block-size
// B; docs/generation.md, "Block decoding"), and autoregressive decoding of the variant whose clean
// stream is causal and trained with a next-token loss (--dlm-bd-clean-attention causal).
//
// Layout (left padding, block-aligned): prompt b of P_b tokens is placed after pad_b =
// B * (floor(Pmax / B) - floor(P_b / B)) pad columns, so that column c holds position c - pad_b,
// blocks are the column ranges [jB, (j+1)B) in every row, block boundaries sit at multiples of B
// of each row's own positions (training's alignment: blocks count from the document start), and
// every row's first block to decode is the same column block J = floor(Pmax / B): the one
// holding the end of its prompt (its prompt tokens there count as decoded). Row b ends at column
// end_b = pad_b + P_b + G; columns after it (in the last block only) are right padding. The
// canvas has ceil(max end_b / B) * B columns. Documents: left padding 0, the row's tokens 1,
// right padding 2, so no token sees another document and every row computes what it computes
// alone.
//
// The loop (exact cache, the default): prefill the prompt blocks [0, JB) into the model's exact
// cache (LogitsModel::exact_cache_logits), block by block with the block-causal clean rule, or in
// one causal forward for the causal variant; then for each block j = J, J+1, ...: denoising steps
// in which the block (all rows) attends to the committed columns [0, jB) and to itself
// bidirectionally, then one forward of the finished block under the clean-stream rule
// (bidirectional in the block, or causal) whose keys and values replace the block's in the cache.
// Committed blocks are clean, so the cache holds exactly what training's clean stream computes.
// Without the cache (exact_cache = false) every step runs training's doubled forward [x_t | x_0]
// over columns [0, (j+1)B) with x_t = x_0 = the current canvas (CanvasBatch::block_ranges): the
// noisy copy of block j sees exactly what the cached step sees, so both give the same tokens.
//
// A step (block k = j - J counted from the first decoded block, step i, s = S / (G / B) steps a
// block): for every row with a masked position in the block, ops::sample_proposals at those
// positions (keys: the request's sample index and the generated position p - P_b; step
// t = k * s + i, or k * B + i with the threshold), then the row commits
//   - static schedule: its c_i most confident proposals (c = transfer_schedule(masks of its block,
//     s), LLaDA's get_num_transfer_tokens per block; ties to the lower position), or
//   - confidence_threshold > 0: every proposal with confidence >= the threshold and at least the
//     most confident one (Fast-dLLM v2's rule; a block takes 1..B steps, no step budget).
// Stopping at EOS: after each block a row whose generated tokens hold EOS is finished (tokens up
// to and including the first EOS); it stays in the batch's forwards (its cache row) without
// proposals until every row is finished or the canvas ends.
//
// CUDA graphs (cuda_graphs = true, --cuda-graphs; model/exact_cache_graphs.h): the model replays
// a graph of each block's cached step, captured at the block's first step; the same calls are
// made, with the same logits.
//
// Autoregressive decoding (autoregressive = true, causal variant only): prompts left padded to
// the longest (plain, no block alignment), a causal prefill whose last logits give the first
// token, then one causal forward of the new column per token through the same exact cache
// (without it: the doubled forward's clean rows, recomputed each token). Token j of request g is
// ops::sample_proposals's proposal with keys (g, j) and step j (greedy at temperature 0).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "megadlm/diffusion/sampler.h"

namespace megadlm {

/// --decode: which sampler generate_difflm runs.
enum class DecodeMode { Full, Block, Ar };
const char* decode_mode_name(DecodeMode m);

struct BlockDecoding {
  bool autoregressive = false;  ///< --decode ar (the causal-clean variant only)
  bool causal_clean = false;    ///< the model's clean stream is causal (--dlm-bd-clean-attention causal)
  bool exact_cache = true;      ///< --kv-cache exact (default) or none
  /// --cuda-graphs: the model's cached steps captured once per block and replayed
  /// (LogitsModel::set_exact_cache_graphs; block decoding with the exact cache only). The same
  /// tokens and logits, bit for bit.
  bool cuda_graphs = false;
  /// Optional caller's stop rule, asked after each finished block (block decoding; not with
  /// `autoregressive`) for every unfinished row with its generated tokens so far (the committed
  /// blocks, clean; EOS included): true finishes the row there, its result holding those tokens
  /// only. Committed blocks never change, so a rule that looks for a stop string (lm-eval's
  /// `until`) ends the row exactly where generating everything and cutting afterwards would.
  std::function<bool(size_t request, const std::vector<int32_t>& generated)> stop_after_block;
};

/// Every problem of `config` (SamplerConfig: gen_length, steps, block_length = the block size
/// B, ...) for block or autoregressive decoding, naming the flag. Includes
/// sampler_config_problems(config, vocab). Empty = valid.
std::vector<std::string> block_decoding_problems(const SamplerConfig& config, const BlockDecoding& decoding,
                                                 int64_t vocab);

/// The block-aligned left-padded layout of the top of this file (autoregressive: plain left
/// padding, block = 1 and J = Pmax).
struct BlockLayout {
  int64_t seq = 0;          ///< canvas columns (a multiple of the block size)
  int64_t first_block = 0;  ///< J: the column block of the first decoded block
  std::vector<int64_t> pad, end;  ///< per row: left pad columns, end column (pad + P + G)
};
BlockLayout block_layout(const std::vector<int64_t>& prompt_lengths, int64_t gen_length, int64_t block);

/// Block (or autoregressive) decoding of `requests` as one batch. GenerationResult::steps
/// counts the forwards that proposed tokens for the request (tokens / steps = tokens per
/// forward), GenerationResult::forwards every forward it took part in (prefill and cache
/// updates too). Throws megadlm::Error on an invalid configuration or request, and when the
/// model lacks the exact cache that `decoding` asks for.
std::vector<GenerationResult> generate_blocks(LogitsModel& model, const std::vector<GenerationRequest>& requests,
                                              const SamplerConfig& config, const BlockDecoding& decoding,
                                              const GenerationFinished& on_finished = {});

}  // namespace megadlm
