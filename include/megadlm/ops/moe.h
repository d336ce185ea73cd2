// Mixture-of-experts math: router scores and top-k, the router's auxiliary losses, the
// permutation of tokens by expert, and grouped GEMMs over experts (as Megatron-Core's MoE layer).
//
// Names. T routed tokens (rows), E experts, K routing slots per token (k for top-k, E for expert
// choice), H hidden size. A routing is two [T, K] tensors: `indices` (i32, the chosen global
// expert of slot j of token t, or -1 for an empty slot) and `probs` (f32, its weight).
// Within a row the experts of the non-empty slots are distinct.
//
// Dtypes. Logits, probabilities, statistics and their gradients are f32 (f64 on the CPU for
// gradient checks); token activations have the activation dtype (f32/f64 on CPU, bf16 on CUDA).
// Accumulation: every op says whether it writes or adds. Probabilities (and everything computed
// from them) are in f32 even when the activations are bf16.
//
// Selection ties go to the lower expert index (top-k) or the lower token index (expert choice,
// capacity), on both backends, so that every layout selects the same slots.
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/core/philox.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/chunk_map.h"

namespace megadlm::ops {

enum class RouterScore : uint8_t { Softmax, Sigmoid };
/// How the k experts are selected: the top-k scores, or (training with sinkhorn balancing) the
/// top-k of the Sinkhorn-normalised exp(logits).
enum class RouterSelection : uint8_t { TopK, Sinkhorn };
/// How a group of experts is scored for group-limited routing: the sum of its best
/// topk / group_topk scores (--moe-router-group-topk), or its best score
/// (--moe-router-topk-limited-devices, one group per EP rank).
enum class RouterGroupScore : uint8_t { TopSum, Max };

struct RouterTopkArgs {
  int topk = 2;
  RouterScore score = RouterScore::Softmax;
  /// Softmax scores: over all experts before the top-k (probs = the selected scores), or
  /// (false) over the k selected logits only. Sigmoid scores: probs are the selected sigmoids
  /// divided by their sum (+1e-20) when topk > 1, the sigmoid itself when topk == 1.
  bool pre_softmax = false;
  float scaling = 1.0f;  ///< --moe-router-topk-scaling-factor (1: none)
  RouterSelection selection = RouterSelection::TopK;
  int num_groups = 0;    ///< group-limited routing over num_groups groups (0: off)
  int group_topk = 0;    ///< groups kept per token
  RouterGroupScore group_score = RouterGroupScore::TopSum;
};

/// Top-k routing of each row.
/// @param[in]  logits      f32 [T, E]
/// @param[in]  expert_bias f32 [E] or undefined: added to the scores for the selection only
///                         (aux-loss-free balancing); probs never include it
/// @param[out] probs       f32 [T, k] (written), slots in descending selection score
/// @param[out] indices     i32 [T, k] (written)
void moe_router_topk_forward(const Tensor& logits, const Tensor& expert_bias, Tensor& probs,
                             Tensor& indices, const RouterTopkArgs& args, const Stream& stream);

/// Gradient of the probs of moe_router_topk_forward (or moe_expert_choice_forward, whose probs
/// are the post-softmax formula over a variable set: pass topk = E, pre_softmax = false) with
/// respect to the logits. Slots with index -1 are not selected; the scores are recomputed.
/// @param[in]  dprobs  f32 [T, K]
/// @param[out] dlogits f32 [T, E] (written)
void moe_router_topk_backward(const Tensor& dprobs, const Tensor& logits, const Tensor& indices,
                              Tensor& dlogits, const RouterTopkArgs& args, const Stream& stream);

struct ExpertChoiceArgs {
  int64_t capacity = 1;       ///< tokens each expert chooses from each sequence
  int64_t seq = 0;            ///< rows per sequence (rows t = b * seq + s); T for batch level
  RouterScore score = RouterScore::Softmax;
};

/// MegaDLMs' expert-choice routing: every expert picks the `capacity` highest-logit rows of each
/// sequence; a row's gate over the experts that picked it is the softmax of their logits (or
/// their sigmoids divided by the sum), 0 for the others.
/// @param[out] probs   f32 [T, E] (written)
/// @param[out] indices i32 [T, E] (written): e where expert e picked the row, else -1
void moe_expert_choice_forward(const Tensor& logits, Tensor& probs, Tensor& indices,
                               const ExpertChoiceArgs& args, const Stream& stream);

enum class CapacityDropPolicy : uint8_t { Probs, Position };

/// Token dropping: each expert keeps at most `capacity` of the (row, slot) pairs routed to it,
/// those of highest prob (ties: lower row) or of lowest row (Position).
/// @param[in]  indices  i32 [T, K]
/// @param[out] kept     i32 [T, K] (written): indices with the dropped slots set to -1
void moe_capacity_drop(const Tensor& probs, const Tensor& indices, Tensor& kept, int64_t capacity,
                       int num_experts, CapacityDropPolicy policy, const Stream& stream);

/// Megatron's --moe-router-force-load-balancing (benchmark routing): every router logit is
/// replaced by a standard normal value, so each expert gets about T·k/E rows whatever the model
/// has learned; the gradient passes straight through to the router. The values are keyed by
/// global coordinates, so every layout routes a token alike: row r of logits [R, E] is
/// micro-batch row g = row_offset + r, of sample sample_offset + g / seq_len at position
/// chunks.global(g % seq_len), and expert e's value is normal_from_words of words
/// (2(e%2), 2(e%2)+1) of philox(key(seed, MoeRandomLogits), {e/2, position, sample, layer}).
struct RandomLogitsArgs {
  uint64_t seed = 0;
  uint32_t layer = 0;          ///< global layer index
  int64_t seq_len = 1;         ///< rows per sample in the micro-batch
  int64_t sample_offset = 0;   ///< global index of the micro-batch's first sample
  int64_t row_offset = 0;      ///< logits' row 0 is this row of the micro-batch (SP shards)
  ChunkMap chunks = {};        ///< global position of each of the seq_len local positions (CP)
};

/// The value of expert e for the token at (sample, position): host and device share it.
MDLM_HOST_DEVICE double random_logit_value(const PhiloxKey& key, uint32_t layer, int64_t sample,
                                           int64_t position, int64_t e) {
  const PhiloxWords w = philox(key, static_cast<uint32_t>(e / 2), static_cast<uint32_t>(position),
                               static_cast<uint32_t>(sample), layer);
  const int pair = static_cast<int>(e % 2) * 2;
  return normal_from_words(w.w[pair], w.w[pair + 1]);
}

/// logits [R, E] (f32 or f64) written with the values above.
void moe_random_logits(Tensor& logits, const RandomLogitsArgs& args, const Stream& stream);

/// Rows are grouped for per-sequence statistics: row t belongs to group
/// (row_offset + t) / rows_per_group (rows_per_group 0: one group).
struct RowGroups {
  int64_t rows_per_group = 0;
  int64_t row_offset = 0;
};

/// score_sums [G, E] += sum over the rows of each group of softmax(logits row) (f32 or f64);
/// lse_sq [1] += sum over rows of logsumexp(logits row)^2. Either output may be undefined.
void moe_router_stats(const Tensor& logits, Tensor& score_sums, Tensor& lse_sq,
                      const RowGroups& groups, const Stream& stream);

/// counts [G, E] (f32) += number of slots of each group's rows routed to each expert.
void moe_count_tokens(const Tensor& indices, Tensor& counts, const RowGroups& groups,
                      const Stream& stream);

struct RouterLossArgs {
  float aux_coeff = 0.0f;  ///< weight of  sum_t sum_e w[g(t), e] * softmax(logits_t)_e
  float z_coeff = 0.0f;    ///< weight of  sum_t logsumexp(logits_t)^2
  RowGroups groups;
};

/// dlogits [T, E] += gradient of  aux_coeff * sum_t sum_e w[g(t),e] s_te + z_coeff * sum_t lse_t^2
/// with s = softmax of each logits row (the load-balancing and z losses; w [G, E] holds the
/// token counts the aux loss weighs the scores with, treated as constants).
void moe_router_loss_backward(const Tensor& logits, const Tensor& w, Tensor& dlogits,
                              const RouterLossArgs& args, const Stream& stream);

/// Expert-choice balancing loss: with s = softmax of each logits *column* (over the T rows) and
/// n [T] the number of experts that chose each row,  value [1] += sum_t (sum_e s_te) n_t  and
/// dlogits [T, E] += grad_scale * its gradient.
void moe_expert_choice_aux(const Tensor& logits, const Tensor& experts_per_row, Tensor& value,
                           Tensor& dlogits, float grad_scale, const Stream& stream);

/// Where each routed slot goes in the expert-major order of experts
/// [first_expert, first_expert + num_experts): rows of expert e in ascending token order, experts
/// one after another. Slots routed elsewhere (or -1) get dest -1.
/// @param[out] dest   i32 [T, K] (written)
/// @param[out] counts i32 [num_experts] (written): rows of each expert
void moe_dispatch_plan(const Tensor& indices, int first_expert, int num_experts, Tensor& dest,
                       Tensor& counts, const Stream& stream);

/// out[dest[t, j]] = x[t] for every slot with dest >= 0 (out [N, H] written where dest points;
/// every row of out must be some slot's destination).
void moe_permute(const Tensor& x, const Tensor& dest, Tensor& out, const Stream& stream);

/// out[t] = sum_j probs[t, j] * y[dest[t, j]] over slots with dest >= 0 (probs undefined: weight
/// 1, the backward of moe_permute). out [T, H] written (rows without slots are zero).
void moe_unpermute(const Tensor& y, const Tensor& dest, const Tensor& probs, Tensor& out,
                   const Stream& stream);

/// Backward of moe_unpermute with probs: dy[dest[t, j]] = probs[t, j] * dout[t] (dy [N, H]
/// written) and dprobs[t, j] = <dout[t], y[dest[t, j]]> (f32 [T, K] written, 0 where dest < 0).
void moe_unpermute_backward(const Tensor& dout, const Tensor& y, const Tensor& dest,
                            const Tensor& probs, Tensor& dy, Tensor& dprobs, const Stream& stream);

struct GroupedGemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;             ///< 1.0f accumulates into C (expert weight gradients)
  const Tensor* bias = nullptr;  ///< optional [G, N] stacked: row g added to the rows of group g
};

/// One GEMM per group g of `group_rows` (host sizes, G = group_rows.size()), ops::gemm semantics
/// for each:
///   - trans_a false (forward, input gradients): the rows of A and C are split into consecutive
///     groups of group_rows[g] rows; B is G stacked matrices ([G * rows_b, cols_b] viewed as G
///     blocks), C_g = alpha * A_g op(B_g) + beta * C_g;
///   - trans_a true (weight gradients): the rows of A and B are split by group_rows and C is G
///     stacked [M, N] blocks, C_g = alpha * A_g^T op(B_g) + beta * C_g (a group of 0 rows
///     leaves beta * C_g).
/// Correct for empty groups and for one group holding every row. Dtypes as ops::gemm.
void grouped_gemm(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& group_rows,
                  const GroupedGemmArgs& args, const Stream& stream);

}  // namespace megadlm::ops
