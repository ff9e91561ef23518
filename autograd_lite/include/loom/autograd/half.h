// Low-precision float storage types: bfloat16 (8-bit exponent, 7-bit mantissa: float32's
// range, ~3 significant digits) and IEEE binary16 "half" (5-bit exponent, 10-bit mantissa:
// largest finite 65504, subnormals down to 2^-24).
//
// BFloat16 and Float16 are plain 2-byte bit containers, the element types of tensors of dtype
// kBFloat16 / kFloat16 (`t.data<BFloat16>()`); arithmetic happens in float32 after toFloat().
// Conversions from float32 round to nearest, ties to even; infinities stay infinities, NaN stays
// (a quiet) NaN with its sign, values past the largest finite round to infinity as IEEE says
// (for half: |x| >= 65520), and half's subnormals are produced and read exactly.
#pragma once

#include <bit>
#include <cstdint>

namespace loom::ag {

struct BFloat16 {
  uint16_t bits = 0;
};

struct Float16 {
  uint16_t bits = 0;
};

// bfloat16 is the top half of a float32: round the bottom 16 bits away.
inline BFloat16 toBFloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and payload top, force quiet
    return BFloat16{static_cast<uint16_t>((x >> 16) | 0x0040u)};
  }
  // Adding 0x7fff (+1 when the kept part is odd) carries into bit 16 exactly when the dropped
  // bits are above half, or exactly half with an odd kept part: round to nearest even. A carry
  // out of the largest finite mantissa lands on the infinity pattern, as it should.
  const uint32_t lsb = (x >> 16) & 1u;
  return BFloat16{static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16)};
}

inline float toFloat(BFloat16 b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16);
}

inline Float16 toFloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, top payload bits kept
    return Float16{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  }
  const int e = static_cast<int>(a >> 23) - 127;  // unbiased exponent (-127 for 0/subnormal)
  if (e >= 16) return Float16{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 2^16 (or inf)
  if (e >= -14) {
    // Normal half: keep 10 of float's 23 mantissa bits and round on the 13 dropped ones. A
    // carry out of the mantissa bumps the exponent (and past 65504 gives 0x7c00, infinity).
    uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | ((a & 0x7fffffu) >> 13);
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return Float16{static_cast<uint16_t>(sign | h)};
  }
  if (e >= -25) {
    // Subnormal half, in units of 2^-24: the 24-bit significand m (value m * 2^(e - 23)) is
    // shifted right by -(e + 1) places (14..24) and rounded to nearest even; rounding up from
    // the largest subnormal gives 0x400, the smallest normal.
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const int shift = -(e + 1);
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return Float16{static_cast<uint16_t>(sign | h)};
  }
  return Float16{sign};  // below half the smallest subnormal: a signed zero
}

inline float toFloat(Float16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0x1f) {  // infinity, or NaN made quiet (as IEEE conversions and F16C do)
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace loom::ag
