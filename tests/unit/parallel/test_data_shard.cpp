// Which samples a rank reads (parallel/data_parallel/data_shard.h): the data group (dp) decides,
// not the gradient group (dp×cp). Dry computation over whole layouts: for every global rank, the
// samples of every micro-batch of a global batch, from the rank's coordinates in the layout.
#include <gtest/gtest.h>
#include <map>
#include <set>
#include <vector>
#include "megadlm/parallel/data_parallel/data_shard.h"
#include "megadlm/parallel/rank_layout.h"

using namespace megadlm;
using namespace megadlm::parallel;

namespace {

/// Samples rank `rank` reads in the global batch [first, first + gbs).
std::vector<int64_t> samples_of(const RankLayout& layout, int rank, int64_t first, int64_t gbs,
                                int64_t mbs) {
  const DataShard shard = DataShard::of(layout, rank);
  std::vector<int64_t> out;
  for (int64_t m = 0; m < gbs / (mbs * shard.size); ++m)
    for (int64_t b = 0; b < mbs; ++b) out.push_back(shard.first_sample(first, m, mbs) + b);
  return out;
}

}  // namespace

TEST(DataShard, WorkedExampleOfTheHeader) {
  ParallelConfig c;
  c.world_size = 2;
  const RankLayout layout = RankLayout::build(c);
  EXPECT_EQ(samples_of(layout, 0, 0, 8, 2), (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(samples_of(layout, 1, 0, 8, 2), (std::vector<int64_t>{2, 3, 6, 7}));
  EXPECT_EQ(samples_of(layout, 1, 16, 8, 2), (std::vector<int64_t>{18, 19, 22, 23}));
}

TEST(DataShard, RanksOfOneContextParallelGroupReadTheSameSamples) {
  // tp 2, cp 2, dp 2 over 8 ranks (order tp-cp-ep-dp-pp): rank = tp + 2 cp + 4 dp. The gradient
  // group dp-cp has 4 ranks, but only 2 data shards exist.
  ParallelConfig c;
  c.world_size = 8;
  c.tensor_model_parallel_size = 2;
  c.context_parallel_size = 2;
  c.expert_tensor_parallel_size = 2;
  const RankLayout layout = RankLayout::build(c);
  const int64_t gbs = 8, mbs = 2;
  for (const std::vector<int>& cp_group : layout.groups(GroupKind::Cp)) {
    ASSERT_EQ(cp_group.size(), 2u);
    EXPECT_EQ(samples_of(layout, cp_group[0], 0, gbs, mbs), samples_of(layout, cp_group[1], 0, gbs, mbs))
        << "ranks " << cp_group[0] << " and " << cp_group[1];
  }
  // The two halves of a dp-cp group split by data rank read disjoint samples.
  EXPECT_EQ(DataShard::of(layout, 0).size, 2);
  EXPECT_EQ(DataShard::of(layout, 0).rank, 0);
  EXPECT_EQ(DataShard::of(layout, 2).rank, 0);  // cp rank 1, dp rank 0
  EXPECT_EQ(DataShard::of(layout, 4).rank, 1);
  EXPECT_EQ(samples_of(layout, 0, 0, gbs, mbs), (std::vector<int64_t>{0, 1, 4, 5}));
  EXPECT_EQ(samples_of(layout, 4, 0, gbs, mbs), (std::vector<int64_t>{2, 3, 6, 7}));
}

TEST(DataShard, EveryModelReplicaReadsTheWholeBatchExactlyOnce) {
  // For several layouts: over the ranks of one (tp, cp, pp) position, i.e. one rank per data
  // shard, the samples read are the global batch, each once; and every rank of a TP, CP or PP
  // group reads what its group's first member reads.
  struct L { int world, tp, cp, pp; };
  for (const L l : {L{4, 1, 2, 1}, L{8, 1, 4, 1}, L{16, 2, 2, 2}, L{8, 2, 1, 2}, L{8, 1, 1, 1}}) {
    ParallelConfig c;
    c.world_size = l.world;
    c.tensor_model_parallel_size = c.expert_tensor_parallel_size = l.tp;
    c.context_parallel_size = l.cp;
    c.pipeline_model_parallel_size = l.pp;
    const RankLayout layout = RankLayout::build(c);
    const int dp = layout.data_parallel_size();
    const int64_t mbs = 2, gbs = 4 * mbs * dp, first = 3 * gbs;
    std::map<std::vector<int64_t>, int> readers;
    for (int r = 0; r < l.world; ++r) {
      const auto mine = samples_of(layout, r, first, gbs, mbs);
      for (GroupKind k : {GroupKind::Tp, GroupKind::Cp, GroupKind::Pp})
        EXPECT_EQ(mine, samples_of(layout, layout.group_of(k, r).front(), first, gbs, mbs))
            << "rank " << r << " of world " << l.world;
      ++readers[mine];
    }
    ASSERT_EQ(static_cast<int>(readers.size()), dp) << "world " << l.world;
    std::set<int64_t> all;
    for (const auto& [samples, n] : readers) {
      EXPECT_EQ(n, l.world / dp);
      for (int64_t s : samples) EXPECT_TRUE(all.insert(s).second) << "sample " << s << " read twice";
    }
    EXPECT_EQ(static_cast<int64_t>(all.size()), gbs);
    EXPECT_EQ(*all.begin(), first);
    EXPECT_EQ(*all.rbegin(), first + gbs - 1);
  }
}
