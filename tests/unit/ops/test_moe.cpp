// The MoE ops on the CPU: routing decisions at hand-checked points, every gradient against f64
// finite differences, the expert-major permutation, capacity dropping and grouped GEMMs (with
// empty groups and a group holding every row).
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <numeric>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/moe.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

Stream cpu() { return Stream::cpu(); }

std::vector<int32_t> ints(const Tensor& t) { return t.to_ints(Stream::cpu()); }

double softmax_of(const std::vector<double>& l, size_t i) {
  double z = 0;
  for (double v : l) z += std::exp(v);
  return std::exp(l[i]) / z;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Routed {
  Tensor probs, indices;
};

Routed route(const Tensor& logits, const ops::RouterTopkArgs& a, const Tensor& bias = Tensor()) {
  Stream s = cpu();
  Routed r{Tensor::empty({logits.rows(), a.topk}, logits.dtype(), s),
           Tensor::empty({logits.rows(), a.topk}, DType::I32, s)};
  ops::moe_router_topk_forward(logits, bias, r.probs, r.indices, a, s);
  return r;
}

}  // namespace

TEST(MoeRouterTopk, PostSoftmaxTakesTheTopLogitsAndNormalisesOverThem) {
  Tensor logits = Tensor::from_floats({1, 3, 2, 0}, {1, 4}, DType::F64);
  Routed r = route(logits, {.topk = 2});
  EXPECT_EQ(ints(r.indices), (std::vector<int32_t>{1, 2}));
  const std::vector<double> p = test::to_doubles(r.probs);
  EXPECT_NEAR(p[0], softmax_of({3, 2}, 0), 1e-15);
  EXPECT_NEAR(p[1], softmax_of({3, 2}, 1), 1e-15);
}

TEST(MoeRouterTopk, PreSoftmaxKeepsTheFullSoftmaxScoresTimesTheScalingFactor) {
  Tensor logits = Tensor::from_floats({1, 3, 2, 0}, {1, 4}, DType::F64);
  Routed r = route(logits, {.topk = 2, .pre_softmax = true, .scaling = 2.5f});
  const std::vector<double> p = test::to_doubles(r.probs);
  EXPECT_NEAR(p[0], 2.5 * softmax_of({1, 3, 2, 0}, 1), 1e-15);
  EXPECT_NEAR(p[1], 2.5 * softmax_of({1, 3, 2, 0}, 2), 1e-15);
}

TEST(MoeRouterTopk, SigmoidScoresAreNormalisedOverTheSelectedExperts) {
  Tensor logits = Tensor::from_floats({1, 3, 2, 0}, {1, 4}, DType::F64);
  Routed r = route(logits, {.topk = 2, .score = ops::RouterScore::Sigmoid});
  const std::vector<double> p = test::to_doubles(r.probs);
  const double d = sigmoid(3) + sigmoid(2) + 1e-20;
  EXPECT_NEAR(p[0], sigmoid(3) / d, 1e-15);
  EXPECT_NEAR(p[1], sigmoid(2) / d, 1e-15);
  Routed one = route(logits, {.topk = 1, .score = ops::RouterScore::Sigmoid});
  EXPECT_NEAR(test::to_doubles(one.probs)[0], sigmoid(3), 1e-15);  // k = 1: not normalised
}

TEST(MoeRouterTopk, TiesGoToTheLowerExpert) {
  Tensor logits = Tensor::from_floats({0.5, 2, 0.5, 2, 1}, {1, 5}, DType::F64);
  EXPECT_EQ(ints(route(logits, {.topk = 3}).indices), (std::vector<int32_t>{1, 3, 4}));
  Tensor flat = Tensor::zeros({1, 5}, DType::F64, cpu());
  EXPECT_EQ(ints(route(flat, {.topk = 2}).indices), (std::vector<int32_t>{0, 1}));
}

