// parallel/context_parallel/mappings.h: the all-to-all, all-gather, reduce-scatter and ring
// transfers of context-parallel attention, as row reorders (ops::gather_rows with the
// micro-batch's SequenceLayout indices) around the collectives.
#include "megadlm/parallel/context_parallel/mappings.h"
#include "megadlm/ops/elementwise.h"

namespace megadlm::cp {

namespace {

int size_of(const comm::Communicator* g) { return g != nullptr ? g->size() : 1; }

Tensor gathered(const Tensor& src, const Tensor& index, int64_t width, const Stream& stream) {
  Tensor dst = Tensor::empty({index.numel(), width}, src.dtype(), stream);
  ops::gather_rows(src.view({src.numel() / width, width}), index, dst, stream);
  return dst;
}

/// Equal all-to-all of `x` ([a blocks of n rows, width] in peer order) over `group`.
Tensor all_to_all_equal(const Tensor& x, comm::Communicator& group, const Stream& stream) {
  const int a = group.size();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), stream);
  const std::vector<int64_t> counts(static_cast<size_t>(a), x.numel() / a);
  group.all_to_all(x, counts, out, counts, stream);
  return out;
}

}  // namespace

Tensor sequence_to_heads(const Tensor& x, comm::Communicator* group, const SequenceLayout& layout,
                         const Stream& stream) {
  const int a = size_of(group);
  if (a == 1) return x;
  MDLM_CHECK(x.cols() % a == 0, "cp::sequence_to_heads: ", x.str(), " does not split into ", a,
             " head blocks");
  const int64_t w = x.cols() / a;
  // Rows of a head blocks -> peer-major (block p of every row, to member p) -> all-to-all ->
  // member-major rows of this head block -> the level-1 block's order.
  Tensor peers = gathered(x, layout.peers_from_heads(a, stream), w, stream);
  Tensor members = all_to_all_equal(peers, *group, stream);
  peers = Tensor();
  return gathered(members, layout.block_from_members(a, stream), w, stream);
}

Tensor heads_to_sequence(const Tensor& x, comm::Communicator* group, const SequenceLayout& layout,
                         const Stream& stream) {
  const int a = size_of(group);
  if (a == 1) return x;
  const int64_t w = x.cols();
  Tensor members = gathered(x, layout.members_from_block(a, stream), w, stream);
  Tensor heads = all_to_all_equal(members, *group, stream);  // from member j: head block j
  members = Tensor();
  Tensor rows = gathered(heads, layout.heads_from_peers(a, stream), w, stream);
  return rows.view({rows.numel() / (w * a), w * a});
}

Tensor gather_sequence(const Tensor& x, comm::Communicator* cp, const SequenceLayout& layout,
                       const Stream& stream) {
  const int n = size_of(cp);
  if (n == 1) return x;
  Tensor all = Tensor::empty({n * x.rows(), x.cols()}, x.dtype(), stream);
  cp->all_gather(x, all, stream);  // member-major: rank j's rows at [j·rows, (j+1)·rows)
  return gathered(all, layout.block_from_members(n, stream), x.cols(), stream);
}

Tensor reduce_scatter_sequence(const Tensor& full, DType dtype, comm::Communicator* cp,
                               const SequenceLayout& layout, const Stream& stream) {
  const int n = size_of(cp);
  Tensor members = n == 1 ? full
                          : gathered(full, layout.members_from_block(n, stream), full.cols(), stream);
  if (members.dtype() != dtype) {
    Tensor wide = Tensor::empty(members.shape(), dtype, stream);
    ops::copy(members, wide, stream);
    members = wide;
  }
  if (n == 1) return members;
  Tensor out = Tensor::empty({members.rows() / n, members.cols()}, dtype, stream);
  cp->reduce_scatter(members, out, comm::ReduceOp::Sum, stream);
  return out;
}

void RingTransfer::start(comm::Communicator& ring, const std::vector<Tensor>& send,
                         const std::vector<Tensor>& recv, const Stream& compute,
                         const Stream* side) {
  const int next = (ring.rank() + 1) % ring.size();
  const int prev = (ring.rank() + ring.size() - 1) % ring.size();
  std::vector<comm::P2POp> ops;
  for (const Tensor& t : send) ops.push_back({comm::P2POp::Kind::Send, t, next});
  for (const Tensor& t : recv) ops.push_back({comm::P2POp::Kind::Recv, t, prev});
  side_ = side;
  if (side_ == nullptr) {
    ring.batch_p2p(ops, compute);
    return;
  }
  Event ready = Event::create(compute.device());
  ready.record(compute);
  ready.wait_on(*side_);
  ring.batch_p2p(ops, *side_);
  done_ = Event::create(compute.device());
  done_->record(*side_);
}

void RingTransfer::finish(const Stream& compute) {
  if (side_ != nullptr && done_) done_->wait_on(compute);
  side_ = nullptr;
  done_.reset();
}

}  // namespace megadlm::cp
