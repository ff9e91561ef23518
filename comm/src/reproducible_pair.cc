// The two-rank arithmetic of the reproducible mode (reproducible_accumulator.h): addPairs, where
// each rank adds the raw pairs itself, and the passes around the ordinary collective's own SUM
// (reproducible.cc, runOrdinaryPair): canonicalNans, halveSums (a sum of two values halved is
// exact, or the one rounding of an exact sum: an inexact sum is at least 2^(emin - p + 1 + p)
// = 2^(emin + 1), so its half is normal), and overflowCandidates (the inputs an overflowing sum
// can come from, listed before an in-place call overwrites them). Built at -O3; the float32
// and float64 loops also have AVX2 forms with the same bits.
//
// Why one IEEE operation is enough for two ranks: the mode's result is the exact sum rounded
// once to the nearest value of the dtype (AVG: the exact sum / 2, rounded once). For two inputs
// a and b that is fl(a + b), what one addition in round-to-nearest computes, and addition
// commutes, so the result cannot depend on which rank holds which input. The work here is in
// the details:
// - float32 SUM: a + b in float. AVG: (double(a) + double(b)) * 0.5 rounded to float: the
//   double sum is exact or rounded once, the halving is exact in double's range, and rounding a
//   sum of two p-bit numbers first to q >= 2p + 2 bits and then to p bits gives the same as
//   rounding it once (53 >= 2 * 24 + 2; Figueroa's double-rounding theorem). The float sum
//   itself could overflow where the average does not (FLT_MAX + FLT_MAX).
// - float64 SUM: a + b. AVG: (a + b) * 0.5, which is exact or the single rounding of an exact
//   a + b (an inexact a + b is at least 2^-1021, so its half is normal and halving it is
//   exact); where a + b overflows but both are finite, both are at least 2^970 and
//   a * 0.5 + b * 0.5 adds two exact halves once.
// - float16 and bfloat16: both to double, added (exact for float16; for bfloat16 rounded once),
//   halved for AVG, then to float and to the 16-bit format: two more roundings, each from a
//   precision of at least 2p + 2 (53 over 24, 24 over 11 and 8), so the same as one.
// - Special values: IEEE addition already gives NaN for any NaN or +inf with -inf, and the
//   signs of infinities and zeros the mode documents; every NaN is made the canonical one.
// - The caller's floating-point environment: the loops run in the default one (round to
//   nearest, no flush-to-zero, no denormals-are-zero), set here and restored after, so that a
//   caller with FTZ/DAZ on (torch.set_flush_denormal) gets the same bits.
#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "half.h"
#include "reproducible_accumulator.h"
#include "reproducible_sixteen.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__x86_64__) && defined(LOOM_HAVE_AVX2_KERNELS)

#include "loom/comm/reduce.h"
#define LOOM_PAIR_AVX2 1
#endif

