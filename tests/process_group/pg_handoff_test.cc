// The comm backend's hand-off ("the waiter runs it", comm_backend.h): which thread runs an
// operation, and that nothing else changes with it. Ranks are threads over one HashStore;
// each group runs over a RecordingContext, a comm::Context that forwards to the real one
// and notes which threads asked for its transport (every collective does, on the thread
// that runs it), and can hold the running thread at a gate.
//
// Every operation is an all-reduce whose result tells how often it ran: each rank adds its
// own value in place, so a second run would double the sum. Operations that ran out of
// order would pair mismatched sequence numbers across the ranks and fail or time out.
//
// The grace is 1 s (options() below): the worker then never takes a lone fresh operation
// during a test, so that an issue-then-wait runs on the waiting thread deterministically.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm_backend.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/gate.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Threads that ran collectives over one rank's context, and an optional gate that holds the
// running thread (inside the operation, before any byte moves) until it is opened.
class Recorder {
 public:
  void note() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads_.insert(std::this_thread::get_id());
    }
    gate_.pass();
  }
  std::set<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    threads_.clear();
    gate_.resetArrivals();
  }
  void closeGate() { gate_.close(); }
  void openGate() { gate_.open(); }
  // Waits until some thread reached note(); returns it (or a default id after `timeout`).
  std::thread::id waitForEntry(milliseconds timeout) {
    if (!gate_.awaitArrivals(1, timeout)) return {};
    std::lock_guard<std::mutex> lock(mu_);
    return *threads_.begin();
  }

 private:
  std::mutex mu_;
  std::set<std::thread::id> threads_;
  testing::Gate gate_;
};

class RecordingContext final : public comm::Context {
 public:
  RecordingContext(std::shared_ptr<comm::Context> inner, std::shared_ptr<Recorder> recorder)
      : inner_(std::move(inner)), recorder_(std::move(recorder)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  std::string transportSummary() const override { return inner_->transportSummary(); }
  comm::Transport& transport() override {
    recorder_->note();
    return inner_->transport();
  }
  void* scratch(size_t bytes, int slot) override { return inner_->scratch(bytes, slot); }

 private:
  std::shared_ptr<comm::Context> inner_;
  std::shared_ptr<Recorder> recorder_;
};

ProcessGroupOptions options(milliseconds timeout = milliseconds(20000)) {
  ProcessGroupOptions o;
  o.timeout = timeout;
  o.debug = DebugLevel::kOff;
  o.failureReportWindow = milliseconds(300);
  o.comm.graceUs = 1000000;
  return o;
}

std::shared_ptr<ProcessGroupComm> makeGroup(std::shared_ptr<Store> store, int rank, int size,
                                            const ProcessGroupOptions& o,
                                            std::shared_ptr<Recorder> recorder) {
  return std::make_shared<ProcessGroupComm>(
      "tcp", std::move(store), rank, size, o,
      [recorder](Store& s, int r, int n, const comm::ContextOptions& co) {
        return std::make_shared<RecordingContext>(comm::Context::create(s, r, n, co), recorder);
      });
}

BufferView view(int64_t* data, size_t n) {
  return BufferView{data, n, DType::kInt64, {}};
}

template <typename E, typename Fn>
std::string messageOf(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// Rank r contributes (r + 1) * k to element k of operation i (plus i), so every element's sum
// over 2 ranks is known, and a second run of the same operation would change it.
void fill(std::vector<int64_t>& buf, int rank, int i) {
  for (size_t k = 0; k < buf.size(); ++k) buf[k] = (rank + 1) * static_cast<int64_t>(k + 1) + i;
}
void expectSum(const std::vector<int64_t>& buf, int i, const std::string& what) {
  for (size_t k = 0; k < buf.size(); ++k) {
    const int64_t want = 3 * static_cast<int64_t>(k + 1) + 2 * i;
    ASSERT_EQ(buf[k], want) << what << " element " << k;
  }
}

TEST(ProcessGroupHandoff, WaitRunsAQueuedOperationOnTheWaitingThreadExactlyOnce) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    for (int i = 0; i < 20; ++i) {
      std::vector<int64_t> buf(7);
      fill(buf, rank, i);
      recorder->reset();
      auto work = pg->allreduce(view(buf.data(), buf.size()));
      EXPECT_TRUE(work->wait());
      expectSum(buf, i, "allreduce #" + std::to_string(i + 1));
      EXPECT_EQ(recorder->threads(), std::set<std::thread::id>{std::this_thread::get_id()})
          << "operation " << i + 1 << " did not run (only) on the waiting thread";
      EXPECT_TRUE(work->isSuccess());
      EXPECT_EQ(work->seq(), static_cast<uint64_t>(i + 1));
      // A second wait neither runs it again nor blocks.
      EXPECT_TRUE(work->wait());
      expectSum(buf, i, "allreduce #" + std::to_string(i + 1) + " after a second wait");
    }
    EXPECT_EQ(pg->lastSeq(), 20u);
  });
}

