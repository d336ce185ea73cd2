// Unit tests of the CPU attention reference (src/ops/cpu/attention.cpp): the forward against the
// textbook softmax(Q K^T * scale) V and a direct log-sum-exp, causal and bidirectional sanity, the
// GQA head mapping, and the backward against central finite differences in f64. Attention dropout:
// the mapping of ops/attention_dropout_mask.h (worked example, threshold, keep rate, offsets), the
// op against the masked textbook formula, finite differences with a fixed mask, invariance to
// batch and head slicing, and p = 0 being exactly the path without dropout.
#include <gtest/gtest.h>
#include <cmath>
#include <limits>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/ops/elementwise.h"
#include "ops/attention_dropout_mask.h"
#include "ops/cpu/cpu_ops.h"
#include "support/attention_cases.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;

namespace {

using Case = test::AttentionCase;
using Dropout = test::AttentionDropout;
using test::kv_shape;
using test::lse_shape;
using test::name_of;
using test::q_shape;

AttentionArgs args_of(const Case& c, const Dropout& d = {}) {
  return test::attention_args(c, d, 0x5eed0123456789ull, 3);
}

/// An output buffer full of NaN: an element the op forgets to write fails every comparison.
Tensor poisoned(const Shape& shape, DType dtype) {
  return Tensor::from_floats(
      std::vector<float>(static_cast<size_t>(shape_numel(shape)),
                         std::numeric_limits<float>::quiet_NaN()),
      shape, dtype);
}

struct Inputs {
  Tensor q, k, v;
};

// Scores of std ~1 (q, k in [-1.5, 1.5), scale 1/sqrt(D)): softmax rows are neither uniform nor
// one-hot, so every term of the gradient matters.
Inputs make_inputs(const Case& c, uint64_t seed, DType dtype = DType::F64) {
  return {test::random_tensor(q_shape(c), seed, dtype, -1.5f, 1.5f),
          test::random_tensor(kv_shape(c), seed + 1, dtype, -1.5f, 1.5f),
          test::random_tensor(kv_shape(c), seed + 2, dtype)};
}

struct Outputs {
  Tensor out, lse;
};

/// Through the public op (lse f32 as the contract requires).
Outputs forward(const Inputs& in, const Case& c, DType dtype = DType::F64, const Dropout& d = {}) {
  Outputs o{poisoned(q_shape(c), dtype), poisoned(lse_shape(c), DType::F32)};
  ops::attention_forward(in.q, in.k, in.v, o.out, o.lse, args_of(c, d), Stream::cpu());
  return o;
}

/// Through the CPU backend with an f64 lse, so the backward of a gradient check is not limited by
/// the f32 rounding of the statistic (the CPU backend accepts lse in the activation dtype).
Outputs forward_f64(const Inputs& in, const Case& c, const Dropout& d = {}) {
  Outputs o{poisoned(q_shape(c), DType::F64), poisoned(lse_shape(c), DType::F64)};
  ops::cpu::attention_forward(in.q, in.k, in.v, o.out, o.lse, args_of(c, d), Stream::cpu());
  return o;
}

struct Grads {
  Tensor dq, dk, dv;
};

Grads backward(const Tensor& dout, const Inputs& in, const Outputs& o, const Case& c,
               DType dtype = DType::F64, const Dropout& d = {}) {
  Grads g{poisoned(q_shape(c), dtype), poisoned(kv_shape(c), dtype), poisoned(kv_shape(c), dtype)};
  ops::attention_backward(dout, in.q, in.k, in.v, o.out, o.lse, g.dq, g.dk, g.dv, args_of(c, d),
                          Stream::cpu());
  return g;
}

// The textbook formula, written independently of the op: materialise the [S, S] score matrix
// (masked entries -inf), softmax as exp(s) / sum exp(s) without max subtraction (the scores here
// are O(1), so no overflow), then P V. Returns out [B, S, Hq, D] and lse [B, Hq, S]. With dropout,
// P is multiplied by the keep mask of the shared mapping and by 1 / (1 - p) before P V.
void naive_attention(const Inputs& in, const Case& c, std::vector<double>& out,
                     std::vector<double>& lse, const Dropout& drop = {}) {
  const auto mask = ops::detail::AttentionDropoutMask::from_args(args_of(c, drop));
  const std::vector<double> q = test::to_doubles(in.q), k = test::to_doubles(in.k),
                            v = test::to_doubles(in.v);
  const double scale = args_of(c).softmax_scale;
  const int64_t S = c.seq, D = c.dim, group = c.heads / c.kv_heads;
  out.assign(static_cast<size_t>(shape_numel(q_shape(c))), 0.0);
  lse.assign(static_cast<size_t>(shape_numel(lse_shape(c))), 0.0);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t kh = h / group;
      std::vector<double> scores(static_cast<size_t>(S * S));
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j < S; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d)
            s += q[((b * S + i) * c.heads + h) * D + d] * k[((b * S + j) * c.kv_heads + kh) * D + d];
          const bool masked = c.mask == AttentionMask::Causal && j > i;
          scores[i * S + j] = masked ? -std::numeric_limits<double>::infinity() : s * scale;
        }
      }
      for (int64_t i = 0; i < S; ++i) {
        double z = 0;
        for (int64_t j = 0; j < S; ++j) z += std::exp(scores[i * S + j]);
        lse[(b * c.heads + h) * S + i] = std::log(z);
        for (int64_t j = 0; j < S; ++j) {
          double p = std::exp(scores[i * S + j]) / z;
          if (drop.p > 0) p = mask.keep(b, h, i, j) ? p / (1.0 - drop.p) : 0.0;
          for (int64_t d = 0; d < D; ++d)
            out[((b * S + i) * c.heads + h) * D + d] += p * v[((b * S + j) * c.kv_heads + kh) * D + d];
        }
      }
    }
  }
}

