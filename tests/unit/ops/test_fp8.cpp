// FP8 numerics (include/megadlm/ops/fp8.h) against an independent exact-arithmetic reference,
// tests/golden/fp8_reference.py: every code of both formats decoded, encodes of every value,
// every tie and its fp32 neighbours, saturation, NaN, subnormals and underflow, quantization with
// a scale, current scaling and delayed scaling over eight steps. All comparisons are bit-exact:
// the conversions and scale rules are exact definitions, there is no accumulation to tolerate.
#include <gtest/gtest.h>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include "megadlm/core/error.h"
#include "megadlm/ops/fp8.h"

using namespace megadlm::ops;

namespace {

struct Fp8DecodeCase { int type; uint8_t code; uint32_t bits; };
struct Fp8EncodeCase { int type; uint32_t x; uint8_t code; };
struct Fp8QuantizeCase { int type; uint32_t x; uint32_t scale; uint8_t code; };
struct Fp8CurrentScaleCase { int type; uint32_t amax; int power_of_2; uint32_t epsilon; uint32_t scale; };
struct Fp8DelayedCase {
  int type, len, algo, margin, steps;
  uint32_t amax[8];
  uint32_t scale[8];
};
#include "golden/fp8_reference.inc"

float f(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
Fp8Type type_of(int t) { return t == 0 ? Fp8Type::E4M3 : Fp8Type::E5M2; }
std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

std::filesystem::path source_root() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "..";
}

}  // namespace

TEST(Fp8, MaxFiniteValues) {
  EXPECT_EQ(fp8_max(Fp8Type::E4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Type::E5M2), 57344.0f);
}

TEST(Fp8, DecodesEveryCodeLikeTheReference) {
  ASSERT_EQ(std::size(kFp8Decode), 512u);
  int nans[2] = {0, 0};
  for (const Fp8DecodeCase& c : kFp8Decode) {
    const float v = fp8_decode(c.code, type_of(c.type));
    if (c.bits == 0x7FC00000u) {
      EXPECT_TRUE(std::isnan(v)) << "type " << c.type << " code " << int(c.code);
      ++nans[c.type];
    } else {
      EXPECT_EQ(bits(v), c.bits) << "type " << c.type << " code " << int(c.code) << ": " << v;
    }
  }
  EXPECT_EQ(nans[0], 2);  // e4m3: only S.1111.111
  EXPECT_EQ(nans[1], 6);  // e5m2: S.11111.{01,10,11}
}

TEST(Fp8, EncodesEdgeValuesTiesAndSaturationLikeTheReference) {
  ASSERT_GT(std::size(kFp8Encode), 1000u);
  for (const Fp8EncodeCase& c : kFp8Encode)
    EXPECT_EQ(int(fp8_encode(f(c.x), type_of(c.type))), int(c.code))
        << "type " << c.type << " x " << hex(c.x) << " (" << f(c.x) << ")";
}

TEST(Fp8, EncodeOfEveryDecodedValueIsItsCode) {
  for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2})
    for (int code = 0; code < 256; ++code) {
      const float v = fp8_decode(static_cast<uint8_t>(code), t);
      if (std::isnan(v)) continue;
      if (std::isinf(v)) {  // e5m2 infinities saturate
        EXPECT_EQ(fp8_encode(v, t), v > 0 ? 0x7B : 0xFB);
        continue;
      }
      EXPECT_EQ(int(fp8_encode(v, t)), code) << v;
    }
}

TEST(Fp8, HandWorkedValues) {
  // The worked example of docs/fp8.md: amax 3.5 -> s = 128; 0.0123 * 128 = 1.5744 -> 1.625.
  EXPECT_EQ(fp8_current_scale(3.5f, 448.0f), 128.0f);
  EXPECT_EQ(fp8_decode(fp8_encode(0.0123f * 128.0f, Fp8Type::E4M3), Fp8Type::E4M3), 1.625f);
  // Ties go to the even code: 1.0625 lies halfway between 1 (0x38) and 1.125 (0x39).
  EXPECT_EQ(fp8_encode(1.0625f, Fp8Type::E4M3), 0x38);
  EXPECT_EQ(fp8_encode(1.1875f, Fp8Type::E4M3), 0x3A);  // halfway 1.125 / 1.25 -> 1.25 (even)
  // Saturation, never NaN or inf: 464 (halfway to the non-existent 480) and inf -> 448.
  EXPECT_EQ(fp8_encode(464.0f, Fp8Type::E4M3), 0x7E);
  EXPECT_EQ(fp8_encode(-INFINITY, Fp8Type::E4M3), 0xFE);
  EXPECT_EQ(fp8_encode(INFINITY, Fp8Type::E5M2), 0x7B);
  EXPECT_EQ(fp8_encode(NAN, Fp8Type::E5M2), 0x7F);
  // Smallest subnormals: 2^-9 (e4m3), 2^-16 (e5m2); half of it is a tie with zero -> 0.
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -9), Fp8Type::E4M3), 0x01);
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -10), Fp8Type::E4M3), 0x00);
  EXPECT_EQ(fp8_encode(-std::ldexp(1.0f, -17), Fp8Type::E5M2), 0x80);
}