namespace loom::comm::repro {

namespace {

constexpr uint32_t kNan32 = 0x7fc00000u;
constexpr uint64_t kNan64 = 0x7ff8000000000000ull;
constexpr uint16_t kNanHalf = 0x7e00u;
constexpr uint16_t kNanBf16 = 0x7fc0u;

uint32_t pairF32(float a, float b, bool average) {
  const float r = average ? static_cast<float>((double{a} + double{b}) * 0.5) : a + b;
  return std::isnan(r) ? kNan32 : std::bit_cast<uint32_t>(r);
}

uint64_t pairF64(double a, double b, bool average) {
  double s = a + b;
  if (average) {
    s = std::isinf(s) && std::isfinite(a) && std::isfinite(b) ? a * 0.5 + b * 0.5 : s * 0.5;
  }
  return std::isnan(s) ? kNan64 : std::bit_cast<uint64_t>(s);
}

uint16_t pairHalf(uint16_t a, uint16_t b, bool average) {
  double s = double{half::toFloat(a)} + double{half::toFloat(b)};
  if (average) s *= 0.5;
  const auto r = static_cast<float>(s);
  return std::isnan(r) ? kNanHalf : half::fromFloat(r);
}

uint16_t pairBf16(uint16_t a, uint16_t b, bool average) {
  double s = double{half::bf16ToFloat(a)} + double{half::bf16ToFloat(b)};
  if (average) s *= 0.5;
  const auto r = static_cast<float>(s);
  return std::isnan(r) ? kNanBf16 : half::bf16FromFloat(r);
}

#ifdef LOOM_PAIR_AVX2
bool useAvx2() {
  return reduceKernelIsa()[0] == 'a';
}

// Each handles a prefix of the buffers (whole vectors) and returns its length; the scalar loop
// does the rest. The same bits as the scalar functions above, lane by lane.
__attribute__((target("avx2"))) size_t pairF32Avx2(const float* a, const float* b, size_t n,
                                                   bool average, float* out) {
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kNan32)));
  const __m256d half = _mm256_set1_pd(0.5);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);
    __m256 r;
    if (average) {
      const __m256d lo = _mm256_mul_pd(_mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                                                     _mm256_cvtps_pd(_mm256_castps256_ps128(y))),
                                       half);
      const __m256d hi = _mm256_mul_pd(_mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)),
                                                     _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1))),
                                       half);
      r = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
    } else {
      r = _mm256_add_ps(x, y);
    }
    r = _mm256_blendv_ps(r, nan, _mm256_cmp_ps(r, r, _CMP_UNORD_Q));
    _mm256_storeu_ps(out + i, r);
  }
  return i;
}

__attribute__((target("avx2"))) size_t pairF64Avx2(const double* a, const double* b, size_t n,
                                                   bool average, double* out) {
  const __m256d nan = _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<int64_t>(kNan64)));
  const __m256d half = _mm256_set1_pd(0.5);
  const __m256d magnitude = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
  const __m256d infinity = _mm256_set1_pd(INFINITY);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    __m256d s = _mm256_add_pd(_mm256_loadu_pd(a + i), _mm256_loadu_pd(b + i));
    if (average) {
      // An infinite sum of finite inputs takes the scalar code (its halves are added instead).
      if (_mm256_movemask_pd(_mm256_cmp_pd(_mm256_and_pd(s, magnitude), infinity, _CMP_EQ_OQ)) !=
          0) {
        break;
      }
      s = _mm256_mul_pd(s, half);
    }
    s = _mm256_blendv_pd(s, nan, _mm256_cmp_pd(s, s, _CMP_UNORD_Q));
    _mm256_storeu_pd(out + i, s);
  }
  return i;
}

// The length of the prefix (whole groups of 32 floats) without a NaN: the caller rewrites from
// there on.
__attribute__((target("avx2"))) size_t nanFreeF32Avx2(const float* x, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    const __m256 c = _mm256_loadu_ps(x + i + 16), d = _mm256_loadu_ps(x + i + 24);
    const __m256 any = _mm256_or_ps(
        _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(b, b, _CMP_UNORD_Q)),
        _mm256_or_ps(_mm256_cmp_ps(c, c, _CMP_UNORD_Q), _mm256_cmp_ps(d, d, _CMP_UNORD_Q)));
    if (_mm256_movemask_ps(any) != 0) break;
  }
  return i;
}

__attribute__((target("avx2"))) size_t nanFreeF64Avx2(const double* x, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256d a = _mm256_loadu_pd(x + i), b = _mm256_loadu_pd(x + i + 4);
    const __m256d c = _mm256_loadu_pd(x + i + 8), d = _mm256_loadu_pd(x + i + 12);
    const __m256d any = _mm256_or_pd(
        _mm256_or_pd(_mm256_cmp_pd(a, a, _CMP_UNORD_Q), _mm256_cmp_pd(b, b, _CMP_UNORD_Q)),
        _mm256_or_pd(_mm256_cmp_pd(c, c, _CMP_UNORD_Q), _mm256_cmp_pd(d, d, _CMP_UNORD_Q)));
    if (_mm256_movemask_pd(any) != 0) break;
  }
  return i;
}

