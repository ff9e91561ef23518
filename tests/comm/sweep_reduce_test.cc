// Thread-rank sweep of the reducing collectives (all-reduce, reduce, reduce-scatter): world
// sizes {1, 2, 3, 4, 7, 8} x counts {0, 1, size-1, 1000} x every dtype x every valid op x
// in-place and out-of-place x every root (reduce). The large count 2^20+3 is in
// sweep_large_test.cc.
#include <gtest/gtest.h>

#include "sweep.h"

namespace loom::comm::testing {
namespace {

TEST(SweepReduce, AllreduceReduceScatter) {
  for (int size : worldSizes()) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWorld(size, [&](Context& ctx) {
      Checker check(ctx);
      for (DType dtype : allDTypes()) {
        for (ReduceOp op : validOps(dtype)) {
          for (size_t count : smallCounts(size)) {
            for (bool inPlace : {false, true}) {
              check.allreduce({"allreduce", dtype, op, count, inPlace, 0});
              check.reduceScatter({"reduce_scatter", dtype, op, count, inPlace, 0});
            }
          }
        }
      }
    });
  }
}

TEST(SweepReduce, ReduceEveryRoot) {
  for (int size : worldSizes()) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWorld(size, [&](Context& ctx) {
      Checker check(ctx);
      for (DType dtype : allDTypes()) {
        for (ReduceOp op : validOps(dtype)) {
          for (size_t count : smallCounts(size)) {
            for (int root = 0; root < size; ++root) {
              for (bool inPlace : {false, true}) {
                check.reduce({"reduce", dtype, op, count, inPlace, root});
              }
            }
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace loom::comm::testing
