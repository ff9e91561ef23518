// Conversions of the reproducible mode (reproducible_accumulator.h).
//
// Rounding works on a magnitude m (an unsigned integer) times 2^lsb, plus a `sticky` flag
// saying that something nonzero but below 2^lsb was dropped (a division's remainder, low
// bits). roundMagnitude finds the result's exponent, keeps precision bits, and rounds to
// nearest even with the bits below (round bit, rest, sticky). Sums too long for 128 bits (the
// full accumulators) go through BigInt, a fixed-width two's complement integer of 32-bit words
// that the digits are added into exactly.
#include "reproducible_accumulator.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <type_traits>

#include "loom/comm/reduce.h"
#include "loom/common/error.h"

#include "reproducible_avx2.h"

namespace loom::comm::repro {

#ifdef LOOM_REPRO_AVX2
using namespace avx2;  // the vector loops (reproducible_avx2.h)
#endif

namespace {

using u128 = unsigned __int128;
using i128 = __int128;

constexpr uint64_t kDigitMask = (uint64_t{1} << kDigitBits) - 1;

constexpr Format kFloat32{4, 24, 8, 127, -149, 0, 1, 6};
constexpr Format kFloat64{8, 53, 11, 1023, -1074, 4, 2, 41};
constexpr Format kFloat16{2, 11, 5, 15, -24, 0, 1, 1};
constexpr Format kBFloat16{2, 8, 8, 127, -133, 0, 1, 6};

// Every finite value of a format fits its full accumulator.
constexpr bool fullCovers(const Format& f) {
  return f.minBit + kDigitBits * f.fullDigits >= f.bias + 1;
}
static_assert(fullCovers(kFloat32) && fullCovers(kFloat64) && fullCovers(kFloat16) &&
              fullCovers(kBFloat16));

uint64_t signBit(const Format& f) {
  return uint64_t{1} << (f.exponentBits + f.precision - 1);
}
uint64_t exponentMask(const Format& f) {
  return (uint64_t{1} << f.exponentBits) - 1;
}
uint64_t infinityBits(const Format& f) {
  return exponentMask(f) << (f.precision - 1);
}
uint64_t nanBits(const Format& f) {
  return infinityBits(f) | (uint64_t{1} << (f.precision - 2));
}

int bitLength(u128 m) {
  const auto hi = static_cast<uint64_t>(m >> 64);
  if (hi != 0) return 128 - std::countl_zero(hi);
  return 64 - std::countl_zero(static_cast<uint64_t>(m));
}

// The bits (sign clear) of m * 2^lsb (+ something below 2^lsb when sticky) rounded to nearest
// even. m != 0. When sticky, the caller guarantees that the rounding position lies at least two
// bits above lsb (sticky must only add to the bits below the round bit).
[[gnu::always_inline]] inline uint64_t roundMagnitude(const Format& f, u128 m, int lsb,
                                                      bool sticky) {
  const int p = f.precision;
  const int emin = 1 - f.bias;
  const int emax = f.bias;
  const int etop = lsb + bitLength(m) - 1;
  int ulp = std::max(etop, emin) - (p - 1);
  const int shift = ulp - lsb;
  u128 q;
  if (shift <= 0) {
    q = m << -shift;
  } else if (shift >= 128) {
    q = 0;  // m < 2^127 <= half an ulp
  } else {
    q = m >> shift;
    const u128 rest = m & ((u128{1} << shift) - 1);
    const u128 half = u128{1} << (shift - 1);
    if (rest > half || (rest == half && (sticky || (q & 1) != 0))) ++q;
  }
  if (q >> p != 0) {  // rounded up to 2^p
    q >>= 1;
    ++ulp;
  }
  if (q == 0) return 0;
  const auto hidden = uint64_t{1} << (p - 1);
  if (q < hidden) return static_cast<uint64_t>(q);  // subnormal (ulp == minBit)
  const int exponent = ulp + p - 1;
  if (exponent > emax) return infinityBits(f);
  return (static_cast<uint64_t>(exponent + f.bias) << (p - 1)) |
         (static_cast<uint64_t>(q) - hidden);
}

// Fixed-width two's complement integer, little-endian 32-bit words; wide enough for float64's
// full accumulator summed over the maximum world, shifted left by 64 bits for a division.
class BigInt {
 public:
  static constexpr int kWords = (kDigitBits * 41 + 64 + 64 + 64) / 32 + 1;
  // Wide enough for `digits` digits summed over the maximum world, times 2^64.
  explicit BigInt(int digits) : n_((kDigitBits * digits + 64 + 64 + 64) / 32 + 1) {}

