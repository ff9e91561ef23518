// Reproducible mode (loom/comm/reproducible.h): every result is checked bit for bit against an
// exact reference written here, independently of the library's accumulators: the exact sum as
// a big fixed-point integer, and the correctly rounded value found by comparing the exact
// distances to the candidate floats around an approximation (ties to the even significand).
// - Reference / property cases: inputs built to defeat naive summation (mixed magnitudes,
//   cancellation, subnormals, ties, overflow, inf and NaN), through reproducibleReduceLocal on
//   both paths (one pass and windowed), thousands of elements per dtype and op.
// - Ranks: reproducible_ranks_test.cc. The reference itself: reproducible_reference.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/reduce.h"
#include "loom/comm/reproducible.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "reproducible_reference.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace loom::comm {
namespace {

using namespace repro_testing;  // the exact reference (reproducible_reference.h)

// Flush-to-zero and denormals-are-zero on (x86's MXCSR) or off, for this thread.
void setFlush(bool on) {
#if defined(__x86_64__)
  _mm_setcsr(on ? (_mm_getcsr() | 0x8040u) : (_mm_getcsr() & ~0x8040u));
#else
  (void)on;
#endif
}
// ---- the reference itself ----

TEST(ReproducibleReference, KnownValues) {
  const auto f32 = [](float x) { return uint64_t{std::bit_cast<uint32_t>(x)}; };
  // 1 + 2^-24 is a tie between 1 and 1 + 2^-23: even gives 1.
  EXPECT_EQ(reference(DType::kFloat32, {f32(1.0f), f32(0x1p-24f)}, false), f32(1.0f));
  // 1 + 2^-24 + 2^-60: above the tie.
  EXPECT_EQ(reference(DType::kFloat32, {f32(1.0f), f32(0x1p-24f), f32(0x1p-60f)}, false),
            f32(1.0f + 0x1p-23f));
  EXPECT_EQ(reference(DType::kFloat32, {f32(1e30f), f32(1.0f), f32(-1e30f)}, false), f32(1.0f));
  EXPECT_EQ(reference(DType::kFloat32, {f32(-0.0f), f32(-0.0f)}, false), f32(-0.0f));
  EXPECT_EQ(reference(DType::kFloat32, {f32(-0.0f), f32(0.0f)}, false), f32(0.0f));
  EXPECT_EQ(reference(DType::kFloat32, {f32(1.0f), f32(2.0f), f32(2.0f)}, true), f32(5.0f / 3.0f));
  EXPECT_EQ(reference(DType::kFloat32, {f32(3.4e38f), f32(3.4e38f)}, false), f32(INFINITY));
  EXPECT_EQ(reference(DType::kFloat32, {f32(3.4e38f), f32(3.4e38f)}, true), f32(3.4e38f));
}

// ---- the arithmetic, both paths, against the reference ----

TEST(ReproducibleLocal, PropertyEveryDTypeBothPaths) {
  int cases = 0;
  for (DType d : kDTypes) {
    for (int ranks : {1, 2, 3, 5, 8}) {
      for (bool average : {false, true}) {
        const size_t count = 600;
        const Inputs in(d, ranks, count, 1000 * ranks + static_cast<int>(d) * 7 + average);
        const auto want = in.expected(average);
        std::vector<const void*> ptrs;
        for (const auto& row : in.data) ptrs.push_back(row.data());
        for (auto path : {ReproduciblePath::kOnePass, ReproduciblePath::kWindowed,
                          ReproduciblePath::kPair, ReproduciblePath::kAuto}) {
          if (path == ReproduciblePath::kPair && ranks != 2) continue;
          std::vector<unsigned char> out(count * dtypeSize(d));
          size_t refined = 0;
          reproducibleReduceLocal(ptrs, out.data(), count, d,
                                  average ? ReduceOp::kAvg : ReduceOp::kSum, path, &refined);
          const std::string what = std::string(dtypeName(d)) + " ranks=" + std::to_string(ranks) +
                                   (average ? " avg" : " sum") +
                                   (path == ReproduciblePath::kOnePass ? " one-pass"
                                    : path == ReproduciblePath::kPair  ? " pair"
                                    : path == ReproduciblePath::kAuto  ? " auto"
                                                                       : " windowed");
          EXPECT_EQ(mismatches(in, want, out.data(), 0, count, what), 0) << what;
          if (path != ReproduciblePath::kOnePass && path != ReproduciblePath::kAuto) {
            EXPECT_LT(refined, count) << what;
          }
          cases += static_cast<int>(count);
        }
      }
    }
  }
  EXPECT_GT(cases, 1000);
}

// Plain random values in a narrow range: the window decides nearly everything (refinement is for
// specials, cancellation and near-ties).
TEST(ReproducibleLocal, WindowDecidesOrdinaryValues) {
  const size_t count = 4000;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<float>> rows(4, std::vector<float>(count));
  for (auto& row : rows)
    for (auto& x : row) x = u(rng);
  std::vector<const void*> ptrs;
  for (const auto& row : rows) ptrs.push_back(row.data());
  std::vector<float> out(count);
  size_t refined = 0;
  reproducibleReduceLocal(ptrs, out.data(), count, DType::kFloat32, ReduceOp::kSum,
                          ReproduciblePath::kWindowed, &refined);
  EXPECT_LE(refined, count / 100);
  for (size_t i = 0; i < count; ++i) {
    // Four floats' exact sum fits a double: the double sum rounded to float is the answer.
    const double exact = double(rows[0][i]) + rows[1][i] + rows[2][i] + rows[3][i];
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(static_cast<float>(exact)))
        << i;
  }
}

