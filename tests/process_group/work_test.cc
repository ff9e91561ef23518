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

// c10d's kNoTimeout is 0 ms: wait(0) and a negative timeout mean "no deadline of the caller's",
// not an instant one that would abort the group (AbortingWork below: the hook is the abort).
class CountingTimeoutWork final : public Work {
 public:
  CountingTimeoutWork() : Work("allreduce", 2, 0) {}
  std::atomic<int> hookCalls{0};

 protected:
  void onWaitTimeout(const std::string&) override { ++hookCalls; }
};

TEST(Work, AZeroOrNegativeTimeoutIsNoTimeoutAsInC10d) {
  for (const milliseconds timeout : {milliseconds(0), milliseconds(-5)}) {
    CountingTimeoutWork work;
    std::thread completer([&] {
      std::this_thread::sleep_for(milliseconds(50));
      work.markCompleted();
    });
    EXPECT_TRUE(work.wait(timeout));
    completer.join();
    EXPECT_EQ(work.hookCalls.load(), 0) << timeout.count() << " ms aborted the group";
  }
}

// A backend's Work aborts its group in onWaitTimeout.
class AbortingWork final : public Work {
 public:
  AbortingWork() : Work("allgather", 5, 1) {}
  std::atomic<int> hookCalls{0};
  std::string hookReason;

 protected:
  void onWaitTimeout(const std::string& reason) override {
    hookReason = reason;
    ++hookCalls;
  }
};

TEST(Work, BoundedWaitThrowsTimeoutNamingTheOpAndCallsTheAbortHook) {
  AbortingWork work;
  try {
    work.wait(milliseconds(20));
    FAIL() << "wait should time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1: allgather#5 did not complete within"));
  }
  EXPECT_EQ(work.hookCalls.load(), 1);
  EXPECT_THAT(work.hookReason, HasSubstr("allgather#5"));
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

// A backend's wait: runs the operation on the waiting thread when it can, then the base
// class's blocking wait; a bounded wait does not run it (the comm backend's CommWork).
class InlineWork final : public Work {
 public:
  explicit InlineWork(bool runs) : Work("barrier", 4, 1), runs_(runs) {}
  std::atomic<int> inlineRuns{0};

  using Work::wait;
  bool wait() override {
    if (runs_ && !isCompleted()) {
      ++inlineRuns;
      markCompleted();
    }
    return Work::wait();
  }

 private:
  const bool runs_;
};

TEST(Work, ABackendWaitCanRunTheOperationThenUseTheBaseWait) {
  InlineWork ran(true);
  EXPECT_TRUE(ran.wait());
  EXPECT_TRUE(ran.wait());  // complete: not run again
  EXPECT_EQ(ran.inlineRuns.load(), 1);

  InlineWork declined(false);
  std::thread completer([&] { declined.markCompleted(); });
  EXPECT_TRUE(declined.wait());
  completer.join();
  EXPECT_EQ(declined.inlineRuns.load(), 0);

  InlineWork bounded(true);
  EXPECT_THROW(bounded.wait(milliseconds(20)), TimeoutError);
  EXPECT_EQ(bounded.inlineRuns.load(), 0);
  EXPECT_FALSE(bounded.isCompleted());
}

// Completion observed by polling (the nccl backend's CUDA events): isCompleted() polls, and
// the waits poll until it reports completion, using finished() and timedOut().
class PolledWork final : public Work {
 public:
  explicit PolledWork(int pollsNeeded) : Work("allreduce", 9, 0), pollsNeeded_(pollsNeeded) {}
  std::atomic<int> polls{0};

  bool isCompleted() override {
    if (Work::isCompleted()) return true;
    if (++polls < pollsNeeded_) return false;
    markCompleted();
    return true;
  }
  bool wait() override { return wait(milliseconds(60000)); }
  bool wait(milliseconds timeout) override {
    const auto start = std::chrono::steady_clock::now();
    while (!isCompleted()) {
      if (std::chrono::steady_clock::now() - start >= timeout) timedOut(start);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return finished();
  }

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
  try {
    never.wait(milliseconds(20));
    FAIL() << "wait should time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0: allreduce#9 did not complete within"));
  }
  EXPECT_FALSE(never.isCompleted());
}

}  // namespace
}  // namespace loom