  // Adds v * 2^offset.
  void add(int64_t v, int offset) {
    int k = offset / 32;
    i128 carry = i128{v} << (offset % 32);
    for (; k < n_ && carry != 0; ++k) {
      const i128 t = i128{words_[k]} + carry;
      words_[k] = static_cast<uint32_t>(t);
      carry = t >> 32;  // arithmetic: -1 propagates the sign to the top
    }
  }
  bool negative() const { return (words_[n_ - 1] >> 31) != 0; }
  void negate() {
    uint64_t carry = 1;
    for (int k = 0; k < n_; ++k) {
      uint32_t& w = words_[k];
      const uint64_t t = uint64_t{static_cast<uint32_t>(~w)} + carry;
      w = static_cast<uint32_t>(t);
      carry = t >> 32;
    }
  }
  bool zero() const {
    return std::all_of(words_.begin(), words_.begin() + n_, [](uint32_t w) { return w == 0; });
  }
  // Multiplies by 2^64 (two words; the top two are free: see kWords), then divides by d;
  // returns whether a remainder was left.
  bool shiftAndDivide(uint32_t d) {
    std::memmove(&words_[2], &words_[0], (n_ - 2) * sizeof(uint32_t));
    words_[0] = words_[1] = 0;
    uint64_t rem = 0;
    for (int k = n_ - 1; k >= 0; --k) {
      const uint64_t cur = (rem << 32) | words_[k];
      words_[k] = static_cast<uint32_t>(cur / d);
      rem = cur % d;
    }
    return rem != 0;
  }
  // Index of the highest set bit; -1 for zero.
  int top() const {
    for (int k = n_ - 1; k >= 0; --k) {
      if (words_[k] != 0) return k * 32 + 31 - std::countl_zero(words_[k]);
    }
    return -1;
  }
  // 32 bits starting at bit `pos` (bits past the top read as 0).
  uint32_t bitsAt(int pos) const {
    const int k = pos / 32, s = pos % 32;
    if (k >= n_) return 0;
    uint64_t w = words_[k];
    if (s != 0 && k + 1 < n_) w |= uint64_t{words_[k + 1]} << 32;
    return static_cast<uint32_t>(w >> s);
  }
  // Whether any bit below `pos` is set.
  bool anyBelow(int pos) const {
    const int k = pos / 32, s = pos % 32;
    for (int i = 0; i < k; ++i) {
      if (words_[i] != 0) return true;
    }
    return s != 0 && (words_[k] & ((uint32_t{1} << s) - 1)) != 0;
  }

