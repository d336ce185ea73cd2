// Block diffusion attention composed of pieces (docs/kernels/attention.md, "Block diffusion
// mask", "Bulk and strips"): for rows holding ONE document whose diffusion blocks are at most
// N = AttentionArgs::block_diffusion_max_block positions (L = seq / 2), most visible pairs are two
// plain causal attentions between row ranges of the same q, k, v:
//
//   noisy bulk: noisy queries p >= N against clean keys kp <= p - N:
//               causal, q rows [N, L), k/v rows [L, 2L - N)       (L - N rows each)
//   clean bulk: clean queries p >= 1 against clean keys kp <= p - 1:
//               causal, q rows [L + 1, 2L), k/v rows [L, 2L - 1)  (L - 1 rows each)
//   strip:      the rest of the mask (AttentionArgs::block_diffusion_strip): the own noisy block,
//               the clean keys (p - N, bs(p)) of a noisy query; clean keys [p, be(p)) of a clean
//               one ([p, p] in the causal variant)
//
// Equal query and key lengths make the causal pieces' top-left and bottom-right alignment the
// same. The bulks lie inside the mask exactly when ds(p) = 0 for every p (one document) and
// p - bs(p) < N (blocks of at most N); then bulk + bulk + strip is every visible pair once
// (tests/unit/ops/test_attention_block_diffusion_bulk.cpp counts them).
//
// Forward: the strip writes out and lse of every row; each bulk's (out, lse) is merged into its
// query rows with the context-parallel lse merge (ops/attention_merge.h). Backward: each piece
// runs with the FINAL out and lse (its rows), so its dq, dk, dv are exact partials of the whole
// gradient (P and delta are the whole row's), which are summed (the two bulks and the strip write
// overlapping key rows). Written once with the public ops: the CPU test runs exactly this
// composition with the CPU reference's pieces; on CUDA the bulks run cuDNN's dense causal
// attention and the strip the flash kernels (the support table's ordinary choices for them).
// The bulks read their rows of q, k, v (dout, out, lse) in place (ops/attention_rows.h: cuDNN
// graphs over row windows; copies on the CPU and wherever cuDNN does not take the piece); their
// outputs go to contiguous scratch, merged in place at the row offset (attention_merge's
// out_seq / out_row0) and summed into the gradients by one fused pass each
// (ops::add_row_block).
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/ops/attention.h"
#include "ops/attention_support.h"

namespace megadlm::ops::detail {

/// One causal bulk: q rows [q_row0, q_row0 + rows), k/v rows [k_row0, k_row0 + rows) of each
/// batch row; query i sees keys 0..i of the piece.
struct BlockDiffusionBulkPiece {
  int64_t q_row0 = 0, k_row0 = 0, rows = 0;
};

/// The bulks for half length L and blocks of at most N (a bulk with no rows is left out).
std::vector<BlockDiffusionBulkPiece> block_diffusion_bulk_pieces(int64_t half, int64_t max_block);

/// The arguments of a bulk piece (causal, no block ranges) and of the strip.
AttentionArgs block_diffusion_bulk_piece_args(const AttentionArgs& a, const BlockDiffusionBulkPiece& p);
AttentionArgs block_diffusion_strip_args(const AttentionArgs& a);

/// The composed forward and backward (arguments as attention_forward / attention_backward, a
/// block diffusion mask with block_diffusion_max_block > 0, whole rows).
void block_diffusion_bulk_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                  Tensor& lse, const AttentionArgs& args, const Stream& stream);
void block_diffusion_bulk_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& dq,
                                   Tensor& dk, Tensor& dv, const AttentionArgs& args,
                                   const Stream& stream);

/// MEGADLM_BD_ATTENTION (read once): unset / "" / "auto" Auto (the default: the composed path
/// from ops/attention_support.h's kBlockDiffusionBulkMinHalf), "flash" Flash, "bulk" Bulk;
/// anything else an error naming the value.
BlockDiffusionAttention block_diffusion_attention();

}  // namespace megadlm::ops::detail
