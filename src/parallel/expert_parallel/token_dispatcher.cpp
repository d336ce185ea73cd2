#include "megadlm/parallel/expert_parallel/token_dispatcher.h"
#include <numeric>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/moe.h"
#include "megadlm/parallel/expert_parallel/communication.h"

namespace megadlm::ep {

namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

std::vector<int64_t> block_sums(const std::vector<int64_t>& v, int64_t block) {
  std::vector<int64_t> out(v.size() / static_cast<size_t>(block), 0);
  for (size_t i = 0; i < v.size(); ++i) out[i / static_cast<size_t>(block)] += v[i];
  return out;
}

/// gather_rows indices that reorder row chunks between the received order (a-major, then b,
/// then expert) and the expert-major order (expert, then a, then b), where
/// chunks[(a * nb + b) * ne + e] counts the rows: `to_expert_major` (dst row in expert-major
/// order <- src row in received order) and its inverse. One gather each way instead of a copy
/// per chunk: the host builds the indices once per dispatch; the backward reuses them.
void sort_indices(const std::vector<int64_t>& chunks, int64_t na, int64_t nb, int64_t ne,
                  const Stream& stream, Tensor& to_expert_major, Tensor& to_received) {
  auto at = [&](int64_t a, int64_t b, int64_t e) { return chunks[static_cast<size_t>((a * nb + b) * ne + e)]; };
  std::vector<int64_t> received(chunks.size());  // start row of every chunk in the received order
  int64_t rows = 0;
  for (int64_t a = 0; a < na; ++a)
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t e = 0; e < ne; ++e) {
        received[static_cast<size_t>((a * nb + b) * ne + e)] = rows;
        rows += at(a, b, e);
      }
  std::vector<int32_t> to_major(static_cast<size_t>(rows)), to_recv(static_cast<size_t>(rows));
  int64_t row = 0;
  for (int64_t e = 0; e < ne; ++e)
    for (int64_t a = 0; a < na; ++a)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t from = received[static_cast<size_t>((a * nb + b) * ne + e)];
        for (int64_t i = 0; i < at(a, b, e); ++i, ++row) {
          to_major[static_cast<size_t>(row)] = static_cast<int32_t>(from + i);
          to_recv[static_cast<size_t>(from + i)] = static_cast<int32_t>(row);
        }
      }
  to_expert_major = Tensor::from_ints(to_major, {rows}).to(stream.device(), stream);
  to_received = Tensor::from_ints(to_recv, {rows}).to(stream.device(), stream);
}

Tensor reorder(const Tensor& x, const Tensor& index, const Stream& stream) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), stream);
  if (x.rows() > 0) ops::gather_rows(x, index, out, stream);
  return out;
}

}  // namespace

TokenDispatcher::TokenDispatcher(DispatcherKind kind, int num_experts, const ModelParallel& mp,
                                 bool source_chunks)
    : kind_(kind), mp_(mp), num_experts_(num_experts), source_chunks_(source_chunks) {
  MDLM_CHECK(num_experts > 0 && num_experts % mp.ep.size == 0, "--num-experts ", num_experts,
             " does not split over ", mp.ep.size, " expert-parallel ranks");
  local_ = num_experts / mp.ep.size;
  first_ = local_ * mp.ep.rank;
}

Tensor TokenDispatcher::to_experts(const Tensor& x_perm, const Saved& s, const Stream& stream) const {
  Tensor x = x_perm;
  if (mp_.ep.enabled()) x = all_to_all_rows(x, s.send_rows, s.recv_rows, mp_.ep.get(), stream);
  if (mp_.expert_tp.enabled()) x = all_gather_rows_uneven(x, s.etp_rows, mp_.expert_tp.get(), stream);
  if (s.sort_to_expert_major.defined()) x = reorder(x, s.sort_to_expert_major, stream);
  return x;
}

Tensor TokenDispatcher::from_experts(const Tensor& y_in, const Saved& s, const Stream& stream) const {
  Tensor y = y_in;
  if (s.sort_to_received.defined()) y = reorder(y, s.sort_to_received, stream);
  if (mp_.expert_tp.enabled()) y = reduce_scatter_rows_uneven(y, s.etp_rows, mp_.expert_tp.get(), stream);
  if (mp_.ep.enabled()) y = all_to_all_rows(y, s.recv_rows, s.send_rows, mp_.ep.get(), stream);
  return y;
}

