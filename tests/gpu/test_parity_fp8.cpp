// FP8 parity: the CUDA quantizer (ops/cuda/fp8_cuda.h) against the host reference
// (megadlm/ops/fp8.h), codes and amax bit for bit, row-wise and transposed, f32 and bf16 inputs,
// e4m3 and e5m2, with values that exercise saturation, NaN and subnormals; and the cuBLASLt FP8
// GEMM (TN, e4m3 x e4m3 and e4m3 x e5m2, f32 and bf16 output) against the CPU emulation on the
// same codes and scales. Bounds: see kFp8GemmF32RelL2 and kBf16ParityRelL2.
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <random>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/fp8.h"
#include "megadlm/ops/fp8_gemm.h"
#include "parity.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/fp8_cuda.h"
#endif

using namespace megadlm;
using namespace megadlm::test::parity;

#if MEGADLM_WITH_CUDA
namespace {

/// A device buffer of n bytes (an i32 tensor: megadlm has no byte dtype yet).
Tensor device_bytes(int64_t n, const Stream& gpu) {
  return Tensor::zeros({(n + 3) / 4 + 1}, DType::I32, gpu);
}
std::vector<uint8_t> download_bytes(const Tensor& t, int64_t n, const Stream& gpu) {
  const std::vector<int32_t> words = t.to_ints(gpu);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  std::memcpy(out.data(), words.data(), out.size());
  return out;
}
Tensor upload_bytes(const std::vector<uint8_t>& bytes, const Stream& gpu) {
  std::vector<int32_t> words((bytes.size() + 3) / 4 + 1, 0);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return ints_to_device(words, {static_cast<int64_t>(words.size())}, gpu);
}
uint8_t* bytes_ptr(const Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }
float* float_ptr(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }

/// Random values spanning many binades, plus the edge cases: ±0, huge (saturating after the
/// scale), tiny (subnormal or underflowing after the scale), NaN.
std::vector<float> fp8_test_values(int64_t n, uint64_t seed, bool with_nan) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-20, 12);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(mant(rng), expo(rng));
  const float edge[] = {0.0f, -0.0f, 1e30f, -1e30f, 1e-30f, -3e-5f, 448.0f, 57344.0f};
  for (size_t i = 0; i < std::size(edge) && i < v.size(); ++i) v[i * 7 % v.size()] = edge[i];
  if (with_nan && v.size() > 3) v[3] = NAN;
  return v;
}

void check_quantizer(int64_t rows, int64_t cols, DType dtype, ops::Fp8Type type, float scale) {
  Stream gpu = gpu_stream();
  std::vector<float> x = fp8_test_values(rows * cols, static_cast<uint64_t>(rows * 131 + cols), true);
  if (dtype == DType::BF16)  // both backends must read the same numbers
    x = Tensor::from_floats(x, {rows, cols}, DType::BF16).to_floats(Stream::cpu());
  const Tensor xd = to_device(x, {rows, cols}, dtype, gpu);
  const Tensor scale_d = to_device({scale}, {1}, DType::F32, gpu);
  Tensor amax_d = to_device({0.0f}, {1}, DType::F32, gpu);
  Tensor codes_d = device_bytes(rows * cols, gpu), codes_t_d = device_bytes(rows * cols, gpu);
  const std::string what = detail::concat("fp8 quantize ", rows, "x", cols, " ", dtype_name(dtype),
                                          type == ops::Fp8Type::E4M3 ? " e4m3" : " e5m2", " scale ", scale);
  // Row-wise only, then row-wise + transposed in one pass (amax accumulates: max of both = same).
  ops::cuda::fp8_quantize(xd, float_ptr(scale_d), type, bytes_ptr(codes_d), nullptr, float_ptr(amax_d), gpu);
  const std::vector<uint8_t> rowwise = download_bytes(codes_d, rows * cols, gpu);
  Tensor codes2_d = device_bytes(rows * cols, gpu);
  Tensor amax2_d = to_device({0.0f}, {1}, DType::F32, gpu);
  ops::cuda::fp8_quantize(xd, float_ptr(scale_d), type, bytes_ptr(codes2_d), bytes_ptr(codes_t_d),
                          float_ptr(amax2_d), gpu);
  std::vector<uint8_t> want(x.size()), want_t(x.size());
  const float amax = ops::fp8_quantize(x, scale, type, want);
  ops::fp8_quantize_transpose(x, rows, cols, scale, type, want_t);
  EXPECT_EQ(rowwise, want) << what << ": row-wise codes";
  EXPECT_EQ(download_bytes(codes2_d, rows * cols, gpu), want) << what << ": row-wise codes (fused)";
  EXPECT_EQ(download_bytes(codes_t_d, rows * cols, gpu), want_t) << what << ": transposed codes";
  EXPECT_EQ(amax_d.to_floats(gpu)[0], amax) << what << ": amax";
  EXPECT_EQ(amax2_d.to_floats(gpu)[0], amax) << what << ": amax (fused)";
}

