// The reproducible mode's fast path for rows reduced in one process (the exchange and the
// gathered path, reproducible.cc): where an element's n values span few binades, their sum in
// double (float64: in a pair of doubles) is exact, so it needs no integer window. float32 first,
// then AVG, the 16-bit formats and float64.
//
// Why it is exact: a float32 with biased exponent e >= 1 (subnormals count as 1) is a multiple of
// 2^(e - 150) and below 2^(e - 126). With lo and hi the smallest and largest such e among an
// element's nonzero values, every partial sum of its n values is a multiple of 2^(lo - 150) below
// n * 2^(hi - 126) <= 2^(hi - 126 + c), c = ceil(log2 n): at most hi - lo + 24 + c bits, which
// double's 53 hold when hi - lo <= 29 - c. Then every addition is exact, in any order, and the
// conversion to float is the one rounding (to nearest even, overflowing to infinity).
//
// AVG divides the exact sum S by the divisor d (the world size). A power of two divides exactly.
// Any other d < 2^27 rounds twice, q = fl64(S / d) then fl32(q), and that is still the correctly
// rounded quotient: the two roundings differ only where q is exactly the midpoint m of two
// floats while S / d is not. m has 25 significant bits from 2^E (E its binade), so d·m is a
// multiple of S's ulp and S - d·m is 0 or at least ulp(S) >= 2^(E + floor(log2 d) - 52), since
// S >= d·2^E. But |S - d·m| = d·|S/d - m| <= d·2^(E - 53) < 2^(E + floor(log2 d) - 52). So
// S = d·m, S / d is the midpoint itself, and fl32's tie to even is the right answer. (The same
// holds on float's subnormal grid, whose midpoints are coarser still; a search over 200,000
// quotients next to midpoints, normal and subnormal, d from 3 to 1000, found no difference.)
// float16 and bfloat16 (p = 11 and 8 significant bits) take the same sums with the span bound
// 53 - p - c (float16's whole range fits: 29 binades, so any n <= 2^13). Their result is rounded
// from the double through float with round-to-odd (truncate, then set the last bit when inexact)
// and then to the 16-bit format to nearest even: rounding to odd at 24 >= p + 2 bits first and
// to nearest at p bits after is one rounding to nearest (Boldo and Melquiond, "Emulation of FMA
// and correctly rounded sums: proved algorithms using rounding to odd", 2008), and the quotient
// argument above holds for any p <= 24.
// float64 (p = 53) cannot add in a wider type; its sums are kept as an unevaluated pair (s, t):
// each value joins s by TwoSum (s' = fl(s + x) and the exact error e = s + x - s'), and the errors
// add into t. Every s, x and e is a multiple of u = 2^(lo - 1075) (a rounding to nearest of a
// multiple of u is one, since the grid is either finer, and then nothing rounds, or coarser and
// a multiple of u), |s| < 2^(hi - 1022 + c), so |e| <= ulp(s)/2 < 2^(hi - 1076 + c), and the n
// errors together stay below 2^(hi - 1076 + 2c): where hi - lo <= 53 - 2c, t and its partial
// sums have at most 53 bits above u, so every addition into t is exact and s + t is the exact
// sum. Its one rounding is fl(s + t), a single IEEE addition. AVG takes this path for a
// power-of-two n only, whose division is exact while the quotient is normal.
// The first row starts the sum, so that -0 + -0
// stays -0 and an exact zero from nonzero values is +0, as the mode says. Infinities and NaN
// (the largest exponent field) are never taken here. Each format has a scalar loop and an AVX2
// one (F16C for float16) that give the same bits. Built at -O3 (the loops vectorise), in the
// default floating-point environment (DAZ would flush subnormal inputs in the conversion).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "half.h"
#include "reproducible_accumulator.h"
#include "reproducible_sixteen.h"

#if defined(__x86_64__) && defined(LOOM_HAVE_AVX2_KERNELS)
#include <immintrin.h>

#include "loom/comm/reduce.h"
#define LOOM_DOUBLE_AVX2 1
#endif