// The windowed path's float32 loops (and kAuto's double sums) have an AVX2 form (where the reduce
// kernels use AVX2) and
// the scalar reference form (ReduceIsa::kGeneric): both give the same bits and refine the same
// elements, on adversarial inputs (the generator's, raw random bit patterns: NaN payloads,
// subnormals, infinities, both zeros; values a few ulps apart; cancellation), every world size
// that takes the fast decode (powers of two) or not, sum and avg, and lengths that leave every
// vector loop a scalar tail. Where the CPU has no AVX2 both runs take the scalar loops.
TEST(ReproducibleLocal, VectorAndScalarLoopsAgree) {
  std::mt19937_64 rng(42);
  const auto family = [&](int kind, int ranks, size_t count) {
    std::vector<std::vector<uint32_t>> rows(ranks, std::vector<uint32_t>(count));
    for (size_t i = 0; i < count; ++i) {
      const uint32_t anchor = static_cast<uint32_t>(rng());
      const int spread = static_cast<int>(rng() % 40);
      for (int r = 0; r < ranks; ++r) {
        uint32_t& x = rows[r][i];
        switch (kind % 3) {
          case 0:  // any bit pattern
            x = static_cast<uint32_t>(rng());
            break;
          case 1:  // near one value, either sign, exponents down to `spread` below
            x = (anchor & 0x7fffffffu) - static_cast<uint32_t>(rng() % 3) +
                ((rng() & 1) != 0 ? 0x80000000u : 0u);
            if (rng() % 4 == 0) x -= static_cast<uint32_t>(spread) << 23;
            break;
          default:  // small magnitudes: subnormals and zeros among normals
            x = static_cast<uint32_t>(rng() % 0x01800000u) | ((rng() & 1) != 0 ? 0x80000000u : 0u);
            if (rng() % 8 == 0) x &= 0x80000000u;
        }
      }
    }
    return rows;
  };
  // Flush-to-zero and denormals-are-zero must not change a bit either: the float conversions
  // leave subnormals to the integer path.
  int compared = 0;
  for (int kind = 0; kind < 6; ++kind) {
    setFlush(kind >= 3);
    for (int ranks : {1, 2, 3, 4, 8}) {
      for (size_t count : {size_t{1}, size_t{37}, size_t{1029}}) {
        const auto rows = family(kind, ranks, count);
        std::vector<const void*> ptrs;
        for (const auto& row : rows) ptrs.push_back(row.data());
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
          for (auto path : {ReproduciblePath::kWindowed, ReproduciblePath::kAuto}) {
            std::vector<uint32_t> vec(count), ref(count);
            size_t vecRefined = 0, refRefined = 0;
            setReduceIsa(ReduceIsa::kAuto);
            reproducibleReduceLocal(ptrs, vec.data(), count, DType::kFloat32, op, path,
                                    &vecRefined);
            setReduceIsa(ReduceIsa::kGeneric);
            reproducibleReduceLocal(ptrs, ref.data(), count, DType::kFloat32, op, path,
                                    &refRefined);
            setReduceIsa(ReduceIsa::kAuto);
            const std::string what = "kind " + std::to_string(kind) + " ranks " +
                                     std::to_string(ranks) + " count " + std::to_string(count) +
                                     " " + reduceOpName(op) +
                                     (path == ReproduciblePath::kAuto ? " auto" : " wide");
            EXPECT_EQ(vecRefined, refRefined) << what;
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(vec[i], ref[i]) << what << " element " << i;
            }
            ++compared;
          }
      }
    }
  }
  setFlush(false);
  EXPECT_EQ(compared, 360);
  // The generator's adversarial inputs, checked against the exact reference on both loops.
  for (int run = 0; run < 4; ++run) {
    setReduceIsa(run % 2 == 0 ? ReduceIsa::kAuto : ReduceIsa::kGeneric);
    setFlush(run >= 2);
    for (int ranks : {2, 4, 5}) {
      const Inputs in(DType::kFloat32, ranks, 515, 77 + ranks);
      const auto want = in.expected(false);
      std::vector<const void*> ptrs;
      for (const auto& row : in.data) ptrs.push_back(row.data());
      for (auto path : {ReproduciblePath::kWindowed, ReproduciblePath::kAuto}) {
        std::vector<unsigned char> out(in.count * 4);
        reproducibleReduceLocal(ptrs, out.data(), in.count, DType::kFloat32, ReduceOp::kSum, path);
        const std::string what = std::string(reduceKernelIsa()) + (run >= 2 ? " ftz" : "") +
                                 " ranks " + std::to_string(ranks) +
                                 (path == ReproduciblePath::kAuto ? " auto" : " wide");
        EXPECT_EQ(mismatches(in, want, out.data(), 0, in.count, what), 0) << what;
      }
    }
  }
  setFlush(false);
  setReduceIsa(ReduceIsa::kAuto);
}