void check_gemm(int64_t m, int64_t n, int64_t k, ops::Fp8Type type_b, DType out) {
  Stream gpu = gpu_stream();
  // a = weight [m, k], b = activation or gradient [n, k]; current (tensorwise) scales.
  const std::vector<float> a = bf16_values(m * k, -0.05f, 0.05f);
  const std::vector<float> b = bf16_values(n * k, -3.0f, 3.0f);
  const float sa = ops::fp8_current_scale(ops::fp8_amax(a), ops::fp8_max(ops::Fp8Type::E4M3));
  const float sb = ops::fp8_current_scale(ops::fp8_amax(b), ops::fp8_max(type_b));
  std::vector<uint8_t> qa(a.size()), qb(b.size());
  ops::fp8_quantize(a, sa, ops::Fp8Type::E4M3, qa);
  ops::fp8_quantize(b, sb, type_b, qb);
  const Tensor qa_d = upload_bytes(qa, gpu), qb_d = upload_bytes(qb, gpu);
  const Tensor inv_a = to_device({1.0f / sa}, {1}, DType::F32, gpu);
  const Tensor inv_b = to_device({1.0f / sb}, {1}, DType::F32, gpu);
  Tensor d = poisoned({n, m}, out, gpu);
  const float alpha = 0.75f;
  ops::cuda::fp8_gemm(bytes_ptr(qa_d), ops::Fp8Type::E4M3, float_ptr(inv_a), bytes_ptr(qb_d), type_b,
                      float_ptr(inv_b), m, n, k, alpha, d, gpu);
  std::vector<float> want(static_cast<size_t>(m * n));
  ops::fp8_gemm_reference(qa, ops::Fp8Type::E4M3, 1.0f / sa, qb, type_b, 1.0f / sb, m, n, k, alpha, want);
  const std::vector<double> want_d(want.begin(), want.end());
  const std::string what = detail::concat("fp8 gemm TN ", m, "x", n, "x", k, " e4m3 x ",
                                          type_b == ops::Fp8Type::E4M3 ? "e4m3" : "e5m2", " -> ",
                                          dtype_name(out));
  expect_close(what, download(d, gpu), want_d,
               out == DType::F32 ? test::kFp8GemmF32RelL2 : test::kBf16ParityRelL2);
}

}  // namespace
#endif

TEST(Fp8Parity, QuantizerMatchesCpuBitForBit) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  for (ops::Fp8Type type : {ops::Fp8Type::E4M3, ops::Fp8Type::E5M2})
    for (DType dtype : {DType::F32, DType::BF16}) {
      check_quantizer(64, 128, dtype, type, 1.0f);      // vectorised kernels: one row of 64 x 64 tiles
      check_quantizer(192, 320, dtype, type, 0.5f);     // vectorised kernels: 3 x 5 tiles
      check_quantizer(37, 45, dtype, type, 3.7f);       // ragged tiles
      check_quantizer(1, 1000, dtype, type, 1e-3f);     // one row
      check_quantizer(300, 33, dtype, type, 65536.0f);  // many values saturate
    }
#endif
}

// The device's cvt instruction (src/ops/cuda/fp8.cu hardware_encode, which the kernels take when
// kHardwareConversion is set) against the host reference's fp8_math::encode.
// Every one of the 2^32 float bit patterns (NaNs, infinities, subnormals, ties) must give the
// same code in both formats, or the quantizer tests above could pass by the luck of their values.
TEST(Fp8Parity, DeviceConversionEqualsTheReferenceRuleOnEveryFloat) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  Stream gpu = gpu_stream();
  for (ops::Fp8Type type : {ops::Fp8Type::E4M3, ops::Fp8Type::E5M2}) {
    uint32_t first = 0;
    const int64_t bad = ops::cuda::fp8_encode_mismatches(type, &first, gpu);
    float v;
    std::memcpy(&v, &first, sizeof v);
    EXPECT_EQ(bad, 0) << (type == ops::Fp8Type::E4M3 ? "e4m3" : "e5m2") << ": first differing float bits 0x"
                      << std::hex << first << " (" << v << ")";
  }
#endif
}