namespace loom::comm::repro {

namespace {

// The widest binade range hi - lo whose n values add exactly in double: 53 - p - ceil(log2 n).
int spanOf(int precision, int n) {
  return 53 - precision - static_cast<int>(std::bit_width(static_cast<unsigned>(n - 1)));
}

// float64's: the widest binade range whose n values' double-double sum is exact,
// 53 - 2 ceil(log2 n) (see the top).
int spanOf64(int n) {
  return 53 - 2 * static_cast<int>(std::bit_width(static_cast<unsigned>(n - 1)));
}

#ifdef LOOM_DOUBLE_AVX2
// float32 eight elements at a time, in one pass over the rows: the double sums, and per element
// the largest magnitude and the smallest magnitude less one (a zero wraps to 0xffffffff and
// counts for nothing), from which the exponent range is read as in the 16-bit loop below (at
// most one binade wider than the scalar loop's: never looser). Then the quotient and the
// conversion where the range allows them; groups with an element outside it are left to the
// scalar code (their indices in `groups`). The same bits as the scalar loop.
__attribute__((target("avx2"))) size_t reduceRowsDoubleAvx2(std::span<const void* const> rows,
                                                            size_t count, int divisor, int span,
                                                            float* out,
                                                            std::vector<size_t>& groups) {
  const int n = static_cast<int>(rows.size());
  const __m256i ff = _mm256_set1_epi32(0xff), one = _mm256_set1_epi32(1);
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i limit = _mm256_set1_epi32(span);
  // A power-of-two divisor multiplies by its exact inverse; another divides (see the top).
  const bool power = std::has_single_bit(static_cast<unsigned>(divisor));
  const __m256d factor = _mm256_set1_pd(power ? 1.0 / divisor : static_cast<double>(divisor));
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256i largest = _mm256_setzero_si256(), smallest = _mm256_set1_epi32(-1);
    __m256d sumLo = _mm256_setzero_pd(), sumHi = _mm256_setzero_pd();
    for (int r = 0; r < n; ++r) {
      const __m256 v = _mm256_loadu_ps(static_cast<const float*>(rows[r]) + i);
      const __m256i m = _mm256_and_si256(_mm256_castps_si256(v), magnitude);
      largest = _mm256_max_epu32(largest, m);
      smallest = _mm256_min_epu32(smallest, _mm256_sub_epi32(m, one));
      // The first row starts the sums (-0 stays -0).
      const __m256d dLo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
      const __m256d dHi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
      sumLo = r == 0 ? dLo : _mm256_add_pd(sumLo, dLo);
      sumHi = r == 0 ? dHi : _mm256_add_pd(sumHi, dHi);
    }
    // Exponent fields, subnormals as 1; an all-zero element has hi 1 and lo 0x1ff (no range).
    const __m256i hi = _mm256_max_epi32(_mm256_srli_epi32(largest, 23), one);
    const __m256i lo = _mm256_max_epi32(_mm256_srli_epi32(smallest, 23), one);
    const __m256i bad = _mm256_or_si256(_mm256_cmpeq_epi32(hi, ff),
                                        _mm256_cmpgt_epi32(_mm256_sub_epi32(hi, lo), limit));
    if (!_mm256_testz_si256(bad, bad)) {
      groups.push_back(i);
      continue;
    }
    sumLo = power ? _mm256_mul_pd(sumLo, factor) : _mm256_div_pd(sumLo, factor);
    sumHi = power ? _mm256_mul_pd(sumHi, factor) : _mm256_div_pd(sumHi, factor);
    _mm256_storeu_ps(out + i, _mm256_set_m128(_mm256_cvtpd_ps(sumHi), _mm256_cvtpd_ps(sumLo)));
  }
  return i;
}

// Four doubles' significands truncated to float's 24 bits, the last kept bit set where that
// dropped anything (round-to-odd at 24 bits; sign and magnitude, so truncating the bits
// truncates toward zero in either sign, and zeros keep theirs), then converted to float. In
// float's normal range the conversion is exact and this is roundToOdd; below it see the 16-bit
// loop's comment.
__attribute__((target("avx2"))) inline __m128 roundToOdd24(__m256d q) {
  const __m256i dropped = _mm256_set1_epi64x((int64_t{1} << 29) - 1);
  const __m256i bits = _mm256_castpd_si256(q);
  const __m256i exact = _mm256_cmpeq_epi64(_mm256_and_si256(bits, dropped), _mm256_setzero_si256());
  const __m256i sticky = _mm256_andnot_si256(exact, _mm256_set1_epi64x(int64_t{1} << 29));
  const __m256i odd = _mm256_or_si256(_mm256_andnot_si256(dropped, bits), sticky);
  return _mm256_cvtpd_ps(_mm256_castsi256_pd(odd));
}

// The 16-bit formats' sums of sixteen elements (lanes: reproducible_sixteen.h; floats k and
// doubles 2k, 2k + 1 hold the same elements).
template <bool kHalf>
struct Rows16 {
  __attribute__((target("avx2"))) static __m256i load(std::span<const void* const> rows, int r,
                                                      size_t i) {
    return sixteen::load(static_cast<const uint16_t*>(rows[r]) + i);
  }
  // Exact float sums (where the range allows them): the first row starts them (-0 stays -0).
  // With them, per element, the largest magnitude and the smallest magnitude less one (a
  // zero's wraps to 0xffff and counts for nothing), for the range check.
  __attribute__((target("avx2,f16c"))) static void sumFloat(std::span<const void* const> rows,
                                                            size_t i, __m256 f[2], __m256i& largest,
                                                            __m256i& smallest) {
    const __m256i magnitude = _mm256_set1_epi16(0x7fff), ones = _mm256_set1_epi16(1);
    for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
      const __m256i raw = load(rows, r, i);
      const __m256i m = _mm256_and_si256(raw, magnitude);
      largest = _mm256_max_epu16(largest, m);
      smallest = _mm256_min_epu16(smallest, _mm256_sub_epi16(m, ones));
      __m256 w0, w1;
      sixteen::widen<kHalf>(raw, w0, w1);
      f[0] = r == 0 ? w0 : _mm256_add_ps(f[0], w0);
      f[1] = r == 0 ? w1 : _mm256_add_ps(f[1], w1);
    }
  }
  // The same sums in double (no range kept: sumFloat's is).
  __attribute__((target("avx2,f16c"))) static void sumDouble(std::span<const void* const> rows,
                                                             size_t i, __m256d s[4]) {
    for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
      __m256 w[2];
      sixteen::widen<kHalf>(load(rows, r, i), w[0], w[1]);
      for (int k = 0; k < 4; ++k) {
        const __m256d d = sixteen::toDouble(w[k / 2], k % 2);
        s[k] = r == 0 ? d : _mm256_add_pd(s[k], d);
      }
    }
  }
};

