// Reproducible mode (loom/comm/reproducible.h): every result is checked bit for bit against an
// exact reference written here, independently of the library's accumulators: the exact sum as
// a big fixed-point integer, and the correctly rounded value found by comparing the exact
// distances to the candidate floats around an approximation (ties to the even significand).
// - Reference / property cases: inputs built to defeat naive summation (mixed magnitudes,
//   cancellation, subnormals, ties, overflow, inf and NaN), through reproducibleReduceLocal on
//   both paths (one pass and windowed), thousands of elements per dtype and op.
// - Ranks: thread ranks over a HashStore, shm, tcp and the two-host hierarchy, 2-5 ranks, forced
//   algorithms, small and large chunks, permuted inputs, every reduce form (all-reduce, reduce,
//   reduce-scatter even and uneven, in place): bitwise equal to the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
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

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace loom::comm {
namespace {

// ---- the reference ----

struct Fmt {
  int bytes, precision, exponentBits, bias;
  int minBit() const { return 1 - bias - (precision - 1); }
  uint64_t sign() const { return uint64_t{1} << (bytes * 8 - 1); }
  uint64_t infinity() const { return ((uint64_t{1} << exponentBits) - 1) << (precision - 1); }
  uint64_t nan() const { return infinity() | (uint64_t{1} << (precision - 2)); }
  uint64_t magnitudeMask() const { return sign() - 1; }
};
Fmt fmtOf(DType d) {
  switch (d) {
    case DType::kFloat32:
      return {4, 24, 8, 127};
    case DType::kFloat64:
      return {8, 53, 11, 1023};
    case DType::kFloat16:
      return {2, 11, 5, 15};
    default:
      return {2, 8, 8, 127};
  }
}

// Signed big integer: sign and magnitude in 32-bit words, little-endian.
struct Big {
  bool negative = false;
  std::vector<uint32_t> mag;  // no leading zero words

  static Big fromU64(uint64_t v, int shift) {  // v * 2^shift
    Big b;
    b.mag.assign(static_cast<size_t>(shift / 32) + 4, 0);
    const int s = shift % 32;
    const unsigned __int128 w = static_cast<unsigned __int128>(v) << s;
    for (int i = 0; i < 3; ++i) b.mag[shift / 32 + i] = static_cast<uint32_t>(w >> (32 * i));
    b.trim();
    return b;
  }
  void trim() {
    while (!mag.empty() && mag.back() == 0) mag.pop_back();
    if (mag.empty()) negative = false;
  }
  bool zero() const { return mag.empty(); }
  static int cmpMag(const Big& a, const Big& b) {
    if (a.mag.size() != b.mag.size()) return a.mag.size() < b.mag.size() ? -1 : 1;
    for (size_t i = a.mag.size(); i-- > 0;) {
      if (a.mag[i] != b.mag[i]) return a.mag[i] < b.mag[i] ? -1 : 1;
    }
    return 0;
  }
  static Big addMag(const Big& a, const Big& b) {
    Big r;
    r.mag.resize(std::max(a.mag.size(), b.mag.size()) + 1, 0);
    uint64_t carry = 0;
    for (size_t i = 0; i < r.mag.size(); ++i) {
      const uint64_t t =
          carry + (i < a.mag.size() ? a.mag[i] : 0) + (i < b.mag.size() ? b.mag[i] : 0);
      r.mag[i] = static_cast<uint32_t>(t);
      carry = t >> 32;
    }
    r.trim();
    return r;
  }
  static Big subMag(const Big& a, const Big& b) {  // |a| >= |b|
    Big r;
    r.mag.resize(a.mag.size(), 0);
    int64_t borrow = 0;
    for (size_t i = 0; i < a.mag.size(); ++i) {
      int64_t t = int64_t{a.mag[i]} - (i < b.mag.size() ? b.mag[i] : 0) - borrow;
      borrow = t < 0;
      if (t < 0) t += int64_t{1} << 32;
      r.mag[i] = static_cast<uint32_t>(t);
    }
    r.trim();
    return r;
  }
  friend Big operator+(const Big& a, const Big& b) {
    Big r;
    if (a.negative == b.negative) {
      r = addMag(a, b);
      r.negative = a.negative;
    } else if (cmpMag(a, b) >= 0) {
      r = subMag(a, b);
      r.negative = a.negative;
    } else {
      r = subMag(b, a);
      r.negative = b.negative;
    }
    r.trim();
    return r;
  }
  Big operator-() const {
    Big r = *this;
    if (!r.zero()) r.negative = !r.negative;
    return r;
  }
  Big times(uint32_t k) const {
    Big r;
    r.negative = negative;
    r.mag.resize(mag.size() + 1, 0);
    uint64_t carry = 0;
    for (size_t i = 0; i < mag.size(); ++i) {
      const uint64_t t = uint64_t{mag[i]} * k + carry;
      r.mag[i] = static_cast<uint32_t>(t);
      carry = t >> 32;
    }
    r.mag[mag.size()] = static_cast<uint32_t>(carry);
    r.trim();
    return r;
  }
  long double approx() const {  // value, relative error ~2^-60
    long double v = 0;
    for (size_t i = mag.size(); i-- > 0;) v = v * 4294967296.0L + mag[i];
    return negative ? -v : v;
  }
};

// A finite value of the format (bits) as an integer in units of 2^minBit.
Big exact(const Fmt& f, uint64_t bits) {
  const uint64_t field = (bits >> (f.precision - 1)) & ((uint64_t{1} << f.exponentBits) - 1);
  const uint64_t frac = bits & ((uint64_t{1} << (f.precision - 1)) - 1);
  Big b = field == 0 ? Big::fromU64(frac, 0)
                     : Big::fromU64(frac | (uint64_t{1} << (f.precision - 1)),
                                    static_cast<int>(field) - 1);
  if ((bits & f.sign()) != 0) b = -b;
  return b;
}

// Maps bits to an ordered integer key (-0 and +0 both 0) and back.
int64_t keyOf(const Fmt& f, uint64_t bits) {
  const auto m = static_cast<int64_t>(bits & f.magnitudeMask());
  return (bits & f.sign()) != 0 ? -m : m;
}
uint64_t bitsOfKey(const Fmt& f, int64_t key) {
  return key >= 0 ? static_cast<uint64_t>(key) : f.sign() | static_cast<uint64_t>(-key);
}

uint64_t toFormat(const Fmt& f, long double v) {
  switch (f.bytes) {
    case 8: {
      const double d = static_cast<double>(v);
      return std::bit_cast<uint64_t>(d);
    }
    case 4:
      return std::bit_cast<uint32_t>(static_cast<float>(v));
    default: {
      const float x = static_cast<float>(v);
      return f.exponentBits == 5 ? floatToHalf(x) : floatToBFloat16(x);
    }
  }
}

// The correctly rounded sum (divisor 1) or average (divisor = number of inputs) of `inputs`.
uint64_t reference(DType dtype, const std::vector<uint64_t>& inputs, bool average) {
  const Fmt f = fmtOf(dtype);
  bool nan = false, plus = false, minus = false, allNegativeZero = true;
  Big sum;
  for (uint64_t b : inputs) {
    if ((b & f.infinity()) == f.infinity()) {
      if ((b & ((uint64_t{1} << (f.precision - 1)) - 1)) != 0) {
        nan = true;
      } else if ((b & f.sign()) != 0) {
        minus = true;
      } else {
        plus = true;
      }
      allNegativeZero = false;
      continue;
    }
    if (b != f.sign()) allNegativeZero = false;
    sum = sum + exact(f, b);
  }
  if (nan || (plus && minus)) return f.nan();
  if (plus) return f.infinity();
  if (minus) return f.sign() | f.infinity();
  if (sum.zero()) return allNegativeZero ? f.sign() : 0;
  const uint32_t n = average ? static_cast<uint32_t>(inputs.size()) : 1;
  // Candidates around the approximation; the nearest by exact distance |sum - n c| wins.
  const long double approx = std::ldexp(sum.approx() / n, f.minBit());
  const int64_t center = keyOf(f, toFormat(f, approx));
  const int64_t maxKey = static_cast<int64_t>(f.infinity());
  int64_t best = 0;
  Big bestDistance;
  bool have = false;
  for (int64_t k = center - 3; k <= center + 3; ++k) {
    if (k > maxKey || k < -maxKey) continue;
    // +-infinity stands for 2^(emax+1): a tie with the largest finite value goes to it.
    const Big c = exact(f, bitsOfKey(f, k));
    Big d = sum + -c.times(n);
    d.negative = false;
    const int cmp = have ? Big::cmpMag(d, bestDistance) : -1;
    if (cmp < 0 || (cmp == 0 && (k % 2 == 0))) {
      best = k;
      bestDistance = d;
      have = true;
    }
  }
  EXPECT_NE(best, center - 3) << "reference: candidates too narrow";
  EXPECT_NE(best, center + 3) << "reference: candidates too narrow";
  if (best == 0) return sum.negative ? f.sign() : 0;
  return bitsOfKey(f, best);
}

// ---- inputs that defeat naive summation ----

class Gen {
 public:
  Gen(DType dtype, uint64_t seed) : f_(fmtOf(dtype)), rng_(seed) {}

  uint64_t randomBits(int exponentLow, int exponentHigh) {
    const uint64_t frac = rng_() & ((uint64_t{1} << (f_.precision - 1)) - 1);
    const int field = std::uniform_int_distribution<int>(exponentLow, exponentHigh)(rng_);
    return (uint64_t{static_cast<unsigned>(field)} << (f_.precision - 1)) | frac |
           (rng_() % 2 ? f_.sign() : 0);
  }
  int maxField() const { return (1 << f_.exponentBits) - 2; }

  // One element's values on `ranks` ranks.
  std::vector<uint64_t> element(int ranks, bool specials) {
    std::vector<uint64_t> v(ranks);
    const int kind = static_cast<int>(rng_() % (specials ? 10 : 8));
    const int mid = maxField() / 2;
    for (int r = 0; r < ranks; ++r) {
      switch (kind) {
        case 0:  // any finite value
          v[r] = randomBits(0, maxField());
          break;
        case 1:  // mixed magnitudes around 1
          v[r] = randomBits(mid - 30, mid + 30);
          break;
        case 2:  // subnormals and the smallest normals
          v[r] = randomBits(0, 2);
          break;
        case 3:  // zeros of both signs
          v[r] = rng_() % 2 ? f_.sign() : 0;
          break;
        case 4:  // near overflow
          v[r] = randomBits(maxField() - 1, maxField());
          break;
        default:  // cancellation: x, -x, then a small remainder
          v[r] = randomBits(mid - 2, mid + 2);
          break;
      }
    }
    if (kind >= 5 && kind < 8 && ranks >= 2) {
      v[1] = v[0] ^ f_.sign();  // exact cancellation of the largest pair
      if (kind == 6) {          // a tie: 1 + half an ulp (+ more ranks that cancel)
        v[0] = uint64_t(f_.bias) << (f_.precision - 1);
        v[1] = uint64_t(f_.bias - f_.precision) << (f_.precision - 1);
        for (int r = 2; r + 1 < ranks; r += 2) v[r + 1] = v[r] ^ f_.sign();
      }
      if (kind == 7) v[ranks - 1] = randomBits(0, mid);
    }
    if (kind == 8) v[rng_() % ranks] = f_.infinity() | (rng_() % 2 ? f_.sign() : 0);
    if (kind == 9) v[rng_() % ranks] = f_.nan() | (rng_() & 1);
    std::shuffle(v.begin(), v.end(), rng_);
    return v;
  }

 private:
  Fmt f_;
  std::mt19937_64 rng_;
};

// Buffers of `count` elements per rank (row r = rank r's input, raw bits of the format).
struct Inputs {
  DType dtype;
  int ranks;
  size_t count;
  std::vector<std::vector<unsigned char>> data;

  Inputs(DType d, int n, size_t c, uint64_t seed, bool specials = true)
      : dtype(d), ranks(n), count(c), data(n, std::vector<unsigned char>(c * dtypeSize(d))) {
    Gen gen(d, seed);
    for (size_t i = 0; i < c; ++i) {
      const auto v = gen.element(n, specials);
      for (int r = 0; r < n; ++r) std::memcpy(&data[r][i * dtypeSize(d)], &v[r], dtypeSize(d));
    }
  }
  uint64_t at(int r, size_t i) const {
    uint64_t v = 0;
    std::memcpy(&v, &data[r][i * dtypeSize(dtype)], dtypeSize(dtype));
    return v;
  }
  std::vector<uint64_t> expected(bool average) const {
    std::vector<uint64_t> out(count);
    for (size_t i = 0; i < count; ++i) {
      std::vector<uint64_t> v(ranks);
      for (int r = 0; r < ranks; ++r) v[r] = at(r, i);
      out[i] = reference(dtype, v, average);
    }
    return out;
  }
};

uint64_t bitsAt(const void* data, DType d, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const unsigned char*>(data) + i * dtypeSize(d), dtypeSize(d));
  return v;
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Counts mismatches of out against want, printing the first few with the inputs.
int mismatches(const Inputs& in, const std::vector<uint64_t>& want, const void* out, size_t first,
               size_t n, const std::string& what) {
  int bad = 0;
  for (size_t k = 0; k < n; ++k) {
    const uint64_t got = bitsAt(out, in.dtype, k);
    if (got == want[first + k]) continue;
    if (++bad <= 3) {
      std::string inputs;
      for (int r = 0; r < in.ranks; ++r) inputs += " " + hex(in.at(r, first + k));
      ADD_FAILURE() << what << ": element " << first + k << " got " << hex(got) << " want "
                    << hex(want[first + k]) << "; inputs" << inputs;
    }
  }
  return bad;
}

const DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};

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
        for (auto path :
             {ReproduciblePath::kOnePass, ReproduciblePath::kWindowed, ReproduciblePath::kNarrow}) {
          std::vector<unsigned char> out(count * dtypeSize(d));
          size_t refined = 0;
          reproducibleReduceLocal(ptrs, out.data(), count, d,
                                  average ? ReduceOp::kAvg : ReduceOp::kSum, path, &refined);
          const std::string what = std::string(dtypeName(d)) + " ranks=" + std::to_string(ranks) +
                                   (average ? " avg" : " sum") +
                                   (path == ReproduciblePath::kOnePass  ? " one-pass"
                                    : path == ReproduciblePath::kNarrow ? " narrow"
                                                                        : " windowed");
          EXPECT_EQ(mismatches(in, want, out.data(), 0, count, what), 0) << what;
          if (path != ReproduciblePath::kOnePass) {
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

// The narrow window (float32, two ranks, 28 value bits) on plain random values: it keeps four
// bits below float32's precision, so it leaves more undecided than the wide window (about 1 in
// 100 here: one value 16 times smaller than the other, and a sum near a midpoint), never a
// wrong bit.
TEST(ReproducibleLocal, NarrowWindowDecidesOrdinaryValues) {
  const size_t count = 20000;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::normal_distribution<float> g(0.0f, 1e-3f);
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<std::vector<float>> rows(2, std::vector<float>(count));
    for (auto& row : rows)
      for (auto& x : row) x = kind == 0 ? u(rng) : g(rng);
    std::vector<const void*> ptrs;
    for (const auto& row : rows) ptrs.push_back(row.data());
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<float> out(count);
      size_t refined = 0;
      reproducibleReduceLocal(ptrs, out.data(), count, DType::kFloat32, op,
                              ReproduciblePath::kNarrow, &refined);
      EXPECT_LE(refined, count * 3 / 100) << kind;
      for (size_t i = 0; i < count; ++i) {
        const double exact = (double(rows[0][i]) + rows[1][i]) * (op == ReduceOp::kAvg ? 0.5 : 1);
        ASSERT_EQ(std::bit_cast<uint32_t>(out[i]),
                  std::bit_cast<uint32_t>(static_cast<float>(exact)))
            << kind << " " << i;
      }
    }
  }
}

// The windowed path's float32 loops have an AVX2 form (where the reduce kernels use AVX2) and
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
  // Flush-to-zero and denormals-are-zero (x86's MXCSR) must not change a bit either: the float
  // conversions leave subnormals to the integer path.
  const auto setFlush = [](bool on) {
#if defined(__x86_64__)
    _mm_setcsr(on ? (_mm_getcsr() | 0x8040u) : (_mm_getcsr() & ~0x8040u));
#else
    (void)on;
#endif
  };
  int compared = 0;
  for (int kind = 0; kind < 6; ++kind) {
    setFlush(kind >= 3);
    for (int ranks : {1, 2, 3, 4, 8}) {
      for (size_t count : {size_t{1}, size_t{37}, size_t{1029}}) {
        const auto rows = family(kind, ranks, count);
        std::vector<const void*> ptrs;
        for (const auto& row : rows) ptrs.push_back(row.data());
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
          for (auto path : {ReproduciblePath::kWindowed, ReproduciblePath::kNarrow}) {
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
                                     (path == ReproduciblePath::kNarrow ? " narrow" : " wide");
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
      for (auto path : {ReproduciblePath::kWindowed, ReproduciblePath::kNarrow}) {
        std::vector<unsigned char> out(in.count * 4);
        reproducibleReduceLocal(ptrs, out.data(), in.count, DType::kFloat32, ReduceOp::kSum, path);
        const std::string what = std::string(reduceKernelIsa()) + (run >= 2 ? " ftz" : "") +
                                 " ranks " + std::to_string(ranks) +
                                 (path == ReproduciblePath::kNarrow ? " narrow" : " wide");
        EXPECT_EQ(mismatches(in, want, out.data(), 0, in.count, what), 0) << what;
      }
    }
  }
  setFlush(false);
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

// ---- ranks ----

struct Config {
  bool shm;
  Algorithm algorithm;
  size_t chunkBytes;
  bool twoHosts = false;  // ranks split into two "hosts": the hierarchical engine
};

std::string describe(const Config& c, int n) {
  return std::string(c.shm ? (c.twoHosts ? "shm+tcp hierarchy" : "shm") : "tcp") +
         " algo=" + algorithmName(c.algorithm) + " chunk=" + std::to_string(c.chunkBytes) +
         " ranks=" + std::to_string(n);
}

// Runs body(rank, ctx) on n thread ranks with the mode on through ContextOptions.
void onRanks(int n, const Config& config, const std::function<void(int, Context&)>& body) {
  HashStore store;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ContextOptions o;
        o.host = "127.0.0.1";
        o.sharedMemory = config.shm;
        o.algorithm = config.algorithm;
        o.chunkBytes = config.chunkBytes;
        o.timeout = std::chrono::seconds(60);
        o.reproducible = true;
        if (config.twoHosts) o.shmHostId = r < (n + 1) / 2 ? "host-a" : "host-b";
        auto ctx = Context::create(store, r, n, o);
        if (config.twoHosts && r == 0 && n >= 3) {  // rank 0's host holds two ranks or more
          EXPECT_NE(ctx->transportSummary().find("between"), std::string::npos)
              << ctx->transportSummary();
        }
        body(r, *ctx);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Every reduce form on one world: the inputs row perm[r] on rank r, so a permutation of the ranks
// must not change a bit.
void checkWorld(int n, const Config& config, DType d, size_t count, uint64_t seed) {
  const Inputs in(d, n, count * n, seed);
  const auto sum = in.expected(false);
  const auto avg = in.expected(true);
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::string what =
      describe(config, n) + " " + dtypeName(d) + " count=" + std::to_string(count);
  const size_t esize = dtypeSize(d);
  // Uneven blocks: rank j gets j elements more than count - something, summing to count * n.
  std::vector<size_t> uneven(n, count);
  if (n >= 2) {
    uneven[0] = count / 2;
    uneven[n - 1] = count + (count - count / 2);
  }
  onRanks(n, config, [&](int r, Context& ctx) {
    const auto& mine = in.data[perm[r]];
    const size_t total = count * n;
    std::vector<unsigned char> out(total * esize);
    CollectiveOptions opts;
    opts.seq = 1;
    allreduce(ctx, mine.data(), out.data(), total, d, ReduceOp::kSum, opts);
    EXPECT_EQ(mismatches(in, sum, out.data(), 0, total, what + " allreduce sum"), 0);
    std::vector<unsigned char> buf = mine;  // in place
    opts.seq = 2;
    allreduce(ctx, buf.data(), buf.data(), total, d, ReduceOp::kAvg, opts);
    EXPECT_EQ(mismatches(in, avg, buf.data(), 0, total, what + " allreduce avg in place"), 0);
    const int root = n - 1;
    opts.seq = 3;
    reduce(ctx, mine.data(), r == root ? out.data() : nullptr, total, d, ReduceOp::kSum, root,
           opts);
    if (r == root) {
      EXPECT_EQ(mismatches(in, sum, out.data(), 0, total, what + " reduce"), 0);
    }
    opts.seq = 4;
    reduceScatter(ctx, mine.data(), out.data(), count, d, ReduceOp::kAvg, opts);
    EXPECT_EQ(mismatches(in, avg, out.data(), r * count, count, what + " reduce_scatter avg"), 0);
    const size_t offset = std::accumulate(uneven.begin(), uneven.begin() + r, size_t{0});
    buf = mine;  // in place: out is this rank's block of in
    opts.seq = 5;
    reduceScatterv(ctx, buf.data(), buf.data() + offset * esize, uneven, d, ReduceOp::kSum, opts);
    EXPECT_EQ(mismatches(in, sum, buf.data() + offset * esize, offset, uneven[r],
                         what + " reduce_scatterv in place"),
              0);
  });
}

// One-pass sizes (a few elements) and windowed ones (more than kReproducibleOnePassBytes of
// accumulators), 2 to 5 ranks, shm, tcp and the two-host hierarchy, every all-reduce algorithm
// the tests can force.
TEST(ReproducibleRanks, EveryFormAlgorithmTransport) {
  const Config configs[] = {
      {true, Algorithm::kAuto, 512 << 10},
      {false, Algorithm::kAuto, 512 << 10},
      {false, Algorithm::kRing, 4096},
      {true, Algorithm::kRecursiveDoubling, 4096},
      {false, Algorithm::kHalvingDoubling, 4096},
      {true, Algorithm::kDirect, 512 << 10},
      {true, Algorithm::kAuto, 512 << 10, true},
  };
  uint64_t seed = 11;
  for (const Config& config : configs) {
    for (int n : {2, 3, 4, 5}) {
      const DType d = kDTypes[seed % 4];
      checkWorld(n, config, d, 3, ++seed);
      checkWorld(n, config, d, 700, ++seed);
    }
    // float32 over two ranks takes the narrow window: every form, 1,400 elements.
    checkWorld(2, config, DType::kFloat32, 700, 1000 + seed);
  }
}

TEST(ReproducibleRanks, Float64WindowedAndProdRefused) {
  const Config config{true, Algorithm::kAuto, 512 << 10};
  checkWorld(3, config, DType::kFloat64, 400, 99);
  onRanks(2, config, [](int, Context& ctx) {
    double x = 1;
    EXPECT_THROW(allreduce(ctx, &x, &x, 1, DType::kFloat64, ReduceOp::kProd), InvalidArgumentError);
    // Integers and max are exact already: they run as usual.
    int64_t i = 3;
    allreduce(ctx, &i, &i, 1, DType::kInt64, ReduceOp::kSum);
    EXPECT_EQ(i, 6);
    allreduce(ctx, &x, &x, 1, DType::kFloat64, ReduceOp::kMax);
    EXPECT_EQ(x, 1.0);
  });
}

// All-reduce and reduce run large windowed buffers chunk by chunk (65,536 float32
// elements each): results across several chunks, refined elements in more than one of them,
// equal the unchunked arithmetic's bit for bit.
TEST(ReproducibleRanks, ChunkedWindowsMatchTheArithmetic) {
  for (const Config& config :
       {Config{true, Algorithm::kAuto, 512 << 10}, Config{false, Algorithm::kRing, 512 << 10}}) {
    const int n = config.shm ? 2 : 3;
    const size_t total = 140001;  // three chunks
    const Inputs in(DType::kFloat32, n, total, 5 + n);
    std::vector<const void*> ptrs;
    for (const auto& row : in.data) ptrs.push_back(row.data());
    std::vector<uint32_t> sum(total), avg(total);
    size_t refined = 0;
    reproducibleReduceLocal(ptrs, sum.data(), total, DType::kFloat32, ReduceOp::kSum,
                            ReproduciblePath::kWindowed, &refined);
    EXPECT_GT(refined, 2u);
    reproducibleReduceLocal(ptrs, avg.data(), total, DType::kFloat32, ReduceOp::kAvg,
                            ReproduciblePath::kWindowed);
    const std::string what = describe(config, n);
    onRanks(n, config, [&](int r, Context& ctx) {
      std::vector<uint32_t> out(total);
      CollectiveOptions opts;
      opts.seq = 1;
      allreduce(ctx, in.data[r].data(), out.data(), total, DType::kFloat32, ReduceOp::kSum, opts);
      EXPECT_TRUE(out == sum) << what << " allreduce sum";
      std::memcpy(out.data(), in.data[r].data(), total * 4);
      opts.seq = 2;
      allreduce(ctx, out.data(), out.data(), total, DType::kFloat32, ReduceOp::kAvg, opts);
      EXPECT_TRUE(out == avg) << what << " allreduce avg in place";
      std::fill(out.begin(), out.end(), 0u);
      opts.seq = 3;
      reduce(ctx, in.data[r].data(), r == 1 ? out.data() : nullptr, total, DType::kFloat32,
             ReduceOp::kSum, 1, opts);
      if (r == 1) {
        EXPECT_TRUE(out == sum) << what << " reduce";
      }
    });
  }
}

}  // namespace
}  // namespace loom::comm