const std::vector<Case> kCases = {
    {2, 5, 2, 2, 8, AttentionMask::None},   {2, 5, 2, 2, 8, AttentionMask::Causal},
    {2, 7, 4, 2, 8, AttentionMask::None},   {2, 7, 4, 2, 8, AttentionMask::Causal},
    {1, 6, 6, 2, 5, AttentionMask::None},   {1, 6, 6, 2, 5, AttentionMask::Causal},
    {1, 1, 2, 1, 8, AttentionMask::Causal},
};

}  // namespace

TEST(Attention, ForwardMatchesNaiveSoftmaxFormula) {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name_of(c));
    const Inputs in = make_inputs(c, seed += 10);
    const Outputs o = forward(in, c);
    std::vector<double> out, lse;
    naive_attention(in, c, out, lse);
    // Both in f64 with O(1) values and at most 8-term sums: only rounding differs.
    EXPECT_LT(test::max_abs_diff(test::to_doubles(o.out), out), 1e-12);
    EXPECT_LT(test::rel_l2(test::to_doubles(o.out), out), 1e-13);
  }
}

TEST(Attention, LseMatchesDirectLogSumExp) {
  uint64_t seed = 200;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name_of(c));
    const Inputs in = make_inputs(c, seed += 10);
    std::vector<double> out, lse;
    naive_attention(in, c, out, lse);
    // f64 lse from the backend: rounding only.
    const Outputs o64 = forward_f64(in, c);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(o64.lse), lse), 1e-12);
    // f32 lse through the public op: one f32 rounding of an O(1..3) value, 2^-24 relative.
    const Outputs o32 = forward(in, c);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(o32.lse), lse), 1e-6);
  }
}

TEST(Attention, CausalFirstRowEqualsFirstValue) {
  const Case c{2, 7, 4, 2, 8, AttentionMask::Causal};
  const Inputs in = make_inputs(c, 300);
  const std::vector<double> out = test::to_doubles(forward(in, c).out);
  const std::vector<double> v = test::to_doubles(in.v);
  // Row 0 sees only key 0: its softmax weight is exp(0) / 1 = 1 exactly, so out = v[0] exactly.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t d = 0; d < c.dim; ++d)
        EXPECT_EQ(out[((b * c.seq) * c.heads + h) * c.dim + d],
                  v[((b * c.seq) * c.kv_heads + h / 2) * c.dim + d]);
}

TEST(Attention, CausalRowsIgnoreLaterKeys) {
  const Case c{1, 7, 2, 2, 8, AttentionMask::Causal};
  Inputs in = make_inputs(c, 400);
  const std::vector<double> before = test::to_doubles(forward(in, c).out);
  // Change key and value of the last position: only the last query row may change.
  const int64_t last = (c.seq - 1) * c.kv_heads * c.dim;
  for (int64_t e = 0; e < c.kv_heads * c.dim; ++e) {
    in.k.data<double>()[last + e] += 0.5;
    in.v.data<double>()[last + e] -= 0.5;
  }
  const std::vector<double> after = test::to_doubles(forward(in, c).out);
  const int64_t row = c.heads * c.dim;
  for (int64_t i = 0; i < (c.seq - 1) * row; ++i) {
    EXPECT_EQ(after[i], before[i]) << "element " << i;
  }
  EXPECT_GT(test::max_abs_diff(std::vector<double>(after.end() - row, after.end()),
                               std::vector<double>(before.end() - row, before.end())),
            1e-3);
}

TEST(Attention, BidirectionalOutputIsInvariantToPermutingKeys) {
  const Case c{2, 7, 4, 2, 8, AttentionMask::None};
  const Inputs in = make_inputs(c, 500);
  const Outputs ref = forward(in, c);
  // Move key/value position j to position perm[j] (the same permutation for k and v).
  const std::vector<int64_t> perm = {3, 6, 0, 5, 1, 4, 2};
  Inputs shuffled{in.q, poisoned(kv_shape(c), DType::F64), poisoned(kv_shape(c), DType::F64)};
  const int64_t row = c.kv_heads * c.dim;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < c.seq; ++j)
      for (int64_t e = 0; e < row; ++e) {
        const int64_t src = (b * c.seq + j) * row + e, dst = (b * c.seq + perm[j]) * row + e;
        shuffled.k.data<double>()[dst] = in.k.data<double>()[src];
        shuffled.v.data<double>()[dst] = in.v.data<double>()[src];
      }
  const Outputs o = forward(shuffled, c);
  // Same terms summed in another order: rounding only.
  EXPECT_LT(test::max_abs_diff(test::to_doubles(o.out), test::to_doubles(ref.out)), 1e-13);
  EXPECT_LT(test::max_abs_diff(test::to_doubles(o.lse), test::to_doubles(ref.lse)), 1e-6);
}