Tensor TokenDispatcher::gather(const Tensor& x, const Saved& s, const Stream& stream) const {
  Tensor g = all_gather_rows_uneven(x, s.ep_rows, mp_.ep.get(), stream);
  return all_gather_rows_uneven(g, s.etp_gather_rows, mp_.expert_tp.get(), stream);
}

Tensor TokenDispatcher::reduce_scatter(const Tensor& full, const Saved& s, const Stream& stream) const {
  Tensor r = reduce_scatter_rows_uneven(full, s.etp_gather_rows, mp_.expert_tp.get(), stream);
  return reduce_scatter_rows_uneven(r, s.ep_rows, mp_.ep.get(), stream);
}

Tensor TokenDispatcher::dispatch(const Tensor& x, const Tensor& indices, const Tensor& probs,
                                 Saved& s, const Stream& stream) const {
  MDLM_CHECK(x.rows() == indices.rows() && probs.shape() == indices.shape(), "dispatch: x ", x.str(),
             ", indices ", indices.str(), ", probs ", probs.str(), " disagree");
  s = Saved{};
  s.tokens = x.rows();
  if (kind_ == DispatcherKind::AllToAll) {
    s.dest = Tensor::empty(indices.shape(), DType::I32, stream);
    Tensor counts = Tensor::empty({num_experts_}, DType::I32, stream);
    ops::moe_dispatch_plan(indices, 0, num_experts_, s.dest, counts, stream);
    const std::vector<int32_t> c32 = counts.to_ints(stream);  // the host needs the sizes
    const std::vector<int64_t> counts_h(c32.begin(), c32.end());
    Tensor x_perm = Tensor::empty({sum(counts_h), x.cols()}, x.dtype(), stream);
    ops::moe_permute(x, s.dest, x_perm, stream);
    std::vector<int64_t> received = counts_h;  // [ep][local expert] rows this rank receives
    if (mp_.ep.enabled()) {
      s.send_rows = block_sums(counts_h, local_);
      received = all_to_all_counts(counts_h, local_, mp_.ep.get(), stream);
      s.recv_rows = block_sums(received, local_);
    }
    s.chunks = received;
    if (mp_.expert_tp.enabled()) {
      s.chunks = all_gather_counts(received, mp_.expert_tp.get(), stream);
      s.etp_rows = block_sums(s.chunks, static_cast<int64_t>(received.size()));
    }
    s.rows_per_expert.assign(static_cast<size_t>(local_), 0);
    for (size_t i = 0; i < s.chunks.size(); ++i) s.rows_per_expert[i % static_cast<size_t>(local_)] += s.chunks[i];
    if (local_ > 1 && (mp_.ep.enabled() || mp_.expert_tp.enabled()))
      sort_indices(s.chunks, mp_.expert_tp.size, mp_.ep.size, local_, stream, s.sort_to_expert_major,
                   s.sort_to_received);
    s.probs = probs;
    if (source_chunks_) {  // chunks are [a][b][e] in received order; expert-major keeps (a, b) order
      const size_t sources = s.chunks.size() / static_cast<size_t>(local_);
      s.source_rows.assign(s.chunks.size(), 0);
      for (size_t src = 0; src < sources; ++src)
        for (size_t e = 0; e < static_cast<size_t>(local_); ++e)
          s.source_rows[e * sources + src] = s.chunks[src * static_cast<size_t>(local_) + e];
    }
    return to_experts(x_perm, s, stream);
  }
  // allgather
  s.ep_rows = all_gather_counts({x.rows()}, mp_.ep.get(), stream);
  s.etp_gather_rows = all_gather_counts({sum(s.ep_rows)}, mp_.expert_tp.get(), stream);
  Tensor x_all = gather(x, s, stream);
  Tensor idx_all = gather(indices, s, stream);
  s.probs = gather(probs, s, stream);
  s.dest = Tensor::empty(idx_all.shape(), DType::I32, stream);
  Tensor counts = Tensor::empty({local_}, DType::I32, stream);
  ops::moe_dispatch_plan(idx_all, first_, local_, s.dest, counts, stream);
  const std::vector<int32_t> c32 = counts.to_ints(stream);
  s.rows_per_expert.assign(c32.begin(), c32.end());
  if (source_chunks_) {
    // The gathered rows are ordered by source (expert-TP rank, then EP rank), and each expert's
    // rows keep the token order: count each source's slots per local expert.
    const std::vector<int64_t> per_source = all_gather_counts(s.ep_rows, mp_.expert_tp.get(), stream);
    const size_t sources = per_source.size();
    const std::vector<int32_t> idx = idx_all.to_ints(stream);
    const int64_t k = idx_all.cols();
    s.source_rows.assign(static_cast<size_t>(local_) * sources, 0);
    int64_t row = 0;
    for (size_t src = 0; src < sources; ++src)
      for (int64_t end = row + per_source[src]; row < end; ++row)
        for (int64_t j = 0; j < k; ++j) {
          const int e = idx[static_cast<size_t>(row * k + j)] - first_;
          if (e >= 0 && e < local_) ++s.source_rows[static_cast<size_t>(e) * sources + src];
        }
  }
  Tensor x_exp = Tensor::empty({sum(s.rows_per_expert), x.cols()}, x.dtype(), stream);
  ops::moe_permute(x_all, s.dest, x_exp, stream);
  return x_exp;
}

