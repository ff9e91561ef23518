// Thread-rank sweep of every collective through the shared-memory arena: world sizes
// {2, 3, 4, 5} x every dtype x every valid op x counts that hit each size class (the
// small-message path, one chunk, many chunks with a partial last one) x in-place and
// out-of-place x every root. Slots are shrunk (ContextOptions::shmSlotBytes) so that many chunks
// and the slot reuse across steps are covered at small counts; a second pass with the
// default slot covers the large path at 2^18 + 3 elements.
#include <gtest/gtest.h>
#include <functional>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "shm/shm.h"
#include "sweep.h"

namespace loom::comm::testing {
namespace {

// runWorld with 4096-byte arena slots (ContextOptions::shmSlotBytes).
void runWithSmallSlots(int size, const std::function<void(Context&)>& fn) {
  ContextOptions o;
  o.shmSlotBytes = 4096;
  runWorld(size, fn, std::chrono::seconds(60), o);
}

void requireArena(Context& ctx) {
  LOOM_CHECK(shm::arenaOf(ctx) != nullptr, "rank ", ctx.rank(),
             ": same-host thread ranks did not get a shared-memory arena");
}

std::vector<size_t> counts(int size) {
  // 4096-byte slots: 1 (small path), size+1 (sub-slices of uneven length), 700 (small path
  // up to 8-byte types, one chunk), 3001 (several chunks, last one partial).
  return {1, static_cast<size_t>(size + 1), 700, 3001};
}

TEST(ShmSweep, ReducingCollectives) {
  for (int size : {2, 3, 4, 5}) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWithSmallSlots(size, [&](Context& ctx) {
      requireArena(ctx);
      Checker check(ctx);
      for (DType dtype : allDTypes()) {
        for (ReduceOp op : validOps(dtype)) {
          for (size_t count : counts(size)) {
            for (bool inPlace : {false, true}) {
              check.allreduce({"allreduce", dtype, op, count, inPlace, 0});
              check.reduceScatter({"reduce_scatter", dtype, op, count, inPlace, 0});
            }
            check.reduce({"reduce", dtype, op, count, false, static_cast<int>(count % size)});
          }
        }
      }
    });
  }
}

TEST(ShmSweep, DataMovingCollectives) {
  for (int size : {2, 3, 4, 5}) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWithSmallSlots(size, [&](Context& ctx) {
      requireArena(ctx);
      Checker check(ctx);
      for (DType dtype : allDTypes()) {
        for (size_t count : counts(size)) {
          for (int root = 0; root < size; ++root) {
            const bool inPlace = root % 2 == 1;
            check.broadcast({"broadcast", dtype, ReduceOp::kSum, count, inPlace, root});
            check.gather({"gather", dtype, ReduceOp::kSum, count, inPlace, root});
            check.scatter({"scatter", dtype, ReduceOp::kSum, count, inPlace, root});
          }
          for (bool inPlace : {false, true}) {
            check.allgather({"allgather", dtype, ReduceOp::kSum, count, inPlace, 0});
            check.alltoall({"alltoall", dtype, ReduceOp::kSum, count, inPlace, 0});
          }
          check.barrier();
          // Point-to-point runs over the shared-memory transport next to the arena.
          check.sendRecv({"send/recv", dtype, ReduceOp::kSum, count, false, 0});
        }
      }
    });
  }
}

TEST(ShmSweep, LargeWithDefaultSlots) {
  const size_t count = (size_t{1} << 18) + 3;
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE(detail::str("world size ", size));
    runWorld(size, [&](Context& ctx) {
      requireArena(ctx);
      Checker check(ctx);
      for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
        check.allreduce({"allreduce", dtype, ReduceOp::kSum, count, false, 0});
        check.allreduce({"allreduce", dtype, ReduceOp::kMax, count, true, 0});
        check.reduce({"reduce", dtype, ReduceOp::kSum, count, false, size - 1});
        check.reduceScatter({"reduce_scatter", dtype, ReduceOp::kSum, count / size, false, 0});
        check.broadcast({"broadcast", dtype, ReduceOp::kSum, count, false, 1});
        check.allgather({"allgather", dtype, ReduceOp::kSum, count / size, false, 0});
        check.alltoall({"alltoall", dtype, ReduceOp::kSum, count / size, false, 0});
      }
    });
  }
}

TEST(ShmSweep, StreamedOutputsAboveEightMiB) {
  // Outputs of 8 MiB and more are copied out with non-temporal stores and step in whole slots;
  // odd counts make the sub-slices start unaligned.
  const size_t count = (size_t{8} << 20) / 4 + 5;
  runWorld(2, [&](Context& ctx) {
    requireArena(ctx);
    Checker check(ctx);
    check.allreduce({"allreduce", DType::kFloat32, ReduceOp::kSum, count, false, 0});
    check.broadcast({"broadcast", DType::kFloat32, ReduceOp::kSum, count, false, 0});
    check.allgather({"allgather", DType::kFloat32, ReduceOp::kSum, count / 2 + 1, true, 0});
    // At 8 MiB and more every step fills a whole slot (2 MiB), also for the collectives
    // whose slot holds one piece per rank.
    check.reduceScatter(
        {"reduce_scatter", DType::kFloat32, ReduceOp::kSum, count / 2 + 1, false, 0});
    check.alltoall({"alltoall", DType::kFloat32, ReduceOp::kSum, count / 2 + 1, false, 0});
    check.reduce({"reduce", DType::kFloat32, ReduceOp::kMax, count, true, 1});
  });
}

TEST(ShmSweep, AvgAndHalfTypesThroughTheSplitPath) {
  // 20000 float16 = 40000 bytes: above the small-message path with the default slot.
  for (int size : {2, 3}) {
    runWorld(size, [&](Context& ctx) {
      requireArena(ctx);
      Checker check(ctx);
      for (DType dtype : {DType::kFloat16, DType::kFloat32, DType::kInt32}) {
        for (ReduceOp op : validOps(dtype)) {
          check.allreduce({"allreduce", dtype, op, 20000, false, 0});
        }
      }
    });
  }
}

}  // namespace
}  // namespace loom::comm::testing
