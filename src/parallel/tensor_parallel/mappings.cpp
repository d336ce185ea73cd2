#include "megadlm/parallel/tensor_parallel/mappings.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/parallel/model_parallel.h"

namespace megadlm::tp {

namespace {
int size_of(comm::Communicator* g) { return g ? g->size() : 1; }
}  // namespace

void all_reduce(Tensor& x, comm::Communicator* group, const Stream& stream) {
  if (size_of(group) == 1) return;
  group->all_reduce(x, comm::ReduceOp::Sum, stream);
}

Tensor gather_rows(const Tensor& shard, int64_t rows, comm::Communicator* group,
                   const Stream& stream) {
  const int tp = size_of(group);
  if (tp == 1) return shard;
  const int64_t per = shard_rows(rows, tp);
  MDLM_CHECK(shard.rows() == per, "gather_rows: shard ", shard.str(), " must have ", per,
             " rows for ", rows, " rows over ", tp, " ranks");
  Tensor full = Tensor::empty({per * tp, shard.cols()}, shard.dtype(), stream);
  group->all_gather(shard, full, stream);
  return per * tp == rows ? full : full.narrow(0, rows);
}

Tensor scatter_rows(const Tensor& full, comm::Communicator* group, const Stream& stream) {
  const int tp = size_of(group);
  if (tp == 1) return full;
  const int64_t rows = full.rows(), per = shard_rows(rows, tp);
  Tensor in = full;
  if (per * tp != rows) {  // pad with zero rows so that the group splits evenly
    in = Tensor::zeros({per * tp, full.cols()}, full.dtype(), stream);
    Tensor head = in.narrow(0, rows);
    ops::copy(full.view({rows, full.cols()}), head, stream);
  }
  Tensor out = Tensor::empty({per, full.cols()}, full.dtype(), stream);
  group->reduce_scatter(in.view({in.numel()}), out, comm::ReduceOp::Sum, stream);
  return out;
}

Tensor shard_of(const Tensor& full, comm::Communicator* group, const Stream& stream) {
  const int tp = size_of(group);
  if (tp == 1) return full;
  const int64_t rows = full.rows(), per = shard_rows(rows, tp);
  const int64_t begin = per * group->rank();
  Tensor out = Tensor::zeros({per, full.cols()}, full.dtype(), stream);
  const int64_t n = std::max<int64_t>(0, std::min(rows, begin + per) - begin);
  if (n > 0) {
    Tensor dst = out.narrow(0, n);
    ops::copy(full.view({rows, full.cols()}).narrow(begin, n), dst, stream);
  }
  return out;
}

}  // namespace megadlm::tp
