// The p2p ring of context-parallel attention (`--cp-comm-type p2p`, Transformer
// Engine's AttnFuncWithCPAndKVP2P): the ranks of a ring hold the shards of one split of the
// sequences (sequence_split.h; ring rank = shard rank). At step i = 0 .. n−1 rank r holds the
// K/V of rank s = (r − i) mod n; it computes its queries' attention over that block of keys and
// folds it into a running result through the log-sum-exp (ops/attention_merge.h), while the
// block travels on to rank r + 1 (on CUDA the next block is in flight, double-buffered, on a side
// stream while the current one computes). After n steps every query has seen every key, and
// the merge makes the result exactly attention over the whole sequence.
//
// Masks: every block is computed whole; the causal mask and the documents are applied by
// global position and global document id (ops/attention.h's chunk maps and key documents), so a
// query sees exactly the keys it would see at CP = 1. Blocks entirely above the diagonal give
// rows with no key (lse = −inf), which the merge ignores. (Transformer Engine skips those
// half-blocks for causal masks; that saving is not taken yet, see
// docs/parallelism/context_parallel.md.)
//
// Block diffusion (ops::is_block_diffusion): a shard's rows are its positions' noisy copies then
// their clean copies (MicroBatch::upload); a block's call has seq = kv_seq = 2 × the split's
// local length and the chunk maps applied to each half, with the whole rows' block_ranges
// (ops/attention.h), so the rule runs on global rows and the merge is the same.
//
// Backward replays the ring with the final output and log-sum-exp: a block's gradients are the
// attention backward with P = exp(s − lse_final) and D = rowsum(dO · O_final). dQ accumulates
// locally; the block's dK/dV accumulator travels with it (one more step than K/V, so that it
// arrives back at its owner). On CUDA both transfers are in flight during the next block's
// compute (the accumulator is waited for only when that block's gradients are added to it).
// Accumulators are f32 (f64 in f64 gradient checks).
#pragma once
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/context_parallel/sequence_layout.h"

namespace megadlm::cp {

struct Ring {
  comm::Communicator* group = nullptr;  ///< the ring (null: a ring of one)
  Split split;                          ///< the split the ring runs on; split.rank = ring rank
  const SequenceLayout* layout = nullptr;
  const Stream* side = nullptr;         ///< transfer stream (CUDA), or null (CPU: blocking)
};

/// The arguments of the block of keys held by ring rank `src`: `local` (batch, seq = the shard's
/// length, heads, mask, dropout) with the queries' and keys' chunk maps and documents.
ops::AttentionArgs ring_block_args(const ops::AttentionArgs& local, const Ring& ring, int src,
                                   const Stream& stream);

/// Collective over the ring. q [B·S_l, Hq·D], k, v [B·S_l, Hkv·D] this shard's rows ->
/// out [B·S_l, Hq·D] (q's dtype) and lse [B, Hq, S_l] (f32, f64 for f64 q), both written.
/// One block of the ring: ops::attention_forward / attention_backward of `block`
/// (ring_block_args), except that a causal block between two different shards runs only its
/// visible half, without a mask (ring_attention.cpp: the same result, half the work, and on CUDA
/// the flash kernels instead of the simple ones).
void ring_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                        const ops::AttentionArgs& block, const Stream& stream);
void ring_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                         const ops::AttentionArgs& block, const Stream& stream);

/// Step `src` of the ring (the block of keys held by ring rank src), as ring_attention_forward
/// runs it: ring_block_forward of ring_block_args, except for block diffusion, whose own block
/// runs as an ordinary whole-row call on the shard's local ranges (SequenceLayout::
/// local_block_ranges: on CUDA the flash block diffusion kernels) and whose blocks between two
/// shards, when every block lies inside one chunk, run only their visible part: the clean keys
/// of the earlier chunks, unmasked except for documents (on CUDA the flash kernels' separate key
/// block path). `args` as ring_attention_forward's.
void ring_step_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const ops::AttentionArgs& args, const Ring& ring, int src, const Stream& stream);
void ring_step_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const ops::AttentionArgs& args, const Ring& ring, int src, const Stream& stream);

void ring_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                            Tensor& lse, const ops::AttentionArgs& args, const Ring& ring,
                            const Stream& stream);

/// Collective over the ring: dq, dk, dv written from dout and the forward's q, k, v, out, lse.
void ring_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& dq,
                             Tensor& dk, Tensor& dv, const ops::AttentionArgs& args,
                             const Ring& ring, const Stream& stream);

}  // namespace megadlm::cp