 private:
  int n_;
  std::array<uint32_t, kWords> words_{};
};

// Rounds the nonnegative `big` * 2^lsb / divisor; big != 0.
uint64_t roundBig(const Format& f, BigInt& big, int lsb, int divisor) {
  bool sticky = false;
  if (divisor > 1) {
    sticky = big.shiftAndDivide(static_cast<uint32_t>(divisor));
    lsb -= 64;
  }
  const int top = big.top();
  // Keep at most 126 bits: enough above any rounding position, the rest goes to sticky.
  const int start = std::max(0, top - 125);
  u128 m = 0;
  for (int i = 3; i >= 0; --i) m = (m << 32) | big.bitsAt(start + 32 * i);
  if (top - start < 127) m &= (u128{1} << (top - start + 1)) - 1;
  sticky = sticky || big.anyBelow(start);
  return roundMagnitude(f, m, lsb + start, sticky);
}

// Signed magnitude m * 2^lsb / divisor rounded; zero gives a zero of the given sign.
[[gnu::always_inline]] inline uint64_t roundSigned(const Format& f, bool negative, u128 m, int lsb,
                                                   int divisor) {
  const uint64_t sign = negative ? signBit(f) : 0;
  if (m == 0) return sign;
  if (divisor == 1) return sign | roundMagnitude(f, m, lsb, false);
  if (std::has_single_bit(static_cast<unsigned>(divisor))) {
    return sign |
           roundMagnitude(f, m, lsb - std::countr_zero(static_cast<unsigned>(divisor)), false);
  }
  if ((m >> 64) == 0) {
    const u128 scaled = m << 64;
    const auto d = static_cast<uint64_t>(divisor);
    return sign | roundMagnitude(f, scaled / d, lsb - 64, scaled % d != 0);
  }
  BigInt big(3);
  big.add(static_cast<int64_t>(static_cast<uint64_t>(m) & ((uint64_t{1} << 62) - 1)), 0);
  big.add(static_cast<int64_t>(static_cast<uint64_t>(m >> 62) & ((uint64_t{1} << 62) - 1)), 62);
  big.add(static_cast<int64_t>(m >> 124), 124);
  return sign | roundBig(f, big, lsb, divisor);
}

struct Parts {
  bool negative;
  uint64_t significand;  // integer
  int exponent;          // of the significand's least significant bit
};
[[gnu::always_inline]] inline Parts decompose(const Format& f, uint64_t bits) {
  const int p = f.precision;
  const uint64_t field = (bits >> (p - 1)) & exponentMask(f);
  const uint64_t fraction = bits & ((uint64_t{1} << (p - 1)) - 1);
  const bool negative = (bits & signBit(f)) != 0;
  if (field == 0) return {negative, fraction, f.minBit};
  return {negative, fraction | (uint64_t{1} << (p - 1)),
          static_cast<int>(field) - f.bias - (p - 1)};
}

// Adds significand * 2^offset (offset >= 0) into the digits, unsigned.
void place(uint64_t significand, int offset, int64_t* digits, int count) {
  int j = offset / kDigitBits;
  u128 v = u128{significand} << (offset % kDigitBits);
  for (; v != 0; ++j) {
    LOOM_CHECK(j < count, "reproducible: a value does not fit its accumulator (digit ", j, " of ",
               count, ")");
    digits[j] = static_cast<int64_t>(static_cast<uint64_t>(v) & kDigitMask);
    v >>= kDigitBits;
  }
}

[[gnu::always_inline]] inline uint8_t exponentByteImpl(const Format& f, uint64_t bits) {
  const uint64_t field = (bits >> (f.precision - 1)) & exponentMask(f);
  if (field == exponentMask(f)) return 255;
  if (bits == signBit(f)) return 0;  // -0
  return static_cast<uint8_t>(1 + ((std::max<uint64_t>(field, 1) - 1) >> f.shift));
}

[[gnu::always_inline]] inline void encodeWindowImpl(const Format& f, uint64_t bits, int lsb,
                                                    int64_t* digits) {
  std::fill(digits, digits + f.windowDigits, 0);
  Parts parts = decompose(f, bits);
  if (parts.significand == 0) return;
  int offset = parts.exponent - lsb;
  int64_t inexact = 0;
  if (offset < 0) {
    const int drop = -offset;
    inexact = drop >= 64 || (parts.significand & ((uint64_t{1} << drop) - 1)) != 0;
    parts.significand = drop >= 64 ? 0 : parts.significand >> drop;  // toward zero
    offset = 0;
  }
  const u128 v = u128{parts.significand} << offset;
  constexpr int kLow = kDigitBits - kCountBits;
  const auto low = static_cast<int64_t>(static_cast<uint64_t>(v) & ((uint64_t{1} << kLow) - 1));
  const auto high = static_cast<int64_t>(v >> kLow);
  LOOM_CHECK(f.windowDigits == 2 || high == 0,
             "reproducible: a value does not fit its window (internal error)");
  LOOM_CHECK(high >> kDigitBits == 0, "reproducible: a value does not fit its window");
  const int64_t sign = parts.negative ? -1 : 1;
  digits[0] = sign * (low << kCountBits) + inexact;
  if (f.windowDigits == 2) digits[1] = sign * high;
}

[[gnu::always_inline]] inline bool decodeWindowImpl(const Format& f, const int64_t* digits,
                                                    uint8_t byte, int ranks, int divisor,
                                                    uint64_t* bits) {
  if (byte == 0) {  // every input was -0
    *bits = signBit(f);
    return true;
  }
  if (byte == 255) return false;
  const int lsb = windowLsb(f, byte);
  const int64_t inexact = digits[0] & ((int64_t{1} << kCountBits) - 1);
  i128 value = digits[0] >> kCountBits;  // arithmetic: the count is below, nonnegative
  if (f.windowDigits == 2) value += i128{digits[1]} << (kDigitBits - kCountBits);
  const auto rounded = [&](i128 v) __attribute__((always_inline)) {
    return roundSigned(f, v < 0, static_cast<u128>(v < 0 ? -v : v), lsb, divisor);
  };
  (void)ranks;
  if (inexact == 0) {  // no rank dropped a bit: the sum is exact
    *bits = value == 0 ? 0 : rounded(value);
    return true;
  }
  // Each of the `inexact` ranks dropped less than one unit (2^lsb) toward zero, so the exact
  // sum lies strictly between value - inexact and value + inexact units.
  const uint64_t low = rounded(value - inexact);
  const uint64_t high = rounded(value + inexact);
  if (low != high) return false;
  *bits = low;
  return true;
}

// Calls fn.template operator()<Format, Bits>() with the format as a compile-time constant, so
// that the loops below are compiled once per format with its fields folded in.
template <typename Fn>
void withFormat(const Format& f, Fn&& fn) {
  if (&f == &kFloat32) return fn.template operator()<kFloat32, uint32_t>();
  if (&f == &kFloat64) return fn.template operator()<kFloat64, uint64_t>();
  if (&f == &kFloat16) return fn.template operator()<kFloat16, uint16_t>();
  return fn.template operator()<kBFloat16, uint16_t>();
}

// 2^e as a double, for e a normal exponent.
[[gnu::always_inline]] inline double powerOfTwo(int e) {
  return std::bit_cast<double>(static_cast<uint64_t>(1023 + e) << 52);
}

template <typename Bits>
[[gnu::always_inline]] inline uint64_t load(const void* data, size_t i) {
  Bits v;
  std::memcpy(&v, static_cast<const Bits*>(data) + i, sizeof(Bits));
  return v;
}

}  // namespace

const Format& formatOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return kFloat32;
    case DType::kFloat64:
      return kFloat64;
    case DType::kFloat16:
      return kFloat16;
    case DType::kBFloat16:
      return kBFloat16;
    default:
      LOOM_THROW(InvalidArgumentError, "reproducible reduction: dtype ", dtypeName(dtype),
                 " is not floating point (float, double, half, bfloat16)");
  }
}