TEST(Fp8, QuantizeWithAScaleLikeTheReference) {
  for (const Fp8QuantizeCase& c : kFp8Quantize) {
    const float x = f(c.x);
    uint8_t out = 0;
    const float amax = fp8_quantize({&x, 1}, f(c.scale), type_of(c.type), {&out, 1});
    EXPECT_EQ(int(out), int(c.code)) << "x " << x << " scale " << f(c.scale);
    EXPECT_EQ(amax, std::fabs(x));
  }
}

TEST(Fp8, QuantizeAndDequantizeASpan) {
  const std::vector<float> x = {0.5f, -3.0f, NAN, 100.0f, -0.001f};
  std::vector<uint8_t> codes(x.size());
  const float amax = fp8_quantize(x, 2.0f, Fp8Type::E4M3, codes);
  EXPECT_EQ(amax, 100.0f);  // NaN ignored
  std::vector<float> back(x.size());
  fp8_dequantize(codes, 0.5f, Fp8Type::E4M3, back);
  EXPECT_EQ(back[0], 0.5f);
  EXPECT_EQ(back[1], -3.0f);
  EXPECT_TRUE(std::isnan(back[2]));
  EXPECT_EQ(back[3], 96.0f);  // 200 is halfway between 192 and 208: the even code, 192; / 2
  EXPECT_EQ(back[4], -0.0009765625f);  // -0.002 -> -2^-9, the smallest subnormal
}

TEST(Fp8, CurrentScaleLikeTheReference) {
  for (const Fp8CurrentScaleCase& c : kFp8CurrentScale) {
    const float s = fp8_current_scale(f(c.amax), fp8_max(type_of(c.type)), c.power_of_2 != 0,
                                      f(c.epsilon));
    EXPECT_EQ(bits(s), c.scale) << "type " << c.type << " amax " << hex(c.amax) << " pow2 "
                                << c.power_of_2 << " eps " << f(c.epsilon) << ": got " << s;
  }
  EXPECT_EQ(fp8_current_scale(0.0f, 448.0f), 1.0f);
  EXPECT_EQ(fp8_current_scale(std::ldexp(1.0f, -140), 448.0f), FLT_MAX);
  EXPECT_EQ(fp8_current_scale(3.0f, 448.0f, true), 128.0f);  // 149.33 rounded down
}

TEST(Fp8, DelayedScalingOverStepsLikeTheReference) {
  for (const Fp8DelayedCase& c : kFp8Delayed) {
    Fp8ScalingState state(c.len);
    for (int step = 0; step < c.steps; ++step) {
      fp8_record_amax(state, f(c.amax[step]));
      const float s = fp8_delayed_update(state, type_of(c.type), c.margin,
                                         c.algo ? AmaxComputeAlgo::Max : AmaxComputeAlgo::MostRecent);
      EXPECT_EQ(bits(s), c.scale[step])
          << "type " << c.type << " len " << c.len << " algo " << c.algo << " margin " << c.margin
          << " step " << step << ": got " << s << ", expected " << f(c.scale[step]);
    }
  }
}

TEST(Fp8, DelayedScalingWorkedExampleOfTheHeader) {
  Fp8ScalingState st(3);
  const float amaxes[] = {2, 8, 4, 1, 1};
  const float expect[] = {224, 56, 56, 56, 112};
  for (int i = 0; i < 5; ++i) {
    fp8_record_amax(st, amaxes[i]);
    EXPECT_EQ(fp8_delayed_update(st, Fp8Type::E4M3, 0, AmaxComputeAlgo::Max), expect[i]) << i;
    if (i == 2) {
      EXPECT_EQ(st.amax_history, (std::vector<float>{0, 8, 4}));
    }
  }
  // Micro-batches of one step share slot 0 (their maximum).
  Fp8ScalingState mb(1);
  fp8_record_amax(mb, 3.5f);
  fp8_record_amax(mb, 1.0f);
  EXPECT_EQ(fp8_delayed_update(mb, Fp8Type::E4M3, 1, AmaxComputeAlgo::MostRecent), 64.0f);
  EXPECT_EQ(mb.scale_inv(), 1.0f / 64.0f);
}