TEST(Attention, GroupedQueryHeadsMatchRepeatedKvHeads) {
  // GQA with Hkv = 2 and group 3 equals MHA whose k/v heads are repeated 3 times; the GQA dk/dv
  // equal the MHA ones summed over each group.
  for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal}) {
    const Case gqa{2, 5, 6, 2, 8, mask};
    const Case mha{2, 5, 6, 6, 8, mask};
    SCOPED_TRACE(name_of(gqa));
    const Inputs in = make_inputs(gqa, 600);
    Inputs rep{in.q, poisoned(kv_shape(mha), DType::F64), poisoned(kv_shape(mha), DType::F64)};
    const int64_t D = gqa.dim;
    for (int64_t bs = 0; bs < gqa.batch * gqa.seq; ++bs)
      for (int64_t h = 0; h < mha.heads; ++h)
        for (int64_t d = 0; d < D; ++d) {
          rep.k.data<double>()[(bs * 6 + h) * D + d] = in.k.data<double>()[(bs * 2 + h / 3) * D + d];
          rep.v.data<double>()[(bs * 6 + h) * D + d] = in.v.data<double>()[(bs * 2 + h / 3) * D + d];
        }
    const Outputs og = forward(in, gqa), om = forward(rep, mha);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(og.out), test::to_doubles(om.out)), 1e-13);
    const Tensor dout = test::random_tensor(q_shape(gqa), 601, DType::F64);
    const Grads gg = backward(dout, in, og, gqa), gm = backward(dout, rep, om, mha);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(gg.dq), test::to_doubles(gm.dq)), 1e-12);
    const std::vector<double> dkm = test::to_doubles(gm.dk), dvm = test::to_doubles(gm.dv);
    std::vector<double> dk_sum(static_cast<size_t>(gg.dk.numel()), 0.0), dv_sum = dk_sum;
    for (int64_t bs = 0; bs < gqa.batch * gqa.seq; ++bs)
      for (int64_t h = 0; h < mha.heads; ++h)
        for (int64_t d = 0; d < D; ++d) {
          dk_sum[(bs * 2 + h / 3) * D + d] += dkm[(bs * 6 + h) * D + d];
          dv_sum[(bs * 2 + h / 3) * D + d] += dvm[(bs * 6 + h) * D + d];
        }
    EXPECT_LT(test::max_abs_diff(test::to_doubles(gg.dk), dk_sum), 1e-12);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(gg.dv), dv_sum), 1e-12);
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 700;
  for (const Case& c : kCases) {
    SCOPED_TRACE(name_of(c));
    Inputs in = make_inputs(c, seed += 10);
    const Tensor dout = test::random_tensor(q_shape(c), seed + 5, DType::F64);
    const Grads g = backward(dout, in, forward_f64(in, c), c);
    // L = <dout, out(q, k, v)>, so dL/dq = dq etc.
    auto loss = [&] { return test::inner(dout, forward_f64(in, c).out); };
    const std::vector<double> fd_q = test::finite_difference(in.q, loss);
    const std::vector<double> fd_k = test::finite_difference(in.k, loss);
    const std::vector<double> fd_v = test::finite_difference(in.v, loss);
    EXPECT_LT(test::rel_l2(test::to_doubles(g.dq), fd_q), test::kFiniteDiffRelTolF64);
    EXPECT_LT(test::rel_l2(test::to_doubles(g.dk), fd_k), test::kFiniteDiffRelTolF64);
    EXPECT_LT(test::rel_l2(test::to_doubles(g.dv), fd_v), test::kFiniteDiffRelTolF64);
  }
}

TEST(Attention, F32PathMatchesF64) {
  const Case c{2, 7, 4, 2, 8, AttentionMask::Causal};
  const Inputs in64 = make_inputs(c, 800, DType::F64);
  const Inputs in32 = make_inputs(c, 800, DType::F32);  // the same numbers (they are f32 values)
  const Tensor dout64 = test::random_tensor(q_shape(c), 801, DType::F64);
  const Tensor dout32 = test::random_tensor(q_shape(c), 801, DType::F32);
  const Outputs o64 = forward(in64, c), o32 = forward(in32, c, DType::F32);
  const Grads g64 = backward(dout64, in64, o64, c), g32 = backward(dout32, in32, o32, c, DType::F32);
  // f32 rounding (2^-24) over sums of at most 8 terms of O(1) values.
  EXPECT_LT(test::rel_l2(test::to_doubles(o32.out), test::to_doubles(o64.out)), 1e-5);
  EXPECT_LT(test::rel_l2(test::to_doubles(g32.dq), test::to_doubles(g64.dq)), 1e-5);
  EXPECT_LT(test::rel_l2(test::to_doubles(g32.dk), test::to_doubles(g64.dk)), 1e-5);
  EXPECT_LT(test::rel_l2(test::to_doubles(g32.dv), test::to_doubles(g64.dv)), 1e-5);
}