// The 16-bit formats' AVX2 loop, the same bits as the scalar reduceOne16, for divisors up to
// 2^14 (reduceRows16 leaves larger ones to the scalar code). Per group of sixteen:
//
// - First the sums in float, with each element's exponent range read off its largest and its
//   smallest magnitude less one (m - 1 has m's exponent field except at a power of two, where it
//   has one less: the range is at most one binade wider than the true one, so every check below
//   is the scalar one or stricter, never looser). A value of field e >= 1 (subnormals: 1) is a
//   multiple of 2^(e - bias - p + 1) below 2^(e - bias + 1), so n of them with fields in
//   [lo, hi] add to multiples of the first below 2^(hi - bias + 1 + c): hi - lo + p + c bits,
//   which float's 24 hold when hi - lo <= 24 - p - c (`floatSpan`: float16 11 over 4 rows,
//   bfloat16 14). bfloat16 also needs its partial sums below float's largest: hi <= 254 - c.
//   Every partial sum is then exact, and so is the float sum; rounded once to the format it is
//   the SUM, and the AVG by a power of two d after the multiplication by 1/d, which is exact:
//   float16's nonzero sums are at least 2^-24, their quotients normal floats, and bfloat16's
//   are multiples of its smallest subnormal, 2^-133, their quotients by d <= 2^16 multiples of
//   float's, 2^-149.
// - A group with an element outside that but inside the double sums' range (`span`) is summed
//   again in double, and an AVG by another divisor converts its exact float sums to double:
//   the quotient in double, roundToOdd24, and to nearest even in the format. Where the quotient
//   is a normal float that is the scalar code's computation. float16's always are (at least
//   2^-24 / 2^14). bfloat16's below 2^-126 are not rounded to odd correctly, but they need not
//   be: the exact quotient T = S / d, with S a multiple of 2^-133, is a tie of the format
//   (an odd multiple of 2^-134 there) or at least 2^-134 / d >= 2^-148 from every tie, while the
//   computed float is within 2^-149 (the truncation below float's last subnormal bit) + 2^-150
//   (the conversion) + the double quotient's error of T: on the same side of every tie as T,
//   or exactly T, so rounding it to nearest gives T's rounding. Quotients at or above 2^128
//   convert to infinity, and those just below it to float's largest, which bfloat16 rounds to
//   infinity as T's rounding does.
// - A group with an infinity or NaN, or a range beyond `span`, goes to the scalar code
//   (`groups`, sixteen elements each).
template <bool kHalf>
__attribute__((target("avx2,f16c"))) size_t reduceRows16Avx2(std::span<const void* const> rows,
                                                             size_t count, int divisor, int span,
                                                             uint16_t* out,
                                                             std::vector<size_t>& groups) {
  using R = Rows16<kHalf>;
  const int n = static_cast<int>(rows.size());
  constexpr int kMantissaBits = kHalf ? 10 : 7;
  constexpr int16_t kNone = kHalf ? 0x1f : 0xff;  // the exponent field of infinities and NaN
  const int c = static_cast<int>(std::bit_width(static_cast<unsigned>(n - 1)));
  const int floatSpan = 24 - (kMantissaBits + 1) - c;  // may be negative: never in float then
  const __m256i ones = _mm256_set1_epi16(1), none = _mm256_set1_epi16(kNone);
  const __m256i doubleLimit = _mm256_set1_epi16(static_cast<int16_t>(span));
  const __m256i floatLimit = _mm256_set1_epi16(static_cast<int16_t>(floatSpan));
  // bfloat16's partial sums stay below 2^128 while hi <= 254 - c.
  const __m256i floatTop = _mm256_set1_epi16(static_cast<int16_t>(kHalf ? kNone : 254 - c));
  const bool power = std::has_single_bit(static_cast<unsigned>(divisor));
  const __m256 inverse = _mm256_set1_ps(power ? 1.0f / static_cast<float>(divisor) : 1.0f);
  const __m256d factor = _mm256_set1_pd(static_cast<double>(divisor));
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m256i largest = _mm256_setzero_si256(), smallest = _mm256_set1_epi16(-1);
    __m256 f[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // the first row replaces these
    R::sumFloat(rows, i, f, largest, smallest);
    // Exponent fields, subnormals as 1; an all-zero element has hi 1 and lo above it.
    const __m256i hi = _mm256_max_epi16(_mm256_srli_epi16(largest, kMantissaBits), ones);
    const __m256i lo = _mm256_max_epi16(_mm256_srli_epi16(smallest, kMantissaBits), ones);
    const __m256i range = _mm256_sub_epi16(hi, lo);
    const __m256i outside =
        _mm256_or_si256(_mm256_cmpeq_epi16(hi, none), _mm256_cmpgt_epi16(range, doubleLimit));
    if (!_mm256_testz_si256(outside, outside)) {
      groups.push_back(i);
      continue;
    }
    const __m256i wide =
        _mm256_or_si256(_mm256_cmpgt_epi16(range, floatLimit), _mm256_cmpgt_epi16(hi, floatTop));
    if (_mm256_testz_si256(wide, wide) && power) {
      // The float sums are exact, and so are their quotients (see above).
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out + i),
          sixteen::narrow<kHalf>(_mm256_mul_ps(f[0], inverse), _mm256_mul_ps(f[1], inverse)));
      continue;
    }
    __m256d s[4];
    if (_mm256_testz_si256(wide, wide)) {  // exact float sums, another divisor
      for (int k = 0; k < 4; ++k) {
        s[k] = sixteen::toDouble(f[k / 2], k % 2);
      }
    } else {
      for (auto& v : s) v = _mm256_setzero_pd();  // the first row replaces these
      R::sumDouble(rows, i, s);
    }
    __m128 odd[4];
    for (int k = 0; k < 4; ++k) {
      odd[k] = roundToOdd24(divisor == 1 ? s[k] : _mm256_div_pd(s[k], factor));
    }
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(out + i),
        sixteen::narrow<kHalf>(_mm256_set_m128(odd[1], odd[0]), _mm256_set_m128(odd[3], odd[2])));
  }
  return i;
}

