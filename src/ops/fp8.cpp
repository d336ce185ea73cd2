// Host FP8 numerics (include/megadlm/ops/fp8.h): conversions through fp8_math.h, the scale
// rules, and quantization loops. Plain loops: this is the reference the CUDA kernels match.
#include "megadlm/ops/fp8.h"
#include <algorithm>
#include <cfloat>
#include <cmath>
#include "megadlm/core/error.h"
#include "ops/fp8_math.h"

namespace megadlm::ops {

namespace {
fp8_math::Format format_of(Fp8Type type) {
  return type == Fp8Type::E4M3 ? fp8_math::e4m3() : fp8_math::e5m2();
}
}  // namespace

float fp8_max(Fp8Type type) { return format_of(type).max_finite; }

float fp8_decode(uint8_t code, Fp8Type type) { return fp8_math::decode(code, format_of(type)); }

uint8_t fp8_encode(float x, Fp8Type type) { return fp8_math::encode(x, format_of(type)); }

float fp8_current_scale(float amax, float fp8_max_value, bool power_of_2, float amax_epsilon) {
  amax = std::max(amax, amax_epsilon);  // NaN amax stays NaN (std::max keeps the first argument)
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  float s = fp8_max_value / amax;
  if (std::isinf(s)) s = FLT_MAX;
  if (power_of_2) s = fp8_math::bits_float(fp8_math::float_bits(s) & 0xFF800000u);
  return s;
}

float fp8_delayed_scale(float amax, float fp8_max_value, int margin, float previous_scale) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous_scale;
  float s = fp8_max_value / amax;
  if (std::isinf(s)) s = FLT_MAX;
  s = std::ldexp(s, -margin);
  if (std::isinf(s)) s = FLT_MAX;
  return s;
}

void fp8_record_amax(Fp8ScalingState& state, float amax) {
  MDLM_CHECK(!state.amax_history.empty(), "an FP8 amax history needs at least one slot");
  if (amax > state.amax_history[0]) state.amax_history[0] = amax;
}

float fp8_delayed_update(Fp8ScalingState& state, Fp8Type type, int margin, AmaxComputeAlgo algo) {
  std::vector<float>& h = state.amax_history;
  MDLM_CHECK(!h.empty(), "an FP8 amax history needs at least one slot");
  const float amax = algo == AmaxComputeAlgo::Max ? *std::max_element(h.begin(), h.end()) : h[0];
  state.scale = fp8_delayed_scale(amax, fp8_max(type), margin, state.scale);
  std::rotate(h.begin(), h.begin() + 1, h.end());
  h[0] = 0.0f;
  return state.scale;
}

float fp8_amax(std::span<const float> x) {
  float m = 0.0f;
  for (float v : x) m = std::fmax(m, std::fabs(v));  // fmax drops a NaN operand
  return m;
}

float fp8_quantize(std::span<const float> x, float scale, Fp8Type type, std::span<uint8_t> out) {
  MDLM_CHECK(out.size() == x.size(), "fp8_quantize: out has ", out.size(), " elements, x has ",
             x.size());
  const fp8_math::Format f = format_of(type);
  for (size_t i = 0; i < x.size(); ++i) out[i] = fp8_math::encode(x[i] * scale, f);
  return fp8_amax(x);
}

void fp8_dequantize(std::span<const uint8_t> codes, float scale_inv, Fp8Type type,
                    std::span<float> out) {
  MDLM_CHECK(out.size() == codes.size(), "fp8_dequantize: out has ", out.size(),
             " elements, codes has ", codes.size());
  const fp8_math::Format f = format_of(type);
  for (size_t i = 0; i < codes.size(); ++i) out[i] = fp8_math::decode(codes[i], f) * scale_inv;
}

