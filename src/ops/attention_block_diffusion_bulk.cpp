// Block diffusion attention as causal bulks + strips (contract in attention_block_diffusion_bulk.h).
#include "ops/attention_block_diffusion_bulk.h"
#include <algorithm>
#include <cstdlib>
#include <string>
#include "megadlm/core/error.h"
#include "megadlm/ops/attention_merge.h"
#include "megadlm/ops/row_block.h"
#include "ops/attention_rows.h"

namespace megadlm::ops::detail {

std::vector<BlockDiffusionBulkPiece> block_diffusion_bulk_pieces(int64_t half, int64_t max_block) {
  std::vector<BlockDiffusionBulkPiece> pieces;
  if (half > max_block) pieces.push_back({max_block, half, half - max_block});  // noisy bulk
  if (half > 1) pieces.push_back({half + 1, half, half - 1});                     // clean bulk
  return pieces;
}

AttentionArgs block_diffusion_bulk_piece_args(const AttentionArgs& a, const BlockDiffusionBulkPiece& p) {
  AttentionArgs c;
  c.batch = a.batch;
  c.seq = p.rows;
  c.num_heads = a.num_heads;
  c.num_kv_heads = a.num_kv_heads;
  c.head_dim = a.head_dim;
  c.mask = AttentionMask::Causal;  // equal lengths: top-left = bottom-right
  c.softmax_scale = a.softmax_scale;
  c.backend = a.backend;
  c.deterministic = a.deterministic;
  return c;
}

AttentionArgs block_diffusion_strip_args(const AttentionArgs& a) {
  AttentionArgs c = a;
  c.block_diffusion_strip = true;
  return c;
}

namespace {

void check_composable(const char* op, const AttentionArgs& a) {
  MDLM_CHECK(is_block_diffusion(a.mask) && a.block_ranges != nullptr && a.block_diffusion_max_block > 0 &&
                 !a.block_diffusion_strip && a.kv_seq == 0 && a.query_chunks.identity() &&
                 a.key_chunks.identity() && a.seq % 2 == 0,
             op, ": the composed block diffusion path needs a block diffusion mask over whole rows "
             "with block_diffusion_max_block > 0");
}

/// x [rows, width] as a 2-D view.
Tensor rows_of(const Tensor& x, int64_t rows) { return x.view({rows, x.numel() / rows}); }

AttentionRowWindow window_of(const BlockDiffusionBulkPiece& p, int64_t seq) {
  return {.rows = seq, .q_row0 = p.q_row0, .kv_row0 = p.k_row0};
}

}  // namespace

void block_diffusion_bulk_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                  Tensor& lse, const AttentionArgs& a, const Stream& stream) {
  check_composable("block_diffusion_bulk_forward", a);
  const int64_t B = a.batch, S = a.seq, H = a.num_heads, D = a.head_dim;
  // The strip writes every row (each query sees its own key there).
  attention_forward(q, k, v, out, lse, block_diffusion_strip_args(a), stream);
  for (const BlockDiffusionBulkPiece& p : block_diffusion_bulk_pieces(S / 2, a.block_diffusion_max_block)) {
    const int64_t n = p.rows;
    // The bulk reads its rows of q, k, v in place (cuDNN on CUDA; copies elsewhere) ...
    Tensor op = Tensor::empty({B, n, H, D}, out.dtype(), stream);
    Tensor lp = Tensor::empty({B, H, n}, lse.dtype(), stream);
    attention_forward_rows(q, k, v, op, lp, block_diffusion_bulk_piece_args(a, p), window_of(p, S), stream);
    // ... and its (out, lse) is merged into the strip's at its query rows, in place. The two
    // bulks' query rows are disjoint ([N, L) and [L + 1, 2L)), so each row is merged once: read
    // (bf16 out on CUDA), merged in f32, rounded once, as the strip's own output was.
    attention_merge(out, lse, op, lp,
                    {.batch = B, .seq = n, .num_heads = H, .head_dim = D, .out_seq = S, .out_row0 = p.q_row0},
                    stream);
  }
}

void block_diffusion_bulk_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& dq,
                                   Tensor& dk, Tensor& dv, const AttentionArgs& a,
                                   const Stream& stream) {
  check_composable("block_diffusion_bulk_backward", a);
  const int64_t B = a.batch, S = a.seq, H = a.num_heads, Hkv = a.num_kv_heads, D = a.head_dim;
  // Every piece with the final out and lse: its P and delta are the whole row's, so its
  // gradients are exact partials of the whole one.
  attention_backward(dout, q, k, v, out, lse, dq, dk, dv, block_diffusion_strip_args(a), stream);
  Tensor dq2 = rows_of(dq, B * S), dk2 = rows_of(dk, B * S), dv2 = rows_of(dv, B * S);
  for (const BlockDiffusionBulkPiece& p : block_diffusion_bulk_pieces(S / 2, a.block_diffusion_max_block)) {
    const int64_t n = p.rows;
    Tensor dqp = Tensor::empty({B, n, H, D}, dq.dtype(), stream);
    Tensor dkp = Tensor::empty({B, n, Hkv, D}, dk.dtype(), stream);
    Tensor dvp = Tensor::empty({B, n, Hkv, D}, dv.dtype(), stream);
    attention_backward_rows(dout, q, k, v, out, lse, dqp, dkp, dvp, block_diffusion_bulk_piece_args(a, p),
                            window_of(p, S), stream);
    // Summed into the strip's gradients (both bulks and the strip write the clean key rows
    // [L, 2L - 1)): one fused pass each, in f32, one rounding per row and add.
    add_row_block(rows_of(dqp, B * n), dq2, B, p.q_row0, stream);
    add_row_block(rows_of(dkp, B * n), dk2, B, p.k_row0, stream);
    add_row_block(rows_of(dvp, B * n), dv2, B, p.k_row0, stream);
  }
}

BlockDiffusionAttention block_diffusion_attention() {
  static const BlockDiffusionAttention policy = [] {
    const char* v = std::getenv("MEGADLM_BD_ATTENTION");
    const std::string s = v == nullptr ? "" : v;
    MDLM_CHECK(s.empty() || s == "auto" || s == "flash" || s == "bulk", "MEGADLM_BD_ATTENTION=", s,
               ": expected auto (the default: bulk from half length ", kBlockDiffusionBulkMinHalf,
               " for one-document rows, else flash), flash (the whole mask on the flash kernels) or bulk "
               "(cuDNN causal bulks + flash strips wherever they run)");
    // Auto since the composed path passed its GPU parity tests and beat flash from L 2048 on an
    // H100 (docs/kernels/attention.md, "Which path runs").
    return s == "bulk"    ? BlockDiffusionAttention::Bulk
           : s == "flash" ? BlockDiffusionAttention::Flash
                          : BlockDiffusionAttention::Auto;
  }();
  return policy;
}

}  // namespace megadlm::ops::detail

namespace megadlm::ops {

int64_t block_diffusion_one_document_max_block(const int32_t* r, int64_t batch, int64_t half) {
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* row = r + b * 4 * half;
    for (int64_t p = 0; p < half; ++p) {
      const int64_t ds = row[p], de = row[half + p], bs = row[2 * half + p], be = row[3 * half + p];
      if (ds != 0 || de != half || !(bs <= p && p < be && be <= half)) return 0;
      // Blocks are runs: a new block starts where the previous one ended.
      if (p > 0 && bs != row[2 * half + p - 1] && bs != p) return 0;
      longest = std::max(longest, be - bs);
    }
  }
  return longest;
}

}  // namespace megadlm::ops
