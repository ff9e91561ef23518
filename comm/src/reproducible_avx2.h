// The float32 loops of the reproducible mode in AVX2 (reproducible_accumulator.cc, the only
// includer; the scalar loops there are the reference). Used where the reduce kernels use AVX2
// (reduceKernelIsa(); the tests compare them with the scalar loops, bit for bit, by forcing the
// generic kernels). Each handles a prefix of the buffer and returns its length; the scalar loop
// does the rest. The decodes are templates over the scalar fallback they call per lane.
#pragma once

#if defined(__x86_64__) && defined(LOOM_HAVE_AVX2_KERNELS)
#include <immintrin.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "loom/comm/reduce.h"

#define LOOM_REPRO_AVX2 1

namespace loom::comm::repro::avx2 {

inline bool useAvx2() {
  return reduceKernelIsa()[0] == 'a';
}

#define LOOM_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline

LOOM_AVX2_INLINE __m128i halfOf(__m256i v, int h) {
  return h == 0 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
}

// The float32 bits nearest v * scale (v an int64 in [-2^51, 2^51], scale a power of two).
LOOM_AVX2_INLINE __m128i toFloat(__m256i v, __m256d scale) {
  const __m256i magicI = _mm256_set1_epi64x(0x4338000000000000);
  const __m256d d =
      _mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(v, magicI)), _mm256_castsi256_pd(magicI));
  return _mm_castps_si128(_mm256_cvtpd_ps(_mm256_mul_pd(d, scale)));
}

// Lanes of r (four float32) whose exponent field is zero, as bits.
LOOM_AVX2_INLINE int exponentZero(__m128i r) {
  return _mm_movemask_ps(_mm_castsi128_ps(
      _mm_cmpeq_epi32(_mm_and_si128(r, _mm_set1_epi32(0x7f800000)), _mm_setzero_si128())));
}

// exponentByte for float32 (shift 0): 0 for -0, else max(field, 1) (255 for inf and NaN).
__attribute__((target("avx2"))) inline size_t exponentBytesF32Avx2(const uint32_t* in, size_t n,
                                                                   uint8_t* bytes) {
  const __m256i one = _mm256_set1_epi32(1), ff = _mm256_set1_epi32(0xff);
  const __m256i negZero = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i r[4];
    for (int k = 0; k < 4; ++k) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8 * k));
      const __m256i b = _mm256_max_epu32(_mm256_and_si256(_mm256_srli_epi32(x, 23), ff), one);
      r[k] = _mm256_andnot_si256(_mm256_cmpeq_epi32(x, negZero), b);
    }
    const __m256i packed =
        _mm256_packus_epi16(_mm256_packus_epi32(r[0], r[1]), _mm256_packus_epi32(r[2], r[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bytes + i),
                        _mm256_permutevar8x32_epi32(packed, order));
  }
  return i;
}

// encodeWindows for float32, in integers: the significand (hidden bit set when normal) shifted
// to the window's lsb (byte - 167): left by field' - byte + 17 (field' = max(field, 1)), or
// right, truncating, with the inexact flag; then the count bits, the sign, and zero for bytes
// 0 and 255.
// kAdd: digits += the window digits (the local reductions' fused encode and sum).
template <bool kAdd>
__attribute__((target("avx2"))) inline size_t encodeWindowsF32Avx2(const uint32_t* in, size_t n,
                                                                   const uint8_t* bytes,
                                                                   int64_t* digits) {
  const __m256i one = _mm256_set1_epi32(1), ff = _mm256_set1_epi32(0xff);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i fraction = _mm256_set1_epi32(0x7fffff), hidden = _mm256_set1_epi32(0x800000);
  const __m256i seventeen = _mm256_set1_epi32(17), eleven = _mm256_set1_epi32(kCountBits);
  const __m256i one64 = _mm256_set1_epi64x(1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    const __m256i b =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + i)));
    const __m256i field = _mm256_and_si256(_mm256_srli_epi32(x, 23), ff);
    const __m256i f1 = _mm256_max_epu32(field, one);
    const __m256i sig =
        _mm256_or_si256(_mm256_and_si256(x, fraction),
                        _mm256_andnot_si256(_mm256_cmpeq_epi32(field, zero), hidden));
    const __m256i offset = _mm256_sub_epi32(_mm256_add_epi32(f1, seventeen), b);
    const __m256i left = _mm256_add_epi32(_mm256_max_epi32(offset, zero), eleven);
    const __m256i right = _mm256_max_epi32(_mm256_sub_epi32(zero, offset), zero);
    const __m256i neg = _mm256_srai_epi32(x, 31);
    const __m256i valid =
        _mm256_andnot_si256(_mm256_or_si256(_mm256_cmpeq_epi32(b, zero), _mm256_cmpeq_epi32(b, ff)),
                            _mm256_set1_epi32(-1));
    for (int h = 0; h < 2; ++h) {
      const __m256i s = _mm256_cvtepu32_epi64(halfOf(sig, h));
      const __m256i r = _mm256_cvtepu32_epi64(halfOf(right, h));
      const __m256i l = _mm256_cvtepu32_epi64(halfOf(left, h));
      const __m256i m = _mm256_cvtepi32_epi64(halfOf(neg, h));
      const __m256i ok = _mm256_cvtepi32_epi64(halfOf(valid, h));
      const __m256i q = _mm256_srlv_epi64(s, r);
      const __m256i inexact =
          _mm256_andnot_si256(_mm256_cmpeq_epi64(_mm256_sllv_epi64(q, r), s), one64);
      const __m256i t = _mm256_sllv_epi64(q, l);
      const __m256i d = _mm256_add_epi64(_mm256_sub_epi64(_mm256_xor_si256(t, m), m), inexact);
      __m256i* at = reinterpret_cast<__m256i*>(digits + i + 4 * h);
      if constexpr (kAdd) {
        _mm256_storeu_si256(at, _mm256_add_epi64(_mm256_loadu_si256(at), _mm256_and_si256(d, ok)));
      } else {
        _mm256_storeu_si256(at, _mm256_and_si256(d, ok));
      }
    }
  }
  return i;
}

