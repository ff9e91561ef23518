// Sixteen float16 or bfloat16 values at a time in AVX2, for the reproducible mode's 16-bit loops
// (reproducible_double.cc, reproducible_pair.cc): loaded, widened to floats (exact) and narrowed
// back from floats with one rounding to nearest even.
//
// Lanes: float16 converts each half of the sixteen in order, to floats 0-7 and 8-15. bfloat16
// widens by interleaving with zeros in each 128-bit lane, which gives floats 0-3 | 8-11 and
// 4-7 | 12-15; narrow's unsigned pack (per 128-bit lane) puts them back in order. Code between
// widen and narrow works lane by lane and need not know which.
#pragma once

#if defined(__x86_64__) && defined(LOOM_HAVE_AVX2_KERNELS)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "loom/comm/reduce.h"

#define LOOM_SIXTEEN_AVX2 1

namespace loom::comm::repro::sixteen {

// Whether the 16-bit loops run: the reduce kernels use AVX2 (reduceKernelIsa) and the CPU has
// F16C.
inline bool useF16c() {
  static const bool has = __builtin_cpu_supports("f16c");
  return reduceKernelIsa()[0] == 'a' && has;
}

__attribute__((target("avx2"))) inline __m256i load(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
__attribute__((target("avx2"))) inline void store(uint16_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}

// Eight floats (no NaN) rounded to nearest even bfloat16, in the low halves of 32-bit lanes: a
// carry out of the significand rounds up into the exponent (to infinity from the largest
// finite), as half::bf16FromFloat.
__attribute__((target("avx2"))) inline __m256i toBf16x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb),
                           16);
}

// The sixteen values of `raw` as two vectors of eight floats (exact), in the order above.
template <bool kHalf>
__attribute__((target("avx2,f16c"))) inline void widen(__m256i raw, __m256& f0, __m256& f1) {
  if constexpr (kHalf) {
    f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(raw));
    f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(raw, 1));
  } else {
    f0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), raw));
    f1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), raw));
  }
}

// Two vectors of eight floats (no NaN), in widen's order, rounded to nearest even in the
// format: the sixteen results in order.
template <bool kHalf>
__attribute__((target("avx2,f16c"))) inline __m256i narrow(__m256 f0, __m256 f1) {
  if constexpr (kHalf) {
    return _mm256_set_m128i(_mm256_cvtps_ph(f1, _MM_FROUND_TO_NEAREST_INT),
                            _mm256_cvtps_ph(f0, _MM_FROUND_TO_NEAREST_INT));
  } else {
    return _mm256_packus_epi32(toBf16x8(f0), toBf16x8(f1));
  }
}

// A float vector's four doubles, k = 0 the low half, 1 the high.
__attribute__((target("avx2"))) inline __m256d toDouble(__m256 f, int k) {
  return _mm256_cvtps_pd(k == 0 ? _mm256_castps256_ps128(f) : _mm256_extractf128_ps(f, 1));
}

}  // namespace loom::comm::repro::sixteen

#endif