TEST(MoeRouterTopk, ExpertBiasMovesTheSelectionButNotTheProbabilities) {
  Tensor logits = Tensor::from_floats({1, 3, 2, 0}, {1, 4}, DType::F64);
  Tensor bias = Tensor::from_floats({0, 0, 0, 5}, {4}, DType::F64);
  Routed r = route(logits, {.topk = 2, .score = ops::RouterScore::Sigmoid}, bias);
  EXPECT_EQ(ints(r.indices), (std::vector<int32_t>{3, 1}));  // 0 + 5 beats 3
  const std::vector<double> p = test::to_doubles(r.probs);
  const double d = sigmoid(0) + sigmoid(3) + 1e-20;
  EXPECT_NEAR(p[0], sigmoid(0) / d, 1e-15);
  EXPECT_NEAR(p[1], sigmoid(3) / d, 1e-15);
}

TEST(MoeRouterTopk, GroupLimitedRoutingStaysInsideTheBestGroups) {
  // 8 experts in 4 groups of 2: g0 {5, 4.95}, g1 {4.5, 0}, g2 {4.9, 0}, g3 {1, 0}.
  Tensor logits = Tensor::from_floats({5, 4.95, 4.5, 0, 4.9, 0, 1, 0}, {1, 8}, DType::F64);
  // top-3 from the best 2 groups, each scored by its best topk / group_topk = 1 member:
  // g0 (5) and g2 (4.9) are kept, so expert 2 (4.5) loses to expert 4 (4.9) and 1 (4.95).
  ops::RouterTopkArgs a{.topk = 3, .num_groups = 4, .group_topk = 2};
  EXPECT_EQ(ints(route(logits, a).indices), (std::vector<int32_t>{0, 1, 4}));
  // One group kept, scored by its best two members: both experts come from g0.
  a.group_topk = 1;
  a.topk = 2;
  EXPECT_EQ(ints(route(logits, a).indices), (std::vector<int32_t>{0, 1}));
  // Device-limited (each group scored by its best member), 2 groups kept: g0 (5) and g2 (4.9);
  // g1 is dropped although its 4.6 beats the rest of g0.
  ops::RouterTopkArgs dev{.topk = 2, .num_groups = 4, .group_topk = 2,
                          .group_score = ops::RouterGroupScore::Max};
  Tensor l2 = Tensor::from_floats({5, 0, 4.5, 4.6, 4.9, 0, 1, 0}, {1, 8}, DType::F64);
  EXPECT_EQ(ints(route(l2, dev).indices), (std::vector<int32_t>{0, 4}));
}

TEST(MoeRouterTopk, BackwardMatchesFiniteDifferencesForEveryScoreFunction) {
  Stream s = cpu();
  const int64_t rows = 5, experts = 6;
  struct Case {
    const char* name;
    ops::RouterTopkArgs args;
  };
  const Case cases[] = {
      {"post-softmax", {.topk = 2}},
      {"post-softmax scaled", {.topk = 3, .scaling = 1.7f}},
      {"pre-softmax", {.topk = 2, .pre_softmax = true, .scaling = 0.5f}},
      {"pre-softmax k=1", {.topk = 1, .pre_softmax = true}},
      {"sigmoid", {.topk = 2, .score = ops::RouterScore::Sigmoid}},
      {"sigmoid k=1", {.topk = 1, .score = ops::RouterScore::Sigmoid, .scaling = 2.0f}},
  };
  for (const Case& c : cases) {
    Tensor logits = test::random_tensor({rows, experts}, 11, DType::F64, -2.0f, 2.0f);
    Routed r = route(logits, c.args);
    Tensor dprobs = test::random_tensor({rows, c.args.topk}, 12, DType::F64);
    Tensor probs = Tensor::empty(r.probs.shape(), DType::F64, s);
    Tensor idx = Tensor::empty(r.indices.shape(), DType::I32, s);
    auto loss = [&] {
      ops::moe_router_topk_forward(logits, Tensor(), probs, idx, c.args, s);
      EXPECT_EQ(ints(idx), ints(r.indices)) << c.name << ": selection changed under the step";
      return test::inner(dprobs, probs);
    };
    Tensor dlogits = Tensor::empty({rows, experts}, DType::F64, s);
    ops::fill(dlogits, 1e30f, s);
    ops::moe_router_topk_backward(dprobs, logits, r.indices, dlogits, c.args, s);
    EXPECT_LT(test::rel_l2(test::to_doubles(dlogits), test::finite_difference(logits, loss)),
              test::kFiniteDiffRelTolF64)
        << c.name;
  }
}

