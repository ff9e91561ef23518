// Unit tests for the comm vocabulary (dtypes, reduce ops, devices, views) and the reduce
// kernels: every dtype x op against a scalar reference on lengths that exercise the vector
// body and the tails, in place and out of place; fp16/bf16 rounding; NaN in min/max.
#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fill.h"
#include "loom/comm/reduce.h"
#include "loom/comm/types.h"
#include "loom/common/error.h"

namespace loom::comm::testing {
namespace {

TEST(Types, SizesAndNames) {
  EXPECT_EQ(dtypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(dtypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(dtypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(dtypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(dtypeSize(DType::kInt8), 1u);
  EXPECT_EQ(dtypeSize(DType::kUInt8), 1u);
  EXPECT_EQ(dtypeSize(DType::kInt32), 4u);
  EXPECT_EQ(dtypeSize(DType::kInt64), 8u);
  for (DType d : allDTypes()) EXPECT_EQ(parseDType(dtypeName(d)), d) << dtypeName(d);
  EXPECT_EQ(parseDType("fp16"), DType::kFloat16);
  EXPECT_EQ(parseDType("BF16"), DType::kBFloat16);
  EXPECT_EQ(parseDType("float32"), DType::kFloat32);
  EXPECT_EQ(parseDType("long"), DType::kInt64);
  EXPECT_THROW(parseDType("complex64"), InvalidArgumentError);
  try {
    parseDType("quad");
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(isFloatingPoint(DType::kBFloat16));
  EXPECT_TRUE(isInteger(DType::kUInt8));
  EXPECT_FALSE(isInteger(DType::kFloat16));
}

TEST(Types, ReduceOps) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kAvg, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    EXPECT_EQ(parseReduceOp(reduceOpName(op)), op);
  }
  EXPECT_THROW(parseReduceOp("median"), InvalidArgumentError);
  EXPECT_TRUE(isBitwise(ReduceOp::kBxor));
  EXPECT_FALSE(isBitwise(ReduceOp::kMax));
  EXPECT_NO_THROW(checkReduceOp(ReduceOp::kBand, DType::kInt32));
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
      EXPECT_THROW(checkReduceOp(op, d), InvalidArgumentError);
      EXPECT_THROW(reduceFunction(d, op), InvalidArgumentError);
    }
  }
  try {
    checkReduceOp(ReduceOp::kBxor, DType::kFloat32);
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("bxor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float"), std::string::npos) << e.what();
  }
}

TEST(Types, DevicesAndViews) {
  EXPECT_EQ(deviceName(Device::cpu()), "cpu");
  EXPECT_EQ(deviceName(Device::cuda(3)), "cuda:3");
  std::vector<float> f(10);
  BufferView v = view(f.data(), f.size());
  EXPECT_EQ(v.dtype, DType::kFloat32);
  EXPECT_EQ(v.bytes(), 40u);
  std::vector<int64_t> l(3);
  EXPECT_EQ(view(l.data(), 3).dtype, DType::kInt64);
  const double d[2] = {1, 2};
  EXPECT_EQ(view(d, 2).dtype, DType::kFloat64);
}

TEST(Half, ConversionsRoundToNearestEven) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // halfway to the next, rounds to even = inf
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(std::nanf("")))));
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: rounds up to even.
  EXPECT_EQ(floatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(floatToHalf(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(floatToHalf(0x1p-25f), 0x0000);  // halfway to 0: ties to even
  EXPECT_EQ(floatToHalf(0x1.8p-25f), 0x0001);
  // Every half value round-trips through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(floatToHalf(f), h) << h;
  }
}

TEST(Half, BFloat16) {
  EXPECT_EQ(floatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBFloat16(1.0f + 0x1p-8f), 0x3f80);      // tie to even
  EXPECT_EQ(floatToBFloat16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie to even (up)
  EXPECT_EQ(floatToBFloat16(1.0f + 0x1.8p-8f), 0x3f81);    // above halfway
  EXPECT_TRUE(std::isnan(bfloat16ToFloat(floatToBFloat16(std::nanf("")))));
  EXPECT_EQ(floatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bfloat16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(floatToBFloat16(f), b) << b;
  }
}

// Scalar reference of one element, through double (floats) or int64 (integers).
double referenceOp(ReduceOp op, DType dtype, double a, double b) {
  const bool isInt = isInteger(dtype);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return dtype == DType::kBool ? double(a || b) : a + b;
    case ReduceOp::kProd:
      return dtype == DType::kBool ? double(a && b) : a * b;
    case ReduceOp::kMin:
      if (std::isnan(a) || std::isnan(b)) return std::nan("");
      return std::min(a, b);
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return std::nan("");
      return std::max(a, b);
    case ReduceOp::kBand:
      return double(int64_t(a) & int64_t(b));
    case ReduceOp::kBor:
      return double(int64_t(a) | int64_t(b));
    case ReduceOp::kBxor:
      return double(int64_t(a) ^ int64_t(b));
  }
  (void)isInt;
  return 0;
}

// Stores a double into the dtype (integers wrap, floats round to nearest even once).
double roundTo(DType dtype, double v) {
  uint8_t tmp[8];
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<float>(v);
    case DType::kFloat64:
      return v;
    case DType::kFloat16:
      return halfToFloat(floatToHalf(static_cast<float>(v)));
    case DType::kBFloat16:
      return bfloat16ToFloat(floatToBFloat16(static_cast<float>(v)));
    default:
      setElem(tmp, 0, dtype, static_cast<int64_t>(v));
      return getElem(tmp, 0, dtype);
  }
}