// The two-rank path (one IEEE operation per element, reproducible_pair.cc) against the one-pass
// path (full integer accumulators, rounded once): the same bits for every dtype, sum and avg, on
// raw random bit patterns (NaN payloads, infinities, subnormals, both zeros), on pairs a few
// ulps or a few exponents apart (ties, cancellation), on the largest finite values (sums that
// overflow, averages that must not); with the AVX2 loops and the scalar ones, and with the
// caller in flush-to-zero / denormals-are-zero, which the call must not see nor change.
TEST(ReproducibleLocal, PairAgreesWithTheIntegerPath) {
  std::mt19937_64 rng(2026);
  const auto mxcsr = [] {
#if defined(__x86_64__)
    return _mm_getcsr() & ~0x3fu;  // the controls; the status flags are sticky
#else
    return 0u;
#endif
  };
  int compared = 0;
  for (DType d : kDTypes) {
    const size_t width = dtypeSize(d);
    const int bits = static_cast<int>(width) * 8;
    const uint64_t all = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    const uint64_t sign = uint64_t{1} << (bits - 1);
    const int mantissa = d == DType::kFloat32   ? 23
                         : d == DType::kFloat64 ? 52
                         : d == DType::kFloat16 ? 10
                                                : 7;
    const uint64_t largest = (sign - 1) & ~(uint64_t{1} << mantissa);  // exponent all-ones - 1
    for (size_t count : {size_t{1}, size_t{37}, size_t{1029}}) {
      for (int kind = 0; kind < 4; ++kind) {
        std::vector<uint64_t> a(count), b(count);
        for (size_t i = 0; i < count; ++i) {
          const uint64_t x = rng() & all;
          uint64_t y = rng() & all;
          switch (kind) {
            case 0:  // any bit patterns
              break;
            case 1:  // a few ulps apart, either sign: ties and cancellation
              y = ((x & (sign - 1)) + rng() % 5 - 2) & (sign - 1);
              y |= (rng() & 1) != 0 ? sign : 0;
              break;
            case 2:  // a few exponents apart
              y = ((x & (sign - 1)) - ((rng() % 30) << mantissa)) & (sign - 1);
              y |= (rng() & 1) != 0 ? sign : 0;
              break;
            default:  // around the largest finite value and the smallest subnormals
              y = rng() % 2 == 0 ? largest - rng() % 3 : rng() % 4;
              y |= (rng() & 1) != 0 ? sign : 0;
          }
          a[i] = kind == 3 && rng() % 2 == 0 ? (largest - rng() % 3) | (x & sign) : x;
          b[i] = y;
        }
        std::vector<unsigned char> rowA(count * width), rowB(count * width);
        for (size_t i = 0; i < count; ++i) {
          std::memcpy(rowA.data() + i * width, &a[i], width);  // little-endian low bytes
          std::memcpy(rowB.data() + i * width, &b[i], width);
        }
        const void* ptrs[] = {rowA.data(), rowB.data()};
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          std::vector<unsigned char> want(count * width);
          reproducibleReduceLocal(ptrs, want.data(), count, d, op, ReproduciblePath::kOnePass);
          for (int run = 0; run < 4; ++run) {
            setReduceIsa(run % 2 == 0 ? ReduceIsa::kAuto : ReduceIsa::kGeneric);
            setFlush(run >= 2);
            const unsigned before = mxcsr();
            std::vector<unsigned char> got(count * width);
            reproducibleReduceLocal(ptrs, got.data(), count, d, op, ReproduciblePath::kPair);
            EXPECT_EQ(mxcsr(), before) << "the caller's floating-point environment changed";
            setFlush(false);
            setReduceIsa(ReduceIsa::kAuto);
            for (size_t i = 0; i < count; ++i) {
              uint64_t w = 0, g = 0;
              std::memcpy(&w, want.data() + i * width, width);
              std::memcpy(&g, got.data() + i * width, width);
              ASSERT_EQ(g, w) << dtypeName(d) << " " << reduceOpName(op) << " kind " << kind
                              << " run " << run << " element " << i << ": a=0x" << std::hex << a[i]
                              << " b=0x" << b[i];
            }
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 4 * 3 * 4 * 2 * 4);
  // Known values: the average of the largest finite values is that value (their sum overflows).
  const double dmax = std::numeric_limits<double>::max();
  const double dtiny = std::numeric_limits<double>::denorm_min();
  const auto pair = [](double x, double y, ReduceOp op) {
    const void* ptrs[] = {&x, &y};
    double r = 0;
    reproducibleReduceLocal(ptrs, &r, 1, DType::kFloat64, op, ReproduciblePath::kPair);
    return std::bit_cast<uint64_t>(r);
  };
  EXPECT_EQ(pair(dmax, dmax, ReduceOp::kAvg), std::bit_cast<uint64_t>(dmax));
  EXPECT_EQ(pair(dmax, dmax, ReduceOp::kSum), std::bit_cast<uint64_t>(double{INFINITY}));
  EXPECT_EQ(pair(dtiny, 0.0, ReduceOp::kAvg), 0u);  // half the smallest subnormal: a tie, to even
  EXPECT_EQ(pair(-dtiny, 0.0, ReduceOp::kAvg), std::bit_cast<uint64_t>(-0.0));
  EXPECT_EQ(pair(3 * dtiny, 0.0, ReduceOp::kAvg), std::bit_cast<uint64_t>(2 * dtiny));
  EXPECT_EQ(pair(-0.0, -0.0, ReduceOp::kSum), std::bit_cast<uint64_t>(-0.0));
  EXPECT_EQ(pair(INFINITY, -INFINITY, ReduceOp::kSum), 0x7ff8000000000000u);
  // Exactly two inputs.
  float x = 1, out = 0;
  const void* three[] = {&x, &x, &x};
  EXPECT_THROW(reproducibleReduceLocal(three, &out, 1, DType::kFloat32, ReduceOp::kSum,
                                       ReproduciblePath::kPair),
               InvalidArgumentError);
}

// float32's double-sum path (reproducible_double.cc) takes an element only when its values span
// at most 29 - ceil(log2 n) binades, where the double sum is exact. One binade more and a double
// sum can round onto a float midpoint: 4 ranks, (8 - 2^-21) + (8 - 2^-21) + (2^-19 - 2^-26) +
// (2^-26 + 2^-49) = 16 + 2^-20 + 2^-49 (exponents 2^2 down to 2^-26: 28 binades), whose double
// sum ties to 16 + 2^-20, a float midpoint, which rounds to 16; the correctly rounded sum is
// 16 + 2^-19. At the bound (27 binades: 2^-25 + 2^-48 last) every path agrees.
TEST(ReproducibleLocal, DoubleSumsStopWhereTheyAreExact) {
  const float big = 8.0f - 0x1p-21f;
  const std::vector<std::vector<float>> elements = {
      {big, big, 0x1p-19f - 0x1p-26f, 0x1p-26f + 0x1p-49f},  // one binade beyond the bound
      {big, big, 0x1p-19f - 0x1p-25f, 0x1p-25f + 0x1p-48f},  // at the bound
  };
  // 1000 elements, the two alternating: above the one-pass sizes, so that kAuto takes the
  // double sums as the exchange does.
  const size_t count = 1000;
  std::vector<std::vector<float>> rows(4, std::vector<float>(count));
  for (size_t i = 0; i < count; ++i)
    for (int r = 0; r < 4; ++r) rows[r][i] = elements[i % 2][r];
  std::vector<const void*> ptrs;
  for (const auto& row : rows) ptrs.push_back(row.data());
  std::vector<float> fast(count), exact(count);
  reproducibleReduceLocal(ptrs, fast.data(), count, DType::kFloat32, ReduceOp::kSum);
  reproducibleReduceLocal(ptrs, exact.data(), count, DType::kFloat32, ReduceOp::kSum,
                          ReproduciblePath::kOnePass);
  EXPECT_EQ(exact[0], 16.0f + 0x1p-19f);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(exact[i])) << i;
  }
  // The double sum of the first element is not its correctly rounded value (the reason for the
  // bound), and the second's is.
  const auto viaDouble = [&](size_t i) {
    double sum = elements[i][0];
    for (int r = 1; r < 4; ++r) sum += elements[i][r];
    return static_cast<float>(sum);
  };
  EXPECT_NE(viaDouble(0), exact[0]);
  EXPECT_EQ(viaDouble(1), exact[1]);
}

// AVG over a world that is not a power of two: the exact double sum divided in double, then
// rounded to float, is the one rounding (reproducible_double.cc). Averages that are exactly a
// float midpoint (ties, to even: up for an odd lower neighbour) and one float ulp of the
// larger operand either side of one, over 3, 5, 6, 7 and 12 rows, both signs, against the
// one-pass integer path. Rounding the sum to float before dividing fails them (tried by hand).
TEST(ReproducibleLocal, DoubleQuotientsRoundOnce) {
  for (int n : {3, 5, 6, 7, 12}) {
    std::vector<std::vector<float>> rows(n);
    for (uint32_t k = 1; k < 64; k += 2) {  // m = 1 + k 2^-24, a midpoint of two floats
      const float b = static_cast<float>(n * k) * 0x1p-24f;  // exact: n k < 2^24
      for (float sign : {1.0f, -1.0f}) {
        for (float tail : {b, std::nextafter(b, 1.0f), std::nextafter(b, 0.0f)}) {
          rows[0].push_back(sign * static_cast<float>(n));  // n m = n + n k 2^-24
          rows[1].push_back(sign * tail);
          for (int r = 2; r < n; ++r) rows[r].push_back(r % 2 == 0 ? 0.0f : -0.0f);
        }
      }
    }
    const size_t count = rows[0].size() * 8;  // above the one-pass sizes: kAuto sums in double
    for (auto& row : rows) {
      const std::vector<float> one = row;
      for (int copy = 1; copy < 8; ++copy) row.insert(row.end(), one.begin(), one.end());
    }
    std::vector<const void*> ptrs;
    for (const auto& row : rows) ptrs.push_back(row.data());
    std::vector<float> fast(count), exact(count);
    reproducibleReduceLocal(ptrs, fast.data(), count, DType::kFloat32, ReduceOp::kAvg);
    reproducibleReduceLocal(ptrs, exact.data(), count, DType::kFloat32, ReduceOp::kAvg,
                            ReproduciblePath::kOnePass);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(exact[i]))
          << "n=" << n << " element " << i << ": " << rows[0][i] << " + " << rows[1][i];
    }
    // Ties to even: k = 1, 1 + 2^-24 between 1 (even) and 1 + 2^-23, goes down; k = 3,
    // 1 + 3 2^-24 between 1 + 2^-23 (odd) and 1 + 2^-22, goes up.
    EXPECT_EQ(fast[0], 1.0f) << "n=" << n;
    EXPECT_EQ(fast[6], 1.0f + 0x1p-22f) << "n=" << n;
  }
}

