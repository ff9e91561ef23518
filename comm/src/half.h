// Scalar IEEE binary16 / bfloat16 conversions (round to nearest even), header-only so that
// both kernel builds (generic and AVX2) inline them.
#pragma once

#include <bit>
#include <cstdint>

namespace loom::comm::half {

inline uint16_t fromFloat(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // infinity or NaN (NaN stays quiet NaN)
    // A NaN keeps its sign and the top 10 bits of its payload, made quiet (as F16C's vcvtps2ph).
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
  }
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (a < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5 puts the value's 2^-24 units (the
    // half subnormal step) in the low mantissa bits, and the FPU rounds to nearest even.
    const float shifted = std::bit_cast<float>(a) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
  }
  const uint32_t odd = (a >> 13) & 1u;
  a += 0xc8000fffu + odd;  // rebias the exponent (127 -> 15) and round to nearest even
  return static_cast<uint16_t>(sign | (a >> 13));
}

inline float toFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t bf16FromFloat(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? ((x >> 16) | 0x40u) : rounded);
}

inline float bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

}  // namespace loom::comm::half
