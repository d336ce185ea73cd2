// GEMM against a naive triple loop in double (all transposes, beta, bias, mixed output dtype), and
// the linear-layer gradients that the model computes with GEMM against finite differences.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/reduce.h"
#include "ops/cpu/cpu_ops.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

namespace {

/// alpha * op(A) op(B) + beta * C0 + bias, with A/B stored as the gemm call sees them.
std::vector<double> naive_gemm(const std::vector<double>& a, const std::vector<double>& b,
                               const std::vector<double>& c0, const std::vector<double>* bias,
                               int64_t m, int64_t n, int64_t k, bool ta, bool tb, double alpha,
                               double beta) {
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double aik = ta ? a[static_cast<size_t>(kk * m + i)] : a[static_cast<size_t>(i * k + kk)];
        const double bkj = tb ? b[static_cast<size_t>(j * k + kk)] : b[static_cast<size_t>(kk * n + j)];
        s += aik * bkj;
      }
      double v = alpha * s + beta * c0[static_cast<size_t>(i * n + j)];
      if (bias != nullptr) v += (*bias)[static_cast<size_t>(j)];
      c[static_cast<size_t>(i * n + j)] = v;
    }
  }
  return c;
}

/// Checks every (trans_a, trans_b, beta, bias) combination for one size and dtype against the
/// naive loop.
void check_all_combinations(int64_t m, int64_t n, int64_t k, DType dtype) {
  Stream s = Stream::cpu();
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (float beta : {0.0f, 1.0f}) {
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
          Tensor a = test::random_tensor(ta ? Shape{k, m} : Shape{m, k}, 11, dtype);
          Tensor b = test::random_tensor(tb ? Shape{n, k} : Shape{k, n}, 12, dtype);
          Tensor c = test::random_tensor({m, n}, 13, dtype);
          Tensor bias = test::random_tensor({n}, 14, dtype);
          const std::vector<double> c0 = test::to_doubles(c), bias_v = test::to_doubles(bias);
          ops::GemmArgs args{.trans_a = ta == 1, .trans_b = tb == 1, .alpha = 0.75f, .beta = beta,
                             .bias = with_bias ? &bias : nullptr};
          ops::gemm(a, b, c, args, s);
          const std::vector<double> expected =
              naive_gemm(test::to_doubles(a), test::to_doubles(b), c0, with_bias ? &bias_v : nullptr,
                         m, n, k, ta == 1, tb == 1, 0.75, beta);
          EXPECT_LT(test::rel_l2(test::to_doubles(c), expected), dtype == DType::F64 ? 1e-14 : 1e-6)
              << "trans_a=" << ta << " trans_b=" << tb << " beta=" << beta << " bias=" << with_bias;
        }
      }
    }
  }
}

}  // namespace

TEST(Gemm, AllTransposeCombinationsMatchANaiveTripleLoopInF64) {
  check_all_combinations(5, 7, 9, DType::F64);
  check_all_combinations(13, 3, 1, DType::F64);  // K = 1 and a row count that is not a multiple of the block
}

TEST(Gemm, AllTransposeCombinationsMatchANaiveTripleLoopInF32) {
  // f32 GEMMs run on OpenBLAS where the build has it (fp32 sums of 33 products, relative error
  // ~sqrt(33) * 6e-8 at worst), else on the naive loop (double sums, one rounding: ~6e-8).
  const char* blas = ops::cpu::blas_library();
  std::printf("[gemm] f32 GEMMs run on %s\n", *blas != '\0' ? blas : "the naive loop (no BLAS in this build)");
  check_all_combinations(6, 10, 33, DType::F32);
}

