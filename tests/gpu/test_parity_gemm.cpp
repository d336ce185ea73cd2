// GEMM parity: cuBLASLt (bf16 x bf16 -> bf16/f32, f32 x f32 -> f32) against the CPU reference on
// the same bf16-rounded inputs, for every transpose combination, beta 0/1 into f32 C, alpha != 1,
// bias, odd and misaligned shapes, and a 4096^3 product checked entry by entry on a sample.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/moe.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

struct GemmCase {
  int64_t m, n, k;
  bool trans_a, trans_b;
  DType ab, c;
  float alpha, beta;
  bool bias;
};

std::string name_of(const GemmCase& g) {
  return detail::concat("gemm ", g.m, "x", g.n, "x", g.k, " ta=", g.trans_a, " tb=", g.trans_b, " ",
                        dtype_name(g.ab), "->", dtype_name(g.c), " a=", g.alpha, " b=", g.beta,
                        g.bias ? " bias" : "");
}

/// Runs one case on both backends. Tolerance by output dtype:
///  - bf16 C: rounding of the output to bf16 dominates -> kBf16ParityRelL2;
///  - f32 C: fp32 accumulation (cuBLASLt) vs double (CPU) over K terms -> kF32AccumRelL2; a TF32
///    product would miss it by ~5x (10-bit mantissa operands), which is what this also checks.
///    Sums of 4096 terms get kF32AccumLongSumRelL2: on the H100 the wgrad shape 384x256x4096
///    measured 4.0e-6 (cuBLASLt's kernel for that shape sums in another order than the H200's).
void run_case(const GemmCase& g) {
  Stream gpu = gpu_stream();
  const Shape sa = g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k};
  const Shape sb = g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n};
  Input a = make_input(sa, g.ab, gpu);
  Input b = make_input(sb, g.ab, gpu);
  Input bias = make_input({g.n}, g.c, gpu);
  // beta != 0: C starts from random values (accumulation); beta == 0: C starts as NaN, which
  // must not leak into the result (BLAS semantics: C is not read).
  Input c0 = make_input({g.m, g.n}, g.c, gpu);
  Tensor c_dev = g.beta != 0.0f ? c0.device : poisoned({g.m, g.n}, g.c, gpu);
  Tensor c_host = g.beta != 0.0f ? c0.host : poisoned_host({g.m, g.n});
  ops::GemmArgs dev_args{.trans_a = g.trans_a, .trans_b = g.trans_b, .alpha = g.alpha,
                         .beta = g.beta, .bias = g.bias ? &bias.device : nullptr};
  ops::GemmArgs host_args = dev_args;
  host_args.bias = g.bias ? &bias.host : nullptr;
  ops::gemm(a.device, b.device, c_dev, dev_args, gpu);
  ops::gemm(a.host, b.host, c_host, host_args, Stream::cpu());
  expect_close(name_of(g), download(c_dev, gpu), test::to_doubles(c_host),
               g.c == DType::BF16 ? test::kBf16ParityRelL2
               : g.k >= 4096      ? test::kF32AccumLongSumRelL2
                                  : test::kF32AccumRelL2);
}

}  // namespace

TEST(GemmParity, Bf16MatchesCpuForEveryTransposeCombination) {
  MDLM_REQUIRE_GPU();
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      run_case({128, 256, 64, ta == 1, tb == 1, DType::BF16, DType::BF16, 1.0f, 0.0f, false});
      run_case({67, 133, 96, ta == 1, tb == 1, DType::BF16, DType::BF16, 1.0f, 0.0f, false});
      run_case({33, 17, 1001, ta == 1, tb == 1, DType::BF16, DType::BF16, 1.0f, 0.0f, false});
    }
}

TEST(GemmParity, Bf16IntoF32WritesWithBetaZeroAndAccumulatesWithBetaOne) {
  MDLM_REQUIRE_GPU();
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 1.0f}) {
        run_case({96, 160, 256, ta == 1, tb == 1, DType::BF16, DType::F32, 1.0f, beta, false});
        run_case({65, 31, 77, ta == 1, tb == 1, DType::BF16, DType::F32, 0.5f, beta, false});
      }
  // The weight-gradient shape: dW[out, in] += dY^T X over many tokens.
  run_case({384, 256, 4096, true, false, DType::BF16, DType::F32, 1.0f, 1.0f, false});
}

TEST(GemmParity, Bf16AccumulatesIntoBf16WithBetaOne) {
  MDLM_REQUIRE_GPU();
  // Inference's residual stream: residual [rows, H] += x W^T (tp::RowParallelLinear::forward_add).
  run_case({4608, 256, 512, false, true, DType::BF16, DType::BF16, 1.0f, 1.0f, false});
  run_case({67, 133, 96, false, true, DType::BF16, DType::BF16, 1.0f, 1.0f, false});
  run_case({128, 192, 64, false, true, DType::BF16, DType::BF16, 1.0f, 1.0f, true});
}

