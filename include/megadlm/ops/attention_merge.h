// Exact merge of partial attention results through their log-sum-exp: context parallelism
// computes the attention of a query block over one key block at a time (parallel/
// context_parallel/ring_attention.h) and folds each block into a running result. For one query
// row with running (o, l) and a block's (o_b, l_b) (outputs normalised over their own keys, l the
// natural-log sum of exp(scale q.k) over them):
//   l' = log(exp(l) + exp(l_b)) = m + log(exp(l - m) + exp(l_b - m)),  m = max(l, l_b)
//   o' = exp(l - l') o + exp(l_b - l') o_b
// which equals attention over the union of the keys (dropout included: a block's output keeps
// its undropped lse). A block whose row saw no key has l_b = -inf and leaves the row unchanged;
// a row that has seen no key yet (l = -inf) takes the block's values. Rows where both are -inf
// stay (0, -inf).
//
// Shapes (contiguous): block_out [B, S, Hq, D] and block_lse [B, Hq, S] (the layout of
// ops/attention.h); out [B, S_out, Hq, D] and lse [B, Hq, S_out] with S_out = out_seq (0: S), of
// which the rows [out_row0, out_row0 + S) of each batch row are merged (block row i into row
// out_row0 + i; the other rows are neither read nor written). Block diffusion's composed
// attention merges its causal bulks into the rows of the whole doubled row this way
// (ops/attention_block_diffusion_bulk.h). Dtypes: out is the running accumulator, f32 (f64 on
// the CPU for gradient checks), or on CUDA bf16 as well: each call then reads bf16, merges in
// f32 and rounds once, so a row merged once is rounded once (a running output merged over many
// blocks wants f32); lse and block_lse f32 (or out's dtype on the CPU); block_out the
// activation dtype (bf16 or f32 on CUDA, out's dtype on the CPU).
// Accumulation: out and lse are updated in place (read, then written); nothing else is written.
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

struct AttentionMergeArgs {
  int64_t batch = 0, seq = 0, num_heads = 0, head_dim = 0;
  int64_t out_seq = 0;   ///< rows per batch row of out and lse (0: seq)
  int64_t out_row0 = 0;  ///< the row of out (and column of lse) that block row 0 merges into
  int64_t out_rows() const { return out_seq > 0 ? out_seq : seq; }
};

/// (out, lse) <- merge((out, lse), (block_out, block_lse)) row by row (see above).
void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                     const AttentionMergeArgs& args, const Stream& stream);

}  // namespace megadlm::ops