void setValue(void* buf, size_t i, DType dtype, double v) {
  auto* p = static_cast<uint8_t*>(buf);
  switch (dtype) {
    case DType::kFloat32:
      reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::kFloat64:
      reinterpret_cast<double*>(p)[i] = v;
      break;
    case DType::kFloat16:
      reinterpret_cast<uint16_t*>(p)[i] = floatToHalf(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      reinterpret_cast<uint16_t*>(p)[i] = floatToBFloat16(static_cast<float>(v));
      break;
    default:
      setElem(buf, i, dtype, static_cast<int64_t>(v));
  }
}

TEST(Kernels, EveryDTypeAndOpMatchesScalarReference) {
  std::mt19937 rng(7);
  for (DType dtype : allDTypes()) {
    for (ReduceOp op : validOps(dtype)) {
      const ReduceFn fn = reduceFunction(dtype, op);
      for (size_t n :
           {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{31}, size_t{517}, size_t{4099}}) {
        const size_t es = dtypeSize(dtype);
        std::vector<uint8_t> a(n * es + 1), b(n * es + 1), out(n * es + 1);
        std::uniform_int_distribution<int> ints(dtype == DType::kBool ? 0 : -100,
                                                dtype == DType::kBool ? 1 : 100);
        std::uniform_real_distribution<double> reals(-100, 100);
        for (size_t i = 0; i < n; ++i) {
          const bool fp = isFloatingPoint(dtype);
          setValue(a.data(), i, dtype, fp ? reals(rng) : ints(rng));
          setValue(b.data(), i, dtype, fp ? reals(rng) : ints(rng));
        }
        fn(out.data(), a.data(), b.data(), n);
        for (size_t i = 0; i < n; ++i) {
          const double want = roundTo(dtype, referenceOp(op, dtype, getElem(a.data(), i, dtype),
                                                         getElem(b.data(), i, dtype)));
          const double got = getElem(out.data(), i, dtype);
          ASSERT_EQ(got, want) << dtypeName(dtype) << " " << reduceOpName(op) << " n=" << n
                               << " i=" << i;
        }
        // In place: dst == a.
        std::vector<uint8_t> inplace = a;
        fn(inplace.data(), inplace.data(), b.data(), n);
        ASSERT_EQ(0, std::memcmp(inplace.data(), out.data(), n * es))
            << dtypeName(dtype) << " " << reduceOpName(op) << " in place, n=" << n;
      }
    }
  }
}

TEST(Kernels, IntegerSumWraps) {
  int8_t a[3] = {127, -128, 100}, b[3] = {1, -1, 100}, out[3];
  reduceFunction(DType::kInt8, ReduceOp::kSum)(out, a, b, 3);
  EXPECT_EQ(out[0], -128);
  EXPECT_EQ(out[1], 127);
  EXPECT_EQ(out[2], static_cast<int8_t>(200));
  int64_t x = std::numeric_limits<int64_t>::max(), y = 1, z;
  reduceFunction(DType::kInt64, ReduceOp::kSum)(&z, &x, &y, 1);
  EXPECT_EQ(z, std::numeric_limits<int64_t>::min());
}

TEST(Kernels, MinMaxPropagateNaN) {
  const float nan = std::nanf("");
  std::vector<float> a(19, 1.0f), b(19, 2.0f), out(19);
  a[3] = nan;
  b[11] = nan;
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    reduceFunction(DType::kFloat32, op)(out.data(), a.data(), b.data(), a.size());
    EXPECT_TRUE(std::isnan(out[3])) << reduceOpName(op);
    EXPECT_TRUE(std::isnan(out[11])) << reduceOpName(op);
    EXPECT_EQ(out[0], op == ReduceOp::kMin ? 1.0f : 2.0f);
  }
}

