// The NCCL backend's watchdog (process_group/src/nccl/nccl_watchdog.h) over a fake device, no
// GPU: operations complete in order and the flight record gets their start and end; an
// operation past its deadline, an asynchronous communicator error and a failed event each abort
// the device once, fail every pending operation in the record and call the failure handler.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "diagnostics/flight_recorder.h"
#include "nccl/nccl_watchdog.h"

namespace loom::nccl_detail {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// Events are ints; the test sets their status. Thread-safe.
class FakeDevice final : public WatchdogDevice {
 public:
  Status query(const std::shared_ptr<void>& handle, std::string& error) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int id = *static_cast<int*>(handle.get());
    if (failed_.count(id)) {
      error = "an illegal memory access was encountered";
      return Status::kFailed;
    }
    return done_.count(id) ? Status::kDone : Status::kPending;
  }
  std::string asyncError() override {
    std::lock_guard<std::mutex> lock(mu_);
    return async_;
  }
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(reason);
  }

  void complete(int id) {
    std::lock_guard<std::mutex> lock(mu_);
    done_[id] = true;
  }
  void failEvent(int id) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_[id] = true;
  }
  void setAsync(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu_);
    async_ = e;
  }
  std::vector<std::string> aborts() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborts_;
  }

 private:
  std::mutex mu_;
  std::map<int, bool> done_, failed_;
  std::string async_;
  std::vector<std::string> aborts_;
};

std::shared_ptr<void> event(int id) {
  return std::make_shared<int>(id);
}

OpDesc allreduce(uint64_t seq) {
  OpDesc op;
  op.type = OpType::kAllreduce;
  op.dtype = DType::kFloat32;
  op.count = 1024;
  op.seq = seq;
  return op;
}

// What the failure handler saw, and a wait for it (bounded).
struct Failures {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::string, bool>> seen;
  Watchdog::FailureHandler handler() {
    return [this](const std::string& reason, bool timedOut, const OpDesc*) {
      std::lock_guard<std::mutex> lock(mu);
      seen.emplace_back(reason, timedOut);
      cv.notify_all();
    };
  }
  bool waitForOne() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return !seen.empty(); });
  }
};

// Polls `cond` until true or 30 s pass (the watchdog runs on its own thread).
template <class F>
bool eventually(F&& cond) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST(NcclWatchdog, CompletedOperationsGetStartAndEndInTheRecord) {
  auto device = std::make_shared<FakeDevice>();
  diag::FlightRecorder recorder(16, comm::Algorithm::kAuto);
  Failures failures;
  Watchdog dog(device, &recorder, "rank 0", failures.handler());
  for (int i = 1; i <= 3; ++i) {
    dog.track(event(i), recorder.recordIssue(allreduce(i)), "allreduce#" + std::to_string(i),
              milliseconds(60000));
  }
  // Completes out of order on purpose: the stream's order is the tracking order, so #3's event
  // is only looked at once #1 and #2 are done.
  device->complete(3);
  device->complete(1);
  device->complete(2);
  ASSERT_TRUE(eventually([&] { return dog.pending() == 0; }));
  const auto entries = recorder.snapshot();
  ASSERT_EQ(entries.size(), 3u);
  for (const auto& e : entries) {
    EXPECT_EQ(e.state, diag::OpState::kDone) << e.describe();
    EXPECT_GT(e.startUs, 0) << e.describe();
    EXPECT_GE(e.endUs, e.startUs) << e.describe();
  }
  EXPECT_TRUE(device->aborts().empty());
  EXPECT_EQ(dog.failure(), "");
}

TEST(NcclWatchdog, DeadlineAbortsOnceAndFailsEveryPendingOperation) {
  auto device = std::make_shared<FakeDevice>();
  diag::FlightRecorder recorder(16, comm::Algorithm::kAuto);
  Failures failures;
  Watchdog dog(device, &recorder, "rank 1", failures.handler());
  dog.track(event(1), recorder.recordIssue(allreduce(1)), "allreduce#1 (4096 bytes)",
            milliseconds(60000));
  dog.track(event(2), recorder.recordIssue(allreduce(2)), "allreduce#2 (4096 bytes)",
            milliseconds(20));
  // #1 never completes, so #2 never starts; #2's deadline still aborts (nobody waits on it).
  ASSERT_TRUE(failures.waitForOne());
  EXPECT_THAT(failures.seen[0].first,
              HasSubstr("rank 1: allreduce#2 (4096 bytes) timed out after 20 ms (NCCL watchdog"));
  EXPECT_TRUE(failures.seen[0].second);
  ASSERT_EQ(device->aborts().size(), 1u);
  EXPECT_EQ(device->aborts()[0], failures.seen[0].first);
  for (const auto& e : recorder.snapshot()) EXPECT_EQ(e.state, diag::OpState::kFailed);
  EXPECT_EQ(dog.pending(), 0u);
  // After the failure, a new operation is recorded as failed at once.
  dog.track(event(3), recorder.recordIssue(allreduce(3)), "allreduce#3", milliseconds(60000));
  EXPECT_EQ(recorder.snapshot().back().state, diag::OpState::kFailed);
  EXPECT_EQ(dog.pending(), 0u);
  EXPECT_EQ(device->aborts().size(), 1u);
}

TEST(NcclWatchdog, AsyncErrorAndFailedEventAbort) {
  {
    auto device = std::make_shared<FakeDevice>();
    Failures failures;
    Watchdog dog(device, nullptr, "rank 2", failures.handler());
    dog.track(event(1), 0, "broadcast#1", milliseconds(60000));
    device->setAsync("remote process exited or there was a network error");
    ASSERT_TRUE(failures.waitForOne());
    EXPECT_THAT(failures.seen[0].first,
                HasSubstr("rank 2: the NCCL communicator failed: remote process exited"));
    EXPECT_FALSE(failures.seen[0].second);
    EXPECT_EQ(device->aborts().size(), 1u);
  }
  {
    auto device = std::make_shared<FakeDevice>();
    Failures failures;
    Watchdog dog(device, nullptr, "rank 3", failures.handler());
    dog.track(event(7), 0, "allgather#4", milliseconds(60000));
    device->failEvent(7);
    ASSERT_TRUE(failures.waitForOne());
    EXPECT_THAT(failures.seen[0].first,
                HasSubstr("rank 3: allgather#4 failed on the device: an illegal memory access"));
    EXPECT_EQ(device->aborts().size(), 1u);
  }
}

}  // namespace
}  // namespace loom::nccl_detail