TEST(GemmParity, Bf16WithAnAddendWritesTheSumIntoANewC) {
  MDLM_REQUIRE_GPU();
  // Training's residual stream: x_mid = x + context W^T, the addend x kept unchanged for the
  // norm's backward; C starts as NaN (not read). A second call gives the same bits; the same sum
  // in place (addend = C) agrees within bf16 rounding (cuBLASLt may take another epilogue path
  // when C aliases D: 27 % of the elements differed by their last bit at 1024 x 2048 x 512).
  Stream gpu = gpu_stream();
  for (const bool bias : {false, true}) {
    for (const int64_t m : {int64_t{1024}, int64_t{67}}) {  // the CPU reference bounds the size
      const int64_t n = m > 100 ? 2048 : 133, k = m > 100 ? 512 : 96;
      const std::string tag = detail::concat("addend ", m, "x", n, "x", k, bias ? " bias" : "");
      Input a = make_input({m, k}, DType::BF16, gpu), b = make_input({n, k}, DType::BF16, gpu);
      Input addend = make_input({m, n}, DType::BF16, gpu), bias_in = make_input({n}, DType::BF16, gpu);
      Tensor c = poisoned({m, n}, DType::BF16, gpu), c_host = poisoned_host({m, n});
      ops::gemm(a.device, b.device, c, {.trans_b = true, .beta = 1.0f, .bias = bias ? &bias_in.device : nullptr,
                                        .addend = &addend.device}, gpu);
      ops::gemm(a.host, b.host, c_host, {.trans_b = true, .beta = 1.0f, .bias = bias ? &bias_in.host : nullptr,
                                         .addend = &addend.host}, Stream::cpu());
      expect_close(tag, download(c, gpu), test::to_doubles(c_host), test::kBf16ParityRelL2);
      expect_identical(tag + " addend unchanged", download(addend.device, gpu), as_doubles(addend.values));
      Tensor again = poisoned({m, n}, DType::BF16, gpu);
      ops::gemm(a.device, b.device, again, {.trans_b = true, .beta = 1.0f, .bias = bias ? &bias_in.device : nullptr,
                                            .addend = &addend.device}, gpu);
      expect_identical(tag + " twice", download(again, gpu), download(c, gpu));
      Tensor in_place = addend.device.to(gpu.device(), gpu);
      ops::gemm(a.device, b.device, in_place, {.trans_b = true, .beta = 1.0f,
                                               .bias = bias ? &bias_in.device : nullptr}, gpu);
      expect_close(tag + " in place", download(in_place, gpu), download(c, gpu), test::kBf16ParityRelL2);
    }
  }
}

TEST(GemmParity, F32MatchesCpuWithoutTf32) {
  MDLM_REQUIRE_GPU();
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      run_case({64, 96, 512, ta == 1, tb == 1, DType::F32, DType::F32, 1.0f, 0.0f, false});
      run_case({31, 45, 67, ta == 1, tb == 1, DType::F32, DType::F32, 0.75f, 1.0f, false});
    }
}

TEST(GemmParity, BiasIsAddedOnceToEveryRowAndNotScaledByAlpha) {
  MDLM_REQUIRE_GPU();
  for (int tb = 0; tb < 2; ++tb) {
    run_case({128, 192, 64, false, tb == 1, DType::BF16, DType::BF16, 0.5f, 0.0f, true});
    run_case({37, 61, 40, false, tb == 1, DType::BF16, DType::BF16, 1.0f, 0.0f, true});
    run_case({128, 192, 64, false, tb == 1, DType::BF16, DType::F32, 0.5f, 0.0f, true});
    run_case({128, 192, 64, false, tb == 1, DType::BF16, DType::F32, 1.0f, 1.0f, true});
    run_case({50, 70, 30, false, tb == 1, DType::F32, DType::F32, 0.5f, 1.0f, true});
  }
}

TEST(GemmParity, EmptyInnerDimensionScalesCAndAddsBias) {
  MDLM_REQUIRE_GPU();
  // A is [K, M] = [0, 8] and B [K, N] = [0, 24]: a row-major [8, 0] would have rows() = 0 / 0.
  run_case({8, 24, 0, true, false, DType::BF16, DType::F32, 1.0f, 0.0f, false});
  run_case({8, 24, 0, true, false, DType::BF16, DType::F32, 1.0f, 1.0f, true});
}