// 64-bit lane max and min (AVX2 has no epi64 forms).
__attribute__((target("avx2"))) inline __m256i max64(__m256i a, __m256i b) {
  return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a));
}
__attribute__((target("avx2"))) inline __m256i min64(__m256i a, __m256i b) {
  return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
}

// float64 four elements at a time, as reduceOne64 (the pairs of doubles, the same checks, the
// same bits); groups with an element it leaves go to the scalar code (`groups`).
__attribute__((target("avx2"))) size_t reduceRows64Avx2(std::span<const void* const> rows,
                                                        size_t count, int divisor, int span,
                                                        double* out, std::vector<size_t>& groups) {
  const int n = static_cast<int>(rows.size());
  const __m256i mask = _mm256_set1_epi64x(0x7ff), one = _mm256_set1_epi64x(1);
  const __m256i magnitude = _mm256_set1_epi64x(0x7fffffffffffffffLL);
  const __m256i infinity = _mm256_set1_epi64x(0x7ff0000000000000LL);
  const __m256i zero = _mm256_setzero_si256(), limit = _mm256_set1_epi64x(span);
  const __m256d factor = _mm256_set1_pd(1.0 / divisor);  // a power of two: exact
  const __m256d smallest = _mm256_set1_pd(0x1p-1022 * divisor);
  size_t i = 0;
  for (; i + 4 <= count; i += 4) {
    __m256i hi = zero, lo = mask;
    __m256d s = _mm256_setzero_pd(), t = _mm256_setzero_pd();
    for (int r = 0; r < n; ++r) {
      const __m256d v = _mm256_loadu_pd(static_cast<const double*>(rows[r]) + i);
      const __m256i bits = _mm256_castpd_si256(v);
      const __m256i e = max64(_mm256_and_si256(_mm256_srli_epi64(bits, 52), mask), one);
      const __m256i isZero = _mm256_cmpeq_epi64(_mm256_and_si256(bits, magnitude), zero);
      hi = max64(hi, _mm256_andnot_si256(isZero, e));
      lo = min64(lo, _mm256_or_si256(_mm256_and_si256(isZero, mask), e));
      if (r == 0) {
        s = v;
        continue;
      }
      const __m256d sum = _mm256_add_pd(s, v);
      const __m256d back = _mm256_sub_pd(sum, s);
      const __m256d error =
          _mm256_add_pd(_mm256_sub_pd(s, _mm256_sub_pd(sum, back)), _mm256_sub_pd(v, back));
      t = _mm256_add_pd(t, error);
      s = sum;
    }
    __m256d result = _mm256_add_pd(s, t);
    const __m256i size = _mm256_and_si256(_mm256_castpd_si256(result), magnitude);
    __m256i bad = _mm256_or_si256(_mm256_cmpeq_epi64(hi, mask),
                                  _mm256_cmpgt_epi64(_mm256_sub_epi64(hi, lo), limit));
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi64(size, _mm256_sub_epi64(infinity, one)));
    if (divisor != 1) {
      // A subnormal average (zero divides exactly).
      const __m256d tiny = _mm256_cmp_pd(_mm256_castsi256_pd(size), smallest, _CMP_LT_OQ);
      bad = _mm256_or_si256(
          bad, _mm256_andnot_si256(_mm256_cmpeq_epi64(size, zero), _mm256_castpd_si256(tiny)));
    }
    if (!_mm256_testz_si256(bad, bad)) {
      groups.push_back(i);
      continue;
    }
    // A zero sum of zeros keeps their sign (s, the sum of the zeros: -0 only when every one
    // was -0); a zero from cancellation is +0, as IEEE's x + (-x).
    const __m256d zeroPd = _mm256_setzero_pd();
    result = _mm256_blendv_pd(result, s,
                              _mm256_and_pd(_mm256_cmp_pd(result, zeroPd, _CMP_EQ_OQ),
                                            _mm256_cmp_pd(s, zeroPd, _CMP_EQ_OQ)));
    if (divisor != 1) result = _mm256_mul_pd(result, factor);
    _mm256_storeu_pd(out + i, result);
  }
  return i;
}

