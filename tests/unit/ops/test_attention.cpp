// Unit tests of the CPU attention reference (src/ops/cpu/attention.cpp): the forward against the
// textbook softmax(Q K^T * scale) V and a direct log-sum-exp, causal and bidirectional sanity, the
// GQA head mapping, and the backward against central finite differences in f64.
#include <gtest/gtest.h>
#include <cmath>
#include <limits>
#include <vector>
#include "megadlm/ops/attention.h"
#include "ops/cpu/cpu_ops.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;

namespace {

struct Case {
  int64_t batch, seq, heads, kv_heads, dim;
  AttentionMask mask;
};

std::string name_of(const Case& c) {
  return "B=" + std::to_string(c.batch) + " S=" + std::to_string(c.seq) + " Hq=" +
         std::to_string(c.heads) + " Hkv=" + std::to_string(c.kv_heads) + " D=" +
         std::to_string(c.dim) + (c.mask == AttentionMask::Causal ? " causal" : " no-mask");
}

AttentionArgs args_of(const Case& c) {
  return {.batch = c.batch,
          .seq = c.seq,
          .num_heads = c.heads,
          .num_kv_heads = c.kv_heads,
          .head_dim = c.dim,
          .mask = c.mask,
          .softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dim)))};
}

Shape q_shape(const Case& c) { return {c.batch, c.seq, c.heads, c.dim}; }
Shape kv_shape(const Case& c) { return {c.batch, c.seq, c.kv_heads, c.dim}; }
Shape lse_shape(const Case& c) { return {c.batch, c.heads, c.seq}; }

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
Outputs forward(const Inputs& in, const Case& c, DType dtype = DType::F64) {
  Outputs o{poisoned(q_shape(c), dtype), poisoned(lse_shape(c), DType::F32)};
  ops::attention_forward(in.q, in.k, in.v, o.out, o.lse, args_of(c), Stream::cpu());
  return o;
}

/// Through the CPU backend with an f64 lse, so the backward of a gradient check is not limited by
/// the f32 rounding of the statistic (the CPU backend accepts lse in the activation dtype).
Outputs forward_f64(const Inputs& in, const Case& c) {
  Outputs o{poisoned(q_shape(c), DType::F64), poisoned(lse_shape(c), DType::F64)};
  ops::cpu::attention_forward(in.q, in.k, in.v, o.out, o.lse, args_of(c), Stream::cpu());
  return o;
}

struct Grads {
  Tensor dq, dk, dv;
};

Grads backward(const Tensor& dout, const Inputs& in, const Outputs& o, const Case& c,
               DType dtype = DType::F64) {
  Grads g{poisoned(q_shape(c), dtype), poisoned(kv_shape(c), dtype), poisoned(kv_shape(c), dtype)};
  ops::attention_backward(dout, in.q, in.k, in.v, o.out, o.lse, g.dq, g.dk, g.dv, args_of(c),
                          Stream::cpu());
  return g;
}

// The textbook formula, written independently of the op: materialise the [S, S] score matrix
// (masked entries -inf), softmax as exp(s) / sum exp(s) without max subtraction (the scores here
// are O(1), so no overflow), then P V. Returns out [B, S, Hq, D] and lse [B, Hq, S].
void naive_attention(const Inputs& in, const Case& c, std::vector<double>& out,
                     std::vector<double>& lse) {
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
          const double p = std::exp(scores[i * S + j]) / z;
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
