// Two threads issuing on one group at once (process_group.h's contract): the second thread is
// told, naming both threads and operations, and the group is aborted with the same text; threads
// that take turns are not.
//
// The group is a fake backend whose post() can hold the issuing thread inside its issue call at
// a gate, so that the overlap is certain instead of left to the scheduler.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/common/error.h"
#include "loom/process_group/process_group.h"
#include "loom/store/hash_store.h"
#include "loom/testing/gate.h"

namespace loom {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

ProcessGroupOptions fakeOptions() {
  ProcessGroupOptions o;
  o.flightRecorderEntries = 0;  // no store traffic, no threads
  o.timeout = std::chrono::seconds(30);
  return o;
}

// Completes every operation at once; post() holds its caller at the gate while it is closed.
class FakeGroup final : public ProcessGroup {
 public:
  FakeGroup() : ProcessGroup("fake", std::make_shared<HashStore>(), 0, 2, fakeOptions()) {}

  void closeGate() { gate_.close(); }
  void openGate() { gate_.open(); }
  // Until a thread waits at the closed gate (bounded: a broken test fails, it does not hang).
  bool awaitHeld() { return gate_.awaitHeld(1, std::chrono::seconds(20)); }

  std::vector<std::string> aborts() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborts_;
  }
  int posts() {
    std::lock_guard<std::mutex> lock(mu_);
    return posts_;
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(reason);
  }
  bool isBroken() const override { return false; }

 protected:
  std::shared_ptr<Work> post(OpDesc&& op) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++posts_;
    }
    // Bounded: when the test never opens it (the second thread was let in and now waits for
    // the issue lock), the operation goes on after 20 s and the test fails on what it sees.
    gate_.pass(std::chrono::seconds(20));
    auto work = std::make_shared<Work>(opTypeName(op.type), op.seq, rank());
    work->markCompleted();
    return work;
  }
  void checkDevice(const BufferView&, const char*) const override {}

 private:
  std::mutex mu_;
  testing::Gate gate_;
  int posts_ = 0;
  std::vector<std::string> aborts_;
};

long thisThread() {
  return static_cast<long>(::syscall(SYS_gettid));
}

TEST(IssueThreads, ASecondThreadIssuingDuringAnIssueIsToldAndTheGroupAborted) {
  FakeGroup pg;
  float a[4] = {1, 2, 3, 4};
  float b[4] = {1, 2, 3, 4};
  pg.closeGate();
  long firstThread = 0;
  std::thread first([&] {
    firstThread = thisThread();
    pg.allreduce(view(a, 4))->wait();
  });
  ASSERT_TRUE(pg.awaitHeld()) << "the first thread never reached post()";
  try {
    pg.broadcast(view(b, 4), {.root = 0});
    ADD_FAILURE() << "a broadcast issued while another thread issued an all-reduce was accepted";
  } catch (const InvalidArgumentError& e) {
    pg.openGate();
    first.join();
    const std::string text = e.what();
    EXPECT_THAT(text, AllOf(HasSubstr("rank 0: broadcast was issued by thread " +
                                      std::to_string(thisThread())),
                            HasSubstr("while thread " + std::to_string(firstThread) +
                                      " was issuing allreduce on the same group"),
                            HasSubstr("from one thread at a time")));
    ASSERT_EQ(pg.aborts().size(), 1u) << "the group was not aborted";
    EXPECT_THAT(text, HasSubstr(pg.aborts()[0])) << "the group was aborted with another text";
  }
  if (first.joinable()) {
    pg.openGate();
    first.join();
  }
  // The refused broadcast never reached the backend (and took no sequence number).
  EXPECT_EQ(pg.posts(), 1);
  EXPECT_EQ(pg.lastSeq(), 1u);
}

TEST(IssueThreads, ThreadsThatTakeTurnsAreNotCaught) {
  FakeGroup pg;
  float a[4] = {};
  for (int round = 0; round < 3; ++round) {
    std::thread t([&] { pg.allreduce(view(a, 4))->wait(); });
    t.join();
    pg.allreduce(view(a, 4))->wait();
  }
  EXPECT_EQ(pg.lastSeq(), 6u);
  EXPECT_TRUE(pg.aborts().empty());
}

TEST(IssueThreads, AnIssueCallThatThrowsEndsItsTurn) {
  // A refused argument throws from inside the issue call: the next thread may issue.
  FakeGroup pg;
  float a[4] = {};
  EXPECT_THROW(pg.allreduce(view(a, 4), {.timeout = std::chrono::milliseconds(-1)}),
               InvalidArgumentError);
  std::thread t([&] { pg.barrier()->wait(); });
  t.join();
  EXPECT_TRUE(pg.aborts().empty());
  EXPECT_EQ(pg.posts(), 1);
}

TEST(IssueThreads, AForkChildIsToldItForkedNotThatAParentThreadIssues) {
  // fork() while a thread is inside an issue call: the child's copy of the group names that
  // thread as issuing, but what the child must hear is that the group is its parent's.
  FakeGroup pg;
  float a[4] = {};
  pg.closeGate();
  std::thread first([&] { pg.allreduce(view(a, 4))->wait(); });
  ASSERT_TRUE(pg.awaitHeld());
  const pid_t child = ::fork();
  if (child == 0) {
    int code = 2;
    try {
      pg.allreduce(view(a, 4));
    } catch (const InvalidArgumentError& e) {
      code = std::string(e.what()).find("child it made with fork()") != std::string::npos ? 0 : 3;
    } catch (...) {
      code = 4;
    }
    ::_exit(code);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  pid_t done = 0;
  while ((done = ::waitpid(child, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  pg.openGate();
  first.join();
  ASSERT_EQ(done, child) << "the child did not end within 20 s";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "2: nothing thrown, 3: another InvalidArgumentError, 4: another exception";
  EXPECT_TRUE(pg.aborts().empty());
}

TEST(IssueThreads, ABatchOfSendsAndReceivesIsOneIssueCall) {
  FakeGroup pg;
  float a[4] = {};
  float b[4] = {};
  pg.closeGate();
  std::thread first([&] { pg.allreduce(view(a, 4))->wait(); });
  ASSERT_TRUE(pg.awaitHeld());
  std::vector<PointToPointOp> ops{{OpType::kSend, view(a, 4), 1, 0},
                                  {OpType::kRecv, view(b, 4), 1, 0}};
  EXPECT_THROW(pg.batchSendRecv(ops), InvalidArgumentError);
  pg.openGate();
  first.join();
  ASSERT_EQ(pg.aborts().size(), 1u);
  EXPECT_THAT(pg.aborts()[0], HasSubstr("send was issued by thread"));
}

}  // namespace
}  // namespace loom
