// The large count 2^20 + 3 (not a multiple of any world size or chunk) on world sizes
// {2, 3, 4}, a subset so that the suite stays fast on 2 cores: all-reduce float32/sum,
// int64 with every op and bfloat16/sum (in-place and out-of-place); reduce-scatter
// float32/sum; reduce float32/sum to the last rank; all-gather, broadcast (from the last
// rank), gather, scatter and all-to-all in float32 (all-gather and all-to-all only up to 3
// ranks to bound memory). World sizes 7 and 8 run with the small counts in the other sweeps.
#include <gtest/gtest.h>

#include "sweep.h"

namespace loom::comm::testing {
namespace {

constexpr size_t kLarge = (size_t{1} << 20) + 3;

TEST(SweepLarge, Allreduce) {
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWorld(size, [&](Context& ctx) {
      Checker check(ctx);
      for (bool inPlace : {false, true}) {
        check.allreduce({"allreduce", DType::kFloat32, ReduceOp::kSum, kLarge, inPlace, 0});
        check.allreduce({"allreduce", DType::kBFloat16, ReduceOp::kSum, kLarge, inPlace, 0});
      }
      for (ReduceOp op : validOps(DType::kInt64)) {
        check.allreduce({"allreduce", DType::kInt64, op, kLarge, false, 0});
      }
    });
  }
}

TEST(SweepLarge, Others) {
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWorld(size, [&](Context& ctx) {
      Checker check(ctx);
      const DType f = DType::kFloat32;
      for (bool inPlace : {false, true}) {
        check.reduceScatter({"reduce_scatter", f, ReduceOp::kSum, kLarge, inPlace, 0});
        check.reduce({"reduce", f, ReduceOp::kSum, kLarge, inPlace, size - 1});
        check.gather({"gather", f, ReduceOp::kSum, kLarge, inPlace, size - 1});
        check.scatter({"scatter", f, ReduceOp::kSum, kLarge, inPlace, 0});
        if (size <= 3) {
          check.allgather({"allgather", f, ReduceOp::kSum, kLarge, inPlace, 0});
          check.alltoall({"alltoall", f, ReduceOp::kSum, kLarge, inPlace, 0});
        }
      }
      check.broadcast({"broadcast", f, ReduceOp::kSum, kLarge, true, size - 1});
      check.sendRecv({"send/recv", f, ReduceOp::kSum, kLarge, false, 0});
    });
  }
}

}  // namespace
}  // namespace loom::comm::testing
