#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "loom/bench/data.h"

namespace loom::bench {
namespace {

TEST(Data, HalfConversionIsExactForSmallIntegersAndRounds) {
  for (int i = -2048; i <= 2048; ++i) {
    EXPECT_EQ(halfToFloat(floatToHalf(static_cast<float>(i))), static_cast<float>(i)) << i;
  }
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(1e6f), 0x7c00);                   // overflow to inf
  EXPECT_EQ(floatToHalf(2049.0f), floatToHalf(2048.0f));  // tie to even
  EXPECT_EQ(floatToHalf(2051.0f), floatToHalf(2052.0f));  // tie to even (up)
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_TRUE(std::isnan(halfToFloat(0xffff)));
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(NAN))));
}

TEST(Data, BFloat16ConversionIsExactForSmallIntegersAndRounds) {
  for (int i = -256; i <= 256; ++i) {
    EXPECT_EQ(bfloat16ToFloat(floatToBFloat16(static_cast<float>(i))), static_cast<float>(i)) << i;
  }
  EXPECT_EQ(floatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(bfloat16ToFloat(floatToBFloat16(257.0f)), 256.0f);  // tie to even
  EXPECT_TRUE(std::isnan(bfloat16ToFloat(0xffff)));
}

TEST(Data, ElementsRoundTrip) {
  std::vector<std::byte> buf(64);
  for (ElemType t : allElemTypes()) {
    storeElem(t, buf.data(), 3, 7.0);
    EXPECT_EQ(loadElem(t, buf.data(), 3), 7.0) << elemTypeName(t);
  }
  std::memset(buf.data(), 0xff, buf.size());  // the output sentinel is never a fill value
  EXPECT_TRUE(std::isnan(loadElem(ElemType::kFloat, buf.data(), 0)));
  EXPECT_EQ(loadElem(ElemType::kInt8, buf.data(), 0), -1);
  EXPECT_EQ(loadElem(ElemType::kUInt8, buf.data(), 0), 255);
}

// Reducing the fills in the element type itself, one rank at a time as a library would (half
// and bfloat16 through float), gives exactly reducedValue: nothing rounds or overflows.
TEST(Data, ReductionsAreExactInEveryType) {
  for (ElemType t : allElemTypes()) {
    for (RedOp r : allRedOps()) {
      for (int n : {1, 2, 3, 4, 7, 8, 16}) {
        for (size_t i = 0; i < 200; ++i) {
          std::vector<std::byte> acc(8);
          storeElem(t, acc.data(), 0, fillValue(Op::kAllReduce, r, t, 0, n, i));
          for (int q = 1; q < n; ++q) {
            const double a = loadElem(t, acc.data(), 0);
            const double v = fillValue(Op::kAllReduce, r, t, q, n, i);
            double next = a;
            if (r == RedOp::kSum || r == RedOp::kAvg) next = a + v;
            if (r == RedOp::kProd) next = a * v;
            if (r == RedOp::kMin) next = std::min(a, v);
            if (r == RedOp::kMax) next = std::max(a, v);
            storeElem(t, acc.data(), 0, next);
          }
          double got = loadElem(t, acc.data(), 0);
          if (r == RedOp::kAvg) {
            EXPECT_EQ(std::fmod(got, n), 0.0) << "avg sum not a multiple of n";
            storeElem(t, acc.data(), 0, got / n);
            got = loadElem(t, acc.data(), 0);
          }
          ASSERT_EQ(got, reducedValue(Op::kAllReduce, r, t, n, i))
              << elemTypeName(t) << " " << redOpName(r) << " n=" << n << " i=" << i;
          EXPECT_GE(fillValue(Op::kAllReduce, r, t, n - 1, n, i), 0.0);
        }
      }
    }
  }
}

TEST(Data, FillsDependOnRank) {
  for (Op op : {Op::kAllGather, Op::kAllReduce}) {
    int differing = 0;
    for (size_t i = 0; i < 16; ++i) {
      differing += fillValue(op, RedOp::kSum, ElemType::kFloat, 0, 4, i) !=
                   fillValue(op, RedOp::kSum, ElemType::kFloat, 1, 4, i);
    }
    EXPECT_GT(differing, 8) << opName(op);
  }
}

// A reduce_scatter or all_gather that delivers the wrong slice must be caught: the reduced
// values of two slices differ for every reduction, even at world sizes where a periodic fill
// would sum to a constant.
TEST(Data, SlicesOfTheResultDiffer) {
  for (RedOp r : allRedOps()) {
    for (int n : {2, 4, 8}) {
      for (size_t piece : {4u, 16u, 84u}) {
        int differing = 0;
        for (size_t j = 0; j < piece; ++j) {
          differing += reducedValue(Op::kReduceScatter, r, ElemType::kFloat, n, j) !=
                       reducedValue(Op::kReduceScatter, r, ElemType::kFloat, n, piece + j);
        }
        EXPECT_GT(differing, 0) << redOpName(r) << " n=" << n << " piece=" << piece;
      }
    }
  }
}

TEST(Data, CountWrongFindsEachBadElement) {
  const int n = 3;
  const Layout layout = layoutFor(Op::kAllGather, 3 * 10 * 4, ElemType::kFloat, n);
  std::vector<float> out(layout.recvCount);
  for (size_t j = 0; j < out.size(); ++j) {
    out[j] = static_cast<float>(fillValue(Op::kAllGather, RedOp::kSum, ElemType::kFloat,
                                          static_cast<int>(j / 10), n, j % 10));
  }
  EXPECT_EQ(countWrong(Op::kAllGather, RedOp::kSum, ElemType::kFloat, 1, n, 0, layout, out.data()),
            0);
  out[4] += 1;
  out[25] = NAN;
  EXPECT_EQ(countWrong(Op::kAllGather, RedOp::kSum, ElemType::kFloat, 1, n, 0, layout, out.data()),
            2);
  // gather: only the root has an output.
  EXPECT_EQ(countWrong(Op::kGather, RedOp::kSum, ElemType::kFloat, 1, n, 0, layout, out.data()), 0);
  EXPECT_EQ(countWrong(Op::kGather, RedOp::kSum, ElemType::kFloat, 0, n, 0, layout, out.data()), 2);
}

TEST(Data, AvgAllowsRoundingOnlyOnFloats) {
  EXPECT_TRUE(matches(ElemType::kHalf, RedOp::kAvg, true, 2.0009765625, 2.0));
  EXPECT_FALSE(matches(ElemType::kHalf, RedOp::kAvg, true, 2.5, 2.0));
  EXPECT_FALSE(matches(ElemType::kInt32, RedOp::kAvg, true, 3.0, 2.0));
  EXPECT_FALSE(matches(ElemType::kFloat, RedOp::kSum, true, 2.0000002, 2.0));
  EXPECT_FALSE(matches(ElemType::kFloat, RedOp::kAvg, false, 2.0000002, 2.0));
}

}  // namespace
}  // namespace loom::bench
