// The ring schedules of --tp-comm-overlap (comm_overlap.h). Slot s of a region is the row shard
// of TP rank s: rows [s * per, s * per + real(s)), per = shard_rows(rows, tp), padded to `per`
// rows with zeros on the wire.
#include "megadlm/parallel/tensor_parallel/comm_overlap.h"
#include <algorithm>
#include <optional>
#include <vector>
#include "megadlm/core/event.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"

namespace megadlm::tp {

namespace {

struct Ring {
  int tp, rank, next, prev;
  int64_t rows, per;
  explicit Ring(const comm::Communicator& g, int64_t region_rows)
      : tp(g.size()), rank(g.rank()), next((g.rank() + 1) % g.size()),
        prev((g.rank() + g.size() - 1) % g.size()), rows(region_rows), per(shard_rows(region_rows, g.size())) {}
  int slot(int k) const { return ((k % tp) + tp) % tp; }
  /// Real (unpadded) rows of slot s.
  int64_t real(int s) const { return std::clamp<int64_t>(rows - s * per, 0, per); }
};

/// Makes `side` wait for everything queued on `compute` so far.
void side_waits_for(const Stream& compute, const Stream& side) {
  Event ready = Event::create(compute.device());
  ready.record(compute);
  ready.wait_on(side);
}

}  // namespace

Tensor gather_rows_overlapped(const Tensor& shard, int64_t rows, comm::Communicator& group,
                              const Stream& compute, const Stream* side, const GatheredChunkFn& on_chunk) {
  const Ring ring(group, rows);
  MDLM_CHECK(ring.tp >= 2, "gather_rows_overlapped needs a group of two or more ranks");
  MDLM_CHECK(shard.rows() == ring.per, "gather_rows_overlapped: shard ", shard.str(), " must have ",
             ring.per, " rows for ", rows, " rows over ", ring.tp, " ranks");
  const int64_t cols = shard.cols();
  Tensor full = Tensor::empty({ring.per * ring.tp, cols}, shard.dtype(), compute);
  auto slot_rows = [&](int s) { return full.narrow(s * ring.per, ring.per); };
  {
    Tensor own = slot_rows(ring.rank);
    ops::copy(shard.view({ring.per, cols}), own, compute);
  }
  // Step k sends the slot that arrived in step k-1 (this rank's own at k = 0) to the next rank
  // and receives the previous rank's: after step k this rank holds slots r, r-1, ..., r-k-1.
  auto step_ops = [&](int k) {
    return std::vector<comm::P2POp>{{comm::P2POp::Kind::Send, slot_rows(ring.slot(ring.rank - k)), ring.next},
                                    {comm::P2POp::Kind::Recv, slot_rows(ring.slot(ring.rank - k - 1)), ring.prev}};
  };
  auto consume = [&](int s) {
    if (ring.real(s) > 0) on_chunk(s * ring.per, full.narrow(s * ring.per, ring.real(s)));
  };
  if (side != nullptr) {
    // Every transfer is queued at once (each sends what the one before received, in stream
    // order); the compute stream takes each chunk as its event fires.
    side_waits_for(compute, *side);
    std::vector<Event> arrived;
    for (int k = 0; k + 1 < ring.tp; ++k) {
      group.batch_p2p(step_ops(k), *side);
      arrived.push_back(Event::create(compute.device()));
      arrived.back().record(*side);
    }
    consume(ring.rank);
    for (int k = 0; k + 1 < ring.tp; ++k) {
      arrived[static_cast<size_t>(k)].wait_on(compute);
      consume(ring.slot(ring.rank - k - 1));
    }
  } else {
    consume(ring.rank);
    for (int k = 0; k + 1 < ring.tp; ++k) {
      group.batch_p2p(step_ops(k), compute);
      consume(ring.slot(ring.rank - k - 1));
    }
  }
  return ring.per * ring.tp == rows ? full : full.narrow(0, rows);
}

Tensor scatter_rows_overlapped(int64_t rows, int64_t cols, DType dtype, comm::Communicator& group,
                               const Stream& compute, const Stream* side, const PartialChunkFn& partial,
                               const std::function<void()>& between) {
  const Ring ring(group, rows);
  MDLM_CHECK(ring.tp >= 2, "scatter_rows_overlapped needs a group of two or more ranks");
  // Buffers stay alive until the compute stream has waited for every transfer that reads or
  // writes them (CUDA memory returns to the pool in the compute stream's order).
  std::vector<Tensor> keep;
  Tensor incoming;              // the running sum of the next chunk, from the next rank
  std::optional<Event> arrived;  // when `incoming` is complete (side stream)
  Tensor sum;
  for (int k = 0; k < ring.tp; ++k) {
    const int s = ring.slot(ring.rank + k + 1);  // k = tp - 1: this rank's own shard
    const int64_t n = ring.real(s);
    sum = n == ring.per ? Tensor::empty({ring.per, cols}, dtype, compute)
                        : Tensor::zeros({ring.per, cols}, dtype, compute);  // zero padding rows
    keep.push_back(sum);
    if (n > 0) {
      Tensor head = sum.narrow(0, n);
      partial(s * ring.per, head);
    }
    if (k > 0) {
      if (arrived) arrived->wait_on(compute);
      ops::add(sum, incoming, sum, compute);  // own partial + the ranks before: same pair at tp 2
    }
    if (k + 1 == ring.tp) break;
    incoming = Tensor::empty({ring.per, cols}, dtype, compute);
    keep.push_back(incoming);
    const std::vector<comm::P2POp> ops{{comm::P2POp::Kind::Send, sum, ring.prev},
                                       {comm::P2POp::Kind::Recv, incoming, ring.next}};
    if (side != nullptr) {
      side_waits_for(compute, *side);
      group.batch_p2p(ops, *side);
      arrived = Event::create(compute.device());
      arrived->record(*side);
    } else {
      group.batch_p2p(ops, compute);
    }
    if (k == 0 && between) between();
  }
  return sum;
}

}  // namespace megadlm::tp
