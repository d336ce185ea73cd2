// The ring schedules of --tp-comm-overlap (parallel/tensor_parallel/comm_overlap.h) against the
// plain collectives of mappings.h, exactly (SPMD under mpirun, TP = the world): inputs are small
// rank-tagged integers, so every summation order gives the same float and EXPECT_EQ holds.
// Row counts cover an even split, a padded last shard and (at 4 ranks) an empty last shard.
#include <gtest/gtest.h>
#include <algorithm>
#include <utility>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/parallel/tensor_parallel/comm_overlap.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/tensor_parallel/mappings.h"
#include "support/spmd.h"

using namespace megadlm;

namespace {

comm::Communicator& world() { return test::spmd::mpi_runtime().world(); }

constexpr int64_t kCols = 3;

/// Row counts for `tp` ranks: even, one short (padded last shard), and 5 at tp 4 (shards of
/// 2, 2, 1, 0 rows: the last rank holds only padding).
std::vector<int64_t> row_counts(int tp) {
  std::vector<int64_t> r{2 * tp, 2 * tp - 1, 3 * tp + 1};
  if (tp == 4) r.push_back(5);
  return r;
}

/// Value of element (row, col) of rank `rank`'s tensor: small integers, distinct per rank.
float tagged(int rank, int64_t row, int64_t col) {
  return static_cast<float>((rank + 1) * 100 + row * kCols + col);
}

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

}  // namespace

TEST(TpCommOverlap, RingAllGatherEqualsGatherRowsAndVisitsEveryShardOnce) {
  comm::Communicator& g = world();
  const int tp = g.size(), me = g.rank();
  const Stream cpu = Stream::cpu();
  for (const int64_t rows : row_counts(tp)) {
    const int64_t per = shard_rows(rows, tp);
    // This rank's shard of a global [rows, kCols] tensor, zero past `rows` (as SP pads).
    Tensor shard = Tensor::zeros({per, kCols}, DType::F32, cpu);
    for (int64_t i = 0; i < per; ++i)
      for (int64_t c = 0; c < kCols; ++c)
        if (me * per + i < rows) shard.data<float>()[i * kCols + c] = tagged(0, me * per + i, c);
    const Tensor want = tp::gather_rows(shard, rows, &g, cpu);
    std::vector<std::pair<int64_t, int64_t>> chunks;  // (first row, rows) in call order
    std::vector<int> seen(static_cast<size_t>(rows), 0);
    const Tensor got = tp::gather_rows_overlapped(shard, rows, g, cpu, nullptr,
                                                  [&](int64_t first, const Tensor& x) {
                                                    chunks.emplace_back(first, x.rows());
                                                    for (int64_t i = 0; i < x.rows(); ++i) {
                                                      ++seen[static_cast<size_t>(first + i)];
                                                      // the chunk holds its rows already
                                                      EXPECT_EQ(x.data<float>()[i * kCols], tagged(0, first + i, 0));
                                                    }
                                                  });
    ASSERT_EQ(got.shape(), want.shape()) << "rows " << rows;
    EXPECT_EQ(values(got), values(want)) << "rows " << rows << ", rank " << me;
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << "row " << r;
    // Ring order: own shard first, then ranks me-1, me-2, ... (shards without real rows skipped).
    std::vector<std::pair<int64_t, int64_t>> order;
    for (int k = 0; k < tp; ++k) {
      const int s = ((me - k) % tp + tp) % tp;
      const int64_t n = std::clamp<int64_t>(rows - s * per, 0, per);
      if (n > 0) order.emplace_back(s * per, n);
    }
    EXPECT_EQ(chunks, order) << "rows " << rows << ", rank " << me;
  }
}

TEST(TpCommOverlap, RingReduceScatterEqualsScatterRows) {
  comm::Communicator& g = world();
  const int tp = g.size(), me = g.rank();
  const Stream cpu = Stream::cpu();
  for (const int64_t rows : row_counts(tp)) {
    // This rank's whole partial output, which the ring never builds: the plain path's input.
    Tensor partial = Tensor::empty({rows, kCols}, DType::F32, cpu);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < kCols; ++c) partial.data<float>()[r * kCols + c] = tagged(me, r, c);
    const Tensor want = tp::scatter_rows(partial, &g, cpu);
    int between_calls = 0;
    std::vector<int> asked(static_cast<size_t>(rows), 0);
    const Tensor got = tp::scatter_rows_overlapped(
        rows, kCols, DType::F32, g, cpu, nullptr,
        [&](int64_t first, Tensor& out) {
          EXPECT_EQ(out.cols(), kCols);
          for (int64_t i = 0; i < out.rows(); ++i) {
            ++asked[static_cast<size_t>(first + i)];
            for (int64_t c = 0; c < kCols; ++c) out.data<float>()[i * kCols + c] = tagged(me, first + i, c);
          }
        },
        [&] { ++between_calls; });
    ASSERT_EQ(got.shape(), want.shape()) << "rows " << rows;
    EXPECT_EQ(values(got), values(want)) << "rows " << rows << ", rank " << me;
    // The sum is right, not just equal: sum over ranks of tagged(rank, row, col).
    const int64_t per = shard_rows(rows, tp);
    for (int64_t i = 0; i < per; ++i) {
      const int64_t row = me * per + i;
      float expect = 0.0f;
      for (int q = 0; q < tp && row < rows; ++q) expect += tagged(q, row, 1);
      EXPECT_EQ(got.data<float>()[i * kCols + 1], expect) << "row " << row;
    }
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(asked[static_cast<size_t>(r)], 1) << "row " << r;
    EXPECT_EQ(between_calls, 1);
  }
}