// The checked-in table is what the reference script prints today (python3 needed; no numpy).
TEST(Fp8, GoldenTableMatchesItsScript) {
  const std::filesystem::path root = source_root();
  const std::filesystem::path script = root / "tests" / "golden" / "fp8_reference.py";
  const std::filesystem::path inc = root / "tests" / "golden" / "fp8_reference.inc";
  if (std::system("python3 -c 'import fractions' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 not found: the golden table is not regenerated";
  ASSERT_TRUE(std::filesystem::exists(script)) << script;
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("fp8_reference_" + std::to_string(::getpid()) + ".inc");
  const std::string cmd = "python3 '" + script.string() + "' > '" + out.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  const std::string fresh = slurp(out), committed = slurp(inc);
  std::filesystem::remove(out);
  EXPECT_FALSE(fresh.empty());
  EXPECT_TRUE(fresh == committed)
      << "tests/golden/fp8_reference.inc differs from what tests/golden/fp8_reference.py prints; "
         "regenerate it (command in the script's header)";
}

// The emulated GEMM on codes whose values are small integers times powers of two: every product
// and every partial sum is exact, so the expected output is computed independently by hand-rolled
// integer arithmetic and must match exactly.
TEST(Fp8Gemm, ReferenceIsExactOnExactlyRepresentableData) {
  const int64_t m = 3, n = 2, k = 4;
  // a (e4m3) holds integers -4..4, b (e5m2) integers -2..2: both exactly representable.
  std::vector<int> ai(m * k), bi(n * k);
  for (int64_t i = 0; i < m * k; ++i) ai[i] = static_cast<int>((i * 5) % 9) - 4;
  for (int64_t i = 0; i < n * k; ++i) bi[i] = static_cast<int>((i * 3) % 5) - 2;
  std::vector<uint8_t> a(m * k), b(n * k);
  for (size_t i = 0; i < a.size(); ++i) a[i] = fp8_encode(static_cast<float>(ai[i]), Fp8Type::E4M3);
  for (size_t i = 0; i < b.size(); ++i) b[i] = fp8_encode(static_cast<float>(bi[i]), Fp8Type::E5M2);
  std::vector<float> d(m * n);
  fp8_gemm_reference(a, Fp8Type::E4M3, 0.5f, b, Fp8Type::E5M2, 0.25f, m, n, k, 2.0f, d);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      int dot = 0;
      for (int64_t p = 0; p < k; ++p) dot += ai[i * k + p] * bi[j * k + p];
      EXPECT_EQ(d[j * m + i], static_cast<float>(dot) * 0.25f) << i << "," << j;  // 2·0.5·0.25
    }
  EXPECT_THROW(fp8_gemm_reference(b, Fp8Type::E5M2, 1, b, Fp8Type::E5M2, 1, n, n, k, 1, d),
               megadlm::Error);
}

// Quantize -> emulated GEMM -> dequantized result tracks the fp32 GEMM of the unquantized data
// within what e4m3 rounding allows (relative spacing 2^-3 per operand: each product is within
// ~2^-3 of its exact value, and random signs make the relative L2 error far smaller).
TEST(Fp8Gemm, QuantizedGemmTracksTheFp32Gemm) {
  const int64_t m = 16, n = 8, k = 64;
  std::vector<float> x(m * k), w(n * k);
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.0f * 2.0f - 1.0f;
  };
  for (float& v : x) v = 3.0f * next();
  for (float& v : w) v = 0.01f * next();
  const float sx = fp8_current_scale(fp8_amax(x), 448.0f), sw = fp8_current_scale(fp8_amax(w), 448.0f);
  std::vector<uint8_t> qx(x.size()), qw(w.size());
  fp8_quantize(x, sx, Fp8Type::E4M3, qx);
  fp8_quantize(w, sw, Fp8Type::E4M3, qw);
  std::vector<float> d(m * n);
  fp8_gemm_reference(qx, Fp8Type::E4M3, 1 / sx, qw, Fp8Type::E4M3, 1 / sw, m, n, k, 1.0f, d);
  double err = 0, ref = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double exact = 0;
      for (int64_t p = 0; p < k; ++p) exact += double(x[i * k + p]) * w[j * k + p];
      err += (d[j * m + i] - exact) * (d[j * m + i] - exact);
      ref += exact * exact;
    }
  EXPECT_LT(std::sqrt(err / ref), 0.06);   // e4m3: 3 mantissa bits, ~2^-4 relative per operand
  EXPECT_GT(std::sqrt(err / ref), 1e-4);   // and it is really quantized (not an fp32 product)
}

TEST(Fp8, QuantizeTransposeWritesTheTransposedCodes) {
  const int64_t rows = 3, cols = 5;
  std::vector<float> x(rows * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.37f * static_cast<float>(i) - 2.0f;
  std::vector<uint8_t> row_wise(x.size()), col_wise(x.size());
  const float amax_r = fp8_quantize(x, 7.0f, Fp8Type::E5M2, row_wise);
  const float amax_c = fp8_quantize_transpose(x, rows, cols, 7.0f, Fp8Type::E5M2, col_wise);
  EXPECT_EQ(amax_r, amax_c);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(col_wise[c * rows + r], row_wise[r * cols + c]);
}