// float16 and bfloat16 take the double sums too, rounded through float by round-to-odd: the
// generator's adversarial inputs over 3-6 rows, sum and avg, against the exact reference and the
// one-pass path; and sums one tiny value past a tie of the 16-bit format, which rounding the
// double to float to nearest first would turn into the tie itself (and then to even, down).
TEST(ReproducibleLocal, SixteenBitDoubleSums) {
  // The AVX2 + F16C loop and the scalar one (ReduceIsa::kGeneric), the caller in FTZ/DAZ or not.
  for (int run = 0; run < 4; ++run) {
    setReduceIsa(run % 2 == 0 ? ReduceIsa::kAuto : ReduceIsa::kGeneric);
    setFlush(run >= 2);
    for (DType d : {DType::kFloat16, DType::kBFloat16}) {
      for (int ranks : {3, 4, 5, 8}) {
        for (bool average : {false, true}) {
          const size_t count = 3003;  // above the one-pass sizes; a tail after the vectors
          const Inputs in(d, ranks, count, 500 + ranks * 2 + average);
          const auto want = in.expected(average);
          std::vector<const void*> ptrs;
          for (const auto& row : in.data) ptrs.push_back(row.data());
          std::vector<unsigned char> out(count * 2);
          reproducibleReduceLocal(ptrs, out.data(), count, d,
                                  average ? ReduceOp::kAvg : ReduceOp::kSum);
          const std::string what = std::string(reduceKernelIsa()) + (run >= 2 ? " ftz " : " ") +
                                   dtypeName(d) + " ranks=" + std::to_string(ranks) +
                                   (average ? " avg" : " sum");
          EXPECT_EQ(mismatches(in, want, out.data(), 0, count, what), 0) << what;
        }
      }
    }
  }
  setFlush(false);
  setReduceIsa(ReduceIsa::kAuto);
  // 1 + half an ulp + the smallest step: float16 1 + 2^-11 + 2^-24 is 1 + 2^-10 (0x3c01);
  // bfloat16 1 + 2^-8 + 2^-30 is 1 + 2^-7 (0x3f81). 1200 copies, above the one-pass sizes.
  const auto sumOf = [](DType d, std::vector<uint16_t> values) {
    const size_t count = 1200;
    std::vector<std::vector<uint16_t>> rows(values.size());
    std::vector<const void*> ptrs;
    for (size_t r = 0; r < values.size(); ++r) {
      rows[r].assign(count, values[r]);
      ptrs.push_back(rows[r].data());
    }
    std::vector<uint16_t> out(count);
    reproducibleReduceLocal(ptrs, out.data(), count, d, ReduceOp::kSum);
    for (uint16_t v : out) EXPECT_EQ(v, out[0]);
    return out[0];
  };
  for (ReduceIsa isa : {ReduceIsa::kAuto, ReduceIsa::kGeneric}) {
    setReduceIsa(isa);
    EXPECT_EQ(sumOf(DType::kFloat16, {0x3c00, 0x1000, 0x0001}), 0x3c01);
    EXPECT_EQ(sumOf(DType::kFloat16, {0x3c00, 0x1000, 0x0000}), 0x3c00);  // the tie: to even
    EXPECT_EQ(sumOf(DType::kBFloat16, {0x3f80, 0x3b80, 0x3080}), 0x3f81);
    EXPECT_EQ(sumOf(DType::kBFloat16, {0x3f80, 0x3b80, 0x0000}), 0x3f80);
    // One binade past the float sums' range over 4 rows (float16 11, bfloat16 14): three values
    // add to a tie of the format and the fourth, a subnormal, is half of float's ulp there, so a
    // float sum would round to the tie and then to even. 0.375 + 0.375 + (0.25 + 2^-11) + 2^-24
    // is 1 + 2^-10 in float16; bfloat16 the same shape at 2^-109 with 2^-133.
    EXPECT_EQ(sumOf(DType::kFloat16, {0x3600, 0x3600, 0x3402, 0x0001}), 0x3c01);
    EXPECT_EQ(sumOf(DType::kBFloat16, {0x0840, 0x0840, 0x0802, 0x0001}), 0x0901);
    // And one past the double sums' over 4 rows (bfloat16 43): 1.5 + 1.5 + (1 + 2^-6), at 2^-82,
    // is a tie, and 2^-133 half of double's ulp at its sum.
    EXPECT_EQ(sumOf(DType::kBFloat16, {0x16c0, 0x16c0, 0x1682, 0x0001}), 0x1781);
    // The largest finite values: float16 65504 x 3 overflows to infinity, its average does not.
    EXPECT_EQ(sumOf(DType::kFloat16, {0x7bff, 0x7bff, 0x7bff}), 0x7c00);
    EXPECT_EQ(sumOf(DType::kBFloat16, {0x7f7f, 0x7f7f, 0x7f7f}), 0x7f80);
  }
  setReduceIsa(ReduceIsa::kAuto);
}

