#include "megadlm/parallel/expert_parallel/communication.h"
#include <algorithm>
#include <numeric>
#include "megadlm/ops/elementwise.h"

namespace megadlm::ep {

namespace {

int size_of(comm::Communicator* g) { return g ? g->size() : 1; }

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

/// Host integers as an i32 tensor on the group's device (counts stay far below 2^31).
Tensor to_group_device(const std::vector<int64_t>& v, comm::Communicator& group, const Stream& stream) {
  std::vector<int32_t> i(v.begin(), v.end());
  for (size_t k = 0; k < v.size(); ++k)
    MDLM_CHECK(v[k] >= 0 && v[k] < (int64_t{1} << 31), "token count ", v[k], " does not fit in i32");
  Tensor host = Tensor::from_ints(i, {static_cast<int64_t>(i.size())});
  return group.device().is_cpu() ? host : host.to(group.device(), stream);
}

std::vector<int64_t> to_host(const Tensor& t, comm::Communicator& group, const Stream& stream) {
  group.synchronize(stream);
  const std::vector<int32_t> i = t.to_ints(stream);
  return std::vector<int64_t>(i.begin(), i.end());
}

/// dst rows [dst_row, +n) = src rows [src_row, +n).
void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t n,
               const Stream& stream) {
  if (n == 0) return;
  Tensor d = dst.narrow(dst_row, n);
  ops::copy(src.narrow(src_row, n), d, stream);
}

}  // namespace

Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows, comm::Communicator* group,
                       const Stream& stream) {
  const int g = size_of(group);
  MDLM_CHECK(static_cast<int>(send_rows.size()) == g && static_cast<int>(recv_rows.size()) == g,
             "all_to_all_rows: ", send_rows.size(), " send and ", recv_rows.size(),
             " receive blocks for a group of ", g);
  MDLM_CHECK(sum(send_rows) == x.rows(), "all_to_all_rows: x ", x.str(), " holds ", x.rows(),
             " rows, the send blocks ", sum(send_rows));
  if (g == 1) return x;
  const int64_t cols = x.cols();
  Tensor out = Tensor::empty({sum(recv_rows), cols}, x.dtype(), stream);
  std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
  for (size_t p = 0; p < send.size(); ++p) {
    send[p] = send_rows[p] * cols;
    recv[p] = recv_rows[p] * cols;
  }
  Tensor in_flat = x.view({x.numel()}), out_flat = out.view({out.numel()});
  group->all_to_all(in_flat, send, out_flat, recv, stream);
  return out;
}

Tensor all_gather_rows_uneven(const Tensor& x, const std::vector<int64_t>& rows_of,
                              comm::Communicator* group, const Stream& stream) {
  const int g = size_of(group);
  if (g == 1) return x;
  MDLM_CHECK(static_cast<int>(rows_of.size()) == g, "all_gather_rows_uneven: ", rows_of.size(),
             " sizes for a group of ", g);
  const int me = group->rank();
  MDLM_CHECK(x.rows() == rows_of[static_cast<size_t>(me)], "all_gather_rows_uneven: x ", x.str(),
             " but member ", me, " holds ", rows_of[static_cast<size_t>(me)], " rows");
  const int64_t cols = x.cols(), most = *std::max_element(rows_of.begin(), rows_of.end());
  const bool even = std::all_of(rows_of.begin(), rows_of.end(), [&](int64_t r) { return r == most; });
  if (most == 0) return Tensor::empty({0, cols}, x.dtype(), stream);
  Tensor mine = x;
  if (!even) {
    mine = Tensor::zeros({most, cols}, x.dtype(), stream);
    copy_rows(x, 0, mine, 0, x.rows(), stream);
  }
  Tensor padded = Tensor::empty({most * g, cols}, x.dtype(), stream);
  Tensor flat = padded.view({padded.numel()});
  group->all_gather(mine.view({mine.numel()}), flat, stream);
  if (even) return padded;
  Tensor out = Tensor::empty({sum(rows_of), cols}, x.dtype(), stream);
  int64_t row = 0;
  for (int p = 0; p < g; ++p) {
    copy_rows(padded, most * p, out, row, rows_of[static_cast<size_t>(p)], stream);
    row += rows_of[static_cast<size_t>(p)];
  }
  return out;
}

Tensor reduce_scatter_rows_uneven(const Tensor& full, const std::vector<int64_t>& rows_of,
                                  comm::Communicator* group, const Stream& stream) {
  const int g = size_of(group);
  if (g == 1) return full;
  MDLM_CHECK(static_cast<int>(rows_of.size()) == g && full.rows() == sum(rows_of),
             "reduce_scatter_rows_uneven: ", full.str(), " does not hold the blocks of ", g, " members");
  const int me = group->rank();
  const int64_t cols = full.cols(), most = *std::max_element(rows_of.begin(), rows_of.end());
  const bool even = std::all_of(rows_of.begin(), rows_of.end(), [&](int64_t r) { return r == most; });
  if (most == 0) return Tensor::empty({0, cols}, full.dtype(), stream);
  Tensor in = full;
  if (!even) {
    in = Tensor::zeros({most * g, cols}, full.dtype(), stream);
    int64_t row = 0;
    for (int p = 0; p < g; ++p) {
      copy_rows(full, row, in, most * p, rows_of[static_cast<size_t>(p)], stream);
      row += rows_of[static_cast<size_t>(p)];
    }
  }
  Tensor out = Tensor::empty({most, cols}, full.dtype(), stream);
  Tensor out_flat = out.view({out.numel()});
  group->reduce_scatter(in.view({in.numel()}), out_flat, comm::ReduceOp::Sum, stream);
  return even ? out : out.narrow(0, rows_of[static_cast<size_t>(me)]);
}

std::vector<int64_t> all_gather_counts(const std::vector<int64_t>& mine, comm::Communicator* group,
                                       const Stream& stream) {
  const int g = size_of(group);
  if (g == 1) return mine;
  Tensor in = to_group_device(mine, *group, stream);
  Tensor out = Tensor::empty({static_cast<int64_t>(mine.size()) * g}, DType::I32,
                             group->device().is_cpu() ? Stream::cpu() : stream);
  group->all_gather(in, out, stream);
  return to_host(out, *group, stream);
}

std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send, int64_t n,
                                       comm::Communicator* group, const Stream& stream) {
  const int g = size_of(group);
  MDLM_CHECK(static_cast<int64_t>(send.size()) == n * g, "all_to_all_counts: ", send.size(),
             " values are not ", g, " blocks of ", n);
  if (g == 1) return send;
  Tensor in = to_group_device(send, *group, stream);
  Tensor out = Tensor::empty({n * g}, DType::I32, group->device().is_cpu() ? Stream::cpu() : stream);
  group->all_to_all(in, std::vector<int64_t>(static_cast<size_t>(g), n), out,
                    std::vector<int64_t>(static_cast<size_t>(g), n), stream);
  return to_host(out, *group, stream);
}

std::vector<int64_t> all_reduce_counts(const std::vector<int64_t>& mine, comm::Communicator* group,
                                       const Stream& stream) {
  if (size_of(group) == 1) return mine;
  Tensor t = to_group_device(mine, *group, stream);
  group->all_reduce(t, comm::ReduceOp::Sum, stream);
  return to_host(t, *group, stream);
}

}  // namespace megadlm::ep
