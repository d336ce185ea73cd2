// Context-parallel core attention: softmax(q kᵀ · scale) v over the whole sequence when each rank
// of the CP group holds only its shard (sequence_split.h). model/attention calls it in place of
// ops::attention_forward/backward when --context-parallel-size > 1; the result is the CP = 1
// attention of this rank's rows, up to floating-point reassociation. One object per layer, of
// the layer's --cp-comm-type (docs/parallelism/context_parallel.md):
//
//   p2p         ring over the CP group (ring_attention.h)
//   all_gather  all-gather K/V in natural order; this rank's queries attend to all of them;
//               backward reduce-scatters dK/dV
//   a2a         all-to-all over the CP group to whole sequences for H/cp of the heads
//               (Ulysses), ordinary attention, all-to-all back
//   a2a+p2p     a2a inside hierarchical level 1 (size a) to the level-1 block's sequence for H/a
//               of the heads, then the p2p ring across level 2 (size cp/a) on that coarser split,
//               then a2a back. a = 1 is p2p, a = cp is a2a.
//
// Tensors: q [B·S_l, Hq·D], k, v [B·S_l, Hkv·D] this rank's rows (S_l = S/cp), after RoPE with
// global positions; out [B·S_l, Hq·D]. `args` are the local arguments (batch, seq = S_l, this
// TP rank's heads, mask, scale, dropout with this TP rank's first global head in head_offset);
// the CP fields of ops::AttentionArgs are filled here. Every call is collective over the CP
// group (or its hierarchical levels): all its ranks call it for the same layer and micro-batch.
// Block diffusion: args are B doubled rows of S_l = 2L/cp ([x_t | x_0] of this rank's
// positions); the layout describes them as 2B rows of L/cp (one copy each), so every reorder
// moves both copies, and the calls get both halves chunk-mapped (ring_attention.h).
#pragma once
#include <memory>
#include "megadlm/core/side_stream.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/context_parallel/comm_type.h"
#include "megadlm/parallel/context_parallel/mappings.h"
#include "megadlm/parallel/context_parallel/ring_attention.h"
#include "megadlm/parallel/context_parallel/sequence_layout.h"
#include "megadlm/parallel/model_parallel.h"

namespace megadlm::cp {

/// What backward needs from forward, in the layout the comm type computes in: the level-1
/// block's rows and head block for p2p / a2a / a2a+p2p (this rank's rows for p2p), this rank's
/// rows for all_gather (whose backward gathers K/V again). lse [B, H, S] of that layout.
struct AttentionSaved {
  Tensor q, k, v, lse;
};

struct AttentionGrads {
  Tensor dq, dk, dv;  ///< [B·S_l, Hq·D], [B·S_l, Hkv·D] x 2, this rank's rows
};

class ContextParallelAttention {
 public:
  ContextParallelAttention() = default;
  /// The CP attention of one layer: `type` over the groups of `mp` (cp; for a2a+p2p the two
  /// hierarchical levels). Checks that the groups fit the type.
  ContextParallelAttention(CommType type, const ModelParallel& mp);

  CommType type() const { return type_; }

  /// Forward; returns out (q's dtype) and fills `saved`.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const ops::AttentionArgs& args,
                 const SequenceLayout& layout, AttentionSaved& saved, const Stream& stream) const;
  /// For callers that drop saved.q/k/v after forward and recompute this rank's q, k, v for
  /// backward (model/attention's fused path): puts them back in the comm type's layout
  /// (collective over the all-to-all group for a2a and a2a+p2p).
  void restore_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                      const SequenceLayout& layout, AttentionSaved& saved,
                      const Stream& stream) const;
  /// Backward from dout and forward's out; clears `saved`.
  AttentionGrads backward(const Tensor& dout, const Tensor& out, AttentionSaved& saved,
                          const ops::AttentionArgs& args, const SequenceLayout& layout,
                          const Stream& stream) const;

 private:
  /// The local arguments turned into those of the level-1 block (heads / a).
  ops::AttentionArgs block_args(const ops::AttentionArgs& args, const SequenceLayout& layout) const;
  Ring ring(const SequenceLayout& layout, const Stream& stream) const;
  void check_layout(const SequenceLayout& layout, const ops::AttentionArgs& args) const;

  CommType type_ = CommType::P2P;
  ParallelGroup cp_;      ///< the whole CP group
  ParallelGroup heads_;   ///< the all-to-all group (level 1; size 1 for p2p, all_gather)
  ParallelGroup ring_;    ///< the ring (level 2; size 1 for a2a, all_gather)
  std::shared_ptr<SideStream> side_;
};

}  // namespace megadlm::cp