bool useAvx2() {
  return reduceKernelIsa()[0] == 'a';
}
#endif

// After a vector loop: the groups it left to scalar code (`width` elements each, ascending) and
// the tail from `i`, through `scalar(k)`, in that order, so that the elements scalar code lists
// stay ascending.
template <typename Scalar>
void scalarRest(const std::vector<size_t>& groups, size_t width, size_t i, size_t count,
                const Scalar& scalar) {
  for (size_t g : groups) {
    for (size_t k = g; k < g + width; ++k) scalar(k);
  }
  for (; i < count; ++i) scalar(i);
}

// One element in scalar code: its result in out[i] when its range allows the double sum, else
// its index appended to rest.
void reduceOne(std::span<const void* const> rows, size_t i, int divisor, int span, float* out,
               std::vector<size_t>& rest) {
  uint32_t hi = 0, lo = 255;
  double sum = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const float v = static_cast<const float*>(rows[r])[i];
    const uint32_t bits = std::bit_cast<uint32_t>(v);
    const uint32_t e = std::max<uint32_t>((bits >> 23) & 0xffu, 1u);
    if ((bits & 0x7fffffffu) != 0) {
      hi = std::max(hi, e);
      lo = std::min(lo, e);
    }
    sum = r == 0 ? double{v} : sum + double{v};
  }
  if (hi != 255 && static_cast<int>(hi) - static_cast<int>(lo) <= span) {
    out[i] = static_cast<float>(sum / divisor);
  } else {
    rest.push_back(i);
  }
}

