// claimRank (rank_claim.h) and the setup-failure helpers (setup_failure.h): a process claims a
// rank once and may claim it again; another process (a forked child, over a FileStore) is
// refused with both named; the refusal's kind and message travel to a rank that waits.
#include "loom/store/rank_claim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/store/file_store.h"
#include "loom/store/hash_store.h"
#include "loom/store/setup_failure.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(RankClaim, TheSameProcessMayClaimItsRankAgain) {
  HashStore store;
  claimRank(store, "g/claim/1", 1, 4);
  claimRank(store, "g/claim/1", 1, 4);  // a group created again by this process
  claimRank(store, "g/claim/2", 2, 4);  // another rank (thread ranks share a process)
  EXPECT_EQ(store.getString("g/claim/1"), thisProcess());
}

TEST(RankClaim, AnotherProcessIsRefusedNamingTheRankAndBothProcesses) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  testing::ChildProcesses child;
  child.spawn([&] {
    FileStore store(path);
    claimRank(store, "g/claim/1", 1, 4);
  });
  ASSERT_EQ(child.waitAllOk(milliseconds(30000)), "");
  FileStore store(path);
  try {
    claimRank(store, "g/claim/1", 1, 4);
    ADD_FAILURE() << "a second process claimed rank 1";
  } catch (const InvalidArgumentError& e) {
    const std::string host = net::hostname();
    EXPECT_THAT(e.what(),
                HasSubstr("rank 1 of this group is claimed by two processes: host " + host +
                          ", pid " + std::to_string(child.pid(0)) + " (first) and host " + host +
                          ", pid " + std::to_string(::getpid()) + " (refused)"));
    EXPECT_THAT(e.what(), HasSubstr("each process must have its own RANK (0..3)"));
  }
  // The claim stays the first process's.
  EXPECT_NE(store.getString("g/claim/1"), thisProcess());
}

TEST(SetupFailure, TheFirstFailureReachesAWaitingRankWithItsKind) {
  HashStore store;
  std::string seen;
  std::thread waiter([&] {
    try {
      waitWatchingSetup(store, {"never"}, Deadline(milliseconds(20000)), "failed", "rank 0");
    } catch (const InvalidArgumentError& e) {
      seen = e.what();
    }
  });
  publishSetupFailure(store, "failed", InvalidArgumentError("rank 1 is claimed twice"));
  publishSetupFailure(store, "failed", IoError("a later failure"));  // the first one wins
  waiter.join();
  EXPECT_EQ(seen, "rank 0: another rank's setup failed: rank 1 is claimed twice");
  EXPECT_THROW(checkSetupFailure(store, "failed", "rank 2"), InvalidArgumentError);
  HashStore other;
  publishSetupFailure(other, "failed", TimeoutError("late"));
  EXPECT_THROW(checkSetupFailure(other, "failed", "rank 2"), TimeoutError);
  EXPECT_NO_THROW(checkSetupFailure(other, "absent", "rank 2"));
}

}  // namespace
}  // namespace loom
