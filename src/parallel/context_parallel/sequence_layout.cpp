// parallel/context_parallel/sequence_layout.h
#include "megadlm/parallel/context_parallel/sequence_layout.h"
#include <algorithm>
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
    case Kind::LocalBlockRanges: host = local_ranges(x, y); break;
    case Kind::BlockDocuments: host = block_docs(x, y); break;
  }
  const int64_t n = static_cast<int64_t>(host.size());
  const Shape shape = kind == Kind::LocalBlockRanges ? Shape{batch_ / 2, 4, n / (batch_ * 2)} : Shape{n};
  Tensor t = Tensor::from_ints(host, shape).to(stream.device(), stream);
  return cache_.emplace(key, std::move(t)).first->second;
}

void SequenceLayout::set_block_diffusion(std::vector<int32_t> ranges) {
  MDLM_CHECK(batch_ % 2 == 0 && static_cast<int64_t>(ranges.size()) == batch_ / 2 * 4 * seq_,
             "cp::SequenceLayout: block diffusion needs 2B rows of one copy and [B, 4, L] ranges; got ",
             batch_, " rows and ", ranges.size(), " ranges of L = ", seq_);
  block_ranges_ = std::move(ranges);
}

bool SequenceLayout::blocks_in_chunks(int n) const {
  MDLM_CHECK(block_diffusion(), "cp::SequenceLayout: no block diffusion ranges");
  if (auto it = blocks_in_chunks_.find(n); it != blocks_in_chunks_.end()) return it->second;
  const int64_t L = seq_, c = Split{n, 0, L}.chunk_len();
  bool inside = true;
  for (int64_t b = 0; b < batch_ / 2 && inside; ++b) {
    const int32_t* r = block_ranges_.data() + b * 4 * L;
    for (int64_t p = 0; p < L && inside; ++p)
      inside = r[2 * L + p] / c == (r[3 * L + p] - 1) / c;  // block_start, block_end - 1
  }
  return blocks_in_chunks_[n] = inside;
}

std::vector<int32_t> SequenceLayout::local_ranges(int n, int rank) const {
  MDLM_CHECK(block_diffusion(), "cp::SequenceLayout: no block diffusion ranges");
  const Split sp{n, rank, seq_};
  const int64_t L = seq_, h = sp.local_len(), c = sp.chunk_len();
  // The shard's positions below global x: its chunks are increasing, so every global interval
  // of positions is a contiguous run of its local rows.
  const auto below = [&](int64_t x) {
    const auto part = [&](int64_t chunk) { return std::clamp<int64_t>(x - chunk * c, 0, c); };
    return static_cast<int32_t>(sp.size == 1 ? x : part(sp.first_chunk()) + part(sp.second_chunk()));
  };
  std::vector<int32_t> out(static_cast<size_t>(batch_ / 2 * 4 * h));
  for (int64_t b = 0; b < batch_ / 2; ++b)
    for (int64_t w = 0; w < 4; ++w)
      for (int64_t i = 0; i < h; ++i)
        out[static_cast<size_t>((b * 4 + w) * h + i)] =
            below(block_ranges_[static_cast<size_t>((b * 4 + w) * L + sp.global(i))]);
  return out;
}

std::vector<int32_t> SequenceLayout::block_docs(int n, int rank) const {
  MDLM_CHECK(block_diffusion(), "cp::SequenceLayout: no block diffusion ranges");
  const Split sp{n, rank, seq_};
  const int64_t L = seq_, h = sp.local_len();
  std::vector<int32_t> out(static_cast<size_t>(batch_ / 2 * 2 * h));
  for (int64_t b = 0; b < batch_ / 2; ++b)
    for (int64_t copy = 0; copy < 2; ++copy)
      for (int64_t i = 0; i < h; ++i)
        out[static_cast<size_t>((b * 2 + copy) * h + i)] = block_ranges_[static_cast<size_t>(b * 4 * L + sp.global(i))];
  return out;
}

const Tensor& SequenceLayout::local_block_ranges(int n, int r, const Stream& stream) const {
  return cached(Kind::LocalBlockRanges, n, r, stream);
}

const Tensor& SequenceLayout::block_documents(int n, int r, const Stream& stream) const {
  return cached(Kind::BlockDocuments, n, r, stream);
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