// The length of the prefix (whole groups of 16) without a finite magnitude from `low` up.
__attribute__((target("avx2"))) size_t noCandidatesF32Avx2(const uint32_t* x, size_t n,
                                                           uint32_t low) {
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  const __m256i below = _mm256_set1_epi32(static_cast<int>(low - 1));
  const __m256i infinity = _mm256_set1_epi32(0x7f800000);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), magnitude);
    const __m256i b = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)), magnitude);
    // Magnitudes are below 2^31, so the signed compares order them: low <= m < inf.
    const __m256i hit = _mm256_or_si256(
        _mm256_andnot_si256(_mm256_cmpgt_epi32(a, _mm256_sub_epi32(infinity, _mm256_set1_epi32(1))),
                            _mm256_cmpgt_epi32(a, below)),
        _mm256_andnot_si256(_mm256_cmpgt_epi32(b, _mm256_sub_epi32(infinity, _mm256_set1_epi32(1))),
                            _mm256_cmpgt_epi32(b, below)));
    if (!_mm256_testz_si256(hit, hit)) break;
  }
  return i;
}

// The 16-bit pairs sixteen at a time, as pairHalf and pairBf16: the floats to double, added
// (and halved), to float, NaN made the canonical float one (which narrows to the format's), and
// to the format.
template <bool kHalf>
__attribute__((target("avx2,f16c"))) size_t pair16Avx2(const uint16_t* a, const uint16_t* b,
                                                       size_t n, bool average, uint16_t* out) {
  const __m256d scale = _mm256_set1_pd(average ? 0.5 : 1.0);
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kNan32)));
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 x[2], y[2], r[2];
    sixteen::widen<kHalf>(sixteen::load(a + i), x[0], x[1]);
    sixteen::widen<kHalf>(sixteen::load(b + i), y[0], y[1]);
    for (int k = 0; k < 2; ++k) {
      const __m256d lo = _mm256_mul_pd(
          _mm256_add_pd(sixteen::toDouble(x[k], 0), sixteen::toDouble(y[k], 0)), scale);
      const __m256d hi = _mm256_mul_pd(
          _mm256_add_pd(sixteen::toDouble(x[k], 1), sixteen::toDouble(y[k], 1)), scale);
      r[k] = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
      r[k] = _mm256_blendv_ps(r[k], nan, _mm256_cmp_ps(r[k], r[k], _CMP_UNORD_Q));
    }
    sixteen::store(out + i, sixteen::narrow<kHalf>(r[0], r[1]));
  }
  return i;
}

// canonicalNans' 16-bit loop (whole vectors; a vector is rewritten only where it holds a NaN).
__attribute__((target("avx2"))) size_t canonicalNans16Avx2(uint16_t* x, size_t n, uint16_t inf,
                                                           uint16_t nan) {
  const __m256i magnitude = _mm256_set1_epi16(0x7fff);
  const __m256i infinity = _mm256_set1_epi16(static_cast<int16_t>(inf));
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = sixteen::load(x + i);
    // Magnitudes are below 2^15: the signed compare orders them.
    const __m256i isNan = _mm256_cmpgt_epi16(_mm256_and_si256(v, magnitude), infinity);
    if (_mm256_testz_si256(isNan, isNan)) continue;
    sixteen::store(x + i,
                   _mm256_blendv_epi8(v, _mm256_set1_epi16(static_cast<int16_t>(nan)), isNan));
  }
  return i;
}