TEST(Attention, RejectsHeadsThatDoNotGroup) {
  const Case c{1, 3, 3, 2, 8, AttentionMask::None};
  const Inputs in = make_inputs(c, 900);
  Tensor out = poisoned(q_shape(c), DType::F64), lse = poisoned(lse_shape(c), DType::F32);
  EXPECT_THROW(ops::attention_forward(in.q, in.k, in.v, out, lse, args_of(c), Stream::cpu()), Error);
}

// ---------------------------------------------------------------------------- attention dropout

namespace {

using ops::detail::AttentionDropoutMask;

AttentionDropoutMask mask_of(const Case& c, const Dropout& d) {
  return AttentionDropoutMask::from_args(args_of(c, d));
}

}  // namespace

TEST(AttentionDropout, MappingFollowsTheDocumentedWorkedExample) {
  // ops/attention_dropout_mask.h: sample_offset 3, head_offset 4, key_offset 8, site 2: element
  // (1, 1, 5, 6) has counter {3, 5, 4, 0x20005} and uses word 2.
  AttentionArgs a = args_of({2, 8, 2, 2, 8, AttentionMask::None},
                            {.p = 0.5f, .sample_offset = 3, .head_offset = 4, .key_offset = 8});
  a.dropout_site = 2;
  const AttentionDropoutMask m = AttentionDropoutMask::from_args(a);
  const PhiloxWords w =
      philox(PhiloxKey::make(a.dropout_seed, RngPurpose::AttentionDropout), 3, 5, 4, 0x20005u);
  EXPECT_EQ(m.keep(1, 1, 5, 6), uniform_from_u32(w.w[2]) >= 0.5f);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(m.words(1, 1, 5, 14).w[k], w.w[k]);
}

TEST(AttentionDropout, IntegerThresholdEqualsTheUniformComparison) {
  // keeps(word) is an integer compare; the contract is uniform_from_u32(word) >= p. Check the
  // words around the threshold and a spread of others for probabilities of every magnitude.
  for (float p : {1e-9f, 1e-7f, 0.0999f, 0.1f, 0.2f, 0.3f, 1.0f / 3.0f, 0.5f, 0.9f, 0.99999994f}) {
    SCOPED_TRACE(p);
    AttentionArgs a = args_of({1, 1, 1, 1, 8, AttentionMask::None});
    a.dropout_p = p;
    const AttentionDropoutMask m = AttentionDropoutMask::from_args(a);
    std::vector<uint32_t> words = {0u, 255u, 256u, 0xFFFFFFFFu, 0xFFFFFF00u};
    for (int64_t d = -600; d <= 600; ++d) {
      const int64_t w = static_cast<int64_t>(m.threshold) + d;
      if (w >= 0 && w <= 0xFFFFFFFFll) words.push_back(static_cast<uint32_t>(w));
    }
    for (uint32_t i = 0; i < 4096; ++i) words.push_back(i * 1048573u);
    for (uint32_t w : words) ASSERT_EQ(m.keeps(w), uniform_from_u32(w) >= p) << "word " << w;
  }
}

TEST(AttentionDropout, KeepRateIsOneMinusP) {
  const Case c{4, 64, 8, 8, 8, AttentionMask::None};
  for (float p : {0.1f, 0.3f, 0.5f}) {
    SCOPED_TRACE(p);
    const AttentionDropoutMask m = mask_of(c, {.p = p});
    int64_t kept = 0, n = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < 64 * 8; ++i)
          for (int64_t j = 0; j < 64; ++j, ++n) kept += m.keep(b, h, i, j);
    // n = 1M Bernoulli(1-p) draws: standard deviation of the rate <= 5e-4; allow 5 of them.
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(n), 1.0 - p, 2.5e-3);
  }
}

TEST(AttentionDropout, MaskDependsOnlyOnGlobalCoordinates) {
  // A shard that starts at (sample, head, query, key) offsets sees the same bits as the whole
  // problem at the shifted indices: batch, tensor-parallel and context-parallel layouts agree.
  const Case c{4, 16, 8, 8, 8, AttentionMask::None};
  const AttentionDropoutMask whole = mask_of(c, {.p = 0.3f});
  const AttentionDropoutMask shard = mask_of(
      c, {.p = 0.3f, .sample_offset = 2, .head_offset = 3, .query_offset = 5, .key_offset = 7});
  int64_t differ = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 5; ++h)
      for (int64_t i = 0; i < 11; ++i)
        for (int64_t j = 0; j < 9; ++j) {
          EXPECT_EQ(shard.keep(b, h, i, j), whole.keep(b + 2, h + 3, i + 5, j + 7));
          differ += shard.keep(b, h, i, j) != whole.keep(b, h, i, j);
        }
  EXPECT_GT(differ, 0) << "the offsets must move the mask";
  // Different sites (layers) and seeds draw different masks.
  AttentionArgs other_site = args_of(c, {.p = 0.3f});
  other_site.dropout_site = 4;
  AttentionArgs other_seed = args_of(c, {.p = 0.3f});
  other_seed.dropout_seed += 1;
  const AttentionDropoutMask ms = AttentionDropoutMask::from_args(other_site);
  const AttentionDropoutMask md = AttentionDropoutMask::from_args(other_seed);
  int64_t differ_site = 0, differ_seed = 0;
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 16; ++j) {
      differ_site += ms.keep(0, 0, i, j) != whole.keep(0, 0, i, j);
      differ_seed += md.keep(0, 0, i, j) != whole.keep(0, 0, i, j);
    }
  EXPECT_GT(differ_site, 0);
  EXPECT_GT(differ_seed, 0);
}

