// parallel/context_parallel/sequence_layout.h
#include "megadlm/parallel/context_parallel/sequence_layout.h"
#include <utility>
#include "megadlm/core/error.h"

namespace megadlm::cp {

SequenceLayout::SequenceLayout(int64_t batch, int64_t seq, int cp_size, int cp_rank,
                               std::vector<int32_t> documents)
    : batch_(batch), seq_(seq), split_{cp_size, cp_rank, seq}, documents_(std::move(documents)) {
  split_.check();
  MDLM_CHECK(batch > 0, "cp::SequenceLayout: empty micro-batch");
  MDLM_CHECK(documents_.empty() || static_cast<int64_t>(documents_.size()) == batch * seq,
             "cp::SequenceLayout: ", documents_.size(), " document ids for ", batch, " x ", seq,
             " positions");
}

const Tensor& SequenceLayout::cached(Kind kind, int x, int y, const Stream& stream) const {
  const auto key = std::make_tuple(kind, x, y);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  std::vector<int32_t> host;
  switch (kind) {
    case Kind::Documents: host = shard_rows(documents_, batch_, Split{x, y, seq_}); break;
    case Kind::BlockFromMembers: host = cp::block_from_members(batch_, split_, x); break;
    case Kind::MembersFromBlock: host = cp::members_from_block(batch_, split_, x); break;
    case Kind::PeersFromHeads: host = cp::peers_from_heads(batch_ * split_.local_len(), x); break;
    case Kind::HeadsFromPeers: host = cp::heads_from_peers(batch_ * split_.local_len(), x); break;
  }
  const int64_t n = static_cast<int64_t>(host.size());
  Tensor t = Tensor::from_ints(host, {n}).to(stream.device(), stream);
  return cache_.emplace(key, std::move(t)).first->second;
}

const Tensor* SequenceLayout::documents(int n, int r, const Stream& stream) const {
  if (!has_documents()) return nullptr;
  return &cached(Kind::Documents, n, r, stream);
}

const Tensor& SequenceLayout::block_from_members(int a, const Stream& stream) const {
  return cached(Kind::BlockFromMembers, a, 0, stream);
}

const Tensor& SequenceLayout::members_from_block(int a, const Stream& stream) const {
  return cached(Kind::MembersFromBlock, a, 0, stream);
}

const Tensor& SequenceLayout::peers_from_heads(int a, const Stream& stream) const {
  return cached(Kind::PeersFromHeads, a, 0, stream);
}

const Tensor& SequenceLayout::heads_from_peers(int a, const Stream& stream) const {
  return cached(Kind::HeadsFromPeers, a, 0, stream);
}

}  // namespace megadlm::cp