TEST(Fp8Parity, CublasLtGemmMatchesCpuEmulation) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  for (DType out : {DType::F32, DType::BF16}) {
    check_gemm(256, 384, 512, ops::Fp8Type::E4M3, out);  // fprop-like
    check_gemm(256, 384, 512, ops::Fp8Type::E5M2, out);  // dgrad / wgrad-like (hybrid)
    check_gemm(64, 40, 1024, ops::Fp8Type::E5M2, out);   // n not a multiple of 16
  }
#endif
}

TEST(Fp8Parity, CublasLtGemmRefusesWhatHopperCannotRun) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  Stream gpu = gpu_stream();
  Tensor buf = device_bytes(64 * 64, gpu);
  Tensor one = to_device({1.0f}, {1}, DType::F32, gpu);
  Tensor d = Tensor::zeros({64, 64}, DType::F32, gpu);
  EXPECT_THROW(ops::cuda::fp8_gemm(bytes_ptr(buf), ops::Fp8Type::E5M2, float_ptr(one), bytes_ptr(buf),
                                   ops::Fp8Type::E5M2, float_ptr(one), 64, 64, 64, 1.0f, d, gpu),
               Error);
  EXPECT_THROW(ops::cuda::fp8_gemm(bytes_ptr(buf), ops::Fp8Type::E4M3, float_ptr(one), bytes_ptr(buf),
                                   ops::Fp8Type::E4M3, float_ptr(one), 64, 64, 40, 1.0f, d, gpu),
               Error);
#endif
}

