// Thread-rank sweep of every collective through the shared-memory arena: world sizes
// {2, 3, 4, 5} x every dtype x every valid op x counts that hit each size class (the
// small-message path, one chunk, many chunks with a partial last one) x in-place and
// out-of-place x every root, one test per case (`Sweep/ShmReduce.AllreduceReduceScatterReduce/
// ws3_count700_half_avg`). Slots are shrunk (ContextOptions::shmSlotBytes) so that many chunks and
// the slot reuse across steps are covered at small counts; a second pass with the default
// slot covers the large path at 2^18 + 3 elements.
#include <gtest/gtest.h>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "shm/shm.h"
#include "sweep_world.h"

namespace loom::comm::testing {
namespace {

void requireArena(Context& ctx) {
  LOOM_CHECK(shm::arenaOf(ctx) != nullptr, "rank ", ctx.rank(),
             ": same-host thread ranks did not get a shared-memory arena");
}

std::vector<size_t> counts(int size) {
  // 4096-byte slots: 1 (small path), size+1 (sub-slices of uneven length), 700 (small path
  // up to 8-byte types, one chunk), 3001 (several chunks, last one partial).
  return {1, static_cast<size_t>(size + 1), 700, 3001};
}

// 4096-byte arena slots (ContextOptions::shmSlotBytes) for the suite's worlds.
class SmallSlots : public SweepTest {
 protected:
  ContextOptions worldOptions() const override {
    ContextOptions o;
    o.shmSlotBytes = 4096;
    return o;
  }
};

using ShmReduce = SmallSlots;

TEST_P(ShmReduce, AllreduceReduceScatterReduce) {
  check([&](Checker& check) {
    requireArena(check.ctx());
    const SweepCase& p = param();
    for (bool inPlace : {false, true}) {
      check.allreduce({"allreduce", p.dtype, op(), p.count, inPlace, 0});
      check.reduceScatter({"reduce_scatter", p.dtype, op(), p.count, inPlace, 0});
    }
    check.reduce({"reduce", p.dtype, op(), p.count, false, static_cast<int>(p.count % p.size)});
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, ShmReduce,
                         ::testing::ValuesIn(sweepCases({2, 3, 4, 5}, counts, true)),
                         sweepCaseName);

using ShmData = SmallSlots;

TEST_P(ShmData, EveryDataMovingCollective) {
  check([&](Checker& check) {
    requireArena(check.ctx());
    const SweepCase& p = param();
    for (int root = 0; root < p.size; ++root) {
      const bool inPlace = root % 2 == 1;
      check.broadcast({"broadcast", p.dtype, ReduceOp::kSum, p.count, inPlace, root});
      check.gather({"gather", p.dtype, ReduceOp::kSum, p.count, inPlace, root});
      check.scatter({"scatter", p.dtype, ReduceOp::kSum, p.count, inPlace, root});
    }
    for (bool inPlace : {false, true}) {
      check.allgather({"allgather", p.dtype, ReduceOp::kSum, p.count, inPlace, 0});
      check.alltoall({"alltoall", p.dtype, ReduceOp::kSum, p.count, inPlace, 0});
    }
    check.barrier();
    // Point-to-point runs over the shared-memory transport next to the arena.
    check.sendRecv({"send/recv", p.dtype, ReduceOp::kSum, p.count, false, 0});
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, ShmData,
                         ::testing::ValuesIn(sweepCases({2, 3, 4, 5}, counts, false)),
                         sweepCaseName);

// The default slot, 2^18 + 3 elements: the large path.
using ShmLarge = SweepTest;

std::vector<size_t> largeCount(int) {
  return {(size_t{1} << 18) + 3};
}

TEST_P(ShmLarge, WithDefaultSlots) {
  check([&](Checker& check) {
    requireArena(check.ctx());
    const DType dtype = param().dtype;
    const size_t count = param().count;
    const int size = param().size;
    check.allreduce({"allreduce", dtype, ReduceOp::kSum, count, false, 0});
    check.allreduce({"allreduce", dtype, ReduceOp::kMax, count, true, 0});
    check.reduce({"reduce", dtype, ReduceOp::kSum, count, false, size - 1});
    check.reduceScatter({"reduce_scatter", dtype, ReduceOp::kSum, count / size, false, 0});
    check.broadcast({"broadcast", dtype, ReduceOp::kSum, count, false, 1});
    check.allgather({"allgather", dtype, ReduceOp::kSum, count / size, false, 0});
    check.alltoall({"alltoall", dtype, ReduceOp::kSum, count / size, false, 0});
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, ShmLarge,
                         ::testing::ValuesIn(sweepCases({2, 3, 4}, largeCount, false,
                                                        {DType::kFloat32, DType::kBFloat16,
                                                         DType::kInt64})),
                         sweepCaseName);

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

// 20000 float16 = 40000 bytes: above the small-message path with the default slot.
using ShmSplitPath = SweepTest;

std::vector<size_t> splitPathCount(int) {
  return {20000};
}

TEST_P(ShmSplitPath, Allreduce) {
  check([&](Checker& check) {
    requireArena(check.ctx());
    check.allreduce({"allreduce", param().dtype, op(), param().count, false, 0});
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, ShmSplitPath,
                         ::testing::ValuesIn(sweepCases({2, 3}, splitPathCount, true,
                                                        {DType::kFloat16, DType::kFloat32,
                                                         DType::kInt32})),
                         sweepCaseName);

}  // namespace
}  // namespace loom::comm::testing