TEST(GemmParity, MisalignedViewsUseAlgorithmsThatAcceptThem) {
  MDLM_REQUIRE_GPU();
  // Row 1 of an [M+1, K] buffer starts K * 2 bytes in: with K = 77 that is 154 bytes, 2-byte
  // aligned only. The heuristic cache keys on alignment, so the aligned case above must not
  // hand its algorithm to this one.
  Stream gpu = gpu_stream();
  const int64_t m = 64, n = 96, k = 77;
  Input a_full = make_input({m + 1, k}, DType::BF16, gpu);
  Input b = make_input({k, n}, DType::BF16, gpu);
  Tensor a_dev = a_full.device.narrow(1, m);
  Tensor a_host = a_full.host.narrow(1, m);
  Tensor c_dev = poisoned({m, n}, DType::F32, gpu);
  Tensor c_host = poisoned_host({m, n});
  ops::gemm(a_dev, b.device, c_dev, {}, gpu);
  ops::gemm(a_host, b.host, c_host, {}, Stream::cpu());
  expect_close("gemm misaligned A view 64x96x77 bf16->f32", download(c_dev, gpu), test::to_doubles(c_host),
               test::kF32AccumRelL2);
}

TEST(GemmParity, Large4096CubedMatchesFloat64OnSampledEntries) {
  MDLM_REQUIRE_GPU();
  // A CPU reference of the full product would take minutes; 1000 random entries, each an exact
  // f64 dot product of the bf16 operands, test every region of C that the tiles cover.
  Stream gpu = gpu_stream();
  const int64_t m = 4096, n = 4096, k = 4096;
  for (bool trans_b : {false, true}) {
    Input a = make_input({m, k}, DType::BF16, gpu);
    Input b = make_input(trans_b ? Shape{n, k} : Shape{k, n}, DType::BF16, gpu);
    for (DType cd : {DType::BF16, DType::F32}) {
      Tensor c = poisoned({m, n}, cd, gpu);
      ops::gemm(a.device, b.device, c, {.trans_b = trans_b}, gpu);
      const std::vector<double> got_all = download(c, gpu);
      std::mt19937_64 rng(fresh_seed());
      std::vector<double> got, want;
      for (int s = 0; s < 1000; ++s) {
        const int64_t i = static_cast<int64_t>(rng() % m), j = static_cast<int64_t>(rng() % n);
        double acc = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double bv = trans_b ? b.values[static_cast<size_t>(j * k + kk)]
                                    : b.values[static_cast<size_t>(kk * n + j)];
          acc += static_cast<double>(a.values[static_cast<size_t>(i * k + kk)]) * bv;
        }
        got.push_back(got_all[static_cast<size_t>(i * n + j)]);
        want.push_back(acc);
      }
      size_t nan = 0;
      for (double v : got_all) nan += std::isnan(v);
      EXPECT_EQ(nan, 0u) << "unwritten elements of C";
      expect_close(detail::concat("gemm 4096^3 tb=", trans_b, " bf16->", dtype_name(cd), " (1000 entries vs f64)"),
                   got, want, cd == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32AccumLongSumRelL2);
    }
  }
}

namespace {

/// Batch-invariant mode for the scope of a test (ops/gemm.h); restored even when a check throws.
struct BatchInvariant {
  explicit BatchInvariant(bool on) { ops::set_batch_invariant(on); }
  ~BatchInvariant() { ops::set_batch_invariant(false); }
};

/// Rows 0..M-1 of C = A[:M] op(B) (+ bias) for each M, as computed with M rows; returns how many
/// rows of each smaller M differ in any bit from the same rows of the largest M.
size_t rows_differing_across_m(const std::vector<int64_t>& ms, int64_t n, int64_t k, bool trans_b, DType cd,
                               bool bias, const std::string& tag) {
  Stream gpu = gpu_stream();
  const int64_t m_max = ms.back();
  Input a = make_input({m_max, k}, DType::BF16, gpu);
  Input b = make_input(trans_b ? Shape{n, k} : Shape{k, n}, DType::BF16, gpu);
  Input bias_in = make_input({n}, cd, gpu);
  const ops::GemmArgs args{.trans_b = trans_b, .bias = bias ? &bias_in.device : nullptr};
  std::vector<std::vector<double>> out;
  for (const int64_t m : ms) {
    // A fresh [M, K] copy of A's first rows (as a batch of M rows gets it), not a view.
    Tensor am = to_device(std::vector<float>(a.values.begin(), a.values.begin() + m * k), {m, k}, DType::BF16, gpu);
    Tensor c = poisoned({m, n}, cd, gpu);
    ops::gemm(am, b.device, c, args, gpu);
    out.push_back(download(c, gpu));
  }
  const std::vector<double>& whole = out.back();
  size_t differ = 0;
  for (size_t t = 0; t + 1 < ms.size(); ++t) {
    const int64_t m = ms[t];
    for (int64_t i = 0; i < m; ++i)
      differ += !std::equal(out[t].begin() + i * n, out[t].begin() + (i + 1) * n, whole.begin() + i * n);
  }
  std::printf("[parity] %-58s %zu rows differ from the M = %lld rows\n", tag.c_str(), differ,
              static_cast<long long>(m_max));
  return differ;
}

}  // namespace