TEST(AttentionDropout, ForwardMatchesMaskedTextbookFormula) {
  uint64_t seed = 1100;
  const Dropout drop{.p = 0.3f, .sample_offset = 5, .head_offset = 1, .query_offset = 2,
                     .key_offset = 6};
  for (const Case& c : kCases) {
    SCOPED_TRACE(name_of(c));
    const Inputs in = make_inputs(c, seed += 10);
    const Outputs o = forward(in, c, DType::F64, drop);
    std::vector<double> out, lse, out_plain, lse_plain;
    naive_attention(in, c, out, lse, drop);
    naive_attention(in, c, out_plain, lse_plain);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(o.out), out), 1e-12);
    // lse is that of the undropped scores.
    EXPECT_LT(test::max_abs_diff(test::to_doubles(o.lse), lse_plain), 1e-6);
    if (c.seq > 1) {
      EXPECT_GT(test::max_abs_diff(out, out_plain), 1e-3) << "nothing was dropped";
    }
  }
}

TEST(AttentionDropout, BackwardMatchesFiniteDifferences) {
  // The mask is a function of the coordinates only, so the dropped attention is a smooth function
  // of q, k, v and central differences apply. MHA and GQA, both masks, odd S, offsets.
  uint64_t seed = 1200;
  const Dropout drop{.p = 0.3f, .sample_offset = 7, .head_offset = 2, .query_offset = 1,
                     .key_offset = 3};
  for (const Case& c : kCases) {
    SCOPED_TRACE(name_of(c));
    Inputs in = make_inputs(c, seed += 10);
    const Tensor dout = test::random_tensor(q_shape(c), seed + 5, DType::F64);
    const Grads g = backward(dout, in, forward_f64(in, c, drop), c, DType::F64, drop);
    auto loss = [&] { return test::inner(dout, forward_f64(in, c, drop).out); };
    const std::vector<double> fd_q = test::finite_difference(in.q, loss);
    const std::vector<double> fd_k = test::finite_difference(in.k, loss);
    const std::vector<double> fd_v = test::finite_difference(in.v, loss);
    if (c.seq == 1) {
      // One key: out = z v does not depend on q, k, so dq = dk = 0 exactly, while the backward
      // forms dP and D = dO.out in different orders (rounding ~1e-16, not relative to zero).
      EXPECT_LT(test::max_abs_diff(test::to_doubles(g.dq), fd_q), 1e-12);
      EXPECT_LT(test::max_abs_diff(test::to_doubles(g.dk), fd_k), 1e-12);
    } else {
      EXPECT_LT(test::rel_l2(test::to_doubles(g.dq), fd_q), test::kFiniteDiffRelTolF64);
      EXPECT_LT(test::rel_l2(test::to_doubles(g.dk), fd_k), test::kFiniteDiffRelTolF64);
    }
    EXPECT_LT(test::rel_l2(test::to_doubles(g.dv), fd_v), test::kFiniteDiffRelTolF64);
  }
}