// ------------------------------------------------------------------------ blockwise scaling
// --fp8-recipe blockwise (docs/fp8.md "Blockwise scaling"): the CUDA block quantizers (1x128
// tiles row-wise and column-wise, 128x128 blocks in both orientations) bit for bit against the
// host reference, codes and scale grids (cuBLASLt layouts, padding included); the cuBLASLt
// VEC128 / BLK128x128 GEMMs of the three kinds a linear runs (fprop BLK x VEC, dgrad BLK of Wᵀ x
// VEC, wgrad VEC x VEC) against fp8_block_gemm_reference on the same codes and grids; and the
// Tensor-level path (ops::fp8_quantize_blockwise + ops::fp8_gemm, which picks each operand's
// orientation and grid) against the CPU backend. GEMM bounds: rel L2 kFp8GemmF32RelL2 = 1e-3 for
// f32 output (the codes and scales are equal on both sides; only the device's fp32 accumulation
// order and where it applies the block scales differ: ~1e-6 expected), kBf16ParityRelL2 = 1e-2
// for bf16 output (one bf16 rounding of each result).
#if MEGADLM_WITH_CUDA
namespace {

std::vector<float> transposed(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> o(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) o[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
  return o;
}

struct HostBlock {
  std::vector<uint8_t> codes;
  std::vector<float> grid;
};
HostBlock host_block(const std::vector<float>& x, int64_t rows, int64_t k, ops::Fp8Granularity g, ops::Fp8Type type,
                     bool power_of_2) {
  HostBlock h{std::vector<uint8_t>(x.size()),
              std::vector<float>(static_cast<size_t>(ops::fp8_block_grid_size(g, rows, k)))};
  ops::fp8_quantize_blockwise(x, rows, k, g, type, power_of_2, h.codes, h.grid);
  return h;
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

void check_block_quantizer(int64_t rows, int64_t cols, DType dtype, ops::Fp8Type type, ops::Fp8Granularity g,
                           bool power_of_2) {
  Stream gpu = gpu_stream();
  std::vector<float> x = fp8_test_values(rows * cols, static_cast<uint64_t>(rows * 977 + cols), true);
  for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>((rows - 1) * cols + c)] = 0.0f;  // zero tiles: scale 1
  if (dtype == DType::BF16) x = Tensor::from_floats(x, {rows, cols}, DType::BF16).to_floats(Stream::cpu());
  const Tensor xd = to_device(x, {rows, cols}, dtype, gpu);
  const ops::Fp8Tensor q = ops::fp8_quantize_blockwise(xd, type, g, true, true, power_of_2, gpu);
  const HostBlock want = host_block(x, rows, cols, g, type, power_of_2);
  const HostBlock want_t = host_block(transposed(x, rows, cols), cols, rows, g, type, power_of_2);
  const std::string what = detail::concat("fp8 block quantize ", rows, "x", cols, " ", dtype_name(dtype),
                                          type == ops::Fp8Type::E4M3 ? " e4m3" : " e5m2",
                                          g == ops::Fp8Granularity::Tile1x128 ? " 1x128" : " 128x128",
                                          power_of_2 ? " pow2" : " fp32 scales");
  EXPECT_EQ(download_bytes(q.data, rows * cols, gpu), want.codes) << what << ": row-wise codes";
  EXPECT_EQ(bits_of(q.scale_inv.to_floats(gpu)), bits_of(want.grid)) << what << ": row-wise scale grid";
  EXPECT_EQ(download_bytes(q.data_t, rows * cols, gpu), want_t.codes) << what << ": column-wise codes";
  EXPECT_EQ(bits_of(q.scale_inv_t.to_floats(gpu)), bits_of(want_t.grid)) << what << ": column-wise scale grid";
}

/// cuBLASLt D [n, m] = A [m, k] (granularity ga, e4m3) x B [n, k] (1x128 tiles, type_b), both
/// quantized on the host, against the CPU emulation.
void check_block_gemm(const char* kind, int64_t m, int64_t n, int64_t k, ops::Fp8Granularity ga,
                      ops::Fp8Type type_b, DType out, bool power_of_2) {
  Stream gpu = gpu_stream();
  const std::vector<float> a = bf16_values(m * k, -0.05f, 0.05f);
  std::vector<float> b = bf16_values(n * k, -3.0f, 3.0f);
  for (size_t i = 0; i < b.size(); i += 97) b[i] *= 64.0f;  // tiles with other scales
  const HostBlock qa = host_block(a, m, k, ga, ops::Fp8Type::E4M3, power_of_2);
  const HostBlock qb = host_block(b, n, k, ops::Fp8Granularity::Tile1x128, type_b, power_of_2);
  const Tensor qa_d = upload_bytes(qa.codes, gpu), qb_d = upload_bytes(qb.codes, gpu);
  const Tensor sa_d = to_device(qa.grid, {static_cast<int64_t>(qa.grid.size())}, DType::F32, gpu);
  const Tensor sb_d = to_device(qb.grid, {static_cast<int64_t>(qb.grid.size())}, DType::F32, gpu);
  Tensor d = poisoned({n, m}, out, gpu);
  const float alpha = 0.75f;
  ops::cuda::fp8_gemm(bytes_ptr(qa_d), ops::Fp8Type::E4M3, float_ptr(sa_d), bytes_ptr(qb_d), type_b, float_ptr(sb_d),
                      m, n, k, alpha, d, gpu, 0.0f, ga, ops::Fp8Granularity::Tile1x128);
  std::vector<float> want(static_cast<size_t>(m * n));
  ops::fp8_block_gemm_reference(qa.codes, ops::Fp8Type::E4M3, ga, qa.grid, qb.codes, type_b,
                                ops::Fp8Granularity::Tile1x128, qb.grid, m, n, k, alpha, want);
  const std::vector<double> want_d(want.begin(), want.end());
  const std::string what = detail::concat("fp8 block gemm ", kind, " ", m, "x", n, "x", k, " e4m3",
                                          ga == ops::Fp8Granularity::Block128x128 ? " BLK128x128" : " VEC128", " x ",
                                          type_b == ops::Fp8Type::E4M3 ? "e4m3" : "e5m2", " VEC128 -> ",
                                          dtype_name(out), power_of_2 ? "" : " (fp32 scales)");
  expect_close(what, download(d, gpu), want_d, out == DType::F32 ? test::kFp8GemmF32RelL2 : test::kBf16ParityRelL2);
}

}  // namespace
#endif

TEST(Fp8Parity, BlockwiseQuantizerMatchesCpuBitForBit) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  for (ops::Fp8Type type : {ops::Fp8Type::E4M3, ops::Fp8Type::E5M2})
    for (DType dtype : {DType::F32, DType::BF16})
      for (ops::Fp8Granularity g : {ops::Fp8Granularity::Tile1x128, ops::Fp8Granularity::Block128x128})
        for (bool pow2 : {true, false}) {
          check_block_quantizer(256, 384, dtype, type, g, pow2);  // whole tiles
          check_block_quantizer(200, 300, dtype, type, g, pow2);  // partial last tiles / blocks
          check_block_quantizer(3, 1000, dtype, type, g, pow2);   // rows not a multiple of 4: grid padding
        }
#endif
}