TEST(GemmParity, BatchInvariantRowsAreTheSameBitsForEveryM) {
  MDLM_REQUIRE_GPU();
  // generate_difflm --batch-invariant: a row of C is the same bits with M = 1, 7, 32 or 512 rows
  // (one cuBLASLt algorithm per N, K, chosen at a fixed M without split-K; src/ops/cuda/gemm.cpp).
  // Shapes of the 1.7B's linears (QKV, MLP up/down) and its LM head, a small K that split-K
  // would favour at M = 1, bias in the epilogue, f32 C.
  const std::vector<int64_t> ms = {1, 7, 32, 512};
  struct Case {
    int64_t n, k;
    bool trans_b, bias;
    DType c;
  };
  for (const Case& g : {Case{2048 + 2 * 1024, 2048, true, false, DType::BF16}, Case{6144, 2048, true, false, DType::BF16},
                        Case{2048, 6144, true, false, DType::BF16}, Case{32000, 2048, true, false, DType::BF16},
                        Case{256, 8192, true, false, DType::BF16}, Case{512, 1024, false, true, DType::BF16},
                        Case{384, 4096, true, false, DType::F32}}) {
    const std::string tag = detail::concat("gemm N ", g.n, " K ", g.k, g.trans_b ? " tb" : "", g.bias ? " bias" : "",
                                           " ->", dtype_name(g.c));
    {
      // The default mode, for the record: how batch-dependent cuBLASLt's per-shape choice is here.
      BatchInvariant off(false);
      rows_differing_across_m(ms, g.n, g.k, g.trans_b, g.c, g.bias, tag + " default");
    }
    BatchInvariant on(true);
    EXPECT_EQ(rows_differing_across_m(ms, g.n, g.k, g.trans_b, g.c, g.bias, tag + " batch-invariant"), 0u) << tag;
  }
}

TEST(GemmParity, BatchInvariantProductsStillMatchTheCpu) {
  MDLM_REQUIRE_GPU();
  BatchInvariant on(true);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      run_case({1, 256, 64, ta == 1, tb == 1, DType::BF16, DType::BF16, 1.0f, 0.0f, false});
      run_case({67, 133, 96, ta == 1, tb == 1, DType::BF16, DType::F32, 0.5f, 1.0f, false});
    }
  run_case({7, 512, 1024, false, true, DType::BF16, DType::BF16, 1.0f, 0.0f, true});
}

TEST(GemmParity, BatchInvariantGroupedGemmRowsIgnoreTheOtherGroupsAndTheirSizes) {
  MDLM_REQUIRE_GPU();
  // MoE experts (grouped_gemm's planned products): an expert's rows are the batch's tokens routed
  // to it, so its M changes with the batch. With the mode on, a token's output row is the same
  // bits whatever its group's size and offset (the group's view starts at another row).
  BatchInvariant on(true);
  Stream gpu = gpu_stream();
  const int64_t n = 1024, k = 2048, experts = 2;
  Input w = make_input({experts * n, k}, DType::BF16, gpu);  // [G * N, K], trans_b
  Input x = make_input({600, k}, DType::BF16, gpu);
  // Layouts of the same first tokens: expert 0 gets the first r0 rows, expert 1 the next r1.
  std::vector<std::vector<double>> first_rows;
  for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{1, 7}, {7, 1}, {32, 100}, {512, 88}}) {
    const int64_t m = r0 + r1;
    Tensor a = to_device(std::vector<float>(x.values.begin(), x.values.begin() + m * k), {m, k}, DType::BF16, gpu);
    Tensor c = poisoned({m, n}, DType::BF16, gpu);
    ops::grouped_gemm(a, w.device, c, {r0, r1}, {.trans_b = true}, gpu);
    const std::vector<double> all = download(c, gpu);
    first_rows.emplace_back(all.begin(), all.begin() + n);  // token 0, always expert 0's first row
  }
  for (size_t i = 1; i < first_rows.size(); ++i)
    expect_identical("grouped gemm token 0 (expert 0) with group sizes of layout " + std::to_string(i),
                     first_rows[i], first_rows[0]);
}