TEST(AttentionDropout, BatchAndHeadSlicesDropTheSameElements) {
  // The whole batch (global samples 10..13) against the slice holding samples 12..13, and all 4
  // query heads against the slice holding heads 2..3 (KV head 1 of group 2): every output and
  // gradient of the slice equals the corresponding part of the whole, bit for bit.
  for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal}) {
    const Case whole{4, 7, 4, 2, 8, mask};
    SCOPED_TRACE(name_of(whole));
    const Dropout dw{.p = 0.3f, .sample_offset = 10};
    const Inputs in = make_inputs(whole, 1300);
    const Tensor dout = test::random_tensor(q_shape(whole), 1305, DType::F64);
    const Outputs ow = forward(in, whole, DType::F64, dw);
    const Grads gw = backward(dout, in, ow, whole, DType::F64, dw);
    const int64_t S = whole.seq, D = whole.dim;

    // Batch rows 2..3 are the trailing half of every tensor.
    const Case bcase{2, S, 4, 2, D, mask};
    const Dropout db{.p = 0.3f, .sample_offset = 12};
    auto tail = [](const Tensor& t) {
      const std::vector<double> v = test::to_doubles(t);
      return std::vector<double>(v.begin() + static_cast<long>(v.size() / 2), v.end());
    };
    auto tensor_of = [](const std::vector<double>& v, const Shape& shape) {
      Tensor t = Tensor::zeros(shape, DType::F64, Stream::cpu());
      std::copy(v.begin(), v.end(), t.data<double>());
      return t;
    };
    const Inputs bin{tensor_of(tail(in.q), q_shape(bcase)), tensor_of(tail(in.k), kv_shape(bcase)),
                     tensor_of(tail(in.v), kv_shape(bcase))};
    const Outputs ob = forward(bin, bcase, DType::F64, db);
    const Grads gb =
        backward(tensor_of(tail(dout), q_shape(bcase)), bin, ob, bcase, DType::F64, db);
    EXPECT_EQ(test::to_doubles(ob.out), tail(ow.out));
    EXPECT_EQ(test::to_doubles(ob.lse), tail(ow.lse));
    EXPECT_EQ(test::to_doubles(gb.dq), tail(gw.dq));
    EXPECT_EQ(test::to_doubles(gb.dk), tail(gw.dk));
    EXPECT_EQ(test::to_doubles(gb.dv), tail(gw.dv));

    // Query heads 2..3 with KV head 1: gather [B, S, 2, D] and [B, S, 1, D] slices.
    const Case hcase{4, S, 2, 1, D, mask};
    const Dropout dh{.p = 0.3f, .sample_offset = 10, .head_offset = 2};
    auto heads = [&](const Tensor& t, int64_t nh, int64_t first, int64_t count) {
      const std::vector<double> v = test::to_doubles(t);
      std::vector<double> r;
      for (int64_t bs = 0; bs < whole.batch * S; ++bs)
        for (int64_t h = first; h < first + count; ++h)
          for (int64_t d = 0; d < D; ++d)
            r.push_back(v[static_cast<size_t>((bs * nh + h) * D + d)]);
      return r;
    };
    const Inputs hin{tensor_of(heads(in.q, 4, 2, 2), q_shape(hcase)),
                     tensor_of(heads(in.k, 2, 1, 1), kv_shape(hcase)),
                     tensor_of(heads(in.v, 2, 1, 1), kv_shape(hcase))};
    const Outputs oh = forward(hin, hcase, DType::F64, dh);
    const Grads gh = backward(tensor_of(heads(dout, 4, 2, 2), q_shape(hcase)), hin, oh, hcase,
                              DType::F64, dh);
    EXPECT_EQ(test::to_doubles(oh.out), heads(ow.out, 4, 2, 2));
    EXPECT_EQ(test::to_doubles(gh.dq), heads(gw.dq, 4, 2, 2));
    EXPECT_EQ(test::to_doubles(gh.dk), heads(gw.dk, 2, 1, 1));
    EXPECT_EQ(test::to_doubles(gh.dv), heads(gw.dv, 2, 1, 1));
  }
}

TEST(AttentionDropout, ZeroProbabilityIsExactlyThePathWithoutDropout) {
  // p = 0 with every other dropout field set: identical bits to the default arguments.
  const Dropout zero{.p = 0.0f, .sample_offset = 9, .head_offset = 4, .query_offset = 3,
                     .key_offset = 5};
  for (DType dtype : {DType::F32, DType::F64}) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(name_of(c));
      const Inputs in = make_inputs(c, 1400, dtype);
      const Tensor dout = test::random_tensor(q_shape(c), 1405, dtype);
      const Outputs a = forward(in, c, dtype), b = forward(in, c, dtype, zero);
      const Grads ga = backward(dout, in, a, c, dtype), gb = backward(dout, in, b, c, dtype, zero);
      EXPECT_EQ(test::to_doubles(a.out), test::to_doubles(b.out));
      EXPECT_EQ(test::to_doubles(a.lse), test::to_doubles(b.lse));
      EXPECT_EQ(test::to_doubles(ga.dq), test::to_doubles(gb.dq));
      EXPECT_EQ(test::to_doubles(ga.dk), test::to_doubles(gb.dk));
      EXPECT_EQ(test::to_doubles(ga.dv), test::to_doubles(gb.dv));
    }
  }
}

TEST(AttentionDropout, F32PathMatchesF64) {
  const Case c{2, 7, 4, 2, 8, AttentionMask::Causal};
  const Dropout drop{.p = 0.2f, .sample_offset = 1};
  const Inputs in64 = make_inputs(c, 1500, DType::F64);
  const Inputs in32 = make_inputs(c, 1500, DType::F32);
  const Tensor dout64 = test::random_tensor(q_shape(c), 1501, DType::F64);
  const Tensor dout32 = test::random_tensor(q_shape(c), 1501, DType::F32);
  const Outputs o64 = forward(in64, c, DType::F64, drop), o32 = forward(in32, c, DType::F32, drop);
  const Grads g64 = backward(dout64, in64, o64, c, DType::F64, drop);
  const Grads g32 = backward(dout32, in32, o32, c, DType::F32, drop);
  // Same mask in both; f32 rounding only (the fp32 1/(1-p) differs from the f64 one by 2^-24).
  EXPECT_LT(test::rel_l2(test::to_doubles(o32.out), test::to_doubles(o64.out)), 1e-5);
  EXPECT_LT(test::rel_l2(test::to_doubles(g32.dq), test::to_doubles(g64.dq)), 1e-5);
  EXPECT_LT(test::rel_l2(test::to_doubles(g32.dk), test::to_doubles(g64.dk)), 1e-5);
  EXPECT_LT(test::rel_l2(test::to_doubles(g32.dv), test::to_doubles(g64.dv)), 1e-5);
}