void fp8_gemm_reference(std::span<const uint8_t> a, Fp8Type type_a, float scale_inv_a,
                        std::span<const uint8_t> b, Fp8Type type_b, float scale_inv_b,
                        int64_t m, int64_t n, int64_t k, float alpha, std::span<float> d) {
  MDLM_CHECK(m >= 0 && n >= 0 && k >= 0, "fp8_gemm_reference: negative size m=", m, " n=", n,
             " k=", k);
  MDLM_CHECK(a.size() == static_cast<size_t>(m * k) && b.size() == static_cast<size_t>(n * k) &&
                 d.size() == static_cast<size_t>(m * n),
             "fp8_gemm_reference: sizes a ", a.size(), " b ", b.size(), " d ", d.size(),
             " do not match m=", m, " n=", n, " k=", k);
  MDLM_CHECK(!(type_a == Fp8Type::E5M2 && type_b == Fp8Type::E5M2),
             "fp8_gemm_reference: e5m2 x e5m2 has no Hopper GEMM; one operand must be e4m3");
  std::vector<float> da(a.size()), db(b.size());
  for (size_t i = 0; i < a.size(); ++i) da[i] = fp8_decode(a[i], type_a);
  for (size_t i = 0; i < b.size(); ++i) db[i] = fp8_decode(b[i], type_b);
  const double scale = static_cast<double>(alpha) * scale_inv_a * scale_inv_b;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p)
        acc += static_cast<double>(da[i * k + p] * db[j * k + p]);  // exact in fp32
      d[j * m + i] = static_cast<float>(acc * scale);
    }
}

float fp8_quantize_transpose(std::span<const float> x, int64_t rows, int64_t cols, float scale,
                             Fp8Type type, std::span<uint8_t> out) {
  MDLM_CHECK(rows >= 0 && cols >= 0 && x.size() == static_cast<size_t>(rows * cols) &&
                 out.size() == x.size(),
             "fp8_quantize_transpose: x ", x.size(), " and out ", out.size(),
             " elements for [", rows, ", ", cols, "]");
  const fp8_math::Format f = format_of(type);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[c * rows + r] = fp8_math::encode(x[r * cols + c] * scale, f);
  return fp8_amax(x);
}

// ------------------------------------------------------------------- blockwise scaling

int64_t fp8_block_grid_size(Fp8Granularity g, int64_t rows, int64_t k) {
  const int64_t kb = (k + kFp8BlockSize - 1) / kFp8BlockSize, rb = (rows + kFp8BlockSize - 1) / kFp8BlockSize;
  switch (g) {
    case Fp8Granularity::Tensor: return 1;
    case Fp8Granularity::Tile1x128: return kb * fp8_pad4(rows);
    case Fp8Granularity::Block128x128: return rb * fp8_pad4(kb);
  }
  return 0;
}

int64_t fp8_block_grid_index(Fp8Granularity g, int64_t rows, int64_t k, int64_t r, int64_t c) {
  const int64_t kb = (k + kFp8BlockSize - 1) / kFp8BlockSize;
  switch (g) {
    case Fp8Granularity::Tensor: return 0;
    case Fp8Granularity::Tile1x128: return (c / kFp8BlockSize) * fp8_pad4(rows) + r;
    case Fp8Granularity::Block128x128: return (r / kFp8BlockSize) * fp8_pad4(kb) + c / kFp8BlockSize;
  }
  return 0;
}