TEST(MoeRouterTopk, SinkhornSpreadsTokensThatAllPreferOneExpert) {
  // Every token prefers expert 0 by a margin; plain top-1 sends all of them there, Sinkhorn's
  // balanced assignment does not.
  const int64_t rows = 8, experts = 4;
  std::vector<float> v = test::random_floats(rows * experts, 5, 0.0f, 0.5f);
  for (int64_t t = 0; t < rows; ++t) v[static_cast<size_t>(t * experts)] += 1.0f;
  Tensor logits = Tensor::from_floats(v, {rows, experts}, DType::F64);
  ops::RouterTopkArgs plain{.topk = 1, .score = ops::RouterScore::Sigmoid};
  for (int32_t e : ints(route(logits, plain).indices)) EXPECT_EQ(e, 0);
  ops::RouterTopkArgs sk = plain;
  sk.selection = ops::RouterSelection::Sinkhorn;
  std::vector<int> count(experts, 0);
  Routed r = route(logits, sk);
  for (int32_t e : ints(r.indices)) ++count[static_cast<size_t>(e)];
  EXPECT_LT(count[0], rows);
  EXPECT_GE(*std::min_element(count.begin(), count.end()), 1);
  // probs are still the sigmoid of the chosen logit (k = 1)
  const std::vector<double> p = test::to_doubles(r.probs);
  const std::vector<int32_t> idx = ints(r.indices);
  for (int64_t t = 0; t < rows; ++t)
    EXPECT_NEAR(p[static_cast<size_t>(t)], sigmoid(v[static_cast<size_t>(t * experts + idx[static_cast<size_t>(t)])]), 1e-6);
}

TEST(MoeExpertChoice, EachExpertPicksItsBestRowsOfEverySequence) {
  Stream s = cpu();
  // Two sequences of 3 rows, 2 experts, capacity 1.
  Tensor logits = Tensor::from_floats({0, 1,  //
                                       2, 0,  //
                                       1, 3,  //
                                       5, 4,  //
                                       0, 6,  //
                                       1, 1},
                                      {6, 2}, DType::F64);
  Tensor probs = Tensor::empty({6, 2}, DType::F64, s);
  Tensor idx = Tensor::empty({6, 2}, DType::I32, s);
  ops::moe_expert_choice_forward(logits, probs, idx, {.capacity = 1, .seq = 3}, s);
  EXPECT_EQ(ints(idx), (std::vector<int32_t>{-1, -1, 0, -1, -1, 1, 0, -1, -1, 1, -1, -1}));
  const std::vector<double> p = test::to_doubles(probs);
  EXPECT_EQ(p[2], 1.0);  // a row chosen by one expert gets its whole weight
  EXPECT_EQ(p[0], 0.0);
  // Capacity 2 in sequence 0: expert 0 takes rows 1 and 2, expert 1 rows 2 and 0; row 2 holds both.
  ops::moe_expert_choice_forward(logits, probs, idx, {.capacity = 2, .seq = 3}, s);
  const std::vector<int32_t> i2 = ints(idx);
  EXPECT_EQ(i2[4], 0);
  EXPECT_EQ(i2[5], 1);
  const std::vector<double> p2 = test::to_doubles(probs);
  EXPECT_NEAR(p2[4], softmax_of({1, 3}, 0), 1e-15);
  EXPECT_NEAR(p2[5], softmax_of({1, 3}, 1), 1e-15);
}

TEST(MoeExpertChoice, GatesBackwardMatchesFiniteDifferences) {
  Stream s = cpu();
  const int64_t rows = 8, experts = 4;
  for (ops::RouterScore score : {ops::RouterScore::Softmax, ops::RouterScore::Sigmoid}) {
    Tensor logits = test::random_tensor({rows, experts}, 21, DType::F64, -2.0f, 2.0f);
    Tensor probs = Tensor::empty({rows, experts}, DType::F64, s);
    Tensor idx = Tensor::empty({rows, experts}, DType::I32, s);
    const ops::ExpertChoiceArgs ec{.capacity = 2, .seq = 4, .score = score};
    ops::moe_expert_choice_forward(logits, probs, idx, ec, s);
    const std::vector<int32_t> chosen = ints(idx);
    Tensor dprobs = test::random_tensor({rows, experts}, 22, DType::F64);
    auto loss = [&] {
      ops::moe_expert_choice_forward(logits, probs, idx, ec, s);
      EXPECT_EQ(ints(idx), chosen);
      return test::inner(dprobs, probs);
    };
    Tensor dlogits = Tensor::empty({rows, experts}, DType::F64, s);
    ops::moe_router_topk_backward(dprobs, logits, idx, dlogits,
                                  {.topk = static_cast<int>(experts), .score = score}, s);
    EXPECT_LT(test::rel_l2(test::to_doubles(dlogits), test::finite_difference(logits, loss)),
              test::kFiniteDiffRelTolF64);
  }
}

