// The integer formats of the reproducible mode (loom/comm/reproducible.h) and their conversions:
// floats to exponent bytes, window digits and full accumulators; sums of those back to floats,
// rounded once. No communication here.
//
// A digit is a signed multiple of 2^(lsb + 52 j) with magnitude below 2^52, held in an int64,
// little-endian (digit 0 is the least significant), so n <= 1024 ranks' digits add in an int64
// without overflow. Digits are never carried before the reduction, only after, in decode.
#pragma once

#include <cfenv>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <vector>

#include "loom/comm/types.h"

namespace loom::comm::repro {

// The IEEE binary format of a floating dtype.
struct Format {
  int bytes;      // storage size
  int precision;  // significand bits, the hidden one included
  int exponentBits;
  int bias;
  int minBit;        // exponent of the least significant bit of the smallest subnormal
  int shift;         // exponent byte = 1 + (biased exponent - 1) >> shift
  int windowDigits;  // digits of the pass-2 window
  int fullDigits;    // digits of the full accumulator (minBit up to the largest finite)
  int fullWords() const { return fullDigits + 1; }  // + the special-value counters
};
const Format& formatOf(DType dtype);  // float32, float64, float16, bfloat16 only

constexpr int kDigitBits = 52;

// The byte pass 1 reduces with MAX: 0 for -0, 255 for inf and NaN, else 1 + ((max(e, 1) - 1)
// >> shift) for biased exponent e. Every value whose byte is at most b is below 2^topOf(b).
uint8_t exponentByte(const Format& f, uint64_t bits);
inline int topOf(const Format& f, uint8_t byte) {
  return (int{byte} << f.shift) - f.bias + 1;
}
// A window's digit 0 keeps its low kCountBits for a count of inexact ranks: each rank adds 1
// there when it dropped nonzero bits below the window, so the sum says how many did (at most
// n < 2^kCountBits) and the bound on what they dropped is that count, not n, window units.
// The window's value bits are the rest: 41 in digit 0, 52 in digit 1 (float64).
constexpr int kCountBits = 11;
// The window's least significant bit for max byte b (1..254).
inline int windowLsb(const Format& f, uint8_t byte) {
  return topOf(f, byte) - (kDigitBits * f.windowDigits - kCountBits);
}

// Loads element i of a buffer of the format as raw bits.
uint64_t loadBits(const Format& f, const void* data, size_t i);
void storeBits(const Format& f, void* data, size_t i, uint64_t bits);

// Window digits of value `bits` at lsb `lsb` (truncated toward zero): f.windowDigits words.
void encodeWindow(const Format& f, uint64_t bits, int lsb, int64_t* digits);
// Full accumulator of `bits`: f.fullWords() words.
void encodeFull(const Format& f, uint64_t bits, int64_t* words);

// The bits of the sum (divisor 1) or average (divisor n) of `ranks` ranks whose window digits
// add to `digits` at max byte `byte`, or false when the window cannot decide it. byte 0 (every
// input -0) gives -0; byte 255 is never decided here.
bool decodeWindow(const Format& f, const int64_t* digits, uint8_t byte, int ranks, int divisor,
                  uint64_t* bits);
// Bulk forms, the collectives' loops (the same results element by element):
// bytes[i] = exponentByte(in[i]);
void exponentBytes(const Format& f, const void* in, size_t n, uint8_t* bytes);
// digits (f.windowDigits per element) of in[i] at windowLsb(bytes[i]); zero where bytes[i] is 0
// or 255 (those are decided without the window, or refined);
// add: digits += those digits instead (encode and sum in one pass over the digits).
void encodeWindows(const Format& f, const void* in, size_t n, const uint8_t* bytes, int64_t* digits,
                   bool add = false);
// out[k] = decodeWindow of sums[k], bytes[k] where decided, else base + k appended to
// `undecided` and out[k] left alone.
void decodeWindows(const Format& f, const int64_t* sums, const uint8_t* bytes, size_t n, int ranks,
                   int divisor, void* out, size_t base, std::vector<size_t>& undecided);
// The local reductions of those integers (reproducibleReduceLocal, the gathered path):
// acc[i] = max(acc[i], v[i]) and acc[i] += v[i].
void maxBytes(uint8_t* acc, const uint8_t* v, size_t n);
void addInts(int64_t* acc, const int64_t* v, size_t n);
// Two ranks (reproducible_pair.cc).
// The default floating-point environment (round to nearest, no flush-to-zero, no
// denormals-are-zero) for the scope; the caller's is restored after.
class DefaultFloatEnvironment {
 public:
  DefaultFloatEnvironment();
  ~DefaultFloatEnvironment();
  DefaultFloatEnvironment(const DefaultFloatEnvironment&) = delete;
  DefaultFloatEnvironment& operator=(const DefaultFloatEnvironment&) = delete;

 private:
#if defined(__x86_64__)
  uint32_t saved_;  // MXCSR
#else
  std::fenv_t saved_;
#endif
};
// out[i] = the correctly rounded a[i] + b[i] (average: that sum / 2, rounded once), NaN
// canonical: one IEEE operation per element, in the default floating-point environment whatever
// the caller's. The same bits as the integer paths.
void addPairs(const Format& f, const void* a, const void* b, size_t n, bool average, void* out);
// Every NaN in data made the canonical one.
void canonicalNans(const Format& f, void* data, size_t n);
// data[i] = data[i] / 2 for sums of two values (exact, or the one rounding of an exact sum: see
// reproducible_pair.cc), NaN canonical; the indices of infinite sums are appended to `infinite`
// (left infinite: the sum may have overflowed).
void halveSums(const Format& f, void* data, size_t n, std::vector<size_t>& infinite);
// The smallest magnitude (raw bits, sign clear) that can make a sum of two finite values
// overflow: 2^(emax - p), half the largest finite value's ulp.
uint64_t overflowThreshold(const Format& f);
// Appends (i, bits) for every finite element of data from overflowThreshold(f) up.
void overflowCandidates(const Format& f, const void* data, size_t n,
                        std::vector<std::pair<size_t, uint64_t>>& out);
// float32, float16 and bfloat16 rows in one process (reproducible_double.cc): where an element's
// values span at most 53 - p - ceil(log2 n) binades (p: significant bits), their double sum is
// exact and its conversion is the one rounding; float64 within 53 - 2 ceil(log2 n) binades, in
// pairs of doubles (SUM and power-of-two AVG). doubleSumApplies: those formats, while the
// bound is not negative, divisor below 2^27 (AVG's quotient in double, then the format, is
// still the one rounding: the proof is in the .cc). reduceRowsDouble writes those
// elements of out and appends the others' indices to `rest`, ascending (infinities, NaN, wide
// spans; out left alone there).
bool doubleSumApplies(const Format& f, int n, int divisor);
void reduceRowsDouble(const Format& f, std::span<const void* const> rows, size_t count, int divisor,
                      void* out, std::vector<size_t>& rest);
// v rounded to float by round-to-odd: toward zero, with the last bit set when inexact.
float roundToOdd(double v);
// The bits of the sum (divisor 1) or average (divisor n) from summed full accumulators.
uint64_t decodeFull(const Format& f, const int64_t* words, int ranks, int divisor);

}  // namespace loom::comm::repro