uint64_t loadBits(const Format& f, const void* data, size_t i) {
  const auto* p = static_cast<const unsigned char*>(data) + i * f.bytes;
  switch (f.bytes) {
    case 2: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

void storeBits(const Format& f, void* data, size_t i, uint64_t bits) {
  auto* p = static_cast<unsigned char*>(data) + i * f.bytes;
  switch (f.bytes) {
    case 2: {
      const auto v = static_cast<uint16_t>(bits);
      std::memcpy(p, &v, 2);
      break;
    }
    case 4: {
      const auto v = static_cast<uint32_t>(bits);
      std::memcpy(p, &v, 4);
      break;
    }
    default:
      std::memcpy(p, &bits, 8);
  }
}

void encodeFull(const Format& f, uint64_t bits, int64_t* words) {
  std::fill(words, words + f.fullWords(), 0);
  int64_t& special = words[f.fullDigits];
  const uint64_t field = (bits >> (f.precision - 1)) & exponentMask(f);
  const Parts parts = decompose(f, bits);
  if (field == exponentMask(f)) {
    if ((bits & ((uint64_t{1} << (f.precision - 1)) - 1)) != 0) {
      special = 1;  // NaN
    } else {
      special = parts.negative ? int64_t{1} << 32 : int64_t{1} << 16;
    }
    return;
  }
  if (parts.significand == 0) {
    if (parts.negative) special = int64_t{1} << 48;
    return;
  }
  place(parts.significand, parts.exponent - f.minBit, words, f.fullDigits);
  if (parts.negative) {
    for (int j = 0; j < f.fullDigits; ++j) words[j] = -words[j];
  }
}

uint64_t decodeFull(const Format& f, const int64_t* words, int ranks, int divisor) {
  const auto special = static_cast<uint64_t>(words[f.fullDigits]);
  const uint64_t nans = special & 0xffff, plus = (special >> 16) & 0xffff,
                 minus = (special >> 32) & 0xffff, negativeZeros = (special >> 48) & 0xffff;
  if (nans != 0 || (plus != 0 && minus != 0)) return nanBits(f);
  if (plus != 0) return infinityBits(f);
  if (minus != 0) return signBit(f) | infinityBits(f);
  if (std::has_single_bit(static_cast<unsigned>(divisor))) {
    // Carry the digits into [0, 2^52) from the bottom up; a negative top carry means a negative
    // sum: carry the negated digits instead. Then the top two digits and 12 bits of the third
    // hold the result's bits (at least 65 of them, so sticky, the rest, lies well below the
    // rounding position).
    const int k = f.fullDigits;
    std::array<int64_t, 44> d{};  // two zero digits below digit 0
    int64_t carry = 0;
    const auto normalize = [&](int64_t sign) {
      carry = 0;
      for (int j = 0; j < k; ++j) {
        const int64_t v = sign * words[j] + carry;
        d[j + 2] = v & static_cast<int64_t>(kDigitMask);
        carry = v >> kDigitBits;
      }
    };
    normalize(1);
    const bool negative = carry < 0;
    if (negative) normalize(-1);
    d[k + 2] = carry;
    int top = k + 2;
    while (top >= 2 && d[top] == 0) --top;
    if (top < 2) return negativeZeros == static_cast<uint64_t>(ranks) ? signBit(f) : 0;
    const u128 m = (u128(static_cast<uint64_t>(d[top])) << 64) |
                   (u128(static_cast<uint64_t>(d[top - 1])) << 12) |
                   (static_cast<uint64_t>(d[top - 2]) >> 40);
    bool sticky = (d[top - 2] & ((int64_t{1} << 40) - 1)) != 0;
    for (int j = 0; j < top - 2 && !sticky; ++j) sticky = d[j] != 0;
    const int lsb =
        f.minBit + kDigitBits * (top - 4) + 40 - std::countr_zero(static_cast<unsigned>(divisor));
    return (negative ? signBit(f) : 0) | roundMagnitude(f, m, lsb, sticky);
  }
  BigInt big(f.fullDigits);
  for (int j = 0; j < f.fullDigits; ++j) {
    if (words[j] != 0) big.add(words[j], j * kDigitBits);
  }
  if (big.zero()) return negativeZeros == static_cast<uint64_t>(ranks) ? signBit(f) : 0;
  const bool negative = big.negative();
  if (negative) big.negate();
  return (negative ? signBit(f) : 0) | roundBig(f, big, f.minBit, divisor);
}

}  // namespace loom::comm::repro

namespace loom::comm::repro {

uint8_t exponentByte(const Format& f, uint64_t bits) {
  return exponentByteImpl(f, bits);
}

void encodeWindow(const Format& f, uint64_t bits, int lsb, int64_t* digits) {
  encodeWindowImpl(f, bits, lsb, digits);
}

bool decodeWindow(const Format& f, const int64_t* digits, uint8_t byte, int ranks, int divisor,
                  uint64_t* bits) {
  return decodeWindowImpl(f, digits, byte, ranks, divisor, bits);
}

void exponentBytes(const Format& f, const void* in, size_t n, uint8_t* bytes) {
  withFormat(f, [&]<const Format & F, typename Bits>() {
    size_t i = 0;
#ifdef LOOM_REPRO_AVX2
    if constexpr (&F == &kFloat32) {
      if (useAvx2()) i = exponentBytesF32Avx2(static_cast<const uint32_t*>(in), n, bytes);
    }
#endif
    for (; i < n; ++i) bytes[i] = exponentByteImpl(F, load<Bits>(in, i));
  });
}

void encodeWindows(const Format& f, const void* in, size_t n, const uint8_t* bytes, int64_t* digits,
                   bool add) {
  if (add) {
    // Fused with the sum: the vector loop adds in place; the scalar rest encodes a block into
    // scratch on the stack and adds it.
    size_t i = 0;
#ifdef LOOM_REPRO_AVX2
    if (&f == &kFloat32 && useAvx2()) {
      i = encodeWindowsF32Avx2<true>(static_cast<const uint32_t*>(in), n, bytes, digits);
    }
#endif
    constexpr size_t kBlock = 64;
    int64_t block[kBlock * 2];
    const auto* raw = static_cast<const unsigned char*>(in);
    const int words = f.windowDigits;
    while (i < n) {
      const size_t k = std::min(kBlock, n - i);
      encodeWindows(f, raw + i * f.bytes, k, bytes + i, block, false);
      addInts(digits + i * words, block, k * words);
      i += k;
    }
    return;
  }
  withFormat(f, [&]<const Format & F, typename Bits>() {
    constexpr int words = F.windowDigits;
    size_t i = 0;
#ifdef LOOM_REPRO_AVX2
    if constexpr (&F == &kFloat32) {
      if (useAvx2()) {
        i = encodeWindowsF32Avx2<false>(static_cast<const uint32_t*>(in), n, bytes, digits);
      }
    }
#endif
    for (; i < n; ++i) {
      const uint8_t byte = bytes[i];
      if (byte == 0 || byte == 255) {  // all -0, or a special value: refined
        for (int w = 0; w < words; ++w) digits[i * words + w] = 0;
        continue;
      }
      const uint64_t bits = load<Bits>(in, i);
      if constexpr (std::is_same_v<Bits, uint32_t>) {
        // float32, not subnormal (whose conversion DAZ would flush): scaling by a power of two
        // is exact in double, and the conversion to int64 truncates toward zero, as the generic
        // path does.
        if ((bits & 0x7f800000u) != 0) {
          const double scaled =
              static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(bits))) *
              powerOfTwo(-windowLsb(F, byte));
          const auto q = static_cast<int64_t>(scaled);
          digits[i] = q * (int64_t{1} << kCountBits) + (static_cast<double>(q) != scaled);
          continue;
        }
      }
      encodeWindowImpl(F, bits, windowLsb(F, byte), &digits[i * words]);
    }
  });
}