TEST(MoeRouterLoss, AuxAndZLossGradientsMatchFiniteDifferences) {
  Stream s = cpu();
  const int64_t rows = 6, experts = 5;
  Tensor logits = test::random_tensor({rows, experts}, 31, DType::F64, -2.0f, 2.0f);
  // Two groups of 3 rows (per-sequence weights), offset 0.
  Tensor w = test::random_tensor({2, experts}, 32, DType::F64, 0.0f, 3.0f);
  const ops::RowGroups groups{.rows_per_group = 3, .row_offset = 0};
  const double aux_coeff = 0.3, z_coeff = 0.05;
  auto loss = [&] {
    Tensor sums = Tensor::zeros({2, experts}, DType::F64, s);
    Tensor lse = Tensor::zeros({1}, DType::F64, s);
    ops::moe_router_stats(logits, sums, lse, groups, s);
    return aux_coeff * test::inner(sums, w) + z_coeff * test::to_doubles(lse)[0];
  };
  Tensor dlogits = Tensor::zeros({rows, experts}, DType::F64, s);
  ops::moe_router_loss_backward(logits, w, dlogits,
                                {.aux_coeff = static_cast<float>(aux_coeff),
                                 .z_coeff = static_cast<float>(z_coeff), .groups = groups},
                                s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dlogits), test::finite_difference(logits, loss)), 1e-6);
}

TEST(MoeRouterLoss, StatsGroupRowsByTheirGlobalSequence) {
  Stream s = cpu();
  // Rows 2..5 of sequences of 4 rows: rows 2, 3 are in sequence 0, rows 4, 5 in sequence 1.
  Tensor indices = Tensor::from_ints({0, 1, 1, 2, 0, 2, 0, 1}, {4, 2});
  Tensor counts = Tensor::zeros({2, 3}, DType::F32, s);
  ops::moe_count_tokens(indices, counts, {.rows_per_group = 4, .row_offset = 2}, s);
  EXPECT_EQ(counts.to_floats(s), (std::vector<float>{1, 2, 1, 2, 1, 1}));
  // Dropped slots (-1) are not counted.
  Tensor dropped = Tensor::from_ints({0, -1, -1, -1}, {2, 2});
  Tensor c1 = Tensor::zeros({1, 3}, DType::F32, s);
  ops::moe_count_tokens(dropped, c1, {}, s);
  EXPECT_EQ(c1.to_floats(s), (std::vector<float>{1, 0, 0}));
}

TEST(MoeRouterLoss, ExpertChoiceAuxIsOneWhenBalancedAndItsGradientMatchesFiniteDifferences) {
  Stream s = cpu();
  const int64_t rows = 6, experts = 3;
  // Equal logits, every row chosen by k = 2 experts: sum_t (sum_e s_te) n_t = sum_e sum_t s_te 2
  // = 2 E, i.e. 1 after dividing by E k as the aux loss does.
  Tensor flat = Tensor::zeros({rows, experts}, DType::F64, s);
  Tensor n = Tensor::from_floats(std::vector<float>(rows, 2.0f), {rows}, DType::F64);
  Tensor value = Tensor::zeros({1}, DType::F64, s);
  Tensor scratch = Tensor::zeros({rows, experts}, DType::F64, s);
  ops::moe_expert_choice_aux(flat, n, value, scratch, 0.0f, s);
  EXPECT_NEAR(test::to_doubles(value)[0] / (experts * 2), 1.0, 1e-12);

  Tensor logits = test::random_tensor({rows, experts}, 41, DType::F64, -2.0f, 2.0f);
  Tensor counts = Tensor::from_floats({1, 0, 3, 2, 2, 1}, {rows}, DType::F64);
  auto loss = [&] {
    Tensor v = Tensor::zeros({1}, DType::F64, s);
    Tensor d = Tensor::zeros({rows, experts}, DType::F64, s);
    ops::moe_expert_choice_aux(logits, counts, v, d, 0.0f, s);
    return test::to_doubles(v)[0];
  };
  Tensor v = Tensor::zeros({1}, DType::F64, s);
  Tensor dlogits = Tensor::zeros({rows, experts}, DType::F64, s);
  ops::moe_expert_choice_aux(logits, counts, v, dlogits, 1.0f, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dlogits), test::finite_difference(logits, loss)), 1e-6);
}

