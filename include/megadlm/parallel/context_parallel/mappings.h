// Communication of context-parallel attention (the CP room's "communications" file, as
// tensor_parallel/mappings.h is TP's), each function paired with its backward conjugate:
//
//   forward                                   backward (the conjugate)
//   sequence_to_heads: all-to-all (level 1)   heads_to_sequence
//   heads_to_sequence: all-to-all (level 1)   sequence_to_heads
//   gather_sequence: all-gather               reduce_scatter_sequence
//   RingTransfer: K/V to the next ring rank   (the backward ring sends dK/dV the same way)
//
// Activations are rows [B·S_local, width], batch-major, in the local order of a split
// (sequence_split.h); the reorders come from the micro-batch's SequenceLayout. Every function
// is collective over the group it takes (every member calls it for the same layer and
// micro-batch); a null group or a group of one makes it the identity.
#pragma once
#include <optional>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/event.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/context_parallel/sequence_layout.h"

namespace megadlm::cp {

/// Ulysses' all-to-all inside a level-1 group of `a` consecutive CP ranks (the whole CP group
/// for a2a, hierarchical level 1 for a2a+p2p): x [B·S/cp, H·D], this CP rank's rows with every
/// local head -> [B·S·a/cp, (H/a)·D], the rows of the level-1 block (Split{cp/a, cp_rank/a}) for
/// head block j = this rank's position in `group` (heads [j·H/a, (j+1)·H/a)). H % a == 0.
Tensor sequence_to_heads(const Tensor& x, comm::Communicator* group, const SequenceLayout& layout,
                         const Stream& stream);
/// The inverse: the block's rows for head block j -> this rank's rows with every head.
Tensor heads_to_sequence(const Tensor& x, comm::Communicator* group, const SequenceLayout& layout,
                         const Stream& stream);

/// All-gather over the CP group: x [B·S/cp, W] this rank's rows -> [B·S, W], every sequence in
/// natural order.
Tensor gather_sequence(const Tensor& x, comm::Communicator* cp, const SequenceLayout& layout,
                       const Stream& stream);
/// The conjugate: full [B·S, W] partial sums (natural order) on every rank -> this rank's rows
/// [B·S/cp, W] of the sum over the group, in `dtype` (the sum runs in it: f32 for bf16 input).
Tensor reduce_scatter_sequence(const Tensor& full, DType dtype, comm::Communicator* cp,
                               const SequenceLayout& layout, const Stream& stream);

/// One ring step's transfer: every tensor of `send` goes to the next rank of the ring, every one
/// of `recv` comes from the previous rank (one batch_p2p over `ring`; same count, order, shapes
/// and dtypes on every rank). With a side stream (CUDA) the transfer waits for the compute
/// stream's work queued so far (so the buffers it sends are complete and those it overwrites are
/// no longer read) and overlaps what is queued next; finish() makes the compute stream wait for
/// it. Without one (CPU) start() returns when the transfer is done.
class RingTransfer {
 public:
  void start(comm::Communicator& ring, const std::vector<Tensor>& send,
             const std::vector<Tensor>& recv, const Stream& compute, const Stream* side);
  void finish(const Stream& compute);

 private:
  const Stream* side_ = nullptr;
  std::optional<Event> done_;
};

}  // namespace megadlm::cp