// The fast float32 decode (power-of-two divisor) four elements at a time: where every lane
// is decided by the conversion (bytes 1..254, |v| < 2^51, results normal or v zero, both ends
// equal), stores the four results; otherwise calls scalar(k) for each of the four.
template <typename Scalar>
__attribute__((target("avx2"))) inline size_t decodeWindowsF32Avx2(const int64_t* sums,
                                                                   const uint8_t* bytes, size_t n,
                                                                   int divisorBits, uint32_t* out,
                                                                   Scalar&& scalar) {
  const __m256i countMask = _mm256_set1_epi64x((int64_t{1} << kCountBits) - 1);
  const __m256i signFix = _mm256_set1_epi64x(int64_t{1} << (63 - kCountBits));
  const __m256i limitHi = _mm256_set1_epi64x(int64_t{1} << 51);
  const __m256i limitLo = _mm256_set1_epi64x(-(int64_t{1} << 51));
  const __m256i zero = _mm256_setzero_si256();
  const __m256i ff = _mm256_set1_epi64x(255);
  const __m256i bias = _mm256_set1_epi64x(1023 - 167 - divisorBits);
  size_t k = 0;
  for (; k + 4 <= n; k += 4) {
    const __m256i sum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + k));
    uint32_t b4;
    std::memcpy(&b4, bytes + k, 4);
    const __m256i b = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(static_cast<int>(b4)));
    const __m256i inexact = _mm256_and_si256(sum, countMask);
    const __m256i value =
        _mm256_sub_epi64(_mm256_xor_si256(_mm256_srli_epi64(sum, kCountBits), signFix), signFix);
    const __m256i lo = _mm256_sub_epi64(value, inexact);
    const __m256i hi = _mm256_add_epi64(value, inexact);
    const __m256d scale = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(b, bias), 52));
    // Usually no rank dropped a bit (hi == lo): one conversion.
    const bool exact = _mm256_testz_si256(inexact, inexact) != 0;
    const __m128i rlo = toFloat(lo, scale), rhi = exact ? rlo : toFloat(hi, scale);
    // Byte 0 (every input -0; its sum is 0) gives -0 here; byte 255 goes to the scalar code.
    const __m128i negativeZero =
        _mm_and_si128(_mm_cmpeq_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(b4))),
                                      _mm_setzero_si128()),
                      _mm_set1_epi32(INT32_MIN));
    const __m256i bad64 = _mm256_or_si256(
        _mm256_cmpeq_epi64(b, ff),
        _mm256_or_si256(_mm256_cmpgt_epi64(limitLo, lo), _mm256_cmpgt_epi64(hi, limitHi)));
    const int bad = _mm256_movemask_pd(_mm256_castsi256_pd(bad64));
    const int loZero = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(lo, zero)));
    int fail = bad | (exponentZero(rlo) & ~loZero);
    if (!exact) {
      const int hiZero = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(hi, zero)));
      const int equal = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(rlo, rhi)));
      fail |= (exponentZero(rhi) & ~hiZero) | (~equal & 0xf);
    }
    const __m128i result = _mm_or_si128(rlo, negativeZero);
    if (fail == 0) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), result);
    } else {
      // Settled lanes stored, the others through the scalar code.
      const __m128i lane = _mm_setr_epi32(1, 2, 4, 8);
      const __m128i settled =
          _mm_cmpeq_epi32(_mm_and_si128(_mm_set1_epi32(fail), lane), _mm_setzero_si128());
      _mm_maskstore_epi32(reinterpret_cast<int*>(out + k), settled, result);
      for (int bits = fail & 0xf; bits != 0; bits &= bits - 1)
        scalar(k + std::countr_zero(static_cast<unsigned>(bits)));
    }
  }
  return k;
}

// acc[i] = max(acc[i], v[i]) (bytes), acc[i] += v[i] (int64), 32 bytes at a time; the
// caller does the tail.
__attribute__((target("avx2"))) inline size_t maxBytesAvx2(uint8_t* acc, const uint8_t* v,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    auto* a = reinterpret_cast<__m256i*>(acc + i);
    _mm256_storeu_si256(
        a, _mm256_max_epu8(_mm256_loadu_si256(a),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i))));
  }
  return i;
}
__attribute__((target("avx2"))) inline size_t addInt64Avx2(int64_t* acc, const int64_t* v,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    auto* a = reinterpret_cast<__m256i*>(acc + i);
    _mm256_storeu_si256(
        a, _mm256_add_epi64(_mm256_loadu_si256(a),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i))));
  }
  return i;
}

}  // namespace loom::comm::repro::avx2

#endif