TEST(MoeCapacity, KeepsTheMostProbableOrTheEarliestSlotsOfEachExpert) {
  Stream s = cpu();
  // 4 tokens, top-2 of 3 experts; expert 0 is chosen by tokens 0, 1, 3 (probs .6 .3 .9).
  Tensor indices = Tensor::from_ints({0, 1, 0, 2, 1, 2, 2, 0}, {4, 2});
  Tensor probs = Tensor::from_floats({.6f, .4f, .3f, .7f, .5f, .5f, .1f, .9f}, {4, 2});
  Tensor kept = Tensor::empty({4, 2}, DType::I32, s);
  ops::moe_capacity_drop(probs, indices, kept, 2, 3, ops::CapacityDropPolicy::Probs, s);
  // expert 0 keeps tokens 3 (.9) and 0 (.6); expert 2 (tokens 1 .7, 2 .5, 3 .1) keeps 1 and 2.
  EXPECT_EQ(ints(kept), (std::vector<int32_t>{0, 1, -1, 2, 1, 2, -1, 0}));
  ops::moe_capacity_drop(probs, indices, kept, 2, 3, ops::CapacityDropPolicy::Position, s);
  EXPECT_EQ(ints(kept), (std::vector<int32_t>{0, 1, 0, 2, 1, 2, -1, -1}));
  ops::moe_capacity_drop(probs, indices, kept, 0, 3, ops::CapacityDropPolicy::Position, s);
  EXPECT_EQ(ints(kept), (std::vector<int32_t>(8, -1)));
}

TEST(MoePermute, PlanIsExpertMajorWithTokensInOrderAndSkipsOtherExperts) {
  Stream s = cpu();
  // 4 tokens x 2 slots over experts 0..3; local range [1, 3).
  Tensor indices = Tensor::from_ints({2, 1, 0, 2, 1, 3, 2, -1}, {4, 2});
  Tensor dest = Tensor::empty({4, 2}, DType::I32, s);
  Tensor counts = Tensor::empty({4}, DType::I32, s);
  ops::moe_dispatch_plan(indices, 0, 4, dest, counts, s);
  EXPECT_EQ(ints(counts), (std::vector<int32_t>{1, 2, 3, 1}));
  // expert 0: token 1 -> 0; expert 1: tokens 0, 2 -> 1, 2; expert 2: tokens 0, 1, 3 -> 3, 4, 5;
  // expert 3: token 2 -> 6.
  EXPECT_EQ(ints(dest), (std::vector<int32_t>{3, 1, 0, 4, 2, 6, 5, -1}));
  Tensor local = Tensor::empty({2}, DType::I32, s);
  ops::moe_dispatch_plan(indices, 1, 2, dest, local, s);
  EXPECT_EQ(ints(local), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(ints(dest), (std::vector<int32_t>{2, 0, -1, 3, 1, -1, 4, -1}));
}

TEST(MoePermute, UnpermuteIsTheProbWeightedSumAndItsBackwardMatchesFiniteDifferences) {
  Stream s = cpu();
  const int64_t tokens = 5, k = 2, experts = 3, h = 4;
  Tensor indices = Tensor::from_ints({0, 2, 1, 0, 2, 1, 0, -1, 1, 2}, {tokens, k});
  Tensor dest = Tensor::empty({tokens, k}, DType::I32, s);
  Tensor counts = Tensor::empty({experts}, DType::I32, s);
  ops::moe_dispatch_plan(indices, 0, experts, dest, counts, s);
  const std::vector<int32_t> c = ints(counts);
  const int64_t n = std::accumulate(c.begin(), c.end(), int64_t{0});
  ASSERT_EQ(n, 9);
  Tensor x = test::random_tensor({tokens, h}, 51, DType::F64);
  Tensor xp = Tensor::empty({n, h}, DType::F64, s);
  ops::moe_permute(x, dest, xp, s);
  // Permute then unpermute without weights: each token times its number of slots.
  Tensor back = Tensor::empty({tokens, h}, DType::F64, s);
  ops::moe_unpermute(xp, dest, Tensor(), back, s);
  const std::vector<double> xv = test::to_doubles(x), bv = test::to_doubles(back);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < h; ++j)
      EXPECT_DOUBLE_EQ(bv[static_cast<size_t>(t * h + j)], (t == 3 ? 1 : 2) * xv[static_cast<size_t>(t * h + j)]);

  Tensor y = test::random_tensor({n, h}, 52, DType::F64);
  Tensor probs = test::random_tensor({tokens, k}, 53, DType::F64, 0.0f, 1.0f);
  Tensor dout = test::random_tensor({tokens, h}, 54, DType::F64);
  Tensor out = Tensor::empty({tokens, h}, DType::F64, s);
  Tensor dy = Tensor::empty({n, h}, DType::F64, s), dprobs = Tensor::empty({tokens, k}, DType::F64, s);
  ops::moe_unpermute_backward(dout, y, dest, probs, dy, dprobs, s);
  auto loss = [&] {
    ops::moe_unpermute(y, dest, probs, out, s);
    return test::inner(dout, out);
  };
  EXPECT_LT(test::rel_l2(test::to_doubles(dy), test::finite_difference(y, loss)), test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(dprobs), test::finite_difference(probs, loss)),
            test::kFiniteDiffRelTolF64);
  EXPECT_EQ(test::to_doubles(dprobs)[7], 0.0);  // the empty slot
}