// The bitwise guarantees built on the CPU GEMM (a padded batch row equals the row alone in
// generation, --tp-comm-overlap's row chunks equal the whole product) need each row of C, and
// each column window, to come out the same whatever the call's shape. OpenBLAS does not give
// that for whole calls; src/ops/cpu/gemm.cpp calls it 2 rows at a time, which does on the
// kernels measured there. Sizes cross OpenBLAS's K blocking (1024) and its unrolls (37, 300).
TEST(Gemm, F32RowsAndColumnWindowsComeOutAsInAnyOtherShape) {
  Stream s = Stream::cpu();
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{37, 96, 64}, {16, 300, 1024}, {7, 37, 17}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(testing::Message() << "M " << m << " N " << n << " K " << k << " trans_a " << ta << " trans_b " << tb);
        const Tensor a = test::random_tensor(ta ? Shape{k, m} : Shape{m, k}, 31, DType::F32);
        const Tensor b = test::random_tensor(tb ? Shape{n, k} : Shape{k, n}, 32, DType::F32);
        Tensor whole = Tensor::empty({m, n}, DType::F32, s);
        ops::gemm(a, b, whole, {.trans_a = ta == 1, .trans_b = tb == 1}, s);
        const std::vector<float> c = whole.to_floats(s);
        // op(A) and op(B) as row-major copies, so that rows and columns can be cut out.
        const std::vector<float> av = a.to_floats(s), bv = b.to_floats(s);
        auto op_a_rows = [&](int64_t first, int64_t count) {
          std::vector<float> r(static_cast<size_t>(count * k));
          for (int64_t i = 0; i < count; ++i)
            for (int64_t j = 0; j < k; ++j)
              r[static_cast<size_t>(i * k + j)] = ta ? av[static_cast<size_t>(j * m + first + i)]
                                                     : av[static_cast<size_t>((first + i) * k + j)];
          return Tensor::from_floats(r, {count, k});
        };
        auto op_b_columns = [&](int64_t first, int64_t count) {  // as [count, K]: trans_b form
          std::vector<float> r(static_cast<size_t>(count * k));
          for (int64_t j = 0; j < count; ++j)
            for (int64_t kk = 0; kk < k; ++kk)
              r[static_cast<size_t>(j * k + kk)] = tb ? bv[static_cast<size_t>((first + j) * k + kk)]
                                                      : bv[static_cast<size_t>(kk * n + first + j)];
          return Tensor::from_floats(r, {count, k});
        };
        int rows_differ = 0, windows_differ = 0;
        for (int64_t i = 0; i < m; ++i) {  // each row alone
          Tensor row = Tensor::empty({1, n}, DType::F32, s);
          ops::gemm(op_a_rows(i, 1), b, row, {.trans_b = tb == 1}, s);
          const std::vector<float> r = row.to_floats(s);
          rows_differ += !std::equal(r.begin(), r.end(), c.begin() + i * n);
        }
        for (const auto& [r0, rn, c0, cn] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, m - 1, 3, n - 5}, {m / 2, m - m / 2, 0, 1}}) {
          Tensor win = Tensor::empty({rn, cn}, DType::F32, s);
          ops::gemm(op_a_rows(r0, rn), op_b_columns(c0, cn), win, {.trans_b = true}, s);
          const std::vector<float> w = win.to_floats(s);
          for (int64_t i = 0; i < rn; ++i)
            windows_differ += !std::equal(w.begin() + i * cn, w.begin() + (i + 1) * cn, c.begin() + (r0 + i) * n + c0);
        }
        EXPECT_EQ(rows_differ, 0) << "rows of C differ from the same rows computed alone";
        EXPECT_EQ(windows_differ, 0) << "rows of a window of C differ from the whole product's";
      }
    }
  }
}

TEST(Gemm, BatchInvariantModeLeavesTheCpuProductUnchanged) {
  // The switch is for CUDA (ops/gemm.h); CPU rows are the same bits in any M with or without it.
  Stream s = Stream::cpu();
  const int64_t m = 7, n = 37, k = 65;
  const Tensor a = test::random_tensor({m, k}, 41, DType::F32);
  const Tensor b = test::random_tensor({n, k}, 42, DType::F32);
  Tensor off = Tensor::empty({m, n}, DType::F32, s), on = Tensor::empty({m, n}, DType::F32, s);
  ops::gemm(a, b, off, {.trans_b = true}, s);
  ops::set_batch_invariant(true);
  ops::gemm(a, b, on, {.trans_b = true}, s);
  Tensor row = Tensor::empty({1, n}, DType::F32, s);
  ops::gemm(a.narrow(3, 1), b, row, {.trans_b = true}, s);
  ops::set_batch_invariant(false);
  const std::vector<float> x = off.to_floats(s), y = on.to_floats(s), r = row.to_floats(s);
  EXPECT_EQ(x, y);
  EXPECT_TRUE(std::equal(r.begin(), r.end(), y.begin() + 3 * n));
}