// The 16-bit formats' AVX2 loop (from 3 ranks) takes each group of sixteen elements one of four
// ways: exact float sums, double sums, exact float sums divided in double (an AVG by a divisor that
// is not a power of two), or the scalar code (an infinity or NaN, a range too wide, a tiny bfloat16
// result). Groups here are built to take each: every element of a group draws its values from one
// band of exponent fields (narrow, past float's span, past double's, tiny, huge, cancelling, one
// special value), so no group is sent elsewhere by a neighbour. Against the reference, with the
// AVX2 loop and the scalar one.
TEST(ReproducibleLocal, SixteenBitVectorLoopEveryWay) {
  struct Band {
    int lo, hi;    // exponent fields drawn from [lo, hi], clamped to the format's finite ones
    bool cancel;   // the last rank cancels the others' first value
    bool special;  // one element of the group gets an infinity or NaN
  };
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    const bool isHalf = d == DType::kFloat16;
    const int mantissa = isHalf ? 10 : 7, top = isHalf ? 30 : 254;
    const int mid = isHalf ? 15 : 127;
    const std::vector<Band> bands = {
        {mid - 3, mid + 3, false, false},  // narrow: float sums
        {mid - 9, mid + 5, false, false},  // past float's span for 4+ ranks
        {1, top, false, false},            // past double's for bfloat16: scalar
        {0, 3, false, false},              // subnormals and the smallest normals
        {top - 4, top, false, false},      // the largest: overflow, bfloat16's float top
        {mid - 2, mid + 2, true, false},   // cancellation: exact zeros
        {mid - 2, mid + 2, false, true},   // one infinity or NaN
    };
    for (int ranks : {1, 2, 3, 4, 5, 7, 8}) {
      for (bool average : {false, true}) {
        std::mt19937_64 rng(900 + ranks * 4 + average * 2 + isHalf);
        // Above the one-pass sizes (16 KiB of float16's full accumulators are 1024 elements),
        // and a tail.
        const size_t count = 12 * bands.size() * 16 + 5;
        Inputs in(d, ranks, count, 1, false);
        for (size_t g = 0; g * 16 < count; ++g) {
          const Band& b = bands[g % bands.size()];
          for (size_t i = g * 16; i < std::min(count, g * 16 + 16); ++i) {
            std::vector<uint16_t> v(ranks);
            for (int r = 0; r < ranks; ++r) {
              const int e = std::clamp(b.lo + static_cast<int>(rng() % (b.hi - b.lo + 1)), 0, top);
              const uint16_t sign = (rng() & 1) ? 0x8000 : 0;
              v[r] =
                  static_cast<uint16_t>(sign | (e << mantissa) | (rng() & ((1u << mantissa) - 1)));
            }
            if (b.cancel && ranks > 1) v[ranks - 1] = v[0] ^ 0x8000;
            if (b.special && i == g * 16 + 7) {
              const uint16_t inf = static_cast<uint16_t>((top + 1) << mantissa);
              v[rng() % ranks] = (rng() & 1) ? inf : static_cast<uint16_t>(inf | 1);
            }
            for (int r = 0; r < ranks; ++r) std::memcpy(&in.data[r][i * 2], &v[r], 2);
          }
        }
        const auto want = in.expected(average);
        std::vector<const void*> ptrs;
        for (const auto& row : in.data) ptrs.push_back(row.data());
        for (ReduceIsa isa : {ReduceIsa::kAuto, ReduceIsa::kGeneric}) {
          setReduceIsa(isa);
          std::vector<unsigned char> out(count * 2);
          reproducibleReduceLocal(ptrs, out.data(), count, d,
                                  average ? ReduceOp::kAvg : ReduceOp::kSum);
          const std::string what = std::string(reduceKernelIsa()) + " " + dtypeName(d) +
                                   " ranks=" + std::to_string(ranks) + (average ? " avg" : " sum");
          EXPECT_EQ(mismatches(in, want, out.data(), 0, count, what), 0) << what;
        }
      }
    }
  }
  setReduceIsa(ReduceIsa::kAuto);
}