void fp8_quantize_blockwise(std::span<const float> x, int64_t rows, int64_t k, Fp8Granularity g,
                            Fp8Type type, bool power_of_2, std::span<uint8_t> codes,
                            std::span<float> scale_inv) {
  MDLM_CHECK(g != Fp8Granularity::Tensor, "fp8_quantize_blockwise: needs Tile1x128 or Block128x128");
  MDLM_CHECK(rows >= 0 && k >= 0 && x.size() == static_cast<size_t>(rows * k) && codes.size() == x.size() &&
                 scale_inv.size() == static_cast<size_t>(fp8_block_grid_size(g, rows, k)),
             "fp8_quantize_blockwise: x ", x.size(), ", codes ", codes.size(), " and grid ", scale_inv.size(),
             " elements for [", rows, ", ", k, "]");
  const fp8_math::Format f = format_of(type);
  std::fill(scale_inv.begin(), scale_inv.end(), 0.0f);
  const int64_t tile_rows = g == Fp8Granularity::Tile1x128 ? 1 : kFp8BlockSize;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t r1 = std::min(rows, r0 + tile_rows);
    for (int64_t c0 = 0; c0 < k; c0 += kFp8BlockSize) {
      const int64_t c1 = std::min(k, c0 + kFp8BlockSize);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(r * k + c)]));
      const float s = fp8_current_scale(amax, f.max_finite, power_of_2);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const size_t i = static_cast<size_t>(r * k + c);
          codes[i] = fp8_math::encode(x[i] * s, f);
        }
      scale_inv[static_cast<size_t>(fp8_block_grid_index(g, rows, k, r0, c0))] = 1.0f / s;
    }
  }
}

void fp8_block_gemm_reference(std::span<const uint8_t> a, Fp8Type type_a, Fp8Granularity ga,
                              std::span<const float> scale_inv_a, std::span<const uint8_t> b,
                              Fp8Type type_b, Fp8Granularity gb, std::span<const float> scale_inv_b,
                              int64_t m, int64_t n, int64_t k, float alpha, std::span<float> d) {
  MDLM_CHECK(ga != Fp8Granularity::Tensor && gb != Fp8Granularity::Tensor,
             "fp8_block_gemm_reference: both operands must be block-scaled");
  MDLM_CHECK(!(ga == Fp8Granularity::Block128x128 && gb == Fp8Granularity::Block128x128),
             "fp8_block_gemm_reference: 128x128 x 128x128 has no cuBLASLt mode; one operand must be 1x128");
  MDLM_CHECK(m >= 0 && n >= 0 && k >= 0 && k % kFp8BlockSize == 0, "fp8_block_gemm_reference: k=", k,
             " must be a multiple of 128");
  MDLM_CHECK(a.size() == static_cast<size_t>(m * k) && b.size() == static_cast<size_t>(n * k) &&
                 d.size() == static_cast<size_t>(m * n) &&
                 scale_inv_a.size() == static_cast<size_t>(fp8_block_grid_size(ga, m, k)) &&
                 scale_inv_b.size() == static_cast<size_t>(fp8_block_grid_size(gb, n, k)),
             "fp8_block_gemm_reference: sizes a ", a.size(), " b ", b.size(), " d ", d.size(), " grids ",
             scale_inv_a.size(), ", ", scale_inv_b.size(), " do not match m=", m, " n=", n, " k=", k);
  MDLM_CHECK(!(type_a == Fp8Type::E5M2 && type_b == Fp8Type::E5M2),
             "fp8_block_gemm_reference: e5m2 x e5m2 has no Hopper GEMM; one operand must be e4m3");
  std::vector<float> da(a.size()), db(b.size());
  for (size_t i = 0; i < a.size(); ++i) da[i] = fp8_decode(a[i], type_a);
  for (size_t i = 0; i < b.size(); ++i) db[i] = fp8_decode(b[i], type_b);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0.0;
      for (int64_t p0 = 0; p0 < k; p0 += kFp8BlockSize) {
        double part = 0.0;
        for (int64_t p = p0; p < p0 + kFp8BlockSize; ++p)
          part += static_cast<double>(da[static_cast<size_t>(i * k + p)] * db[static_cast<size_t>(j * k + p)]);
        acc += part * scale_inv_a[static_cast<size_t>(fp8_block_grid_index(ga, m, k, i, p0))] *
               scale_inv_b[static_cast<size_t>(fp8_block_grid_index(gb, n, k, j, p0))];
      }
      d[static_cast<size_t>(j * m + i)] = static_cast<float>(acc * alpha);
    }
}

}  // namespace megadlm::ops
