#include "megadlm/core/dtype.h"
#include <cmath>

namespace megadlm {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F64: return "f64";
  }
  return "?";
}

f16_t f16_t::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  f16_t r;
  if (exp == 0xff) {  // inf / nan
    r.bits = static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
    return r;
  }
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) {
    r.bits = static_cast<uint16_t>(sign | 0x7c00u);
    return r;
  }
  if (e <= 0) {  // subnormal or zero
    if (e < -10) {
      r.bits = static_cast<uint16_t>(sign);
      return r;
    }
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    r.bits = static_cast<uint16_t>(sign | half);
    return r;
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  r.bits = static_cast<uint16_t>(half);
  return r;
}

float f16_t::to_float() const {
  uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  uint32_t x;
  if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace megadlm
