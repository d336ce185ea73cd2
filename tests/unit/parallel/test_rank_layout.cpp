// Rank groups against Megatron's worked examples (A–F, lists Megatron's RankGenerator computes:
// every list, in group order and member order) and against an independent recomputation from the
// closed forms (rank_layout.h) for many layouts up to 4096 ranks. Everything here is integer arithmetic: exact.
#include <gtest/gtest.h>
#include <algorithm>
#include <chrono>
#include "megadlm/core/error.h"
#include "megadlm/parallel/rank_layout.h"

// Layouts are written as designated initializers naming only the sizes that matter; GCC 12 warns
// about the omitted members anyway.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace megadlm;
using namespace megadlm::parallel;

namespace {

using Groups = std::vector<std::vector<int>>;

struct Sizes {
  int world = 1, tp = 1, pp = 1, cp = 1, ep = 1, etp = 0;  // etp 0 = tp
  bool tp_pp_dp = false;
  int instances = 1;
  std::vector<int> hierarchical;
};

ParallelConfig make(const Sizes& s) {
  ParallelConfig c;
  c.world_size = s.world;
  c.tensor_model_parallel_size = s.tp;
  c.pipeline_model_parallel_size = s.pp;
  c.context_parallel_size = s.cp;
  c.expert_model_parallel_size = s.ep;
  c.expert_tensor_parallel_size = s.etp == 0 ? s.tp : s.etp;
  c.use_tp_pp_dp_mapping = s.tp_pp_dp;
  c.num_distributed_optimizer_instances = s.instances;
  c.hierarchical_context_parallel_sizes = s.hierarchical;
  return c;
}

Groups singletons(int n) {
  Groups g;
  for (int i = 0; i < n; ++i) g.push_back({i});
  return g;
}

Groups range_groups(int n, int size) {  // [0..size-1] [size..2size-1] ...
  Groups g;
  for (int start = 0; start < n; start += size) {
    g.emplace_back();
    for (int r = start; r < start + size; ++r) g.back().push_back(r);
  }
  return g;
}

}  // namespace

// ---------------------------------------------------------------------------- RankGenerator

TEST(RankGenerator, AppendsMissingDimensionsInMegatronOrder) {
  RankGenerator g({.tp = 2, .cp = 1, .ep = 1, .dp = 2, .pp = 2}, "tp-pp-dp");
  EXPECT_EQ(g.dims(), (std::vector<std::string>{"tp", "pp", "dp", "ep", "cp"}));
  EXPECT_EQ(g.stride_of("tp"), 1);
  EXPECT_EQ(g.stride_of("pp"), 2);
  EXPECT_EQ(g.stride_of("dp"), 4);
  EXPECT_EQ(g.world_size(), 8);
}

TEST(RankGenerator, TokenOrderDoesNotMatter) {
  RankGenerator g({.tp = 2, .cp = 2, .ep = 1, .dp = 2, .pp = 2}, "tp-cp-ep-dp-pp");
  EXPECT_EQ(g.get_ranks("tp-pp"), g.get_ranks("pp-tp"));
  EXPECT_EQ(g.get_ranks("dp-cp"), g.get_ranks("cp-dp"));
}

TEST(RankGenerator, RejectsOrdersThatCannotHoldTheSizes) {
  EXPECT_THROW(RankGenerator({.tp = 2, .cp = 2, .ep = 1, .dp = 1, .pp = 1}, "tp-pp-dp"), Error);
  EXPECT_THROW(RankGenerator({.tp = 1, .cp = 2, .ep = 2, .dp = 1, .pp = 1}, "tp-cp-ep-dp-pp"), Error);
  EXPECT_THROW(RankGenerator({.tp = 1}, "tp-xp-dp"), Error);
  EXPECT_THROW(RankGenerator({.tp = 1}, "tp-tp-dp"), Error);
  EXPECT_THROW(RankGenerator({.tp = 0}, "tp-cp-ep-dp-pp"), Error);
  RankGenerator ok({.tp = 2}, "tp-cp-ep-dp-pp");
  EXPECT_THROW(ok.get_ranks("tp-zz"), Error);
}

// ------------------------------------------------------------------------ Example A