void decodeWindows(const Format& f, const int64_t* sums, const uint8_t* bytes, size_t n, int ranks,
                   int divisor, void* out, size_t base, std::vector<size_t>& undecided) {
  withFormat(f, [&]<const Format & F, typename Bits>() {
    constexpr int words = F.windowDigits;
    const bool fast = std::is_same_v<Bits, uint32_t> && std::has_single_bit(unsigned(divisor));
    const int divisorBits = std::countr_zero(unsigned(divisor));
    const auto one = [&](size_t k) __attribute__((always_inline)) {
      uint64_t bits;
      if (fast && bytes[k] != 0 && bytes[k] != 255) {
        // float32, sum or average over a power-of-two world: the window's integer (below 2^51)
        // times a power of two is exact in double, and its conversion to float rounds once,
        // to nearest even. Results that come out subnormal or zero (which FTZ would flush) take
        // the generic path.
        const int64_t sum = sums[k];
        const int64_t inexact = sum & ((int64_t{1} << kCountBits) - 1);
        const int64_t value = sum >> kCountBits;
        const double scale = powerOfTwo(windowLsb(F, bytes[k]) - divisorBits);
        const auto round = [&](int64_t v) -> uint64_t {
          const uint32_t r =
              std::bit_cast<uint32_t>(static_cast<float>(static_cast<double>(v) * scale));
          if ((r & 0x7f800000u) != 0 || v == 0) return r;
          uint64_t b = 0;
          int64_t digit = v * (int64_t{1} << kCountBits);
          decodeWindowImpl(F, &digit, bytes[k], ranks, divisor, &b);
          return b;
        };
        const uint64_t low = round(value - inexact);
        if (inexact == 0 || round(value + inexact) == low) {
          const auto v = static_cast<uint32_t>(low);
          std::memcpy(static_cast<uint32_t*>(out) + k, &v, sizeof v);
        } else {
          undecided.push_back(base + k);
        }
        return;
      }
      if (decodeWindowImpl(F, &sums[k * words], bytes[k], ranks, divisor, &bits)) {
        const auto v = static_cast<Bits>(bits);
        std::memcpy(static_cast<Bits*>(out) + k, &v, sizeof(Bits));
      } else {
        undecided.push_back(base + k);
      }
    };
    size_t k = 0;
#ifdef LOOM_REPRO_AVX2
    if constexpr (&F == &kFloat32) {
      if (fast && useAvx2()) {
        k = decodeWindowsF32Avx2(sums, bytes, n, divisorBits, static_cast<uint32_t*>(out), one);
      }
    }
#endif
    for (; k < n; ++k) one(k);
  });
}

void maxBytes(uint8_t* acc, const uint8_t* v, size_t n) {
  size_t i = 0;
#ifdef LOOM_REPRO_AVX2
  if (useAvx2()) i = maxBytesAvx2(acc, v, n);
#endif
  for (; i < n; ++i) acc[i] = std::max(acc[i], v[i]);
}

void addInts(int64_t* acc, const int64_t* v, size_t n) {
  size_t i = 0;
#ifdef LOOM_REPRO_AVX2
  if (useAvx2()) i = addInt64Avx2(acc, v, n);
#endif
  for (; i < n; ++i) acc[i] += v[i];
}

}  // namespace loom::comm::repro
