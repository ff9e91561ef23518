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

INSTANTIATE_TEST_SUITE_P(Sweep, Reduce,
                         ::testing::ValuesIn(sweepCases(worldSizes(), smallCounts, true)),
                         sweepCaseName);

}  // namespace
}  // namespace loom::comm::testing