TEST(RankLayout, MatchesMegatronExampleA) {
  const RankLayout L = RankLayout::build(make({.world = 16, .tp = 2, .pp = 2, .cp = 2}));
  EXPECT_EQ(L.data_parallel_size(), 2);
  EXPECT_EQ(L.expert_data_parallel_size(), 4);
  EXPECT_EQ(L.groups(GroupKind::Tp), range_groups(16, 2));
  EXPECT_EQ(L.groups(GroupKind::Cp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(L.groups(GroupKind::Dp),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(L.groups(GroupKind::DpCp),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  const Groups pp{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}};
  EXPECT_EQ(L.groups(GroupKind::Pp), pp);
  EXPECT_EQ(L.groups(GroupKind::TpPp),
            (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(L.groups(GroupKind::Embedding), pp);
  EXPECT_EQ(L.groups(GroupKind::PositionEmbedding), singletons(8));
  EXPECT_EQ(L.groups(GroupKind::TpDpCp), range_groups(16, 8));
  EXPECT_EQ(L.groups(GroupKind::TpDp),
            (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}}));
  EXPECT_EQ(L.groups(GroupKind::TpCp), range_groups(16, 4));
  EXPECT_EQ(L.groups(GroupKind::ExpertEp), singletons(16));
  EXPECT_EQ(L.groups(GroupKind::ExpertTp), range_groups(16, 2));
  EXPECT_EQ(L.groups(GroupKind::ExpertTpEp), range_groups(16, 2));
  EXPECT_EQ(L.groups(GroupKind::ExpertTpEpPp),
            (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(L.groups(GroupKind::ExpertDp),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  // Ranks of the last stage belong to no position-embedding group.
  EXPECT_TRUE(L.group_of(GroupKind::PositionEmbedding, 9).empty());
  EXPECT_EQ(L.rank_in_group(GroupKind::PositionEmbedding, 9), -1);
  // Rank 13 = tp 1, cp 0, dp 1, pp 1 (13 = 1 + 2·0 + 4·1 + 8·1).
  const RankCoordinates x = L.coordinates(13);
  EXPECT_EQ(x.tp, 1);
  EXPECT_EQ(x.cp, 0);
  EXPECT_EQ(x.dp, 1);
  EXPECT_EQ(x.pp, 1);
  EXPECT_EQ(x.ep, 0);
  EXPECT_EQ(x.expert_tp, 1);
  EXPECT_EQ(x.expert_dp, 2);
  EXPECT_EQ(L.pipeline_next_rank(13), 5);
  EXPECT_EQ(L.pipeline_prev_rank(5), 13);
}

// ------------------------------------------------------------------------ Example B (MoE)

TEST(RankLayout, MatchesMegatronExampleB) {
  const RankLayout L = RankLayout::build(make({.world = 16, .tp = 2, .pp = 2, .ep = 4}));
  EXPECT_EQ(L.data_parallel_size(), 4);
  EXPECT_EQ(L.expert_data_parallel_size(), 1);
  const Groups dp{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}};
  EXPECT_EQ(L.groups(GroupKind::Tp), range_groups(16, 2));
  EXPECT_EQ(L.groups(GroupKind::Dp), dp);
  EXPECT_EQ(L.groups(GroupKind::DpCp), dp);
  EXPECT_EQ(L.groups(GroupKind::Cp), singletons(16));
  EXPECT_EQ(L.groups(GroupKind::Pp),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(L.groups(GroupKind::TpPp),
            (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(L.groups(GroupKind::TpDp), range_groups(16, 8));
  EXPECT_EQ(L.groups(GroupKind::TpCp), range_groups(16, 2));
  EXPECT_EQ(L.groups(GroupKind::ExpertEp), dp);
  EXPECT_EQ(L.groups(GroupKind::ExpertTp), range_groups(16, 2));
  EXPECT_EQ(L.groups(GroupKind::ExpertTpEp), range_groups(16, 8));
  EXPECT_EQ(L.groups(GroupKind::ExpertTpEpPp), range_groups(16, 16));
  EXPECT_EQ(L.groups(GroupKind::ExpertDp), singletons(16));
}

// ---------------------------------------------------- Example C (MoE, CP, different expert TP)

TEST(RankLayout, MatchesMegatronExampleC) {
  const RankLayout L = RankLayout::build(make({.world = 16, .tp = 2, .pp = 1, .cp = 2, .ep = 4, .etp = 1}));
  EXPECT_EQ(L.data_parallel_size(), 4);
  EXPECT_EQ(L.expert_data_parallel_size(), 4);
  const Groups strided4{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}};
  EXPECT_EQ(L.groups(GroupKind::Tp), range_groups(16, 2));
  EXPECT_EQ(L.groups(GroupKind::Cp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(L.groups(GroupKind::Dp), strided4);
  EXPECT_EQ(L.groups(GroupKind::DpCp),
            (Groups{{0, 2, 4, 6, 8, 10, 12, 14}, {1, 3, 5, 7, 9, 11, 13, 15}}));
  EXPECT_EQ(L.groups(GroupKind::TpDp),
            (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(L.groups(GroupKind::TpCp), range_groups(16, 4));
  EXPECT_EQ(L.groups(GroupKind::TpDpCp), range_groups(16, 16));
  EXPECT_EQ(L.groups(GroupKind::ExpertEp), range_groups(16, 4));
  EXPECT_EQ(L.groups(GroupKind::ExpertTp), singletons(16));
  EXPECT_EQ(L.groups(GroupKind::ExpertTpEp), range_groups(16, 4));
  EXPECT_EQ(L.groups(GroupKind::ExpertTpEpPp), range_groups(16, 4));
  EXPECT_EQ(L.groups(GroupKind::ExpertDp), strided4);
}

// ------------------------------------------------------ Example D (--use-tp-pp-dp-mapping)

TEST(RankLayout, MatchesMegatronExampleD) {
  const RankLayout L = RankLayout::build(make({.world = 8, .tp = 2, .pp = 2, .tp_pp_dp = true}));
  EXPECT_EQ(L.groups(GroupKind::Tp), range_groups(8, 2));
  EXPECT_EQ(L.groups(GroupKind::Pp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(L.groups(GroupKind::Dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(L.groups(GroupKind::TpPp), range_groups(8, 4));
  EXPECT_EQ(L.groups(GroupKind::Embedding), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  // The same sizes with the default order.
  const RankLayout D = RankLayout::build(make({.world = 8, .tp = 2, .pp = 2}));
  EXPECT_EQ(D.groups(GroupKind::Pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(D.groups(GroupKind::Dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(D.groups(GroupKind::TpPp), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
}

TEST(RankLayout, TpPpDpMappingNeedsEqualDenseAndExpertTp) {
  // pp stride is tp (dense) and etp (expert) in tp-pp-dp: the pp groups would differ (G-4).
  EXPECT_THROW(RankLayout::build(make({.world = 8, .tp = 2, .pp = 2, .etp = 1, .tp_pp_dp = true})),
               Error);
}

// ---------------------------------------------------------- Example E (hierarchical CP)

TEST(RankLayout, MatchesMegatronExampleE) {
  const RankLayout L =
      RankLayout::build(make({.world = 16, .tp = 2, .cp = 8, .hierarchical = {2, 4}}));
  EXPECT_EQ(L.groups(GroupKind::Cp),
            (Groups{{0, 2, 4, 6, 8, 10, 12, 14}, {1, 3, 5, 7, 9, 11, 13, 15}}));
  ASSERT_EQ(L.num_hierarchical_cp_levels(), 2);
  EXPECT_EQ(L.hierarchical_cp_groups(0),
            (Groups{{0, 2}, {4, 6}, {8, 10}, {12, 14}, {1, 3}, {5, 7}, {9, 11}, {13, 15}}));
  EXPECT_EQ(L.hierarchical_cp_groups(1),
            (Groups{{0, 4, 8, 12}, {2, 6, 10, 14}, {1, 5, 9, 13}, {3, 7, 11, 15}}));
  EXPECT_EQ(L.hierarchical_cp_group_of(0, 6), (std::vector<int>{4, 6}));
  EXPECT_EQ(L.hierarchical_cp_group_of(1, 6), (std::vector<int>{2, 6, 10, 14}));
}

TEST(RankLayout, HierarchicalCpLevelsFollowTheGenericIllustration) {
  // Sizes [2, 2, 4] over a 16-member cp group (tp = 1, so R[i] = i).
  const RankLayout L = RankLayout::build(make({.world = 16, .cp = 16, .hierarchical = {2, 2, 4}}));
  EXPECT_EQ(L.hierarchical_cp_groups(0), range_groups(16, 2));
  EXPECT_EQ(L.hierarchical_cp_groups(1), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10},
                                                 {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(L.hierarchical_cp_groups(2),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_THROW(RankLayout::build(make({.world = 16, .cp = 16, .hierarchical = {2, 4}})), Error);
}

// ------------------------------------------------- Example F (distributed-optimizer instances)

TEST(RankLayout, MatchesMegatronExampleF) {
  const RankLayout L = RankLayout::build(make({.world = 16, .tp = 2, .instances = 2}));
  EXPECT_EQ(L.groups(GroupKind::DpCp),
            (Groups{{0, 2, 4, 6, 8, 10, 12, 14}, {1, 3, 5, 7, 9, 11, 13, 15}}));
  EXPECT_EQ(L.groups(GroupKind::DistOptIntra),
            (Groups{{0, 2, 4, 6}, {8, 10, 12, 14}, {1, 3, 5, 7}, {9, 11, 13, 15}}));
  EXPECT_EQ(L.groups(GroupKind::DistOptInter), (Groups{{0, 8}, {2, 10}, {4, 12}, {6, 14}, {1, 9},
                                                       {3, 11}, {5, 13}, {7, 15}}));
}

TEST(RankLayout, DistOptInstancesSliceTheWholeDpCpGroup) {
  // The upstream fix (docs/compat.md): n = dp·cp / N, so the intra groups cover every dp-cp member even
  // with CP (MegaDLMs' dp / N would leave half of each dp-cp group out here).
  const RankLayout L = RankLayout::build(make({.world = 16, .cp = 2, .instances = 4}));
  ASSERT_EQ(L.groups(GroupKind::DpCp), range_groups(16, 16));
  EXPECT_EQ(L.groups(GroupKind::DistOptIntra), range_groups(16, 4));
  EXPECT_EQ(L.groups(GroupKind::DistOptInter),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_THROW(RankLayout::build(make({.world = 12, .instances = 5})), Error);
}

TEST(RankLayout, EmbeddingGroupsHoldFirstAndLastStage) {
  const RankLayout one = RankLayout::build(make({.world = 4, .tp = 2}));
  EXPECT_EQ(one.groups(GroupKind::Embedding), (Groups{{0}, {1}, {2}, {3}}));
  const RankLayout four = RankLayout::build(make({.world = 8, .tp = 2, .pp = 4}));
  EXPECT_EQ(four.groups(GroupKind::Pp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(four.groups(GroupKind::Embedding), (Groups{{0, 6}, {1, 7}}));
  EXPECT_EQ(four.groups(GroupKind::PositionEmbedding), (Groups{{0}, {1}}));
  EXPECT_TRUE(four.group_of(GroupKind::Embedding, 2).empty());  // middle stage
  EXPECT_EQ(four.pipeline_next_rank(6), 0);                       // wraps around
}

TEST(RankLayout, RejectsSizesThatDoNotTileTheWorld) {
  EXPECT_THROW(RankLayout::build(make({.world = 12, .tp = 2, .pp = 2, .cp = 2})), Error);
  EXPECT_THROW(RankLayout::build(make({.world = 8, .ep = 16, .etp = 1})), Error);
  EXPECT_THROW(RankLayout::build(make({.world = 8, .tp = 0})), Error);
  const RankLayout L = RankLayout::build(make({.world = 4}));
  EXPECT_THROW(L.group_of(GroupKind::Tp, 4), Error);
  EXPECT_THROW(L.coordinates(-1), Error);
}

// ------------------------------------------------ independent recomputation (closed forms)

namespace {

struct Dense {
  int tp, cp, dp, pp;
  int rank(int t, int c, int d, int p) const { return t + tp * (c + cp * (d + dp * p)); }
};

// Checks groups(kind) against a generator of expected groups, O(world) per kind: for group g,
// `expected(g)` is the exact member list.
template <typename F>
void expect_groups(const RankLayout& L, GroupKind kind, int num_groups, F expected,
                   const std::string& where) {
  const Groups& got = L.groups(kind);
  ASSERT_EQ(static_cast<int>(got.size()), num_groups) << where << " " << group_kind_name(kind);
  std::vector<int> seen(static_cast<size_t>(L.world_size()), 0);
  for (int g = 0; g < num_groups; ++g) {
    const std::vector<int> want = expected(g);
    ASSERT_EQ(got[static_cast<size_t>(g)], want)
        << where << " " << group_kind_name(kind) << " group " << g;
    for (size_t i = 0; i < want.size(); ++i) {
      ++seen[static_cast<size_t>(want[i])];
      ASSERT_EQ(L.rank_in_group(kind, want[i]), static_cast<int>(i));
      ASSERT_EQ(&L.group_of(kind, want[i]), &got[static_cast<size_t>(g)]);
    }
  }
  for (int r = 0; r < L.world_size(); ++r)
    ASSERT_EQ(seen[static_cast<size_t>(r)], 1)
        << where << " " << group_kind_name(kind) << ": rank " << r << " not in exactly one group";
}

void check_layout(int tp, int cp, int dp, int pp, int ep, int etp) {
  const int world = tp * cp * dp * pp;
  const std::string where = "world " + std::to_string(world) + " tp " + std::to_string(tp) +
                            " cp " + std::to_string(cp) + " dp " + std::to_string(dp) + " pp " +
                            std::to_string(pp) + " ep " + std::to_string(ep) + " etp " +
                            std::to_string(etp);
  const RankLayout L = RankLayout::build(make({.world = world, .tp = tp, .pp = pp, .cp = cp,
                                               .ep = ep, .etp = etp}));
  ASSERT_EQ(L.data_parallel_size(), dp) << where;
  const Dense D{tp, cp, dp, pp};
  // Dense groups: the group index is the mixed-radix number of the unmasked coordinates
  // (generator order tp, cp, [ep = 1], dp, pp; first fastest), members run over the masked ones.
  expect_groups(L, GroupKind::Tp, cp * dp * pp, [&](int g) {
    std::vector<int> m;
    for (int t = 0; t < tp; ++t) m.push_back(D.rank(t, g % cp, g / cp % dp, g / (cp * dp)));
    return m;
  }, where);
  expect_groups(L, GroupKind::Cp, tp * dp * pp, [&](int g) {
    std::vector<int> m;
    for (int c = 0; c < cp; ++c) m.push_back(D.rank(g % tp, c, g / tp % dp, g / (tp * dp)));
    return m;
  }, where);
  expect_groups(L, GroupKind::Dp, tp * cp * pp, [&](int g) {
    std::vector<int> m;
    for (int d = 0; d < dp; ++d) m.push_back(D.rank(g % tp, g / tp % cp, d, g / (tp * cp)));
    return m;
  }, where);
  expect_groups(L, GroupKind::Pp, tp * cp * dp, [&](int g) {
    std::vector<int> m;
    for (int p = 0; p < pp; ++p) m.push_back(D.rank(g % tp, g / tp % cp, g / (tp * cp), p));
    return m;
  }, where);
  expect_groups(L, GroupKind::DpCp, tp * pp, [&](int g) {
    std::vector<int> m;
    for (int d = 0; d < dp; ++d)
      for (int c = 0; c < cp; ++c) m.push_back(D.rank(g % tp, c, d, g / tp));
    return m;
  }, where);
  expect_groups(L, GroupKind::TpPp, cp * dp, [&](int g) {
    std::vector<int> m;
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t) m.push_back(D.rank(t, g % cp, g / cp, p));
    return m;
  }, where);
  expect_groups(L, GroupKind::TpDp, cp * pp, [&](int g) {
    std::vector<int> m;
    for (int d = 0; d < dp; ++d)
      for (int t = 0; t < tp; ++t) m.push_back(D.rank(t, g % cp, d, g / cp));
    return m;
  }, where);
  expect_groups(L, GroupKind::TpCp, dp * pp, [&](int g) {
    std::vector<int> m;
    for (int c = 0; c < cp; ++c)
      for (int t = 0; t < tp; ++t) m.push_back(D.rank(t, c, g % dp, g / dp));
    return m;
  }, where);
  expect_groups(L, GroupKind::TpDpCp, pp, [&](int g) {
    std::vector<int> m;
    for (int d = 0; d < dp; ++d)
      for (int c = 0; c < cp; ++c)
        for (int t = 0; t < tp; ++t) m.push_back(D.rank(t, c, d, g));
    return m;
  }, where);
  // Expert groups: rank = etp_r + etp·(ep_r + ep·(edp_r + edp·pp_r)).
  const int edp = world / (etp * ep * pp);
  ASSERT_EQ(L.expert_data_parallel_size(), edp) << where;
  auto erank = [&](int t, int e, int d, int p) { return t + etp * (e + ep * (d + edp * p)); };
  expect_groups(L, GroupKind::ExpertTp, ep * edp * pp, [&](int g) {
    std::vector<int> m;
    for (int t = 0; t < etp; ++t) m.push_back(erank(t, g % ep, g / ep % edp, g / (ep * edp)));
    return m;
  }, where);
  expect_groups(L, GroupKind::ExpertEp, etp * edp * pp, [&](int g) {
    std::vector<int> m;
    for (int e = 0; e < ep; ++e) m.push_back(erank(g % etp, e, g / etp % edp, g / (etp * edp)));
    return m;
  }, where);
  expect_groups(L, GroupKind::ExpertDp, etp * ep * pp, [&](int g) {
    std::vector<int> m;
    for (int d = 0; d < edp; ++d) m.push_back(erank(g % etp, g / etp % ep, d, g / (etp * ep)));
    return m;
  }, where);
  expect_groups(L, GroupKind::ExpertTpEp, edp * pp, [&](int g) {
    std::vector<int> m;
    for (int e = 0; e < ep; ++e)
      for (int t = 0; t < etp; ++t) m.push_back(erank(t, e, g % edp, g / edp));
    return m;
  }, where);
  expect_groups(L, GroupKind::ExpertTpEpPp, edp, [&](int g) {
    std::vector<int> m;
    for (int p = 0; p < pp; ++p)
      for (int e = 0; e < ep; ++e)
        for (int t = 0; t < etp; ++t) m.push_back(erank(t, e, g, p));
    return m;
  }, where);
  // Dense and expert pipeline groups coincide (G-4): pp is the slowest dimension of both.
  RankGenerator expert({.tp = etp, .cp = 1, .ep = ep, .dp = edp, .pp = pp}, "tp-cp-ep-dp-pp");
  ASSERT_EQ(expert.get_ranks("pp"), L.groups(GroupKind::Pp)) << where;
  // Coordinates agree with the closed form on a sample of ranks.
  for (int r = 0; r < world; r += std::max(1, world / 64)) {
    const RankCoordinates x = L.coordinates(r);
    ASSERT_EQ(D.rank(x.tp, x.cp, x.dp, x.pp), r) << where;
    ASSERT_EQ(erank(x.expert_tp, x.ep, x.expert_dp, x.pp), r) << where;
  }
}

}  // namespace

TEST(RankLayout, MatchesClosedFormsForManyLayouts) {
  int checked = 0;
  for (int tp : {1, 2, 4, 8})
    for (int cp : {1, 2, 4})
      for (int pp : {1, 2, 3, 8})
        for (int dp : {1, 2, 6, 16})
          for (int ep : {1, 2, 4})
            for (int etp : {1, 2, 8}) {
              const int world = tp * cp * dp * pp;
              if (world > 4096 || (world / pp) % (ep * etp) != 0) continue;
              check_layout(tp, cp, dp, pp, ep, etp);
              if (::testing::Test::HasFatalFailure()) return;
              ++checked;
            }
  EXPECT_GT(checked, 300);
}

TEST(RankLayout, BuildsFourThousandRanksQuickly) {
  const auto start = std::chrono::steady_clock::now();
  const RankLayout L = RankLayout::build(make({.world = 4096, .tp = 8, .pp = 4, .cp = 2, .ep = 8,
                                               .etp = 1, .instances = 4, .hierarchical = {2}}));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(L.data_parallel_size(), 64);
  EXPECT_EQ(L.group_of(GroupKind::DpCp, 4095).size(), 128u);
  EXPECT_EQ(L.group_of(GroupKind::DistOptIntra, 4095).size(), 32u);
  // Generous bound (CI machines are slow); the work is O(world) per group kind.
  EXPECT_LT(seconds, 2.0);
}

// --------------------------------------------------------------------------- format_layout

TEST(RankLayout, FormatsTheLayoutOfARank) {
  const std::string text = format_layout(make({.world = 16, .tp = 2, .pp = 2, .cp = 2}), 9);
  EXPECT_NE(text.find("world size 16 = tp 2 x cp 2 x dp 2 x pp 2"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 9: tp_rank 1, cp_rank 0, dp_rank 0, pp_rank 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  tp .......................... [8, 9]"), std::string::npos) << text;
  EXPECT_NE(text.find("  dp-cp ....................... [9, 11, 13, 15]"), std::string::npos);
  EXPECT_NE(text.find("  pp .......................... [1, 9]"), std::string::npos);
  EXPECT_NE(text.find("  embedding ................... [1, 9]"), std::string::npos);
  EXPECT_NE(text.find("  position-embedding .......... (none)"), std::string::npos);
  EXPECT_NE(text.find("  expert-dp ................... [9, 11, 13, 15]"), std::string::npos);
  // Long groups stay one short line.
  const std::string big = format_layout(make({.world = 4096, .tp = 8}), 0);
  EXPECT_NE(big.find("  dp .......................... [0, 8, ..., 4088] (512 ranks)"),
            std::string::npos) << big;
  EXPECT_NE(big.find("  tp-dp ....................... [0..4095] (4096 ranks)"), std::string::npos);
}