Tensor TokenDispatcher::combine(const Tensor& expert_out, Saved& s, const Stream& stream) const {
  if (kind_ == DispatcherKind::AllToAll) {
    s.weighed = from_experts(expert_out, s, stream);
    Tensor y = Tensor::empty({s.tokens, expert_out.cols()}, expert_out.dtype(), stream);
    ops::moe_unpermute(s.weighed, s.dest, s.probs, y, stream);
    return y;
  }
  s.weighed = expert_out;
  Tensor y_all = Tensor::empty({s.dest.rows(), expert_out.cols()}, expert_out.dtype(), stream);
  ops::moe_unpermute(expert_out, s.dest, s.probs, y_all, stream);
  return reduce_scatter(y_all, s, stream);
}

Tensor TokenDispatcher::combine_backward(const Tensor& dy, Saved& s, Tensor& dprobs,
                                         const Stream& stream) const {
  const DType pd = s.probs.dtype();
  if (kind_ == DispatcherKind::AllToAll) {
    Tensor d_perm = Tensor::empty(s.weighed.shape(), dy.dtype(), stream);
    dprobs = Tensor::empty(s.probs.shape(), pd, stream);
    ops::moe_unpermute_backward(dy, s.weighed, s.dest, s.probs, d_perm, dprobs, stream);
    s.weighed = Tensor();
    return to_experts(d_perm, s, stream);
  }
  Tensor dy_all = gather(dy, s, stream);
  Tensor d_out = Tensor::empty(s.weighed.shape(), dy.dtype(), stream);
  Tensor dprobs_all = Tensor::empty(s.probs.shape(), pd, stream);
  ops::moe_unpermute_backward(dy_all, s.weighed, s.dest, s.probs, d_out, dprobs_all, stream);
  s.weighed = Tensor();
  dprobs = reduce_scatter(dprobs_all, s, stream);
  return d_out;
}

Tensor TokenDispatcher::dispatch_backward(const Tensor& dx_expert, Saved& s, const Stream& stream) const {
  Tensor dx;
  if (kind_ == DispatcherKind::AllToAll) {
    Tensor d_perm = from_experts(dx_expert, s, stream);
    dx = Tensor::empty({s.tokens, dx_expert.cols()}, dx_expert.dtype(), stream);
    ops::moe_unpermute(d_perm, s.dest, Tensor(), dx, stream);
  } else {
    Tensor dx_all = Tensor::empty({s.dest.rows(), dx_expert.cols()}, dx_expert.dtype(), stream);
    ops::moe_unpermute(dx_expert, s.dest, Tensor(), dx_all, stream);
    dx = reduce_scatter(dx_all, s, stream);
  }
  s = Saved{};
  return dx;
}

}  // namespace megadlm::ep