TEST(Gemm, BetaZeroWritesCWithoutReadingIt) {
  Stream s = Stream::cpu();
  Tensor a = Tensor::from_floats({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_floats({1, 0, 0, 1}, {2, 2});
  Tensor c = Tensor::from_floats({NAN, INFINITY, NAN, -INFINITY}, {2, 2});
  ops::gemm(a, b, c, {}, s);
  EXPECT_EQ(c.to_floats(s), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Gemm, BetaOneAccumulatesIntoC) {
  Stream s = Stream::cpu();
  Tensor a = Tensor::from_floats({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_floats({1, 1, 1, 1}, {2, 2});
  Tensor c = Tensor::from_floats({10, 20, 30, 40}, {2, 2});
  ops::gemm(a, b, c, {.beta = 1.0f}, s);
  EXPECT_EQ(c.to_floats(s), (std::vector<float>{13, 23, 37, 47}));
  ops::gemm(a, b, c, {.beta = 1.0f}, s);
  EXPECT_EQ(c.to_floats(s), (std::vector<float>{16, 26, 44, 54}));
}

TEST(Gemm, AnAddendIsAddedInsteadOfCAndCIsWritten) {
  // C = alpha A B + beta * addend + bias: the residual add of a branch formed in the GEMM. C's
  // old contents (NaN here) are not read; the addend is not written.
  Stream s = Stream::cpu();
  for (const bool with_bias : {false, true}) {
    Tensor a = test::random_tensor({5, 3}, 21, DType::F32), b = test::random_tensor({4, 3}, 22, DType::F32);
    Tensor addend = test::random_tensor({5, 4}, 23, DType::F32), bias = test::random_tensor({4}, 24, DType::F32);
    const std::vector<double> addend_v = test::to_doubles(addend), bias_v = test::to_doubles(bias);
    Tensor c = Tensor::from_floats(std::vector<float>(20, NAN), {5, 4});
    ops::gemm(a, b, c, {.trans_b = true, .alpha = 0.5f, .beta = 2.0f, .bias = with_bias ? &bias : nullptr,
                        .addend = &addend}, s);
    const std::vector<double> want = naive_gemm(test::to_doubles(a), test::to_doubles(b), addend_v,
                                                with_bias ? &bias_v : nullptr, 5, 4, 3, false, true, 0.5, 2.0);
    EXPECT_LT(test::rel_l2(test::to_doubles(c), want), 1e-6) << "bias " << with_bias;
    EXPECT_EQ(test::to_doubles(addend), addend_v);
    // The addend may be C itself: the in-place accumulation of beta = 1.
    Tensor same = Tensor::from_floats(addend.to_floats(s), {5, 4});
    ops::gemm(a, b, same, {.trans_b = true, .alpha = 0.5f, .beta = 2.0f, .bias = with_bias ? &bias : nullptr,
                           .addend = &same}, s);
    EXPECT_EQ(same.to_floats(s), c.to_floats(s));
  }
  Tensor a = test::random_tensor({2, 2}, 25, DType::F32), c = Tensor::zeros({2, 2}, DType::F32, s);
  Tensor wrong = Tensor::zeros({2, 3}, DType::F32, s);
  EXPECT_THROW(ops::gemm(a, a, c, {.beta = 1.0f, .addend = &wrong}, s), Error);
  EXPECT_THROW(ops::gemm(a, a, c, {.addend = &c}, s), Error);  // beta 0 would ignore it
}

TEST(Gemm, F64OperandsCanWriteAnF32Output) {
  Stream s = Stream::cpu();
  Tensor a = test::random_tensor({4, 6}, 1, DType::F64);
  Tensor b = test::random_tensor({6, 3}, 2, DType::F64);
  Tensor c32 = Tensor::zeros({4, 3}, DType::F32, s);
  Tensor c64 = Tensor::zeros({4, 3}, DType::F64, s);
  ops::gemm(a, b, c32, {}, s);
  ops::gemm(a, b, c64, {}, s);
  const std::vector<double> r32 = test::to_doubles(c32), r64 = test::to_doubles(c64);
  for (size_t i = 0; i < r64.size(); ++i) EXPECT_EQ(r32[i], static_cast<double>(static_cast<float>(r64[i])));
}

TEST(Gemm, ALargerProductMatchesTheNaiveLoop) {
  // Sizes of the hidden-256 test model's projections, f32 as in training.
  Stream s = Stream::cpu();
  const int64_t m = 37, n = 96, k = 64;
  Tensor a = test::random_tensor({m, k}, 3);
  Tensor b = test::random_tensor({n, k}, 4);
  Tensor c = Tensor::empty({m, n}, DType::F32, s);
  ops::gemm(a, b, c, {.trans_b = true}, s);
  const std::vector<double> zeros(static_cast<size_t>(m * n), 0.0);
  EXPECT_LT(test::rel_l2(test::to_doubles(c), naive_gemm(test::to_doubles(a), test::to_doubles(b),
                                                          zeros, nullptr, m, n, k, false, true, 1, 0)),
            1e-6);
}

// Y = X W^T + b (weight [out, in] as Megatron stores it); the backward a linear layer runs is
// dX = dY W, dW += dY^T X, db += sum_rows(dY): three GEMM/reduce calls whose transposes must agree
// with finite differences of L = <dY, Y>.
TEST(Gemm, LinearLayerGradientsMatchFiniteDifferences) {
  Stream s = Stream::cpu();
  const int64_t tokens = 5, in = 4, out = 3;
  Tensor x = test::random_tensor({tokens, in}, 21, DType::F64);
  Tensor w = test::random_tensor({out, in}, 22, DType::F64);
  Tensor bias = test::random_tensor({out}, 23, DType::F64);
  Tensor dy = test::random_tensor({tokens, out}, 24, DType::F64);
  Tensor y = Tensor::empty({tokens, out}, DType::F64, s);
  auto loss = [&] {
    ops::gemm(x, w, y, {.trans_b = true, .bias = &bias}, s);
    return test::inner(dy, y);
  };
  Tensor dx = Tensor::empty({tokens, in}, DType::F64, s);
  Tensor dw = Tensor::zeros({out, in}, DType::F64, s);
  Tensor db = Tensor::zeros({out}, DType::F64, s);
  ops::gemm(dy, w, dx, {}, s);
  ops::gemm(dy, x, dw, {.trans_a = true, .beta = 1.0f}, s);
  ops::sum_rows(dy, db, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dx), test::finite_difference(x, loss)),
            test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), test::finite_difference(w, loss)),
            test::kFiniteDiffRelTolF64);
  EXPECT_LT(test::rel_l2(test::to_doubles(db), test::finite_difference(bias, loss)),
            test::kFiniteDiffRelTolF64);
}