// A weight's transposed codes made from its row-wise cast (ops::fp8_columnwise, what the FP8
// linears' data-gradient GEMMs read) are the codes and grid of the quantizer's own column-wise
// pass, byte for byte: per-tensor (bf16 and f32 weights) and 128x128 blocks, with shapes whose
// last 64x64 transpose tiles and 128x128 blocks are partial.
TEST(Fp8Parity, TransposedWeightCodesEqualTheColumnwiseCast) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  Stream gpu = gpu_stream();
  // Whole 64 x 64 tiles take the 8-bytes-a-thread transpose, the others the byte-a-thread one.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{256, 384}, {192, 640}, {200, 336}, {48, 1000}, {1040, 80}};
  for (const auto& [rows, cols] : shapes)
    for (DType dtype : {DType::F32, DType::BF16}) {
      const Tensor w = to_device(fp8_test_values(rows * cols, static_cast<uint64_t>(rows + 7 * cols), false),
                                 {rows, cols}, dtype, gpu);
      const std::string what = detail::concat(rows, "x", cols, " ", dtype_name(dtype));
      const Tensor scale = to_device({0.75f}, {1}, DType::F32, gpu);
      const ops::Fp8Tensor both = ops::fp8_quantize(w, scale, ops::Fp8Type::E4M3, /*columnwise=*/true, nullptr, gpu);
      const ops::Fp8Tensor row = ops::fp8_quantize(w, scale, ops::Fp8Type::E4M3, /*columnwise=*/false, nullptr, gpu);
      ASSERT_FALSE(row.data_t.defined()) << what;
      const ops::Fp8Tensor t = ops::fp8_columnwise(row, gpu);
      EXPECT_EQ(download_bytes(t.data_t, rows * cols, gpu), download_bytes(both.data_t, rows * cols, gpu))
          << what << ": per-tensor transposed codes";
      EXPECT_EQ(t.scale_inv.to_floats(gpu), both.scale_inv.to_floats(gpu)) << what;
      const auto blk = [&](bool columnwise) {
        return ops::fp8_quantize_blockwise(w, ops::Fp8Type::E4M3, ops::Fp8Granularity::Block128x128, true,
                                           columnwise, true, gpu);
      };
      const ops::Fp8Tensor bboth = blk(true);
      const ops::Fp8Tensor bt = ops::fp8_columnwise(blk(false), gpu);
      EXPECT_EQ(download_bytes(bt.data_t, rows * cols, gpu), download_bytes(bboth.data_t, rows * cols, gpu))
          << what << ": 128x128 transposed codes";
      EXPECT_EQ(bt.scale_inv_t.to_floats(gpu), bboth.scale_inv_t.to_floats(gpu)) << what << ": transposed grid";
    }
  // 1x128 tiles run along one orientation: refused.
  const Tensor x = to_device(fp8_test_values(128 * 128, 5, false), {128, 128}, DType::F32, gpu);
  EXPECT_ANY_THROW(ops::fp8_columnwise(
      ops::fp8_quantize_blockwise(x, ops::Fp8Type::E4M3, ops::Fp8Granularity::Tile1x128, true, false, true, gpu), gpu));
#endif
}