TEST(AttentionDropout, RejectsInvalidArguments) {
  const Case c{1, 3, 2, 2, 8, AttentionMask::None};
  const Inputs in = make_inputs(c, 1600);
  Tensor out = poisoned(q_shape(c), DType::F64), lse = poisoned(lse_shape(c), DType::F32);
  for (float p : {-0.1f, 1.0f, 1.5f}) {
    EXPECT_THROW(ops::attention_forward(in.q, in.k, in.v, out, lse, args_of(c, {.p = p}),
                                        Stream::cpu()),
                 Error)
        << p;
  }
  // The counter holds 16 bits of global head.
  EXPECT_THROW(ops::attention_forward(in.q, in.k, in.v, out, lse,
                                      args_of(c, {.p = 0.1f, .head_offset = 65535}), Stream::cpu()),
               Error);
  EXPECT_THROW(ops::attention_forward(in.q, in.k, in.v, out, lse,
                                      args_of(c, {.p = 0.1f, .sample_offset = -1}), Stream::cpu()),
               Error);
  // A head offset only matters with dropout.
  EXPECT_NO_THROW(ops::attention_forward(in.q, in.k, in.v, out, lse,
                                         args_of(c, {.p = 0.0f, .head_offset = 65535}),
                                         Stream::cpu()));
}

// Per-document (packed) attention: a row holding documents [0,3) [3,5) [5,7) gives exactly what
// attention over each document alone gives, forward and backward (same summation order over
// the same keys, so the comparison is exact), bidirectional and causal.
TEST(Attention, DocumentIdsKeepPackedDocumentsApart) {
  const std::vector<int64_t> bounds = {0, 3, 5, 7};
  for (AttentionMask mask : {AttentionMask::None, AttentionMask::Causal}) {
    const Case whole{1, 7, 2, 1, 4, mask};
    const Stream s = Stream::cpu();
    const Tensor q = test::random_tensor(q_shape(whole), 901, DType::F64);
    const Tensor k = test::random_tensor(kv_shape(whole), 902, DType::F64);
    const Tensor v = test::random_tensor(kv_shape(whole), 903, DType::F64);
    const Tensor dout = test::random_tensor(q_shape(whole), 904, DType::F64);
    const Tensor docs = Tensor::from_ints({0, 0, 0, 1, 1, 2, 2}, {1, 7});
    AttentionArgs a = args_of(whole);
    a.document_ids = &docs;
    Tensor out = Tensor::zeros(q_shape(whole), DType::F64, s), lse = Tensor::zeros(lse_shape(whole), DType::F64, s);
    ops::attention_forward(q, k, v, out, lse, a, s);
    Tensor dq = Tensor::zeros(q_shape(whole), DType::F64, s), dk = Tensor::zeros(kv_shape(whole), DType::F64, s),
           dv = Tensor::zeros(kv_shape(whole), DType::F64, s);
    ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, a, s);
    // Rows [lo, hi) of a [1, S, H, D] tensor as its own tensor.
    auto rows = [](const Tensor& t, int64_t lo, int64_t hi, int64_t h, int64_t d) {
      std::vector<double> x = test::to_doubles(t);
      Tensor r = Tensor::zeros({1, hi - lo, h, d}, DType::F64, Stream::cpu());
      for (int64_t i = 0; i < (hi - lo) * h * d; ++i) r.data<double>()[i] = x[static_cast<size_t>(lo * h * d + i)];
      return r;
    };
    for (size_t part = 0; part + 1 < bounds.size(); ++part) {
      const int64_t lo = bounds[part], hi = bounds[part + 1];
      const Case one{1, hi - lo, 2, 1, 4, mask};
      const Tensor qp = rows(q, lo, hi, 2, 4), kp = rows(k, lo, hi, 1, 4), vp = rows(v, lo, hi, 1, 4);
      Tensor op = Tensor::zeros(q_shape(one), DType::F64, s), lp = Tensor::zeros(lse_shape(one), DType::F64, s);
      ops::attention_forward(qp, kp, vp, op, lp, args_of(one), s);
      Tensor dqp = Tensor::zeros(q_shape(one), DType::F64, s), dkp = Tensor::zeros(kv_shape(one), DType::F64, s),
             dvp = Tensor::zeros(kv_shape(one), DType::F64, s);
      ops::attention_backward(rows(dout, lo, hi, 2, 4), qp, kp, vp, op, lp, dqp, dkp, dvp, args_of(one), s);
      EXPECT_EQ(test::to_doubles(rows(out, lo, hi, 2, 4)), test::to_doubles(op)) << "document " << part;
      EXPECT_EQ(test::to_doubles(rows(dq, lo, hi, 2, 4)), test::to_doubles(dqp)) << "document " << part;
      EXPECT_EQ(test::to_doubles(rows(dk, lo, hi, 1, 4)), test::to_doubles(dkp)) << "document " << part;
      EXPECT_EQ(test::to_doubles(rows(dv, lo, hi, 1, 4)), test::to_doubles(dvp)) << "document " << part;
    }
  }
}

