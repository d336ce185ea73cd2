// Runs of gradient-norm pieces (parallel/data_parallel/grad_norm_runs.h): a run may only join
// pieces that touch and share an accumulator. TP-replicated and split pieces interleave in a
// real layout (norm weights between split linears), as do dense and expert ones, and a tied
// weight's copy or padding leaves a gap that no run may cover.
#include <gtest/gtest.h>
#include <cmath>
#include <random>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/data_parallel/grad_norm_runs.h"

using namespace megadlm;

namespace {

bool same(const NormPiece& a, const NormPiece& b) {
  return a.offset == b.offset && a.count == b.count && a.target == b.target;
}

}  // namespace

TEST(GradNormRuns, MergesOnlyTouchingPiecesOfOneTarget) {
  // Given out of order, as for_each_owned_piece yields them (registration order, laid out in
  // reverse): [0,10) t0 | [10,20) t1 | [20,30) t0 | [30,40) t0 | gap | [45,50) t0 | [50,60) t2.
  const std::vector<NormPiece> runs = coalesce_norm_pieces({{.offset = 50, .count = 10, .target = 2},
                                                            {.offset = 30, .count = 10, .target = 0},
                                                            {.offset = 45, .count = 5, .target = 0},
                                                            {.offset = 20, .count = 10, .target = 0},
                                                            {.offset = 10, .count = 10, .target = 1},
                                                            {.offset = 0, .count = 10, .target = 0},
                                                            {.offset = 40, .count = 0, .target = 1}});
  const std::vector<NormPiece> want = {{.offset = 0, .count = 10, .target = 0},
                                       {.offset = 10, .count = 10, .target = 1},
                                       {.offset = 20, .count = 20, .target = 0},
                                       {.offset = 45, .count = 5, .target = 0},
                                       {.offset = 50, .count = 10, .target = 2}};
  ASSERT_EQ(runs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(same(runs[i], want[i])) << "run " << i << ": [" << runs[i].offset << ", +"
                                        << runs[i].count << ") target " << runs[i].target;
}

TEST(GradNormRuns, RunsStopGrowingAtTheirLimit) {
  // Four touching pieces of 10, limit 25: [0,20) and [20,40); a piece of 30 stays whole.
  const std::vector<NormPiece> runs = coalesce_norm_pieces({{.offset = 0, .count = 10, .target = 0},
                                                            {.offset = 10, .count = 10, .target = 0},
                                                            {.offset = 20, .count = 10, .target = 0},
                                                            {.offset = 30, .count = 10, .target = 0},
                                                            {.offset = 40, .count = 30, .target = 0}},
                                                           25);
  const std::vector<NormPiece> want = {{.offset = 0, .count = 20, .target = 0},
                                       {.offset = 20, .count = 20, .target = 0},
                                       {.offset = 40, .count = 30, .target = 0}};
  ASSERT_EQ(runs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same(runs[i], want[i])) << "run " << i;
}

TEST(GradNormRuns, OverlappingPiecesAreRejected) {
  EXPECT_THROW(coalesce_norm_pieces({{.offset = 0, .count = 10, .target = 0},
                                     {.offset = 5, .count = 10, .target = 0}}),
               Error);
}

TEST(GradNormRuns, RunSumsEqualThePerPieceSumsOfEachAccumulator) {
  // A layout like TP's: split weights (target 0) with replicated norms (target 1) between
  // them, expert split/replicated pieces after them (2, 3), padding gaps poisoned with NaN.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> value(-1.0, 1.0);
  std::uniform_int_distribution<int> size(1, 40), target(0, 3), gap(0, 3);
  std::vector<NormPiece> pieces;
  int64_t at = 0;
  for (int i = 0; i < 200; ++i) {
    const int t = i < 100 ? target(rng) % 2 : 2 + target(rng) % 2;
    pieces.push_back({.offset = at, .count = size(rng), .target = t});
    at += pieces.back().count + (gap(rng) == 0 ? 3 : 0);
  }
  Tensor g = Tensor::empty({at}, DType::F64, Stream::cpu());
  double* p = g.data<double>();
  for (int64_t e = 0; e < at; ++e) p[e] = std::nan("");
  for (const NormPiece& q : pieces)
    for (int64_t e = q.offset; e < q.offset + q.count; ++e) p[e] = value(rng);

  auto sums = [&](const std::vector<NormPiece>& list, size_t* launches) {
    std::vector<Tensor> acc;
    for (int t = 0; t < 4; ++t) acc.push_back(Tensor::zeros({1}, DType::F64, Stream::cpu()));
    for (const NormPiece& q : list)
      ops::sum_squares(g.slice_flat(q.offset, {q.count}), acc[static_cast<size_t>(q.target)], Stream::cpu());
    *launches = list.size();
    std::vector<double> out;
    for (const Tensor& a : acc) out.push_back(a.data<double>()[0]);
    return out;
  };
  std::vector<NormPiece> shuffled = pieces;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  size_t per_piece = 0, per_run = 0;
  const std::vector<double> want = sums(pieces, &per_piece);
  const std::vector<double> got = sums(coalesce_norm_pieces(shuffled), &per_run);
  for (int t = 0; t < 4; ++t) {
    ASSERT_TRUE(std::isfinite(got[static_cast<size_t>(t)])) << "a run covered a gap (target " << t << ")";
    // f64 sums of 200 pieces of O(1) squares: only the summation order differs.
    EXPECT_NEAR(got[static_cast<size_t>(t)], want[static_cast<size_t>(t)], 1e-12 * want[static_cast<size_t>(t)])
        << "target " << t;
  }
  EXPECT_LT(per_run, per_piece) << "neighbours of one target were not merged";
}

TEST(GradNormRuns, TargetsFollowTheParameterKindAndTheGroupsThatExist) {
  ParamDesc split, replicated, expert_split, expert_replicated;
  split.tp.split = TpSplit::Rows;
  expert_split.tp.split = TpSplit::Cols;
  expert_split.expert = expert_replicated.expert = true;
  const NormTpGroups both{.tp = true, .expert_tp = true};
  EXPECT_EQ(norm_target(split, both), kNormSplit);
  EXPECT_EQ(norm_target(replicated, both), kNormReplicated);
  EXPECT_EQ(norm_target(expert_split, both), kNormExpertSplit);
  EXPECT_EQ(norm_target(expert_replicated, both), kNormExpertReplicated);
  // Without the group a parameter could be replicated over, it counts on every rank.
  EXPECT_EQ(norm_target(replicated, {.tp = false, .expert_tp = true}), kNormSplit);
  EXPECT_EQ(norm_target(expert_replicated, {.tp = true, .expert_tp = false}), kNormExpertSplit);
  EXPECT_EQ(norm_target(replicated, {.tp = true, .expert_tp = false}), kNormReplicated);
}

TEST(GradNormRuns, SumNormPiecesSumsEachTargetAndSkipsGaps) {
  // g = 1..8; target 0 takes [0,2) and [6,8) (1+4, 49+64), target 2 takes [3,5) (16+25); element
  // 2 and 5 are gaps, target 1 and 3 have no pieces. Small integers: every sum is exact in fp32.
  Tensor g = Tensor::from_floats({1, 2, 3, 4, 5, 6, 7, 8}, {8}, DType::F32);
  const NormSums s = sum_norm_pieces(g,
                                     {{.offset = 6, .count = 2, .target = kNormSplit},
                                      {.offset = 3, .count = 2, .target = kNormExpertSplit},
                                      {.offset = 0, .count = 2, .target = kNormSplit}},
                                     Stream::cpu());
  EXPECT_EQ(s.split, 1 + 4 + 49 + 64);
  EXPECT_EQ(s.replicated, 0);
  EXPECT_EQ(s.expert_split, 16 + 25);
  EXPECT_EQ(s.expert_replicated, 0);
  const NormSums r = sum_norm_pieces(g,
                                     {{.offset = 0, .count = 1, .target = kNormSplit},
                                      {.offset = 1, .count = 1, .target = kNormReplicated},
                                      {.offset = 2, .count = 1, .target = kNormExpertSplit},
                                      {.offset = 3, .count = 1, .target = kNormExpertReplicated}},
                                     Stream::cpu());
  EXPECT_EQ(r.dense(true), 1 + 4);
  EXPECT_EQ(r.dense(false), 1);  // replicated parameters count on TP rank 0 only
  EXPECT_EQ(r.expert(true), 9 + 16);
  EXPECT_EQ(r.expert(false), 9);
}
