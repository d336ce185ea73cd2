// Block diffusion attention as causal bulks + strips (contract in attention_block_diffusion_bulk.h).
#include "ops/attention_block_diffusion_bulk.h"
#include <algorithm>
#include <cstdlib>
#include <string>
#include "megadlm/core/error.h"
#include "megadlm/ops/attention_merge.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/row_block.h"

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

/// Rows [row0, row0 + n) of each of `batch` batch rows of x viewed as [batch * rows, width], into
/// a new contiguous [batch * n, width] tensor.
Tensor read_rows(const Tensor& x, int64_t batch, int64_t rows, int64_t row0, int64_t n, const Stream& stream) {
  const Tensor x2 = rows_of(x, batch * rows);
  Tensor out = Tensor::empty({batch * n, x2.cols()}, x.dtype(), stream);
  read_row_block(x2, out, batch, row0, stream);
  return out;
}

/// dst's rows [row0, row0 + n) of each batch row += part [batch * n, width], summed in f32 on
/// CUDA (each partial was rounded once by its kernel), in the activation dtype on the CPU.
void add_rows(Tensor& dst, int64_t batch, int64_t rows, const Tensor& part, int64_t row0, const Stream& stream) {
  const int64_t n = part.numel() / (dst.numel() / (batch * rows)) / batch;
  Tensor cur = read_rows(dst, batch, rows, row0, n, stream);
  const Tensor p2 = rows_of(part, batch * n);
  if (stream.is_cuda() && cur.dtype() != DType::F32) {
    Tensor acc = Tensor::empty(cur.shape(), DType::F32, stream), add32 = Tensor::empty(cur.shape(), DType::F32, stream);
    copy(cur, acc, stream);
    copy(p2, add32, stream);
    add(acc, add32, acc, stream);
    copy(acc, cur, stream);
  } else {
    add(cur, p2, cur, stream);
  }
  Tensor d2 = rows_of(dst, batch * rows);
  copy_row_block(cur, d2, batch, row0, stream);
}

}  // namespace

void block_diffusion_bulk_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                  Tensor& lse, const AttentionArgs& a, const Stream& stream) {
  check_composable("block_diffusion_bulk_forward", a);
  const int64_t B = a.batch, S = a.seq, H = a.num_heads, Hkv = a.num_kv_heads, D = a.head_dim;
  // The strip writes every row (each query sees its own key there).
  attention_forward(q, k, v, out, lse, block_diffusion_strip_args(a), stream);
  // The running output of a merge is f32 on CUDA; on the CPU the activation dtype (f32 / f64).
  const DType acc_dtype = stream.is_cuda() ? DType::F32 : out.dtype();
  for (const BlockDiffusionBulkPiece& p : block_diffusion_bulk_pieces(S / 2, a.block_diffusion_max_block)) {
    const int64_t n = p.rows;
    const Tensor qp = read_rows(q, B, S, p.q_row0, n, stream).view({B, n, H, D});
    const Tensor kp = read_rows(k, B, S, p.k_row0, n, stream).view({B, n, Hkv, D});
    const Tensor vp = read_rows(v, B, S, p.k_row0, n, stream).view({B, n, Hkv, D});
    Tensor op = Tensor::empty({B, n, H, D}, out.dtype(), stream);
    Tensor lp = Tensor::empty({B, H, n}, lse.dtype(), stream);
    attention_forward(qp, kp, vp, op, lp, block_diffusion_bulk_piece_args(a, p), stream);
    // Merge into the strip's result at the piece's query rows.
    Tensor cur = read_rows(out, B, S, p.q_row0, n, stream);
    Tensor acc = Tensor::empty(cur.shape(), acc_dtype, stream);
    copy(cur, acc, stream);
    Tensor lacc = read_rows(lse, B * H, S, p.q_row0, n, stream);
    attention_merge(acc, lacc, op, lp, {.batch = B, .seq = n, .num_heads = H, .head_dim = D}, stream);
    copy(acc, cur, stream);
    Tensor out2 = rows_of(out, B * S), lse2 = rows_of(lse, B * H * S);
    copy_row_block(cur, out2, B, p.q_row0, stream);
    copy_row_block(lacc, lse2, B * H, p.q_row0, stream);
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
  for (const BlockDiffusionBulkPiece& p : block_diffusion_bulk_pieces(S / 2, a.block_diffusion_max_block)) {
    const int64_t n = p.rows;
    const Tensor dop = read_rows(dout, B, S, p.q_row0, n, stream).view({B, n, H, D});
    const Tensor qp = read_rows(q, B, S, p.q_row0, n, stream).view({B, n, H, D});
    const Tensor op = read_rows(out, B, S, p.q_row0, n, stream).view({B, n, H, D});
    const Tensor kp = read_rows(k, B, S, p.k_row0, n, stream).view({B, n, Hkv, D});
    const Tensor vp = read_rows(v, B, S, p.k_row0, n, stream).view({B, n, Hkv, D});
    const Tensor lp = read_rows(lse, B * H, S, p.q_row0, n, stream).view({B, H, n});
    Tensor dqp = Tensor::empty({B, n, H, D}, dq.dtype(), stream);
    Tensor dkp = Tensor::empty({B, n, Hkv, D}, dk.dtype(), stream);
    Tensor dvp = Tensor::empty({B, n, Hkv, D}, dv.dtype(), stream);
    attention_backward(dop, qp, kp, vp, op, lp, dqp, dkp, dvp, block_diffusion_bulk_piece_args(a, p), stream);
    add_rows(dq, B, S, dqp, p.q_row0, stream);
    add_rows(dk, B, S, dkp, p.k_row0, stream);
    add_rows(dv, B, S, dvp, p.k_row0, stream);
  }
}

bool block_diffusion_bulk_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MEGADLM_BD_ATTENTION");
    const std::string s = v == nullptr ? "" : v;
    MDLM_CHECK(s.empty() || s == "flash" || s == "bulk", "MEGADLM_BD_ATTENTION=", s,
               ": expected bulk (cuDNN causal bulks + flash strips) or flash (the default)");
    return s == "bulk";
  }();
  return enabled;
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