TEST(Attention, PackedQkvEqualsSeparateTensors) {
  // The packed entries read q, k, v from one [B, S, (Hq + 2 Hkv) D] buffer and write dq, dk, dv
  // into one: the same numbers as the separate-tensor op on the split columns.
  const Stream s = Stream::cpu();
  const Case c{2, 9, 4, 2, 8, AttentionMask::Causal};
  const AttentionArgs a = args_of(c);
  const int64_t t = c.batch * c.seq, width = (c.heads + 2 * c.kv_heads) * c.dim;
  const Tensor qkv = test::random_tensor({t, width}, 71, DType::F32, -2.0f, 2.0f);
  Tensor q = Tensor::empty({t, c.heads * c.dim}, DType::F32, s), k = Tensor::empty({t, c.kv_heads * c.dim}, DType::F32, s);
  Tensor v = Tensor::empty({t, c.kv_heads * c.dim}, DType::F32, s);
  ops::split_columns(qkv, {&q, &k, &v}, s);
  Tensor out = poisoned(q_shape(c), DType::F32), lse = poisoned(lse_shape(c), DType::F32);
  Tensor out_p = poisoned(q_shape(c), DType::F32), lse_p = poisoned(lse_shape(c), DType::F32);
  ops::attention_forward(q, k, v, out, lse, a, s);
  ops::attention_forward_packed(qkv, out_p, lse_p, a, s);
  EXPECT_EQ(out.to_floats(s), out_p.to_floats(s));
  EXPECT_EQ(lse.to_floats(s), lse_p.to_floats(s));
  const Tensor dout = test::random_tensor(q_shape(c), 72);
  Tensor dq = poisoned(q_shape(c), DType::F32), dk = poisoned(kv_shape(c), DType::F32), dv = poisoned(kv_shape(c), DType::F32);
  ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, a, s);
  Tensor dqkv = poisoned({t, width}, DType::F32), want = Tensor::empty({t, width}, DType::F32, s);
  ops::attention_backward_packed(dout, qkv, out, lse, dqkv, a, s);
  Tensor dq2 = dq.view({t, c.heads * c.dim}), dk2 = dk.view({t, c.kv_heads * c.dim}), dv2 = dv.view({t, c.kv_heads * c.dim});
  ops::concat_columns({&dq2, &dk2, &dv2}, want, s);
  EXPECT_EQ(dqkv.to_floats(s), want.to_floats(s));
}

TEST(Attention, PackedRowsTakeTheirValuesFromASecondBuffer) {
  // Training rotates q and k into a buffer whose value columns stay unwritten and passes the QKV
  // projection's output as the value source: the result must be that of one buffer holding
  // the first's q, k and the second's v (poisoned columns that are not read change nothing).
  const Stream s = Stream::cpu();
  const Case c{2, 7, 4, 2, 8, AttentionMask::None};
  const AttentionArgs a = args_of(c);
  const int64_t t = c.batch * c.seq, width = (c.heads + 2 * c.kv_heads) * c.dim;
  const int64_t qk = (c.heads + c.kv_heads) * c.dim;
  const Tensor qkv = test::random_tensor({t, width}, 73, DType::F32, -2.0f, 2.0f);
  Tensor qk_rows = Tensor::from_floats(qkv.to_floats(s), {t, width});
  Tensor v_rows = Tensor::from_floats(qkv.to_floats(s), {t, width});
  float* qr = qk_rows.data<float>();
  float* vr = v_rows.data<float>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = qk; j < width; ++j) qr[i * width + j] = std::nanf("");  // v slot unwritten
    for (int64_t j = 0; j < qk; ++j) vr[i * width + j] = std::nanf("");      // only v is read
  }
  Tensor out = poisoned(q_shape(c), DType::F32), lse = poisoned(lse_shape(c), DType::F32);
  Tensor out2 = poisoned(q_shape(c), DType::F32), lse2 = poisoned(lse_shape(c), DType::F32);
  ops::attention_forward_packed(qkv, out, lse, a, s);
  ops::attention_forward_packed(qk_rows, v_rows, out2, lse2, a, s);
  EXPECT_EQ(out.to_floats(s), out2.to_floats(s));
  EXPECT_EQ(lse.to_floats(s), lse2.to_floats(s));
  const Tensor dout = test::random_tensor(q_shape(c), 74);
  Tensor dqkv = poisoned({t, width}, DType::F32), dqkv2 = poisoned({t, width}, DType::F32);
  ops::attention_backward_packed(dout, qkv, out, lse, dqkv, a, s);
  ops::attention_backward_packed(dout, qk_rows, v_rows, out, lse, dqkv2, a, s);
  EXPECT_EQ(dqkv.to_floats(s), dqkv2.to_floats(s));
  EXPECT_FALSE(ops::attention_packed_reads_in_place(a, s));  // the CPU splits copies
}