TEST(Fp8Parity, FusedSwigluBackwardCodesEqualTheUnfusedCasts) {
  // ops::fp8_swiglu_backward (MLP backward under delayed scaling) against its definition on the
  // same GPU: swiglu_backward_recompute in bf16, then fp8_quantize of dfc1 (both orientations)
  // and of act (column-wise): every code, both amaxes and the scale_inv bit for bit. The first
  // shapes take the fused kernel (multiples of 64), the last the composition.
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  Stream gpu = gpu_stream();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{128, 192}, {256, 64}, {64, 512}, {100, 96}};
  for (const auto& [rows, f] : shapes) {
    const std::string what = detail::concat(rows, "x", f);
    // Gate and up around +-4 (the sigmoid's bends), dact small like a gradient.
    std::vector<float> x = fp8_test_values(rows * 2 * f, static_cast<uint64_t>(rows + 3 * f), false);
    for (float& v : x) v = std::fmod(v, 6.0f);
    std::vector<float> d = fp8_test_values(rows * f, static_cast<uint64_t>(rows * 5 + f), false);
    for (float& v : d) v = std::fmod(v, 1.0f) * 1e-3f;
    const Tensor fc1_out = to_device(x, {rows, 2 * f}, DType::BF16, gpu);
    const Tensor dact = to_device(d, {rows, f}, DType::BF16, gpu);
    const auto target = [&](float scale, float amax0, ops::Fp8Type type) {
      return ops::Fp8CastTarget{.scale = to_device({scale}, {1}, DType::F32, gpu),
                                .amax = to_device({amax0}, {1}, DType::F32, gpu),
                                .type = type};
    };
    // amax0 below (dfc1) and above (act) the values' own maxima: both max rules show.
    const ops::Fp8CastTarget td = target(2048.0f, 1e-6f, ops::Fp8Type::E5M2), ta = target(24.0f, 100.0f, ops::Fp8Type::E4M3);
    const ops::Fp8CastTarget rd = target(2048.0f, 1e-6f, ops::Fp8Type::E5M2), ra = target(24.0f, 100.0f, ops::Fp8Type::E4M3);
    ops::Fp8Tensor dfc1, act;
    ops::fp8_swiglu_backward(dact, fc1_out, td, ta, dfc1, act, gpu);
    Tensor dx = Tensor::empty({rows, 2 * f}, DType::BF16, gpu), y = Tensor::empty({rows, f}, DType::BF16, gpu);
    ops::swiglu_backward_recompute(dact, fc1_out, dx, y, gpu);
    Tensor rd_amax = rd.amax, ra_amax = ra.amax;
    const ops::Fp8Tensor want_d = ops::fp8_quantize(dx, rd.scale, rd.type, true, &rd_amax, gpu);
    const ops::Fp8Tensor want_a = ops::fp8_quantize(y, ra.scale, ra.type, true, &ra_amax, gpu, false);
    const int64_t n = rows * 2 * f;
    ASSERT_TRUE(dfc1.data.defined() && dfc1.data_t.defined() && act.data_t.defined()) << what;
    EXPECT_EQ(dfc1.rows, rows);
    EXPECT_EQ(dfc1.cols, 2 * f);
    EXPECT_EQ(act.cols, f);
    EXPECT_EQ(download_bytes(dfc1.data, n, gpu), download_bytes(want_d.data, n, gpu)) << what << ": dfc1 row-wise";
    EXPECT_EQ(download_bytes(dfc1.data_t, n, gpu), download_bytes(want_d.data_t, n, gpu)) << what << ": dfc1 column-wise";
    EXPECT_EQ(download_bytes(act.data_t, n / 2, gpu), download_bytes(want_a.data_t, n / 2, gpu)) << what << ": act";
    EXPECT_EQ(td.amax.to_floats(gpu), rd_amax.to_floats(gpu)) << what << ": dfc1 amax";
    EXPECT_EQ(ta.amax.to_floats(gpu), ra_amax.to_floats(gpu)) << what << ": act amax";
    EXPECT_GT(td.amax.to_floats(gpu)[0], 1e-6f) << what << ": the dfc1 amax was not raised";
    EXPECT_EQ(dfc1.scale_inv.to_floats(gpu), want_d.scale_inv.to_floats(gpu)) << what;
    EXPECT_EQ(act.scale_inv.to_floats(gpu), want_a.scale_inv.to_floats(gpu)) << what;
  }
#endif
}

TEST(Fp8Parity, BlockwiseGemmsMatchCpuEmulation) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  using G = ops::Fp8Granularity;
  for (DType out : {DType::F32, DType::BF16}) {
    // A linear with T = 256 tokens, in = 512, out = 384 (hybrid: gradients e5m2).
    check_block_gemm("fprop", 384, 256, 512, G::Block128x128, ops::Fp8Type::E4M3, out, true);
    // dgrad's K = 384 gives KB = 3: its BLK128x128 grid has a padded row stride pad4(3) = 4,
    // a part of the layout (docs/fp8.md "Scale-grid layout") no earlier probe checked.
    check_block_gemm("dgrad", 512, 256, 384, G::Block128x128, ops::Fp8Type::E5M2, out, true);
    check_block_gemm("wgrad", 512, 384, 256, G::Tile1x128, ops::Fp8Type::E5M2, out, true);
  }
  check_block_gemm("fprop", 384, 256, 512, G::Block128x128, ops::Fp8Type::E4M3, DType::F32, false);
  check_block_gemm("wgrad", 512, 384, 256, G::Tile1x128, ops::Fp8Type::E5M2, DType::F32, false);
#endif
}

