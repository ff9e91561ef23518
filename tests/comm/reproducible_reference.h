// The exact reference of the reproducible-mode tests (reproducible_test.cc,
// reproducible_ranks_test.cc), written independently of the library's accumulators: the exact
// sum as a big fixed-point integer, and the correctly rounded value found by comparing the exact
// distances to the candidate floats around an approximation (ties to the even significand); the
// input generators built to defeat naive summation, and the bit-for-bit comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loom/comm/reduce.h"
#include "loom/comm/reproducible.h"
#include "loom/common/error.h"

namespace loom::comm::repro_testing {

// ---- the reference ----

struct Fmt {
  int bytes, precision, exponentBits, bias;
  int minBit() const { return 1 - bias - (precision - 1); }
  uint64_t sign() const { return uint64_t{1} << (bytes * 8 - 1); }
  uint64_t infinity() const { return ((uint64_t{1} << exponentBits) - 1) << (precision - 1); }
  uint64_t nan() const { return infinity() | (uint64_t{1} << (precision - 2)); }
  uint64_t magnitudeMask() const { return sign() - 1; }
};
inline Fmt fmtOf(DType d) {
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
inline Big exact(const Fmt& f, uint64_t bits) {
  const uint64_t field = (bits >> (f.precision - 1)) & ((uint64_t{1} << f.exponentBits) - 1);
  const uint64_t frac = bits & ((uint64_t{1} << (f.precision - 1)) - 1);
  Big b = field == 0 ? Big::fromU64(frac, 0)
                     : Big::fromU64(frac | (uint64_t{1} << (f.precision - 1)),
                                    static_cast<int>(field) - 1);
  if ((bits & f.sign()) != 0) b = -b;
  return b;
}

// Maps bits to an ordered integer key (-0 and +0 both 0) and back.
inline int64_t keyOf(const Fmt& f, uint64_t bits) {
  const auto m = static_cast<int64_t>(bits & f.magnitudeMask());
  return (bits & f.sign()) != 0 ? -m : m;
}
inline uint64_t bitsOfKey(const Fmt& f, int64_t key) {
  return key >= 0 ? static_cast<uint64_t>(key) : f.sign() | static_cast<uint64_t>(-key);
}

inline uint64_t toFormat(const Fmt& f, long double v) {
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
inline uint64_t reference(DType dtype, const std::vector<uint64_t>& inputs, bool average) {
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

inline uint64_t bitsAt(const void* data, DType d, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const unsigned char*>(data) + i * dtypeSize(d), dtypeSize(d));
  return v;
}

inline std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Counts mismatches of out against want, printing the first few with the inputs.
inline int mismatches(const Inputs& in, const std::vector<uint64_t>& want, const void* out,
                      size_t first, size_t n, const std::string& what) {
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

inline constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                    DType::kBFloat16};

}  // namespace loom::comm::repro_testing