TEST(ProcessGroupHandoff, AnOperationNobodyWaitsForRunsOnTheWorker) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    // Waited operations first, so that the worker naps (the inline runs are recent).
    for (int i = 0; i < 3; ++i) {
      std::vector<int64_t> buf(3);
      fill(buf, rank, i);
      pg->allreduce(view(buf.data(), buf.size()))->wait();
    }
    // Then a burst nobody waits for: polling isCompleted() only, it still completes.
    recorder->reset();
    std::vector<std::vector<int64_t>> bufs(4, std::vector<int64_t>(5));
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 4; ++i) {
      fill(bufs[i], rank, i);
      works.push_back(pg->allreduce(view(bufs[i].data(), bufs[i].size())));
    }
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!works.back()->isCompleted() && Clock::now() < deadline) std::this_thread::yield();
    ASSERT_TRUE(works.back()->isCompleted()) << "un-waited operations did not run";
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(works[i]->isSuccess());
      expectSum(bufs[i], i, "un-waited allreduce " + std::to_string(i));
    }
    EXPECT_EQ(recorder->threads().count(std::this_thread::get_id()), 0u)
        << "an un-waited operation ran on the issuing thread";
  });
}

TEST(ProcessGroupHandoff, WaitingOnALaterOperationRunsTheQueueInIssueOrder) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    auto pg = makeGroup(store, rank, 2, options(), std::make_shared<Recorder>());
    for (int round = 0; round < 10; ++round) {
      std::vector<std::vector<int64_t>> bufs(4, std::vector<int64_t>(1 + round));
      std::vector<std::shared_ptr<Work>> works;
      for (int i = 0; i < 4; ++i) {
        fill(bufs[i], rank, i);
        works.push_back(pg->allreduce(view(bufs[i].data(), bufs[i].size())));
      }
      // Rank 0 waits on the last one only (whoever runs them, the worker or this thread,
      // runs them in order); rank 1 waits on each in turn.
      if (rank == 0) {
        EXPECT_TRUE(works[3]->wait());
        for (int i = 0; i < 3; ++i) EXPECT_TRUE(works[i]->isCompleted()) << "op " << i;
      } else {
        for (auto& w : works) EXPECT_TRUE(w->wait());
      }
      for (int i = 0; i < 4; ++i) {
        expectSum(bufs[i], i, "round " + std::to_string(round) + " op " + std::to_string(i));
      }
    }
  });
}

TEST(ProcessGroupHandoff, ConcurrentWaitersFromTwoThreadsRunEachOperationOnce) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    auto pg = makeGroup(store, rank, 2, options(), std::make_shared<Recorder>());
    for (int round = 0; round < 20; ++round) {
      std::vector<int64_t> a(3), b(4);
      fill(a, rank, 0);
      fill(b, rank, 1);
      auto workA = pg->allreduce(view(a.data(), a.size()));
      auto workB = pg->allreduce(view(b.data(), b.size()));
      // Two threads wait at once, in either order relative to each other.
      std::thread other([&] { EXPECT_TRUE((round % 2 ? workA : workB)->wait()); });
      EXPECT_TRUE((round % 2 ? workB : workA)->wait());
      other.join();
      expectSum(a, 0, "round " + std::to_string(round) + " a");
      expectSum(b, 1, "round " + std::to_string(round) + " b");
    }
  });
}

