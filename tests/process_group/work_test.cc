// Work semantics without any network: completion, failure, bounded waits and their hook.
#include "loom/process_group/work.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "loom/common/error.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(Work, CompletesOnceAndWaitReturnsTrue) {
  Work work("allreduce", 17, 2);
  EXPECT_EQ(work.describe(), "allreduce#17");
  EXPECT_EQ(work.seq(), 17u);
  EXPECT_EQ(work.rank(), 2);
  EXPECT_FALSE(work.isCompleted());
  EXPECT_FALSE(work.isSuccess());
  std::thread completer([&] { work.markCompleted(); });
  EXPECT_TRUE(work.wait());
  completer.join();
  EXPECT_TRUE(work.isCompleted());
  EXPECT_TRUE(work.isSuccess());
  EXPECT_EQ(work.exception(), nullptr);
  // Completion is final: a later failure is ignored.
  work.markFailed(std::make_exception_ptr(IoError("late")));
  EXPECT_TRUE(work.isSuccess());
  EXPECT_TRUE(work.wait(milliseconds(0)));
}

TEST(Work, FailureIsStoredAndRethrownByEveryWait) {
  Work work("broadcast", 3, 0);
  work.markFailed(
      std::make_exception_ptr(IoError("rank 0: broadcast#3: connection reset by rank 1")));
  EXPECT_TRUE(work.isCompleted());
  EXPECT_FALSE(work.isSuccess());
  ASSERT_NE(work.exception(), nullptr);
  EXPECT_THROW(work.wait(), IoError);
  try {
    work.wait(milliseconds(10));
    FAIL() << "wait should rethrow";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("connection reset by rank 1"));
  }
}

TEST(Work, BoundedWaitThrowsTimeoutNamingTheOpAndCallsTheAbortHook) {
  Work work("allgather", 5, 1);
  std::atomic<int> hookCalls{0};
  std::string hookReason;
  work.setOnWaitTimeout([&](const std::string& reason) {
    hookReason = reason;
    ++hookCalls;
  });
  try {
    work.wait(milliseconds(20));
    FAIL() << "wait should time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1: allgather#5 did not complete within"));
  }
  EXPECT_EQ(hookCalls.load(), 1);
  EXPECT_THAT(hookReason, HasSubstr("allgather#5"));
  EXPECT_FALSE(work.isCompleted());
}

TEST(Work, ManyWaitersAreAllWoken) {
  Work work("barrier", 1, 0);
  std::atomic<int> woken{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      if (work.wait(milliseconds(10000))) ++woken;
    });
  }
  work.markCompleted();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woken.load(), 4);
}

// Completion racing with a waiter that is about to sleep: the waiter must never miss the
// wake-up (it counts itself as a sleeper, then re-checks; the completer publishes, then looks
// for sleepers). A lost wake-up would show as a wait that runs into its 10 s deadline.
TEST(Work, CompletionRacingWithASleepingWaiterIsNeverLost) {
  for (int i = 0; i < 2000; ++i) {
    Work work("allreduce", static_cast<uint64_t>(i + 1), 0);
    std::thread completer([&] {
      if (i % 2) std::this_thread::yield();
      if (i % 3 == 0) {
        work.markFailed(std::make_exception_ptr(IoError("failed on purpose")));
      } else {
        work.markCompleted();
      }
    });
    if (i % 3 == 0) {
      EXPECT_THROW(work.wait(milliseconds(10000)), IoError) << "iteration " << i;
    } else {
      EXPECT_TRUE(work.wait(milliseconds(10000))) << "iteration " << i;
    }
    completer.join();
  }
}

// The backend hooks: wait() offers the operation to runInline() first and does not sleep
// when it ran; a wait that must sleep calls beforeSleep() first; a bounded wait never runs
// the operation inline; an expired bounded wait calls onWaitTimeout().
class HookedWork final : public Work {
 public:
  explicit HookedWork(bool runs) : Work("barrier", 4, 1), runs_(runs) {}
  std::atomic<int> inlineCalls{0};
  std::atomic<int> sleepCalls{0};
  std::atomic<int> timeoutCalls{0};

 protected:
  bool runInline() override {
    ++inlineCalls;
    if (!runs_) return false;
    markCompleted();
    return true;
  }
  void beforeSleep() override { ++sleepCalls; }
  void onWaitTimeout(const std::string&) override { ++timeoutCalls; }

 private:
  const bool runs_;
};

TEST(Work, WaitOffersTheOperationToRunInlineBeforeSleeping) {
  HookedWork ran(true);
  EXPECT_TRUE(ran.wait());
  EXPECT_EQ(ran.inlineCalls.load(), 1);
  EXPECT_EQ(ran.sleepCalls.load(), 0);
  EXPECT_TRUE(ran.wait());  // complete: no more offers
  EXPECT_EQ(ran.inlineCalls.load(), 1);

  HookedWork declined(false);
  std::thread completer([&] {
    while (declined.sleepCalls.load() == 0) std::this_thread::yield();
    declined.markCompleted();
  });
  EXPECT_TRUE(declined.wait());
  completer.join();
  EXPECT_EQ(declined.inlineCalls.load(), 1);
  EXPECT_EQ(declined.sleepCalls.load(), 1);

  HookedWork bounded(true);
  EXPECT_THROW(bounded.wait(milliseconds(20)), TimeoutError);
  EXPECT_EQ(bounded.inlineCalls.load(), 0);
  EXPECT_EQ(bounded.sleepCalls.load(), 1);
  EXPECT_EQ(bounded.timeoutCalls.load(), 1);
  EXPECT_FALSE(bounded.isCompleted());
}

// Completion observed by polling (the NCCL backend's CUDA events): wait() and isCompleted()
// call poll() until it reports completion; a bounded wait gives up at its deadline.
class PolledWork final : public Work {
 public:
  explicit PolledWork(int pollsNeeded) : Work("allreduce", 9, 0), pollsNeeded_(pollsNeeded) {}
  std::atomic<int> polls{0};

 protected:
  bool poll() override {
    if (++polls < pollsNeeded_) return false;
    markCompleted();
    return true;
  }
  int pollIntervalUs() const override { return 50; }

 private:
  const int pollsNeeded_;
};

TEST(Work, PolledCompletionIsSeenByWaitAndIsCompleted) {
  PolledWork work(5);
  EXPECT_FALSE(work.isCompleted());
  EXPECT_TRUE(work.wait());
  EXPECT_GE(work.polls.load(), 5);
  EXPECT_TRUE(work.isCompleted());
  EXPECT_TRUE(work.isSuccess());

  PolledWork never(1 << 30);
  EXPECT_THROW(never.wait(milliseconds(20)), TimeoutError);
  EXPECT_FALSE(never.isCompleted());
}

}  // namespace
}  // namespace loom
