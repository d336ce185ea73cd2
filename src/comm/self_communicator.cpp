// The one-rank communicator (self_communicator.h). Reductions over one rank are the identity for
// every ReduceOp, so all_reduce touches nothing; gathers and exchanges are copies on `stream`.
#include "comm/self_communicator.h"

namespace megadlm::comm::detail {

namespace {
/// dst = src as raw elements (same dtype, same count); nothing to do when they are one buffer.
void copy_elements(const Tensor& src, Tensor& dst, const Stream& stream) {
  if (src.numel() == 0 || src.data_ptr() == dst.data_ptr()) return;
  Tensor flat_dst = dst.view({dst.numel()});
  copy_tensor(src.view({src.numel()}), flat_dst, stream);
}
}  // namespace

SelfCommunicator::SelfCommunicator(std::string name, Device device, int global_rank,
                                   std::chrono::milliseconds timeout,
                                   std::shared_ptr<CommRegistry> registry)
    : name_(std::move(name)), device_(device), global_rank_(global_rank), timeout_(timeout),
      registry_(std::move(registry)) {
  if (registry_) registry_->add(this);
}

SelfCommunicator::~SelfCommunicator() {
  if (registry_) registry_->remove(this);
}

int SelfCommunicator::global_rank(int group_rank) const {
  MDLM_CHECK(group_rank == 0, "group '", name_, "' has one rank; asked for the global rank of "
             "member ", group_rank, " (valid: 0)");
  return global_rank_;
}

void SelfCommunicator::set_timeout(std::chrono::milliseconds timeout) {
  check_timeout(*this, timeout);
  timeout_ = timeout;
}

void SelfCommunicator::begin(const char* op, const Stream& stream) const {
  check_usable(*this, aborted_, false, op);
  check_stream(*this, op, stream);
}

void SelfCommunicator::all_reduce(Tensor& t, ReduceOp op, const Stream& stream) {
  begin("all_reduce", stream);
  check_all_reduce(*this, t, op, reduces_16bit());
}

void SelfCommunicator::reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op,
                                      const Stream& stream) {
  begin("reduce_scatter", stream);
  check_reduce_scatter(*this, in, out, op, reduces_16bit());
  copy_elements(in, out, stream);
}

void SelfCommunicator::all_gather(const Tensor& in, Tensor& out, const Stream& stream) {
  begin("all_gather", stream);
  check_all_gather(*this, in, out);
  copy_elements(in, out, stream);
}

void SelfCommunicator::broadcast(Tensor& t, int root, const Stream& stream) {
  begin("broadcast", stream);
  check_broadcast(*this, t, root);
}

void SelfCommunicator::all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts,
                                  Tensor& out, const std::vector<int64_t>& recv_counts,
                                  const Stream& stream) {
  begin("all_to_all", stream);
  check_all_to_all(*this, in, send_counts, out, recv_counts);
  MDLM_CHECK(send_counts[0] == recv_counts[0], "all_to_all on ", describe(*this),
             ": this rank sends itself ", send_counts[0], " elements but expects ", recv_counts[0]);
  copy_elements(in, out, stream);
}

void SelfCommunicator::send(const Tensor& t, int peer, const Stream& stream) {
  begin("send", stream);
  check_p2p(*this, "send", t, peer);  // always throws: the only peer is this rank
}

void SelfCommunicator::recv(Tensor& t, int peer, const Stream& stream) {
  begin("recv", stream);
  check_p2p(*this, "recv", t, peer);
}

void SelfCommunicator::batch_p2p(const std::vector<P2POp>& ops, const Stream& stream) {
  begin("batch_p2p", stream);
  check_batch_p2p(*this, ops);
  // The k-th send to itself feeds the k-th receive from itself, as MPI and NCCL match them.
  std::vector<const P2POp*> sends, recvs;
  for (const P2POp& o : ops) (o.kind == P2POp::Kind::Send ? sends : recvs).push_back(&o);
  MDLM_CHECK(sends.size() == recvs.size(), "batch_p2p on ", describe(*this), ": ", sends.size(),
             " send(s) to itself but ", recvs.size(), " receive(s); each send needs its receive");
  for (size_t i = 0; i < sends.size(); ++i) {
    const Tensor& s = sends[i]->tensor;
    Tensor r = recvs[i]->tensor;
    MDLM_CHECK(s.dtype() == r.dtype() && s.numel() == r.numel(), "batch_p2p on ",
               describe(*this), ": send ", i, " is ", tensor_text(s), " but the matching receive is ",
               tensor_text(r), "; dtype and element count must agree");
    copy_elements(s, r, stream);
  }
}

void SelfCommunicator::barrier(const Stream& stream) { begin("barrier", stream); }

void SelfCommunicator::synchronize(const Stream& stream) {
  check_stream(*this, "synchronize", stream);
  stream.synchronize();  // the copies above were queued on it
}

std::unique_ptr<Communicator> SelfCommunicator::split(int color, int, const std::string& name) {
  check_usable(*this, aborted_, false, "split");
  if (color < 0) return nullptr;
  return std::make_unique<SelfCommunicator>(name, device_, global_rank_, timeout_, registry_);
}

}  // namespace megadlm::comm::detail
