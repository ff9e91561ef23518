#include "loom/store/barrier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "loom/common/error.h"
#include "store_kinds.h"

namespace loom::testing {
namespace {

using std::chrono::milliseconds;

template <typename Kind>
class StoreBarrier : public ::testing::Test {
 protected:
  Kind kind;
};
using BarrierKinds = ::testing::Types<HashStoreKind, TCPStoreKind>;
TYPED_TEST_SUITE(StoreBarrier, BarrierKinds);

TYPED_TEST(StoreBarrier, IsReusableAndNobodyLeavesEarly) {
  constexpr int kRanks = 4;
  constexpr int kRounds = 5;
  std::atomic<int> arrived[kRounds] = {};
  runThreadRanks(kRanks, [&](int rank) {
    auto store = this->kind.open();
    for (int round = 0; round < kRounds; ++round) {
      arrived[round].fetch_add(1);
      storeBarrier(*store, "sync", rank, kRanks, milliseconds(10000));
      if (arrived[round].load() != kRanks) {
        throw std::runtime_error("left barrier round " + std::to_string(round) + " early");
      }
    }
  });
}

TYPED_TEST(StoreBarrier, TimeoutNamesTheRanksThatNeverArrived) {
  constexpr int kRanks = 5;
  std::vector<std::string> errors(kRanks);
  runThreadRanks(kRanks, [&](int rank) {
    if (rank == 1 || rank == 3) return;  // these two never come
    auto store = this->kind.open();
    try {
      storeBarrier(*store, "init", rank, kRanks, milliseconds(200));
    } catch (const TimeoutError& e) {
      errors[rank] = e.what();
    }
  });
  for (int rank : {0, 2, 4}) {
    EXPECT_NE(errors[rank].find("barrier 'init' #1 timed out"), std::string::npos) << errors[rank];
    EXPECT_NE(errors[rank].find("3/5 ranks arrived; missing ranks: 1, 3"), std::string::npos)
        << errors[rank];
  }
}

TEST(StoreBarrierArgs, RefusesBadRanks) {
  HashStore store;
  EXPECT_THROW(storeBarrier(store, "b", 3, 3, milliseconds(10)), InvalidArgumentError);
  EXPECT_THROW(storeBarrier(store, "b", 0, 0, milliseconds(10)), InvalidArgumentError);
  EXPECT_THROW(storeBarrier(store, "", 0, 1, milliseconds(10)), InvalidArgumentError);
  storeBarrier(store, "alone", 0, 1, milliseconds(10));
}

}  // namespace
}  // namespace loom::testing