TEST(ProcessGroupHandoff, AbortFailsAnOperationRunningInlineInItsWaiter) {
  auto store = std::make_shared<HashStore>();
  std::promise<void> rank0Done;
  auto rank0DoneFuture = rank0Done.get_future().share();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    if (rank == 1) {
      // Never joins: rank 0's all-reduce blocks until it is aborted.
      ASSERT_EQ(rank0DoneFuture.wait_for(std::chrono::seconds(30)), std::future_status::ready);
      return;
    }
    std::vector<int64_t> buf(4);
    fill(buf, rank, 0);
    auto work = pg->allreduce(view(buf.data(), buf.size()));
    std::thread aborter([&] {
      // Once the operation runs (on the waiter), abort from here.
      const std::thread::id runner = recorder->waitForEntry(milliseconds(20000));
      EXPECT_NE(runner, std::thread::id{}) << "the all-reduce never started";
      pg->abort("stopped by the test");
    });
    const auto start = Clock::now();
    const std::string what = messageOf<IoError>([&] { work->wait(); });
    aborter.join();
    EXPECT_THAT(what, HasSubstr("stopped by the test"));
    EXPECT_THAT(what, HasSubstr("allreduce#1"));
    EXPECT_EQ(recorder->threads(), std::set<std::thread::id>{std::this_thread::get_id()});
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
    EXPECT_TRUE(pg->isBroken());
    // Queued-after and future operations fail at once.
    EXPECT_THAT(messageOf<IoError>([&] { pg->allreduce(view(buf.data(), 1))->wait(); }),
                HasSubstr("the group failed earlier"));
    rank0Done.set_value();
  });
}

TEST(ProcessGroupHandoff, ATimeoutFiresForAnOperationRunningInline) {
  auto store = std::make_shared<HashStore>();
  std::promise<void> rank0Done;
  auto rank0DoneFuture = rank0Done.get_future().share();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(milliseconds(600)), recorder);
    if (rank == 1) {
      ASSERT_EQ(rank0DoneFuture.wait_for(std::chrono::seconds(30)), std::future_status::ready);
      return;
    }
    std::vector<int64_t> buf(4);
    auto work = pg->allreduce(view(buf.data(), buf.size()));
    const auto start = Clock::now();
    const std::string what = messageOf<TimeoutError>([&] { work->wait(); });
    const auto took = Clock::now() - start;
    EXPECT_THAT(what, HasSubstr("allreduce#1"));
    EXPECT_THAT(what, HasSubstr("rank 1"));
    EXPECT_EQ(recorder->threads(), std::set<std::thread::id>{std::this_thread::get_id()});
    // Within 1.75x the timeout (comm_backend.h), with slack for a loaded machine.
    EXPECT_LT(took, milliseconds(600 * 2 + 2000));
    EXPECT_GE(took, milliseconds(500));
    rank0Done.set_value();
  });
}