// -0 orders below +0 (IEEE 754-2019 minimum / maximum): the result does not depend on which
// operand comes first, in the vector body and the tail, for every floating dtype.
TEST(Kernels, MinMaxOrderNegativeZeroBelowPositiveZeroInEitherOrder) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const size_t es = dtypeSize(dtype);
    const auto zero = [&](bool negative, void* at) {
      switch (dtype) {
        case DType::kFloat32:
          *static_cast<float*>(at) = negative ? -0.0f : 0.0f;
          break;
        case DType::kFloat64:
          *static_cast<double*>(at) = negative ? -0.0 : 0.0;
          break;
        default:
          *static_cast<uint16_t*>(at) = negative ? 0x8000 : 0x0000;
          break;
      }
    };
    const auto negative = [&](const void* at) {
      switch (dtype) {
        case DType::kFloat32:
          return std::signbit(*static_cast<const float*>(at));
        case DType::kFloat64:
          return std::signbit(*static_cast<const double*>(at));
        default:
          return (*static_cast<const uint16_t*>(at) & 0x8000) != 0;
      }
    };
    const size_t n = 37;  // vector bodies and a tail
    std::vector<unsigned char> a(n * es), b(n * es), out(n * es);
    for (size_t i = 0; i < n; ++i) {
      zero(i % 2 == 0, a.data() + i * es);
      zero(i % 2 != 0, b.data() + i * es);
    }
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      reduceFunction(dtype, op)(out.data(), a.data(), b.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(negative(out.data() + i * es), op == ReduceOp::kMin)
            << dtypeName(dtype) << " " << reduceOpName(op) << " element " << i;
      }
    }
  }
}

// float and double min / max (their own vector kernels) against the scalar rule, bit for bit,
// over random values mixed with NaN, both infinities and both zeros, in the vector body and
// the tail.
template <typename T>
void minMaxMatchesScalarRule(DType dtype) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<T> value(-4, 4);
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(),
                        T(0),
                        -T(0),
                        T(1),
                        T(-1)};
  const size_t n = 1003;
  std::vector<T> a(n), b(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = i % 3 == 0 ? specials[rng() % 7] : value(rng);
    b[i] = i % 5 == 0 ? specials[rng() % 7] : (i % 7 == 0 ? a[i] : value(rng));
  }
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    reduceFunction(dtype, op)(out.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const T x = a[i], y = b[i];
      const T want = op == ReduceOp::kMin
                         ? ((x < y || x != x || (x == y && std::signbit(x))) ? x : y)
                         : ((x > y || x != x || (x == y && !std::signbit(x))) ? x : y);
      ASSERT_EQ(std::memcmp(&out[i], &want, sizeof(T)), 0)
          << dtypeName(dtype) << " " << reduceOpName(op) << " i=" << i << " a=" << x << " b=" << y
          << " got " << out[i];
    }
  }
}

TEST(Kernels, FloatAndDoubleMinMaxMatchTheScalarRuleBitForBit) {
  minMaxMatchesScalarRule<float>(DType::kFloat32);
  minMaxMatchesScalarRule<double>(DType::kFloat64);
}

TEST(Kernels, HalfSumRoundsOnce) {
  // 2048 + 1 is not representable in fp16 (spacing 2 there): a tie, rounds to even 2048;
  // 2048 + 3 = 2051 rounds to 2052. Widening to float and rounding once gives exactly that.
  uint16_t a[2] = {floatToHalf(2048), floatToHalf(2048)};
  uint16_t b[2] = {floatToHalf(1), floatToHalf(3)};
  uint16_t out[2];
  reduceFunction(DType::kFloat16, ReduceOp::kSum)(out, a, b, 2);
  EXPECT_EQ(halfToFloat(out[0]), 2048.0f);
  EXPECT_EQ(halfToFloat(out[1]), 2052.0f);
}