// float64 keeps its sums as unevaluated pairs of doubles (reproducible_double.cc): 1 + (2^-49 +
// 2^-101) - 1 is 2^-49 + 2^-101 exactly, where adding in double loses the 2^-101 (the values
// span 49 binades, the bound for 3 and 4 rows); the average over 4 rows is a quarter of it.
// Against the one-pass path and the constants, above the one-pass sizes (kAuto).
TEST(ReproducibleLocal, Float64PairsOfDoubles) {
  const double small = 0x1p-49 + 0x1p-101;
  for (int ranks : {3, 4}) {
    const size_t count = 100;
    std::vector<std::vector<double>> rows(ranks, std::vector<double>(count, 0.0));
    for (size_t i = 0; i < count; ++i) {
      rows[0][i] = 1.0;
      rows[1][i] = small;
      rows[2][i] = -1.0;
    }
    std::vector<const void*> ptrs;
    for (const auto& row : rows) ptrs.push_back(row.data());
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<double> fast(count), exact(count);
      reproducibleReduceLocal(ptrs, fast.data(), count, DType::kFloat64, op);
      reproducibleReduceLocal(ptrs, exact.data(), count, DType::kFloat64, op,
                              ReproduciblePath::kOnePass);
      const double want = op == ReduceOp::kSum ? small : small / ranks;
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(exact[i], want) << ranks << " " << reduceOpName(op);
        ASSERT_EQ(fast[i], want) << ranks << " " << reduceOpName(op);
      }
    }
  }
  EXPECT_NE(1.0 + small - 1.0, small);  // what adding in double gives
  // The AVX2 loop and the scalar one on the generator's adversarial inputs, against the exact
  // reference, with a tail after the vectors; zeros among them average exactly.
  for (ReduceIsa isa : {ReduceIsa::kAuto, ReduceIsa::kGeneric}) {
    setReduceIsa(isa);
    for (int ranks : {3, 4, 8}) {
      for (bool average : {false, true}) {
        const Inputs in(DType::kFloat64, ranks, 1001, 900 + ranks * 2 + average);
        const auto want = in.expected(average);
        std::vector<const void*> ptrs;
        for (const auto& row : in.data) ptrs.push_back(row.data());
        std::vector<unsigned char> out(in.count * 8);
        reproducibleReduceLocal(ptrs, out.data(), in.count, DType::kFloat64,
                                average ? ReduceOp::kAvg : ReduceOp::kSum);
        const std::string what = std::string(reduceKernelIsa()) +
                                 " ranks=" + std::to_string(ranks) + (average ? " avg" : " sum");
        EXPECT_EQ(mismatches(in, want, out.data(), 0, in.count, what), 0) << what;
      }
    }
  }
  setReduceIsa(ReduceIsa::kAuto);
}