// One element of a 16-bit format in scalar code, as reduceOne: float16 (kHalf) or bfloat16.
template <bool kHalf>
void reduceOne16(std::span<const void* const> rows, size_t i, int divisor, int span,
                 uint16_t* result, std::vector<size_t>& rest) {
  constexpr int kMantissaBits = kHalf ? 10 : 7;
  constexpr uint32_t kExponentMask = kHalf ? 0x1f : 0xff;
  {
    uint32_t hi = 0, lo = kExponentMask;
    double sum = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const uint16_t bits = static_cast<const uint16_t*>(rows[r])[i];
      const uint32_t e = std::max<uint32_t>((bits >> kMantissaBits) & kExponentMask, 1u);
      if ((bits & 0x7fffu) != 0) {
        hi = std::max(hi, e);
        lo = std::min(lo, e);
      }
      const double v = kHalf ? half::toFloat(bits) : half::bf16ToFloat(bits);
      sum = r == 0 ? v : sum + v;
    }
    if (hi == kExponentMask || static_cast<int>(hi) - static_cast<int>(lo) > span) {
      rest.push_back(i);
      return;
    }
    const float odd = roundToOdd(sum / divisor);
    result[i] = kHalf ? half::fromFloat(odd) : half::bf16FromFloat(odd);
  }
}

// float64, one element: the exact sum as an unevaluated pair (s, t) of doubles (see the top),
// rounded once by fl(s + t); a zero sum of zeros keeps their sign (-0 only from -0 alone) and a
// zero from cancellation is +0. Elements
// outside the range, whose pair met an overflow (a non-finite s + t), or whose average would be
// subnormal (dividing it by the power-of-two divisor could drop bits) go to `rest`.
void reduceOne64(std::span<const void* const> rows, size_t i, int divisor, int span, double* out,
                 std::vector<size_t>& rest) {
  uint64_t hi = 0, lo = 0x7ff;
  double s = 0, t = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const double v = static_cast<const double*>(rows[r])[i];
    const uint64_t bits = std::bit_cast<uint64_t>(v);
    const uint64_t e = std::max<uint64_t>((bits >> 52) & 0x7ffu, 1u);
    if ((bits & 0x7fffffffffffffffULL) != 0) {
      hi = std::max(hi, e);
      lo = std::min(lo, e);
    }
    if (r == 0) {
      s = v;
      continue;
    }
    // TwoSum (Knuth): sum = fl(s + v), and s + v - sum exactly.
    const double sum = s + v;
    const double back = sum - s;
    t += (s - (sum - back)) + (v - back);
    s = sum;
  }
  double result = s + t;
  if (hi == 0x7ff || static_cast<int>(hi) - static_cast<int>(lo) > span || !std::isfinite(result)) {
    rest.push_back(i);
    return;
  }
  // A zero sum of zeros keeps their sign (s: -0 only when every one was -0); a zero from
  // cancellation (s and t opposite) is +0, as IEEE's x + (-x).
  if (result == 0) result = s == 0 ? s : 0.0;
  if (divisor != 1) {
    if (result != 0 && std::abs(result) < 0x1p-1022 * divisor) {  // a subnormal average
      rest.push_back(i);
      return;
    }
    result /= divisor;  // a power of two, the quotient normal: exact
  }
  out[i] = result;
}

