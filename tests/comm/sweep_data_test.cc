// Thread-rank sweep of the data-movement collectives: broadcast, all-gather, gather,
// scatter, all-to-all, barrier and send/recv over world sizes {1, 2, 3, 4, 7, 8} x counts
// {0, 1, size-1, 1000} x every dtype, one test per case (`Sweep/Data.Gather/ws3_count2_int8`),
// each in-place and out-of-place and from every root.
#include <gtest/gtest.h>

#include "sweep_world.h"

namespace loom::comm::testing {
namespace {

using Data = SweepTest;

Case dataCase(const char* what, const SweepCase& p, bool inPlace, int root) {
  return {what, p.dtype, ReduceOp::kSum, p.count, inPlace, root};
}

TEST_P(Data, Broadcast) {
  check([&](Checker& check) {
    for (int root = 0; root < param().size; ++root) {
      check.broadcast(dataCase("broadcast", param(), true, root));
    }
  });
}

TEST_P(Data, Gather) {
  check([&](Checker& check) {
    for (int root = 0; root < param().size; ++root) {
      for (bool inPlace : {false, true}) check.gather(dataCase("gather", param(), inPlace, root));
    }
  });
}

TEST_P(Data, Scatter) {
  check([&](Checker& check) {
    for (int root = 0; root < param().size; ++root) {
      for (bool inPlace : {false, true}) check.scatter(dataCase("scatter", param(), inPlace, root));
    }
  });
}

TEST_P(Data, Allgather) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) check.allgather(dataCase("allgather", param(), inPlace, 0));
  });
}

TEST_P(Data, Alltoall) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) check.alltoall(dataCase("alltoall", param(), inPlace, 0));
  });
}

TEST_P(Data, SendRecvAndBarrier) {
  check([&](Checker& check) {
    check.sendRecv(dataCase("send/recv", param(), false, 0));
    check.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, Data,
                         ::testing::ValuesIn(sweepCases(worldSizes(), smallCounts, false)),
                         sweepCaseName);

}  // namespace
}  // namespace loom::comm::testing
