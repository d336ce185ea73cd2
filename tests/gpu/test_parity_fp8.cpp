// FP8 parity: the CUDA quantizer (ops/cuda/fp8_cuda.h) against the host reference
// (megadlm/ops/fp8.h), codes and amax bit for bit, row-wise and transposed, f32 and bf16 inputs,
// e4m3 and e5m2, with values that exercise saturation, NaN and subnormals; and the cuBLASLt FP8
// GEMM (TN, e4m3 x e4m3 and e4m3 x e5m2, f32 and bf16 output) against the CPU emulation on the
// same codes and scales. Bounds: see kFp8GemmF32RelL2 and kBf16ParityRelL2.
#include <gtest/gtest.h>
#include <cmath>
#include <cstring>
#include <random>
#include "megadlm/ops/fp8.h"
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