// halveSums' 16-bit loop, as its scalar code: each sum to float (exact), halved (exact), to the
// format (one rounding); NaN canonical. Returns the prefix done and whether it met an infinite
// sum (halved, it stays itself).
template <bool kHalf>
__attribute__((target("avx2,f16c"))) size_t halve16Avx2(uint16_t* x, size_t n, bool& infinities) {
  const uint16_t inf = kHalf ? 0x7c00 : 0x7f80, nan = kHalf ? kNanHalf : kNanBf16;
  const __m256i magnitude = _mm256_set1_epi16(0x7fff);
  const __m256i infinity = _mm256_set1_epi16(static_cast<int16_t>(inf));
  const __m256 half = _mm256_set1_ps(0.5f);
  __m256i seen = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = sixteen::load(x + i);
    const __m256i m = _mm256_and_si256(v, magnitude);
    const __m256i isNan = _mm256_cmpgt_epi16(m, infinity);
    seen = _mm256_or_si256(seen, _mm256_cmpeq_epi16(m, infinity));
    __m256 f0, f1;
    sixteen::widen<kHalf>(v, f0, f1);
    // NaN lanes give any bits here; the blend below replaces them.
    const __m256i h = sixteen::narrow<kHalf>(_mm256_mul_ps(f0, half), _mm256_mul_ps(f1, half));
    sixteen::store(x + i,
                   _mm256_blendv_epi8(h, _mm256_set1_epi16(static_cast<int16_t>(nan)), isNan));
  }
  infinities = !_mm256_testz_si256(seen, seen);
  return i;
}

// Whether sixteen 16-bit values hold one with low <= magnitude < inf (overflowCandidates).
__attribute__((target("avx2"))) bool candidate16Avx2(const uint16_t* x, uint16_t low,
                                                     uint16_t inf) {
  const __m256i m = _mm256_and_si256(sixteen::load(x), _mm256_set1_epi16(0x7fff));
  const __m256i hit =
      _mm256_andnot_si256(_mm256_cmpgt_epi16(m, _mm256_set1_epi16(static_cast<int16_t>(inf - 1))),
                          _mm256_cmpgt_epi16(m, _mm256_set1_epi16(static_cast<int16_t>(low - 1))));
  return !_mm256_testz_si256(hit, hit);
}

// halveSums' float32 loop: returns the prefix done (whole vectors) and whether it met an
// infinite sum.
__attribute__((target("avx2"))) size_t halveF32Avx2(float* x, size_t n, bool& infinities) {
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kNan32)));
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 infinity = _mm256_set1_ps(INFINITY);
  __m256 seen = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 h = _mm256_mul_ps(_mm256_loadu_ps(x + i), half);
    seen = _mm256_or_ps(seen, _mm256_cmp_ps(_mm256_and_ps(h, magnitude), infinity, _CMP_EQ_OQ));
    h = _mm256_blendv_ps(h, nan, _mm256_cmp_ps(h, h, _CMP_UNORD_Q));
    _mm256_storeu_ps(x + i, h);
  }
  infinities = _mm256_movemask_ps(seen) != 0;
  return i;
}
#endif

}  // namespace

#if defined(__x86_64__)
// On x86-64 the vector and scalar float arithmetic obey MXCSR alone (rounding, FTZ, DAZ; x87 is
// not used), and reading it costs a few cycles where fegetenv/fesetenv cost hundreds: the
// environment is only touched when its controls differ from the default. The status flags
// (bits 0-5, sticky exception flags) are kept as they are.
constexpr uint32_t kDefaultMxcsr = 0x1f80;
constexpr uint32_t kMxcsrFlags = 0x3f;

DefaultFloatEnvironment::DefaultFloatEnvironment() : saved_(_mm_getcsr()) {
  if ((saved_ & ~kMxcsrFlags) != kDefaultMxcsr) _mm_setcsr(kDefaultMxcsr | (saved_ & kMxcsrFlags));
}

DefaultFloatEnvironment::~DefaultFloatEnvironment() {
  if ((saved_ & ~kMxcsrFlags) != kDefaultMxcsr) {
    _mm_setcsr(saved_ | (_mm_getcsr() & kMxcsrFlags));
  }
}
#else
DefaultFloatEnvironment::DefaultFloatEnvironment() {
  std::fegetenv(&saved_);
  std::fesetenv(FE_DFL_ENV);
}