TEST(GroupedGemm, MatchesOneGemmPerGroupIncludingEmptyAndFullGroups) {
  Stream s = cpu();
  const int64_t k = 5, n = 3;
  for (const std::vector<int64_t>& sizes :
       {std::vector<int64_t>{3, 0, 4}, std::vector<int64_t>{0, 7, 0}, std::vector<int64_t>{0, 0, 0}}) {
    const int64_t groups = 3;
    const int64_t rows = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    Tensor a = test::random_tensor({rows, k}, 61, DType::F64);
    Tensor w = test::random_tensor({groups * n, k}, 62, DType::F64);  // G stacked [n, k]
    Tensor bias = test::random_tensor({groups, n}, 63, DType::F64);
    Tensor c = Tensor::empty({rows, n}, DType::F64, s);
    ops::grouped_gemm(a, w, c, sizes, {.trans_b = true, .bias = &bias}, s);
    // Reference: group by group with the plain gemm.
    Tensor ref = Tensor::empty({rows, n}, DType::F64, s);
    int64_t r = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t m = sizes[static_cast<size_t>(g)];
      if (m > 0) {
        Tensor cg = ref.narrow(r, m);
        Tensor bg = bias.slice_flat(g * n, {n});
        ops::gemm(a.narrow(r, m), w.slice_flat(g * n * k, {n, k}), cg, {.trans_b = true, .bias = &bg}, s);
      }
      r += m;
    }
    EXPECT_EQ(test::to_doubles(c), test::to_doubles(ref));

    // Weight gradients: dW_g += dY_g^T X_g, accumulated; an empty group leaves its block as is.
    Tensor dy = test::random_tensor({rows, n}, 64, DType::F64);
    Tensor dw = test::random_tensor({groups * n, k}, 65, DType::F64);
    Tensor dw_ref = Tensor::empty(dw.shape(), DType::F64, s);
    ops::copy(dw, dw_ref, s);
    ops::grouped_gemm(dy, a, dw, sizes, {.trans_a = true, .beta = 1.0f}, s);
    r = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t m = sizes[static_cast<size_t>(g)];
      Tensor dg = dw_ref.slice_flat(g * n * k, {n, k});
      if (m > 0) ops::gemm(dy.narrow(r, m), a.narrow(r, m), dg, {.trans_a = true, .beta = 1.0f}, s);
      r += m;
    }
    EXPECT_EQ(test::to_doubles(dw), test::to_doubles(dw_ref));
  }
}