TEST(ProcessGroupHandoff, ABoundedWaitNeverRunsInlineAndItsDeadlineHolds) {
  auto store = std::make_shared<HashStore>();
  std::promise<void> rank0Done;
  auto rank0DoneFuture = rank0Done.get_future().share();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    if (rank == 1) {
      ASSERT_EQ(rank0DoneFuture.wait_for(std::chrono::seconds(30)), std::future_status::ready);
      return;
    }
    std::vector<int64_t> buf(4);
    auto work = pg->allreduce(view(buf.data(), buf.size()));
    const auto start = Clock::now();
    // The worker starts the operation at once for a sleeping waiter (no grace), and the
    // waiter's own 200 ms deadline ends the wait although the operation's is 20 s.
    EXPECT_THAT(messageOf<TimeoutError>([&] { work->wait(milliseconds(200)); }),
                HasSubstr("allreduce#1 did not complete within"));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    EXPECT_TRUE(pg->isBroken());
    const std::thread::id runner = recorder->waitForEntry(milliseconds(20000));
    EXPECT_NE(runner, std::thread::id{});
    EXPECT_NE(runner, std::this_thread::get_id());
    EXPECT_THROW(work->wait(), IoError);
    rank0Done.set_value();
  });
}

TEST(ProcessGroupHandoff, DestructionRunsTheQueuedOperations) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    std::vector<std::vector<int64_t>> bufs(5, std::vector<int64_t>(6));
    std::vector<std::shared_ptr<Work>> works;
    {
      auto pg = makeGroup(store, rank, 2, options(), std::make_shared<Recorder>());
      for (int i = 0; i < 5; ++i) {
        fill(bufs[i], rank, i);
        works.push_back(pg->allreduce(view(bufs[i].data(), bufs[i].size())));
      }
    }  // the destructor drains the queue: nobody waited
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(works[i]->isCompleted()) << "op " << i;
      EXPECT_TRUE(works[i]->isSuccess()) << "op " << i;
      expectSum(bufs[i], i, "op " + std::to_string(i));
    }
  });
}

TEST(ProcessGroupHandoff, DestructionWithALoneFreshOperationDoesNotWaitForTheGrace) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    std::vector<int64_t> buf(2);
    fill(buf, rank, 0);
    std::shared_ptr<Work> work;
    auto pg = makeGroup(store, rank, 2, options(), std::make_shared<Recorder>());
    const auto start = Clock::now();
    work = pg->allreduce(view(buf.data(), buf.size()));
    pg.reset();
    EXPECT_TRUE(work->isSuccess());
    expectSum(buf, 0, "lone op");
    // The grace is 1 s in this binary; stopping skips it.
    EXPECT_LT(Clock::now() - start, milliseconds(900));
  });
}

TEST(ProcessGroupHandoff, AFailedPeerFailsTheInlineOperationNamingItsReport) {
  auto store = std::make_shared<HashStore>();
  std::promise<void> rank1Aborted;
  auto rank1AbortedFuture = rank1Aborted.get_future().share();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    std::vector<int64_t> buf(4);
    fill(buf, rank, 0);
    if (rank == 1) {
      pg->abort("rank 1 gives up");
      // The worker publishes the report and closes the connections.
      rank1Aborted.set_value();
      EXPECT_THROW(pg->allreduce(view(buf.data(), buf.size()))->wait(), IoError);
      return;
    }
    ASSERT_EQ(rank1AbortedFuture.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    const std::string what =
        messageOf<IoError>([&] { pg->allreduce(view(buf.data(), buf.size()))->wait(); });
    EXPECT_THAT(what, HasSubstr("rank 0"));
    EXPECT_THAT(what, HasSubstr("allreduce#1"));
    EXPECT_THAT(what, HasSubstr("rank 1 gives up"));
    EXPECT_EQ(recorder->threads(), std::set<std::thread::id>{std::this_thread::get_id()});
    EXPECT_TRUE(pg->isBroken());
  });
}

