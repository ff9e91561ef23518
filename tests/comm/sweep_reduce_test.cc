// Thread-rank sweep of the reducing collectives (all-reduce, reduce, reduce-scatter): world
// sizes {1, 2, 3, 4, 7, 8} x counts {0, 1, size-1, 1000} x every dtype x every valid op, one
// test per case (`Sweep/Reduce.Allreduce/ws4_count1000_float_sum`), each in-place and
// out-of-place and, for reduce, to every root. The large count 2^20+3 is in
// sweep_large_test.cc.
#include <gtest/gtest.h>

#include "sweep_world.h"

namespace loom::comm::testing {
namespace {

using Reduce = SweepTest;

TEST_P(Reduce, Allreduce) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) {
      check.allreduce({"allreduce", param().dtype, op(), param().count, inPlace, 0});
    }
  });
}

TEST_P(Reduce, ReduceScatter) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) {
      check.reduceScatter({"reduce_scatter", param().dtype, op(), param().count, inPlace, 0});
    }
  });
}

TEST_P(Reduce, ReduceEveryRoot) {
  check([&](Checker& check) {
    for (int root = 0; root < param().size; ++root) {
      for (bool inPlace : {false, true}) {
        check.reduce({"reduce", param().dtype, op(), param().count, inPlace, root});
      }
    }
  });
}

// float16 / bfloat16 AVG divides every input by the world size before the sum (as NCCL's
// ncclAvg): summing first overflowed the 16-bit type where the average does not (3 ranks of
// 40000 in float16 gave inf). Out-of-place inputs stay as they were.
TEST(HalfAvg, AnAverageThatFitsDoesNotOverflowInTheSum) {
  World world(3);
  const auto mismatches = world.run([&](Checker& check) {
    Context& ctx = check.ctx();
    const int size = ctx.size();
    uint64_t seq = 100;
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const bool bf16 = dtype == DType::kBFloat16;
      const float big = bf16 ? 2e38f : 40000.0f;  // 3x is past the type's largest finite value
      const uint16_t bits = bf16 ? floatToBFloat16(big) : floatToHalf(big);
      const auto value = [&](uint16_t h) { return bf16 ? bfloat16ToFloat(h) : halfToFloat(h); };
      const size_t n = 37;
      const auto expectAll = [&](const std::vector<uint16_t>& got, size_t count, const char* what) {
        for (size_t i = 0; i < count; ++i) {
          if (got[i] != bits) {
            throw std::runtime_error(std::string(what) + " " + dtypeName(dtype) + ": element " +
                                     std::to_string(i) + " is " + std::to_string(value(got[i])) +
                                     ", expected " + std::to_string(value(bits)));
          }
        }
      };
      const auto opts = [&] {
        CollectiveOptions o;
        o.seq = ++seq;
        return o;
      };
      std::vector<uint16_t> in(n * size, bits), out(n * size, 0);
      allreduce(ctx, in.data(), out.data(), n, dtype, ReduceOp::kAvg, opts());
      expectAll(out, n, "allreduce");
      expectAll(in, n, "allreduce's input");
      allreduce(ctx, in.data(), in.data(), n, dtype, ReduceOp::kAvg, opts());
      expectAll(in, n, "allreduce in place");
      reduce(ctx, in.data(), out.data(), n, dtype, ReduceOp::kAvg, 1, opts());
      if (ctx.rank() == 1) expectAll(out, n, "reduce");
      expectAll(in, n, "reduce's input");
      reduceScatter(ctx, in.data(), out.data(), n, dtype, ReduceOp::kAvg, opts());
      expectAll(out, n, "reduce_scatter");
      expectAll(in, n * size, "reduce_scatter's input");
      const std::vector<size_t> counts = {5, 0, 9};
      reduceScatterv(ctx, in.data(), out.data(), counts, dtype, ReduceOp::kAvg, opts());
      expectAll(out, counts[ctx.rank()], "reduce_scatterv");
      expectAll(in, 14, "reduce_scatterv's input");
    }
  });
  for (const auto& mismatch : mismatches) ADD_FAILURE() << mismatch;
}

INSTANTIATE_TEST_SUITE_P(Sweep, Reduce,
                         ::testing::ValuesIn(sweepCases(worldSizes(), smallCounts, true)),
                         sweepCaseName);

}  // namespace
}  // namespace loom::comm::testing