TEST(GroupedGemm, RejectsSizesThatDoNotCoverTheRows) {
  Stream s = cpu();
  Tensor a = Tensor::zeros({4, 2}, DType::F32, s), w = Tensor::zeros({6, 2}, DType::F32, s);
  Tensor c = Tensor::zeros({4, 3}, DType::F32, s);
  EXPECT_THROW(ops::grouped_gemm(a, w, c, {1, 2}, {.trans_b = true}, s), Error);
  EXPECT_NO_THROW(ops::grouped_gemm(a, w, c, {1, 3}, {.trans_b = true}, s));
}

TEST(MoeRandomLogits, StandardNormalValuesKeyedByGlobalCoordinates) {
  Stream s = cpu();
  // 6 samples of 10 positions, 16 experts: mean ~0 and variance ~1 over 960 values.
  const int64_t seq = 10, rows = 60, experts = 16;
  const ops::RandomLogitsArgs whole{.seed = 7, .layer = 3, .seq_len = seq, .sample_offset = 4};
  Tensor all = Tensor::empty({rows, experts}, DType::F64, s);
  ops::moe_random_logits(all, whole, s);
  const std::vector<double> v = test::to_doubles(all);
  double mean = 0, var = 0;
  for (double x : v) mean += x / static_cast<double>(v.size());
  for (double x : v) var += (x - mean) * (x - mean) / static_cast<double>(v.size() - 1);
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(var, 1.0, 0.12);
  // Every value distinct (no two experts or tokens share a draw).
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());

  // An SP shard (rows 25..39 of the micro-batch) draws exactly the whole tensor's rows.
  Tensor shard = Tensor::empty({15, experts}, DType::F64, s);
  ops::RandomLogitsArgs sa = whole;
  sa.row_offset = 25;
  ops::moe_random_logits(shard, sa, s);
  const std::vector<double> sv = test::to_doubles(shard);
  for (int64_t i = 0; i < 15 * experts; ++i) ASSERT_EQ(sv[static_cast<size_t>(i)], v[static_cast<size_t>(25 * experts + i)]) << i;

  // A CP shard holding chunks 0 and 4 of length 1 of each 10-position sample (local seq 2) draws
  // the values of global positions 0 and 4 of the same samples.
  Tensor cp = Tensor::empty({12, experts}, DType::F64, s);
  ops::RandomLogitsArgs ca = whole;
  ca.seq_len = 2;
  ca.chunks = ops::ChunkMap{1, 0, 4};
  ops::moe_random_logits(cp, ca, s);
  const std::vector<double> cv = test::to_doubles(cp);
  for (int64_t b = 0; b < 6; ++b)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t e = 0; e < experts; ++e)
        ASSERT_EQ(cv[static_cast<size_t>((b * 2 + j) * experts + e)],
                  v[static_cast<size_t>((b * seq + (j == 0 ? 0 : 4)) * experts + e)]) << b << " " << j << " " << e;

  // Another layer or seed draws other values.
  Tensor other = Tensor::empty({rows, experts}, DType::F64, s);
  ops::RandomLogitsArgs oa = whole;
  oa.layer = 4;
  ops::moe_random_logits(other, oa, s);
  EXPECT_NE(test::to_doubles(other), v);
}

TEST(MoeRandomLogits, TopKOverRandomLogitsSpreadsTheLoad) {
  // 512 tokens, top-8 of 64 experts: every expert gets about 64 slots (max/mean well under 2),
  // where logits favouring a few experts would give every slot to 8 of them (max/mean 8).
  Stream s = cpu();
  const int64_t rows = 512, experts = 64;
  Tensor logits = Tensor::empty({rows, experts}, DType::F32, s);
  ops::moe_random_logits(logits, {.seed = 1, .layer = 0, .seq_len = 128}, s);
  ops::RouterTopkArgs a;
  a.topk = 8;
  const Routed r = route(logits, a);
  std::vector<int> load(static_cast<size_t>(experts), 0);
  for (int32_t e : ints(r.indices)) ++load[static_cast<size_t>(e)];
  const double mean = static_cast<double>(rows * 8) / static_cast<double>(experts);
  const int most = *std::max_element(load.begin(), load.end());
  EXPECT_LT(most / mean, 1.6);
  EXPECT_GT(*std::min_element(load.begin(), load.end()), 0);
}