DefaultFloatEnvironment::~DefaultFloatEnvironment() {
  std::fesetenv(&saved_);
}
#endif

void addPairs(const Format& f, const void* a, const void* b, size_t n, bool average, void* out) {
  const DefaultFloatEnvironment environment;
  if (f.bytes == 4) {
    const auto* x = static_cast<const float*>(a);
    const auto* y = static_cast<const float*>(b);
    auto* r = static_cast<uint32_t*>(out);
    size_t i = 0;
#ifdef LOOM_PAIR_AVX2
    if (useAvx2()) i = pairF32Avx2(x, y, n, average, reinterpret_cast<float*>(r));
#endif
    for (; i < n; ++i) r[i] = pairF32(x[i], y[i], average);
  } else if (f.bytes == 8) {
    const auto* x = static_cast<const double*>(a);
    const auto* y = static_cast<const double*>(b);
    auto* r = static_cast<uint64_t*>(out);
    size_t i = 0;
    while (i < n) {
#ifdef LOOM_PAIR_AVX2
      if (useAvx2())
        i += pairF64Avx2(x + i, y + i, n - i, average, reinterpret_cast<double*>(r + i));
#endif
      // The tail, or the group of four with an overflowing average, then the vectors again.
      const size_t end = std::min(n, i + 4);
      for (; i < end; ++i) r[i] = pairF64(x[i], y[i], average);
    }
  } else {
    const auto* x = static_cast<const uint16_t*>(a);
    const auto* y = static_cast<const uint16_t*>(b);
    auto* r = static_cast<uint16_t*>(out);
    size_t i = 0;
#ifdef LOOM_PAIR_AVX2
    if (sixteen::useF16c()) {
      i = f.precision == 11 ? pair16Avx2<true>(x, y, n, average, r)
                            : pair16Avx2<false>(x, y, n, average, r);
    }
#endif
    if (f.precision == 11) {
      for (; i < n; ++i) r[i] = pairHalf(x[i], y[i], average);
    } else {
      for (; i < n; ++i) r[i] = pairBf16(x[i], y[i], average);
    }
  }
}

namespace {

// The raw bits of element i, sign cleared, and the format's infinity.
uint64_t magnitudeAt(const Format& f, const void* data, size_t i) {
  return loadBits(f, data, i) & ((uint64_t{1} << (f.bytes * 8 - 1)) - 1);
}
uint64_t infinityOf(const Format& f) {
  return ((uint64_t{1} << (f.bytes * 8 - f.precision)) - 1) << (f.precision - 1);
}
uint64_t nanOf(const Format& f) {
  return infinityOf(f) | (uint64_t{1} << (f.precision - 2));
}

}  // namespace

void canonicalNans(const Format& f, void* data, size_t n) {
  const uint64_t inf = infinityOf(f), nan = nanOf(f);
  size_t i = 0;
#ifdef LOOM_PAIR_AVX2
  // NaNs are rare: a fast scan skips the prefix without one.
  if (useAvx2()) {
    if (f.bytes == 4) i = nanFreeF32Avx2(static_cast<const float*>(data), n);
    if (f.bytes == 8) i = nanFreeF64Avx2(static_cast<const double*>(data), n);
    if (f.bytes == 2) {
      i = canonicalNans16Avx2(static_cast<uint16_t*>(data), n, static_cast<uint16_t>(inf),
                              static_cast<uint16_t>(nan));
    }
  }
#endif
  for (; i < n; ++i) {
    if (magnitudeAt(f, data, i) > inf) storeBits(f, data, i, nan);
  }
}