// A sum that is exactly zero by cancellation is +0, in any order of the ranks: the pair (s, t)
// can hold s = -t != 0 (a tie rounded to even in the first addition), and s's sign was kept
// for every zero result (-2^-52 came back, or +0 with the ranks reordered). A sum of -0 alone
// stays -0. The vector and the scalar loops, and the one-pass path.
TEST(ReproducibleLocal, Float64CancellationIsPositiveZeroInAnyOrder) {
  const double a = 1.0 + 0x1p-52;
  const std::vector<std::vector<double>> orders = {
      {a, 1.0, -a, -1.0}, {a, -a, 1.0, -1.0}, {-1.0, 1.0, a, -a}, {1.0, a, -1.0, -a}};
  for (ReduceIsa isa : {ReduceIsa::kAuto, ReduceIsa::kGeneric}) {
    setReduceIsa(isa);
    for (const auto& order : orders) {
      const size_t count = 61;  // vectors and a tail; past the 49 where another path took it
      std::vector<std::vector<double>> rows;
      for (double v : order) rows.emplace_back(count, v);
      rows.emplace_back(count, -0.0);  // a fifth rank of -0 does not make the sum negative
      std::vector<const void*> ptrs;
      for (const auto& row : rows) ptrs.push_back(row.data());
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        for (ReproduciblePath path : {ReproduciblePath::kAuto, ReproduciblePath::kOnePass}) {
          std::vector<double> out(count, 1.0);
          reproducibleReduceLocal(ptrs, out.data(), count, DType::kFloat64, op, path);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_TRUE(out[i] == 0.0 && !std::signbit(out[i]))
                << reduceKernelIsa() << " " << reduceOpName(op) << " order " << order[0] << ", "
                << order[1] << ", ... element " << i << ": " << out[i];
          }
        }
      }
    }
    std::vector<std::vector<double>> zeros(3, std::vector<double>(61, -0.0));
    std::vector<const void*> ptrs;
    for (const auto& row : zeros) ptrs.push_back(row.data());
    std::vector<double> out(61, 1.0);
    reproducibleReduceLocal(ptrs, out.data(), 61, DType::kFloat64, ReduceOp::kSum);
    for (double v : out) ASSERT_TRUE(v == 0.0 && std::signbit(v)) << reduceKernelIsa();
  }
  setReduceIsa(ReduceIsa::kAuto);
}

TEST(ReproducibleLocal, RefusesWhatItCannotDo) {
  float a = 1, out = 0;
  const void* ptrs[] = {&a};
  EXPECT_THROW(reproducibleReduceLocal(ptrs, &out, 1, DType::kFloat32, ReduceOp::kProd),
               InvalidArgumentError);
  EXPECT_THROW(reproducibleReduceLocal(ptrs, &out, 1, DType::kInt32, ReduceOp::kSum),
               InvalidArgumentError);
  EXPECT_THROW(checkReproducible(ReduceOp::kProd, DType::kFloat64), InvalidArgumentError);
  EXPECT_NO_THROW(checkReproducible(ReduceOp::kMax, DType::kFloat64));
  EXPECT_NO_THROW(checkReproducible(ReduceOp::kProd, DType::kInt64));
}

}  // namespace
}  // namespace loom::comm