// The 16-bit formats: the AVX2 loop where the CPU has it (and F16C), groups it leaves and the
// tail in scalar code, `rest` ascending.
template <bool kHalf>
void reduceRows16(std::span<const void* const> rows, size_t count, int divisor, void* out,
                  std::vector<size_t>& rest) {
  const int span = spanOf(kHalf ? 11 : 8, static_cast<int>(rows.size()));
  auto* result = static_cast<uint16_t*>(out);
  size_t i = 0;
  std::vector<size_t> groups;
#ifdef LOOM_DOUBLE_AVX2
  if (sixteen::useF16c() && divisor <= (1 << 14)) {  // see reduceRows16Avx2
    i = reduceRows16Avx2<kHalf>(rows, count, divisor, span, result, groups);
  }
#endif
  scalarRest(groups, 16, i, count,
             [&](size_t k) { reduceOne16<kHalf>(rows, k, divisor, span, result, rest); });
}

}  // namespace

float roundToOdd(double v) {
  const float nearest = static_cast<float>(v);
  if (static_cast<double>(nearest) == v) return nearest;
  uint32_t bits = std::bit_cast<uint32_t>(nearest);
  // Rounded away from zero (or to infinity): one step back toward zero, a sign-magnitude
  // decrement; then the last bit set (the truncation's odd neighbour, as v was not exact).
  if (std::abs(static_cast<double>(nearest)) > std::abs(v)) --bits;
  return std::bit_cast<float>(bits | 1u);
}

bool doubleSumApplies(const Format& f, int n, int divisor) {
  if (f.precision == 53) {
    return n >= 1 && spanOf64(n) >= 0 && std::has_single_bit(static_cast<unsigned>(divisor));
  }
  return f.precision <= 24 && n >= 1 && spanOf(f.precision, n) >= 0 && divisor >= 1 &&
         divisor < (1 << 27);
}

void reduceRowsDouble(const Format& f, std::span<const void* const> rows, size_t count, int divisor,
                      void* out, std::vector<size_t>& rest) {
  const DefaultFloatEnvironment environment;
  if (f.bytes == 8) {
    const int span = spanOf64(static_cast<int>(rows.size()));
    auto* result = static_cast<double*>(out);
    size_t i = 0;
    std::vector<size_t> groups;
#ifdef LOOM_DOUBLE_AVX2
    if (useAvx2()) i = reduceRows64Avx2(rows, count, divisor, span, result, groups);
#endif
    scalarRest(groups, 4, i, count,
               [&](size_t k) { reduceOne64(rows, k, divisor, span, result, rest); });
    return;
  }
  if (f.bytes == 2) {
    return f.precision == 11 ? reduceRows16<true>(rows, count, divisor, out, rest)
                             : reduceRows16<false>(rows, count, divisor, out, rest);
  }
  const int span = spanOf(24, static_cast<int>(rows.size()));
  auto* result = static_cast<float*>(out);
  size_t i = 0;
  std::vector<size_t> groups;
#ifdef LOOM_DOUBLE_AVX2
  if (useAvx2()) i = reduceRowsDoubleAvx2(rows, count, divisor, span, result, groups);
#endif
  scalarRest(groups, 8, i, count,
             [&](size_t k) { reduceOne(rows, k, divisor, span, result, rest); });
}

}  // namespace loom::comm::repro