// The path the FP8 linears take: quantize on each backend, then the three GEMMs through
// ops::fp8_gemm (orientation and grid chosen per operand; wgrad accumulating into f32 with
// beta = 1, through cuBLASLt's C = D or, where it has no algorithm for that, an f32 product).
TEST(Fp8Parity, BlockwiseLinearGemmsMatchCpu) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  Stream gpu = gpu_stream();
  const Stream& cpu = Stream::cpu();
  const int64_t t = 256, in = 512, out = 384;
  const std::vector<float> xv = bf16_values(t * in, -3.0f, 3.0f), wv = bf16_values(out * in, -0.05f, 0.05f),
                           dyv = bf16_values(t * out, -1e-3f, 1e-3f), dw0 = bf16_values(out * in, -1.0f, 1.0f);
  std::vector<double> res[2][4];
  for (int side = 0; side < 2; ++side) {
    const Stream& s = side == 0 ? cpu : static_cast<const Stream&>(gpu);
    auto put = [&](const std::vector<float>& v, const Shape& shape) {
      return side == 0 ? Tensor::from_floats(v, shape) : to_device(v, shape, DType::F32, gpu);
    };
    const Tensor x = put(xv, {t, in}), w = put(wv, {out, in}), dy = put(dyv, {t, out});
    const ops::Fp8Tensor xq = ops::fp8_quantize_blockwise(x, ops::Fp8Type::E4M3, ops::Fp8Granularity::Tile1x128,
                                                          true, true, true, s);
    const ops::Fp8Tensor wq = ops::fp8_quantize_blockwise(w, ops::Fp8Type::E4M3, ops::Fp8Granularity::Block128x128,
                                                          true, true, true, s);
    const ops::Fp8Tensor dyq = ops::fp8_quantize_blockwise(dy, ops::Fp8Type::E5M2, ops::Fp8Granularity::Tile1x128,
                                                           true, true, true, s);
    Tensor y = Tensor::zeros({t, out}, DType::F32, s), dx = Tensor::zeros({t, in}, DType::F32, s);
    Tensor dw = put(dw0, {out, in});
    Tensor yb = Tensor::zeros({t, out}, side == 0 ? DType::F32 : DType::BF16, s);
    ops::fp8_gemm(xq, wq, y, {.trans_b = true}, s);
    ops::fp8_gemm(xq, wq, yb, {.trans_b = true}, s);
    ops::fp8_gemm(dyq, wq, dx, {}, s);
    ops::fp8_gemm(dyq, xq, dw, {.trans_a = true, .beta = 1.0f}, s);
    s.synchronize();
    res[side][0] = test::to_doubles(y, s);
    res[side][1] = test::to_doubles(dx, s);
    res[side][2] = test::to_doubles(dw, s);
    res[side][3] = test::to_doubles(yb, s);
  }
  expect_close("blockwise linear fprop (f32)", res[1][0], res[0][0], test::kFp8GemmF32RelL2);
  expect_close("blockwise linear dgrad (f32)", res[1][1], res[0][1], test::kFp8GemmF32RelL2);
  expect_close("blockwise linear wgrad (f32, beta 1)", res[1][2], res[0][2], test::kFp8GemmF32RelL2);
  expect_close("blockwise linear fprop (bf16)", res[1][3], res[0][3], test::kBf16ParityRelL2);
#endif
}

// The residual stream's GEMM, y = x W^T + r in bf16 with r a separate addend (the attention
// and MLP output projections): cuBLASLt reads r as its C, per-tensor and blockwise, against the
// CPU emulation within bf16 rounding; r unchanged; and the same numbers as r copied into y first
// and accumulated in place (beta = 1), which is the other form of the same epilogue.
TEST(Fp8Parity, ResidualAddendInTheGemmMatchesCpu) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  Stream gpu = gpu_stream();
  const int64_t t = 256, in = 512, out = 384;
  const Input x = make_input({t, in}, DType::F32, gpu, -3.0f, 3.0f), w = make_input({out, in}, DType::F32, gpu, -0.05f, 0.05f);
  const Input r = make_input({t, out}, DType::BF16, gpu, -2.0f, 2.0f);
  for (bool blockwise : {false, true}) {
    const std::string what = blockwise ? "blockwise" : "per-tensor";
    // x in 1x128 tiles and w in 128x128 blocks, or both per tensor with the scale 4.
    const auto quantize = [&](const Tensor& v, ops::Fp8Granularity g, const Stream& s) {
      return blockwise ? ops::fp8_quantize_blockwise(v, ops::Fp8Type::E4M3, g, true, false, true, s)
                       : ops::fp8_quantize(v, Tensor::from_floats({4.0f}, {1}).to(s.device(), s), ops::Fp8Type::E4M3,
                                           false, nullptr, s);
    };
    const Stream& cpu = Stream::cpu();
    Tensor y_cpu = Tensor::zeros({t, out}, DType::F32, cpu);
    ops::fp8_gemm(quantize(x.host, ops::Fp8Granularity::Tile1x128, cpu),
                  quantize(w.host, ops::Fp8Granularity::Block128x128, cpu), y_cpu,
                  {.trans_b = true, .beta = 1.0f, .addend = &r.host}, cpu);
    const std::vector<double> want = test::to_doubles(y_cpu, cpu);
    const ops::Fp8Tensor xq = quantize(x.device, ops::Fp8Granularity::Tile1x128, gpu);
    const ops::Fp8Tensor wq = quantize(w.device, ops::Fp8Granularity::Block128x128, gpu);
    Tensor y = poisoned({t, out}, DType::BF16, gpu);
    ops::fp8_gemm(xq, wq, y, {.trans_b = true, .beta = 1.0f, .addend = &r.device}, gpu);
    Tensor in_place = r.device.to(gpu.device(), gpu);
    ops::fp8_gemm(xq, wq, in_place, {.trans_b = true, .beta = 1.0f, .addend = &in_place}, gpu);
    const std::vector<double> got = download(y, gpu);
    expect_close(what + " y = x W^T + r (bf16)", got, want, test::kBf16ParityRelL2);
    expect_identical(what + " r unchanged", download(r.device, gpu), as_doubles(r.values));
    expect_close(what + " separate addend vs in place", got, download(in_place, gpu), test::kBf16ParityRelL2);
  }