// Every 16-bit pattern shows up (NaNs, infinities, subnormals, ties), in lengths that cover the
// 8-wide vector body and the tail: each element must be the scalar rule, widen both operands
// to float, apply the op in float (NaN propagates through min / max), round once.
TEST(Kernels, HalfTypesOnEveryBitPatternMatchWidenApplyRoundOnce) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const bool bf16 = dtype == DType::kBFloat16;
    auto widen = [&](uint16_t h) { return bf16 ? bfloat16ToFloat(h) : halfToFloat(h); };
    auto narrow = [&](float f) { return bf16 ? floatToBFloat16(f) : floatToHalf(f); };
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
      for (size_t n : {size_t{8}, size_t{13}, size_t{65536 + 7}}) {
        std::vector<uint16_t> a(n), b(n), out(n);
        for (size_t i = 0; i < n; ++i) {
          // The first 65536 elements of a walk every pattern against random partners.
          a[i] = static_cast<uint16_t>(n > 65536 && i < 65536 ? i : bits(rng));
          b[i] = static_cast<uint16_t>(bits(rng));
        }
        // Pairs random patterns rarely meet: +0 and -0 (min takes -0, max +0, in either order),
        // infinities
        // of both signs (their sum is NaN), the largest finite values (the sum overflows).
        const uint16_t inf = bf16 ? 0x7f80 : 0x7c00, big = bf16 ? 0x7f7f : 0x7bff;
        const uint16_t special[][2] = {
            {0x0000, 0x8000}, {0x8000, 0x0000}, {inf, uint16_t(inf | 0x8000)}, {big, big}};
        for (size_t k = 0; k < 4; ++k) {
          a[n - 1 - k] = special[k][0];
          b[n - 1 - k] = special[k][1];
          a[k] = special[k][1];
          b[k] = special[k][0];
        }
        reduceFunction(dtype, op)(out.data(), a.data(), b.data(), n);
        for (size_t i = 0; i < n; ++i) {
          const float x = widen(a[i]), y = widen(b[i]);
          float r = 0;
          switch (op) {
            case ReduceOp::kSum:
              r = x + y;
              break;
            case ReduceOp::kProd:
              r = x * y;
              break;
            case ReduceOp::kMin:
              r = (x < y || x != x || (x == y && std::signbit(x))) ? x : y;
              break;
            default:
              r = (x > y || x != x || (x == y && !std::signbit(x))) ? x : y;
              break;
          }
          if (std::isnan(r)) {
            ASSERT_TRUE(std::isnan(widen(out[i])))
                << dtypeName(dtype) << " " << reduceOpName(op) << " i=" << i << " a=" << a[i]
                << " b=" << b[i] << ": NaN expected, got " << out[i];
          } else {
            ASSERT_EQ(out[i], narrow(r)) << dtypeName(dtype) << " " << reduceOpName(op)
                                         << " i=" << i << " a=" << a[i] << " b=" << b[i];
          }
        }
      }
    }
  }
}

TEST(Kernels, DivideByForAvg) {
  float f[3] = {3, 4, 5};
  divideBy(f, 3, DType::kFloat32, 2);
  EXPECT_EQ(f[0], 1.5f);
  int32_t i[3] = {7, -7, 8};
  divideBy(i, 3, DType::kInt32, 2);
  EXPECT_EQ(i[0], 3);
  EXPECT_EQ(i[1], -3);  // truncates toward zero
  EXPECT_EQ(i[2], 4);
  uint16_t h[1] = {floatToHalf(3)};
  divideBy(h, 1, DType::kFloat16, 2);
  EXPECT_EQ(halfToFloat(h[0]), 1.5f);
  EXPECT_THROW(divideBy(f, 3, DType::kFloat32, 0), InvalidArgumentError);
  // The divisor is the world size, which need not fit the element type: int8 at 128 ranks
  // divided by -128, uint8 at 256 by zero (SIGFPE).
  int8_t minusOne[2] = {-128, 100};
  divideBy(minusOne, 2, DType::kInt8, 128);
  EXPECT_EQ(minusOne[0], -1);
  EXPECT_EQ(minusOne[1], 0);
  uint8_t u[2] = {200, 255};
  divideBy(u, 2, DType::kUInt8, 300);
  EXPECT_EQ(u[0], 0);
  EXPECT_EQ(u[1], 0);
  uint8_t w[1] = {255};
  divideBy(w, 1, DType::kUInt8, 256);
  EXPECT_EQ(w[0], 0);
}

// A NaN keeps its sign in float16 (the scalar conversion set the sign bit of every NaN, so
// the generic kernels and a vector loop's tail disagreed with F16C's body).
TEST(Half, NaNKeepsItsSign) {
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::quiet_NaN()), 0xfe00);
  EXPECT_EQ(floatToHalf(std::bit_cast<float>(0x7fffffffu)), 0x7fff);
}

TEST(Kernels, IsaReported) {
  const std::string isa = reduceKernelIsa();
  EXPECT_TRUE(isa == "avx2" || isa == "generic") << isa;
}

}  // namespace
}  // namespace loom::comm::testing