// With no grace and no napping the worker races every waiter for every operation: mixed
// issue/wait patterns must still run each operation once, in order.
TEST(ProcessGroupHandoff, WorkerAndWaitersRacingRunEachOperationOnceInOrder) {
  ProcessGroupOptions racing = options();
  racing.comm.graceUs = 0;
  racing.comm.napUs = 0;
  auto store = std::make_shared<HashStore>();
  std::string failure;
  try {
    testing::runThreadRanks(2, [&](int rank) {
      auto pg = makeGroup(store, rank, 2, racing, std::make_shared<Recorder>());
      for (int round = 0; round < 150; ++round) {
        const int n = 1 + round % 3;
        std::vector<std::vector<int64_t>> bufs(n, std::vector<int64_t>(2 + round % 5));
        std::vector<std::shared_ptr<Work>> works;
        for (int i = 0; i < n; ++i) {
          fill(bufs[i], rank, i);
          works.push_back(pg->allreduce(view(bufs[i].data(), bufs[i].size())));
          if ((round + rank) % 4 == 0) std::this_thread::yield();
        }
        if ((round + rank) % 2) {
          EXPECT_TRUE(works.back()->wait());
        }
        for (auto& w : works) EXPECT_TRUE(w->wait());
        for (int i = 0; i < n; ++i) {
          expectSum(bufs[i], i, "round " + std::to_string(round) + " op " + std::to_string(i));
        }
      }
    });
  } catch (const std::exception& e) {
    failure = e.what();
  }
  EXPECT_EQ(failure, "");
}

// A lone collective is claimed by its waiter without the queue lock and stays at the head of
// the queue while it runs (comm_backend.h, "Direct operations"). HeldDirect issues one (an
// all-reduce of `n` elements, filled as operation 0), has it waited for on a thread of its own
// and holds it inside the transport (the recorder's gate) until the test opens the gate.
class HeldDirect {
 public:
  HeldDirect(ProcessGroup& pg, Recorder& recorder, int rank, size_t n)
      : buf(n), recorder_(recorder) {
    fill(buf, rank, 0);
    recorder_.closeGate();
    work = pg.allreduce(view(buf.data(), buf.size()));
    waiter_ = std::thread([this] { EXPECT_TRUE(work->wait()); });
    runner = recorder_.waitForEntry(milliseconds(20000));
  }
  ~HeldDirect() { release(); }
  // Opens the gate and joins the waiting thread.
  void release() {
    recorder_.openGate();
    if (waiter_.joinable()) waiter_.join();
  }

  std::vector<int64_t> buf;
  std::shared_ptr<Work> work;
  std::thread::id runner;  // the thread that entered the transport (default: none did)

 private:
  Recorder& recorder_;
  std::thread waiter_;
};

// Nothing issued behind a running direct operation may start before it completes.
TEST(ProcessGroupHandoff, AnOperationBehindADirectOneWaitsForIt) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    HeldDirect held(*pg, *recorder, rank, 5);
    ASSERT_NE(held.runner, std::thread::id{}) << "the first all-reduce never started";
    std::vector<int64_t> b(3);
    fill(b, rank, 1);
    auto workB = pg->allreduce(view(b.data(), b.size()));  // queued behind the running one
    std::atomic<bool> bDone{false};
    std::thread waiterB([&] {
      EXPECT_TRUE(workB->wait());
      bDone = true;
    });
    std::this_thread::sleep_for(milliseconds(200));
    EXPECT_FALSE(bDone.load()) << "the second all-reduce finished while the first was held";
    EXPECT_FALSE(held.work->isCompleted());
    EXPECT_EQ(recorder->threads().size(), 1u) << "the second all-reduce started too early";
    held.release();
    waiterB.join();
    expectSum(held.buf, 0, "direct op");
    expectSum(b, 1, "op behind it");
  });
}

TEST(ProcessGroupHandoff, OperationsQueuedBehindADirectOneRunOnTheWorker) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    HeldDirect held(*pg, *recorder, rank, 4);
    ASSERT_NE(held.runner, std::thread::id{}) << "the first all-reduce never started";
    // A burst behind it that nobody waits for: the worker must run it once A completed.
    std::vector<std::vector<int64_t>> bufs(3, std::vector<int64_t>(6));
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 3; ++i) {
      fill(bufs[i], rank, i + 1);
      works.push_back(pg->allreduce(view(bufs[i].data(), bufs[i].size())));
    }
    held.release();
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!works.back()->isCompleted() && Clock::now() < deadline) std::this_thread::yield();
    ASSERT_TRUE(works.back()->isCompleted()) << "the burst behind a direct operation never ran";
    expectSum(held.buf, 0, "direct op");
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(works[i]->isSuccess());
      expectSum(bufs[i], i + 1, "burst op " + std::to_string(i));
    }
    const auto threads = recorder->threads();
    EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u) << "the issuing thread ran the burst";
    EXPECT_EQ(threads.size(), 2u) << "the burst did not run on the worker alone";
    EXPECT_EQ(threads.count(held.runner), 1u);
  });
}