#endif
}

// A weight gradient over a token count that is no multiple of 16 (a varilen-truncated
// micro-batch: 8 rows of 331 tokens), which cuBLASLt's FP8 GEMMs cannot take as K: the codes are
// padded along K with zeros on the device; against the CPU emulation, accumulating into f32.
TEST(Fp8Parity, WeightGradientOverAnyTokenCountMatchesCpu) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  Stream gpu = gpu_stream();
  for (int64_t t : {int64_t{2648}, int64_t{40}, int64_t{7}}) {
    const int64_t in = 256, out = 384;
    const Input x = make_input({t, in}, DType::BF16, gpu, -3.0f, 3.0f), dy = make_input({t, out}, DType::BF16, gpu, -1e-3f, 1e-3f);
    const Input dw0 = make_input({out, in}, DType::F32, gpu);
    const auto wgrad = [&](const Tensor& xs, const Tensor& dys, Tensor dw, const Stream& s) {
      const Tensor sx = Tensor::from_floats({8.0f}, {1}).to(s.device(), s), sd = Tensor::from_floats({65536.0f}, {1}).to(s.device(), s);
      const ops::Fp8Tensor xq = ops::fp8_quantize(xs, sx, ops::Fp8Type::E4M3, true, nullptr, s, false);
      const ops::Fp8Tensor dyq = ops::fp8_quantize(dys, sd, ops::Fp8Type::E5M2, true, nullptr, s);
      ops::fp8_gemm(dyq, xq, dw, {.trans_a = true, .beta = 1.0f}, s);
      return test::to_doubles(dw, s);
    };
    const std::vector<double> want = wgrad(x.host, dy.host, dw0.host, Stream::cpu());
    const std::vector<double> got = wgrad(x.device, dy.device, dw0.device, gpu);
    expect_close(detail::concat("wgrad over ", t, " tokens"), got, want, test::kFp8GemmF32RelL2);
  }
#endif
}

TEST(Fp8Parity, BlockwiseGemmRefusesWhatCublasLtCannotRun) {
  MDLM_REQUIRE_GPU();
#if MEGADLM_WITH_CUDA
  Stream gpu = gpu_stream();
  using G = ops::Fp8Granularity;
  Tensor buf = device_bytes(256 * 256, gpu);
  Tensor grid = Tensor::zeros({1024}, DType::F32, gpu);
  Tensor d = Tensor::zeros({256, 256}, DType::F32, gpu);
  // K not a multiple of 128.
  EXPECT_THROW(ops::cuda::fp8_gemm(bytes_ptr(buf), ops::Fp8Type::E4M3, float_ptr(grid), bytes_ptr(buf),
                                   ops::Fp8Type::E4M3, float_ptr(grid), 256, 256, 192, 1.0f, d, gpu, 0.0f,
                                   G::Tile1x128, G::Tile1x128),
               Error);
  // 128x128 x 128x128, and one operand per-tensor scaled.
  EXPECT_THROW(ops::cuda::fp8_gemm(bytes_ptr(buf), ops::Fp8Type::E4M3, float_ptr(grid), bytes_ptr(buf),
                                   ops::Fp8Type::E4M3, float_ptr(grid), 256, 256, 256, 1.0f, d, gpu, 0.0f,
                                   G::Block128x128, G::Block128x128),
               Error);
  EXPECT_THROW(ops::cuda::fp8_gemm(bytes_ptr(buf), ops::Fp8Type::E4M3, float_ptr(grid), bytes_ptr(buf),
                                   ops::Fp8Type::E4M3, float_ptr(grid), 256, 256, 256, 1.0f, d, gpu, 0.0f,
                                   G::Block128x128, G::Tensor),
               Error);
#endif
}