void halveSums(const Format& f, void* data, size_t n, std::vector<size_t>& infinite) {
  const DefaultFloatEnvironment environment;
  const uint64_t inf = infinityOf(f), nan = nanOf(f);
  if (f.bytes == 4) {
    // Branch-free, so that it vectorises (this file is built at -O3); the infinite sums are
    // listed in a second scan, only when there is one.
    auto* bits = static_cast<uint32_t*>(data);
    uint32_t infinities = 0;
    size_t i = 0;
#ifdef LOOM_PAIR_AVX2
    if (useAvx2()) {
      bool seen = false;
      i = halveF32Avx2(reinterpret_cast<float*>(bits), n, seen);
      infinities = seen ? 1 : 0;
    }
#endif
    for (; i < n; ++i) {
      const uint32_t h = std::bit_cast<uint32_t>(std::bit_cast<float>(bits[i]) * 0.5f);
      const uint32_t m = h & 0x7fffffffu;
      infinities |= m == 0x7f800000u ? 1u : 0u;
      bits[i] = m > 0x7f800000u ? kNan32 : h;
    }
    if (infinities != 0) {
      for (size_t i = 0; i < n; ++i) {
        if ((bits[i] & 0x7fffffffu) == 0x7f800000u) infinite.push_back(i);
      }
    }
    return;
  }
  size_t i = 0;
#ifdef LOOM_PAIR_AVX2
  if (f.bytes == 2 && sixteen::useF16c()) {
    auto* x = static_cast<uint16_t*>(data);
    bool seen = false;
    i = f.precision == 11 ? halve16Avx2<true>(x, n, seen) : halve16Avx2<false>(x, n, seen);
    for (size_t k = 0; seen && k < i; ++k) {
      if ((x[k] & 0x7fffu) == inf) infinite.push_back(k);
    }
  }
#endif
  for (; i < n; ++i) {
    const uint64_t m = magnitudeAt(f, data, i);
    if (m > inf) {
      storeBits(f, data, i, nan);
      continue;
    }
    if (m == inf) {
      infinite.push_back(i);
      continue;
    }
    const uint64_t bits = loadBits(f, data, i);
    uint64_t half = 0;
    if (f.bytes == 8) {
      half = std::bit_cast<uint64_t>(std::bit_cast<double>(bits) * 0.5);
    } else if (f.precision == 8) {  // bfloat16: exact in float, one rounding back
      half = half::bf16FromFloat(half::bf16ToFloat(static_cast<uint16_t>(bits)) * 0.5f);
    } else {
      half = half::fromFloat(half::toFloat(static_cast<uint16_t>(bits)) * 0.5f);
    }
    storeBits(f, data, i, half);
  }
}

uint64_t overflowThreshold(const Format& f) {
  // ulp(largest finite) / 2 = 2^(emax - p): the smallest magnitude whose sum with the largest
  // finite value rounds to infinity; below it, a sum of two finite values stays finite.
  const int emax = f.bias;
  return static_cast<uint64_t>(emax - f.precision + f.bias) << (f.precision - 1);
}

void overflowCandidates(const Format& f, const void* data, size_t n,
                        std::vector<std::pair<size_t, uint64_t>>& out) {
  const uint64_t low = overflowThreshold(f), inf = infinityOf(f);
  size_t i = 0;
#ifdef LOOM_PAIR_AVX2
  // Such values are rare (float32: from 2^103): a fast scan skips the prefix without one.
  if (f.bytes == 4 && useAvx2()) {
    i = noCandidatesF32Avx2(static_cast<const uint32_t*>(data), n, static_cast<uint32_t>(low));
  }
  if (f.bytes == 2 && useAvx2()) {
    // Sixteen at a time; those that hold one are listed by the scalar code.
    const auto* x = static_cast<const uint16_t*>(data);
    for (; i + 16 <= n; i += 16) {
      if (!candidate16Avx2(x + i, static_cast<uint16_t>(low), static_cast<uint16_t>(inf))) continue;
      for (size_t k = i; k < i + 16; ++k) {
        const uint64_t m = x[k] & 0x7fffu;
        if (m >= low && m < inf) out.emplace_back(k, x[k]);
      }
    }
  }
#endif
  for (; i < n; ++i) {
    const uint64_t m = magnitudeAt(f, data, i);
    if (m >= low && m < inf) out.emplace_back(i, loadBits(f, data, i));
  }
}

}  // namespace loom::comm::repro
