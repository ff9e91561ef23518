// The large count 2^20 + 3 (not a multiple of any world size or chunk) on world sizes
// {2, 3, 4}, a subset so that the suite stays fast on 2 cores: all-reduce float32/sum and
// bfloat16/sum (in-place and out-of-place) and int64 with every op; reduce-scatter
// float32/sum; reduce float32/sum to the last rank; broadcast (from the last rank), gather,
// scatter and send/recv in float32; all-gather and all-to-all in float32 only up to 3 ranks to
// bound memory. World sizes 7 and 8 run with the small counts in the other sweeps. One test
// per case: `Sweep/LargeAllreduce.InPlaceAndOut/ws3_count1048579_bfloat16_sum`.
#include <gtest/gtest.h>

#include "sweep_world.h"

namespace loom::comm::testing {
namespace {

constexpr size_t kLarge = (size_t{1} << 20) + 3;

std::vector<size_t> large(int) {
  return {kLarge};
}

std::vector<SweepCase> allreduceCases() {
  std::vector<SweepCase> cases;
  for (int size : {2, 3, 4}) {
    cases.push_back({size, DType::kFloat32, kLarge, ReduceOp::kSum});
    cases.push_back({size, DType::kBFloat16, kLarge, ReduceOp::kSum});
    for (ReduceOp op : validOps(DType::kInt64)) cases.push_back({size, DType::kInt64, kLarge, op});
  }
  return cases;
}

using LargeAllreduce = SweepTest;

TEST_P(LargeAllreduce, InPlaceAndOut) {
  check([&](Checker& check) {
    check.allreduce({"allreduce", param().dtype, op(), kLarge, false, 0});
    // In place only for the sums: int64 with every op runs out of place, to bound the time.
    if (param().dtype != DType::kInt64) {
      check.allreduce({"allreduce", param().dtype, op(), kLarge, true, 0});
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, LargeAllreduce, ::testing::ValuesIn(allreduceCases()),
                         sweepCaseName);

using Large = SweepTest;

Case floatCase(const char* what, bool inPlace, int root) {
  return {what, DType::kFloat32, ReduceOp::kSum, kLarge, inPlace, root};
}

TEST_P(Large, ReduceScatter) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) check.reduceScatter(floatCase("reduce_scatter", inPlace, 0));
  });
}

TEST_P(Large, ReduceToLastRank) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) {
      check.reduce(floatCase("reduce", inPlace, param().size - 1));
    }
  });
}

TEST_P(Large, GatherToLastRank) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) {
      check.gather(floatCase("gather", inPlace, param().size - 1));
    }
  });
}

TEST_P(Large, Scatter) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) check.scatter(floatCase("scatter", inPlace, 0));
  });
}

TEST_P(Large, BroadcastFromLastRank) {
  check([&](Checker& check) { check.broadcast(floatCase("broadcast", true, param().size - 1)); });
}

TEST_P(Large, SendRecv) {
  check([&](Checker& check) { check.sendRecv(floatCase("send/recv", false, 0)); });
}

INSTANTIATE_TEST_SUITE_P(Sweep, Large,
                         ::testing::ValuesIn(sweepCases({2, 3, 4}, large, false,
                                                        {DType::kFloat32})),
                         sweepCaseName);

using LargeGathered = SweepTest;

TEST_P(LargeGathered, Allgather) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) check.allgather(floatCase("allgather", inPlace, 0));
  });
}

TEST_P(LargeGathered, Alltoall) {
  check([&](Checker& check) {
    for (bool inPlace : {false, true}) check.alltoall(floatCase("alltoall", inPlace, 0));
  });
}

INSTANTIATE_TEST_SUITE_P(Sweep, LargeGathered,
                         ::testing::ValuesIn(sweepCases({2, 3}, large, false, {DType::kFloat32})),
                         sweepCaseName);

}  // namespace
}  // namespace loom::comm::testing
