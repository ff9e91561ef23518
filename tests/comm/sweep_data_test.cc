// Thread-rank sweep of the data-movement collectives: broadcast, all-gather, gather,
// scatter, all-to-all, barrier and send/recv over world sizes {1, 2, 3, 4, 7, 8} x counts
// {0, 1, size-1, 1000} x every dtype x in-place and out-of-place x every root.
#include <gtest/gtest.h>

#include "sweep.h"

namespace loom::comm::testing {
namespace {

TEST(SweepData, RootedCollectives) {
  for (int size : worldSizes()) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWorld(size, [&](Context& ctx) {
      Checker check(ctx);
      for (DType dtype : allDTypes()) {
        for (size_t count : smallCounts(size)) {
          for (int root = 0; root < size; ++root) {
            check.broadcast({"broadcast", dtype, ReduceOp::kSum, count, true, root});
            for (bool inPlace : {false, true}) {
              check.gather({"gather", dtype, ReduceOp::kSum, count, inPlace, root});
              check.scatter({"scatter", dtype, ReduceOp::kSum, count, inPlace, root});
            }
          }
        }
      }
    });
  }
}

TEST(SweepData, AllToAllLike) {
  for (int size : worldSizes()) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWorld(size, [&](Context& ctx) {
      Checker check(ctx);
      for (DType dtype : allDTypes()) {
        for (size_t count : smallCounts(size)) {
          for (bool inPlace : {false, true}) {
            check.allgather({"allgather", dtype, ReduceOp::kSum, count, inPlace, 0});
            check.alltoall({"alltoall", dtype, ReduceOp::kSum, count, inPlace, 0});
          }
          check.sendRecv({"send/recv", dtype, ReduceOp::kSum, count, false, 0});
          check.barrier();
        }
      }
    });
  }
}

}  // namespace
}  // namespace loom::comm::testing