// The last group reference goes while another thread runs a direct operation without holding
// the group: the destructor must wait for it (and the runner must not touch the group after).
TEST(ProcessGroupHandoff, DestroyingTheGroupWaitsForADirectOperationRunningElsewhere) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    HeldDirect held(*pg, *recorder, rank, 9);
    ASSERT_NE(held.runner, std::thread::id{}) << "the all-reduce never started";
    std::thread opener([&] {
      std::this_thread::sleep_for(milliseconds(200));
      recorder->openGate();
    });
    pg.reset();
    EXPECT_TRUE(held.work->isCompleted()) << "the group was destroyed under a running operation";
    opener.join();
    held.release();
    EXPECT_TRUE(held.work->isSuccess());
    expectSum(held.buf, 0, "direct op");
  });
}

// A direct operation's Work holds no reference to its group: a bounded wait finds the group
// through the registry (to wake the worker), and may still be waiting when the last group
// reference goes. The destructor runs the operation to completion on the worker and the
// waiter returns with the result, never touching the destroyed group.
TEST(ProcessGroupHandoff, ABoundedWaiterOfADirectOperationMayOutliveTheGroup) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(2, [&](int rank) {
    auto recorder = std::make_shared<Recorder>();
    auto pg = makeGroup(store, rank, 2, options(), recorder);
    std::vector<int64_t> buf(7);
    fill(buf, rank, 0);
    recorder->closeGate();
    auto work = pg->allreduce(view(buf.data(), buf.size()));  // lone: direct
    std::thread::id waiterId;
    std::thread waiter([&] {
      waiterId = std::this_thread::get_id();
      EXPECT_TRUE(work->wait(milliseconds(20000)));
    });
    // The bounded wait woke the worker at once (the grace is 1 s in these options).
    const std::thread::id runner = recorder->waitForEntry(milliseconds(900));
    ASSERT_NE(runner, std::thread::id{}) << "the bounded wait did not start the worker";
    std::thread opener([&] {
      std::this_thread::sleep_for(milliseconds(200));
      recorder->openGate();
    });
    std::weak_ptr<ProcessGroup> alive = pg;
    // The last reference, unless the waiter still holds the one its look-up returned for a
    // moment (then the group goes when the waiter drops it).
    pg.reset();
    waiter.join();
    EXPECT_TRUE(alive.expired()) << "a Work kept its group alive";
    EXPECT_TRUE(work->isCompleted());
    opener.join();
    EXPECT_NE(runner, waiterId) << "a bounded wait ran the operation inline";
    EXPECT_TRUE(work->isSuccess());
    expectSum(buf, 0, "direct op");
    // A finished Work answers any wait without its group.
    EXPECT_TRUE(work->wait(milliseconds(1)));
    EXPECT_TRUE(work->wait());
  });
}

TEST(ProcessGroupHandoff, AHandoffSettingOutOfRangeIsNamed) {
  auto store = std::make_shared<HashStore>();
  ProcessGroupOptions o = options();
  o.comm.napUs = -1;
  const std::string what = messageOf<InvalidArgumentError>(
      [&] { makeGroup(store, 0, 1, o, std::make_shared<Recorder>()); });
  EXPECT_THAT(what, HasSubstr("options.comm.napUs = -1 is out of range"));
  EXPECT_THAT(what, HasSubstr("microseconds"));
}

}  // namespace
}  // namespace loom
