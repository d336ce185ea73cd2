// Element types of tensors and host-side conversions for the 16-bit float formats.
// bf16/f16 arithmetic never happens on the host: CPU ops compute in f32 (f64 in gradient tests).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace megadlm {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, F64 };
inline constexpr int kNumDTypes = 6;

/// Size in bytes of one element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F64: return 8;
  }
  return 0;
}
const char* dtype_name(DType t);
constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64;
}

/// Host-side bfloat16 storage type; conversions round to nearest even (NaN stays NaN).
struct bf16_t {
  uint16_t bits = 0;
  static bf16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bf16_t r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet
      r.bits = static_cast<uint16_t>((u >> 16) | 0x40u);
      return r;
    }
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    r.bits = static_cast<uint16_t>((u + rounding) >> 16);
    return r;
  }
  float to_float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

/// Host-side IEEE half storage type (round to nearest even).
struct f16_t {
  uint16_t bits = 0;
  static f16_t from_float(float f);
  float to_float() const;
};

/// Round a float through bf16 (what a value looks like after a bf16 store).
inline float round_to_bf16(float f) { return bf16_t::from_float(f).to_float(); }

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::BF16; }
template <> constexpr DType dtype_of<f16_t>() { return DType::F16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }

}  // namespace megadlm
