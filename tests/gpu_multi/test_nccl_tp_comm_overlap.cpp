// --tp-comm-overlap's rings (parallel/tensor_parallel/comm_overlap.h) on CUDA tensors under NCCL,
// with the side stream and its events, against the plain collectives (TP = the world):
//   mpirun -np 2 build/bin/gpu_nccl --gtest_filter='NcclTpCommOverlap*'
//   mpirun -np 8 scripts/shared_gpu_rank.sh build/bin/gpu_nccl --gtest_filter='NcclTpCommOverlap*'
// The CPU suite (tests/layout/tensor_parallel/test_tp_comm_overlap.cpp) proves the schedules;
// this one proves the stream ordering: each chunk's work runs on the compute stream after its
// transfer (a missing wait reads stale rows), and the returned tensors are complete once the
// compute stream is. Rank-tagged small integers in f32 and bf16: EXPECT_EQ. Skips without a GPU.
#include <gtest/gtest.h>
#include <algorithm>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/tensor_parallel/comm_overlap.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"
#include "support/spmd.h"

using namespace megadlm;

namespace {

constexpr int64_t kCols = 256;  // wide enough that a transfer takes longer than a launch

class NcclTpCommOverlap : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    runtime_ = test::spmd::runtime(comm::Transport::Nccl, &why);
    if (runtime_ == nullptr) GTEST_SKIP() << why;
    compute_ = Stream::create(runtime_->device());
    side_ = Stream::create(runtime_->device());
  }
  comm::Communicator& group() { return runtime_->world(); }
  comm::DistributedRuntime* runtime_ = nullptr;
  Stream compute_, side_;
};

float tagged(int rank, int64_t row, int64_t col) {
  return static_cast<float>((rank + 1) + (row * 7 + col) % 8);  // sums over 8 ranks < 256: exact in bf16
}

/// [rows, kCols] of rank `rank`'s tagged values (zero rows from `valid` on), on `stream`'s device.
Tensor tagged_rows(int rank, int64_t first_row, int64_t rows, int64_t valid, DType dtype, const Stream& s) {
  std::vector<float> v(static_cast<size_t>(rows * kCols), 0.0f);
  for (int64_t r = 0; r < std::min(rows, valid); ++r)
    for (int64_t c = 0; c < kCols; ++c) v[static_cast<size_t>(r * kCols + c)] = tagged(rank, first_row + r, c);
  return Tensor::from_floats(v, {rows, kCols}, DType::F32).to(s.device(), dtype, s);
}

std::vector<float> host(const Tensor& t, const Stream& s) {
  Tensor h = t.to(Device::cpu(), DType::F32, s);
  s.synchronize();
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

}  // namespace

TEST_F(NcclTpCommOverlap, RingAllGatherOnTheSideStreamEqualsGatherRows) {
  comm::Communicator& g = group();
  const int tp = g.size(), me = g.rank();
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const int64_t rows : {int64_t{4096} * tp, int64_t{4096} * tp - 3}) {
      const int64_t per = shard_rows(rows, tp);
      const Tensor shard = tagged_rows(0, me * per, per, rows - me * per, dtype, compute_);
      const Tensor want = tp::gather_rows(shard, rows, &g, compute_);
      // Each chunk's rows copied as they arrive: a copy queued before its transfer ended reads
      // the uninitialised buffer.
      Tensor seen = Tensor::zeros({rows, kCols}, dtype, compute_);
      const Tensor got = tp::gather_rows_overlapped(shard, rows, g, compute_, &side_,
                                                    [&](int64_t first, const Tensor& x) {
                                                      Tensor dst = seen.narrow(first, x.rows());
                                                      ops::copy(x, dst, compute_);
                                                    });
      g.synchronize(side_);
      EXPECT_EQ(host(got, compute_), host(want, compute_)) << "rows " << rows;
      EXPECT_EQ(host(seen, compute_), host(want, compute_)) << "rows " << rows;
    }
  }
}

TEST_F(NcclTpCommOverlap, RingReduceScatterOnTheSideStreamEqualsScatterRows) {
  comm::Communicator& g = group();
  const int tp = g.size(), me = g.rank();
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const int64_t rows : {int64_t{4096} * tp, int64_t{4096} * tp - 3}) {
      const Tensor partial = tagged_rows(me, 0, rows, rows, dtype, compute_);
      const Tensor want = tp::scatter_rows(partial, &g, compute_);
      const Tensor got = tp::scatter_rows_overlapped(
          rows, kCols, dtype, g, compute_, &side_,
          [&](int64_t first, Tensor& out) { ops::copy(partial.narrow(first, out.rows()), out, compute_); });
      g.synchronize(side_);
      EXPECT_EQ(host(got, compute_), host(want, compute_)) << "rows " << rows << ", " << dtype_name(dtype);
    }
  }
}
