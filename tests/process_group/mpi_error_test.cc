// The mpi backend's error paths, under mpirun (2 ranks; see CMakeLists.txt): arguments MPI
// cannot take (InvalidArgumentError on the caller's thread, nothing issued), MPI errors turned
// into IoError with MPI's error string (a truncated receive), a receive of the wrong size, an
// operation past its deadline (TimeoutError, the group broken, the next operation failing at
// once with the cause), abort() and a bounded Work::wait, and monitoredBarrier through a
// FileStore. Each scenario breaks a group of its own; the ranks meet again on a healthy one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/process_group/diagnostics.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"
#include "mpi_test_support.h"

namespace loom::mpi_testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::shared_ptr<ProcessGroup> freshGroup(std::chrono::milliseconds timeout,
                                         std::shared_ptr<Store> store = nullptr) {
  ProcessGroupOptions options;
  options.timeout = timeout;
  return createProcessGroup("mpi", std::move(store), world().rank(), world().size(), options);
}

template <typename E, typename Fn>
std::string messageOf(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(another exception: ") + e.what() + ")";
  }
  return "(nothing thrown)";
}

TEST(MpiErrors, ArgumentsMpiCannotTake) {
  ProcessGroup& pg = world();
  const int peer = (pg.rank() + 1) % pg.size();
  int32_t x = 0;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg.send(view(&x, 1), peer, 1ull << 40); }),
              HasSubstr("larger than MPI's largest tag (MPI_TAG_UB"));
  // Counts are C ints: nothing is issued, so the buffer behind the view is never touched.
  const BufferView huge{&x, size_t{1} << 31, DType::kUInt8, Device::cpu()};
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg.allreduce(huge); }),
              HasSubstr("more than MPI's C int counts take (2147483647)"));
  const BufferView gpu{&x, 1, DType::kInt32, Device::cuda(0)};
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg.allreduce(gpu); }),
              HasSubstr("the mpi backend takes CPU buffers"));
  bool flag = true;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                pg.allreduce(BufferView{&flag, 1, DType::kBool, Device::cpu()},
                             {.reduceOp = ReduceOp::kAvg});
              }),
              HasSubstr("avg is not defined for dtype bool; use sum (logical or)"));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg.monitoredBarrier(); }),
              HasSubstr("created without one"));
  EXPECT_THAT(
      messageOf<InvalidArgumentError>([&] { createProcessGroup("mpi", nullptr, peer, pg.size()); }),
      HasSubstr("MPI_COMM_WORLD says rank " + std::to_string(pg.rank())));
  EXPECT_FALSE(pg.isBroken());
  EXPECT_EQ(pg.lastSeq(), 0u) << "a rejected operation takes no sequence number";
}

TEST(MpiErrors, TruncatedReceiveIsAnIoErrorWithMpisMessage) {
  auto g = freshGroup(30s);
  std::vector<int32_t> buf(10, 1);
  if (g->rank() == 0) {
    EXPECT_TRUE(g->send(view(buf.data(), 10), 1, /*tag=*/3)->wait());
  } else if (g->rank() == 1) {
    auto w = g->recv(view(buf.data(), 5), 0, 3);
    const std::string what = messageOf<IoError>([&] { w->wait(); });
    EXPECT_THAT(what, HasSubstr("recv#1 from rank 0"));
    EXPECT_THAT(what, HasSubstr("MPI_ERR_TRUNCATE"));
    EXPECT_TRUE(g->isBroken());
    // Every later operation fails at once, naming the cause.
    const std::string next =
        messageOf<IoError>([&] { g->recv(view(buf.data(), 5), 0, 4)->wait(); });
    EXPECT_THAT(next, HasSubstr("was not run: the group failed earlier"));
    EXPECT_THAT(next, HasSubstr("MPI_ERR_TRUNCATE"));
  }
  world().barrier()->wait();
}

TEST(MpiErrors, ShortMessageNamesBothCounts) {
  auto g = freshGroup(30s);
  std::vector<int32_t> buf(5, 1);
  if (g->rank() == 0) {
    EXPECT_TRUE(g->send(view(buf.data(), 3), 1, 9)->wait());
  } else if (g->rank() == 1) {
    const std::string what =
        messageOf<IoError>([&] { g->recv(view(buf.data(), 5), 0, 9)->wait(); });
    EXPECT_THAT(what, HasSubstr("received 3 elements (tag 9) from rank 0 but its buffer holds 5"));
  }
  world().barrier()->wait();
}

TEST(MpiErrors, TimeoutBreaksTheGroup) {
  // Rank 0's allreduce on `g` passes its deadline while rank 1 waits for rank 0's word on the
  // world group; then rank 1 joins the allreduce, which completes the request MPI still holds.
  auto g = freshGroup(1000ms);
  // MPI may write a timed-out collective's buffer until every rank completed it: this one
  // outlives the test.
  static std::vector<float> buf;
  buf.assign(100, 1.0f);
  if (g->rank() == 0) {
    auto w = g->allreduce(view(buf.data(), buf.size()));
    const std::string what = messageOf<TimeoutError>([&] { w->wait(); });
    EXPECT_THAT(what, HasSubstr("allreduce#1 timed out after 1000 ms"));
    EXPECT_THAT(what, HasSubstr("MPI request is still pending"));
    EXPECT_TRUE(g->isBroken());
    const std::string next = messageOf<IoError>([&] { g->barrier()->wait(); });
    EXPECT_THAT(next, HasSubstr("barrier#2 was not run: the group failed earlier"));
    EXPECT_THAT(next, HasSubstr("allreduce#1 timed out"));
    int32_t go = 1;
    world().send(view(&go, 1), 1, 77)->wait();
  } else if (g->rank() == 1) {
    int32_t go = 0;
    world().recv(view(&go, 1), 0, 77)->wait();
    EXPECT_TRUE(g->allreduce(view(buf.data(), buf.size()))->wait());
    EXPECT_EQ(buf[0], 2.0f);
  }
  world().barrier()->wait();
}

TEST(MpiErrors, NewGroupTimesOutWhenARankNeverCalls) {
  auto g = freshGroup(500ms);
  if (g->rank() == 0) {
    const std::string what = messageOf<TimeoutError>([&] { newGroup(*g, {0}); });
    EXPECT_THAT(what, HasSubstr("newGroup #1: waiting for every rank of the parent group to call "
                                "newGroup did not complete within"));
    int32_t done = 1;
    world().send(view(&done, 1), 1, 78)->wait();
  } else if (g->rank() == 1) {
    int32_t done = 0;
    world().recv(view(&done, 1), 0, 78)->wait();
  }
  world().barrier()->wait();
}

TEST(MpiErrors, AbortFailsARunningReceive) {
  auto g = freshGroup(60s);
  if (g->rank() == 0) {
    int32_t x = 0;
    auto w = g->recv(view(&x, 1), 1, 1);  // rank 1 never sends
    g->abort("test abort");
    const std::string what = messageOf<IoError>([&] { w->wait(); });
    EXPECT_THAT(what, HasSubstr("aborted: test abort"));
    EXPECT_TRUE(g->isBroken());
  }
  world().barrier()->wait();
}

TEST(MpiErrors, AbortFromAnotherThreadFailsARunningCollective) {
  // Rank 0's barrier on `g` cannot complete (rank 1 joins only after rank 0's word); another
  // thread aborts the group; then rank 1 joins, which completes the barrier MPI still holds.
  auto g = freshGroup(60s);
  if (g->rank() == 0) {
    auto w = g->barrier();
    // The flight recorder says when the worker has started it (posted to MPI).
    const Deadline deadline(30s);
    while (diag::parseDump(g->dumpFlightRecord(), "flight record").entries.back().state !=
           diag::OpState::kRunning) {
      ASSERT_FALSE(deadline.expired()) << "barrier#1 never started";
      std::this_thread::sleep_for(1ms);
    }
    std::thread aborter([&] { g->abort("abort from another thread"); });
    const std::string what = messageOf<IoError>([&] { w->wait(); });
    aborter.join();
    EXPECT_THAT(what, HasSubstr("barrier#1 did not complete: the group failed"));
    EXPECT_THAT(what, HasSubstr("aborted: abort from another thread"));
    int32_t go = 1;
    world().send(view(&go, 1), 1, 79)->wait();
  } else if (g->rank() == 1) {
    int32_t go = 0;
    world().recv(view(&go, 1), 0, 79)->wait();
    EXPECT_TRUE(g->barrier()->wait());
  }
  world().barrier()->wait();
}

TEST(MpiErrors, BoundedWaitAbortsTheGroup) {
  auto g = freshGroup(60s);
  if (g->rank() == 0) {
    int32_t x = 0;
    auto w = g->recv(view(&x, 1), 1, 1);  // rank 1 never sends
    const std::string what = messageOf<TimeoutError>([&] { w->wait(200ms); });
    EXPECT_THAT(what, HasSubstr("recv#1"));
    EXPECT_TRUE(g->isBroken());
  }
  world().barrier()->wait();
}

TEST(MpiErrors, MonitoredBarrierThroughAFileStore) {
  // Rank 0 picks the store's path and broadcasts it.
  std::unique_ptr<testing::TempDir> dir;
  char path[256] = {};
  if (world().rank() == 0) {
    dir = std::make_unique<testing::TempDir>();
    std::snprintf(path, sizeof(path), "%s/store", dir->path().c_str());
  }
  world().broadcast(view(reinterpret_cast<uint8_t*>(path), sizeof(path)), {.root = 0})->wait();
  auto store = std::make_shared<FileStore>(path);
  auto g = freshGroup(10s, store);
  EXPECT_TRUE(g->monitoredBarrier()->wait());
  // Rank 1 stays away from the second one: rank 0 names it.
  if (g->rank() == 0) {
    const std::string what = messageOf<TimeoutError>(
        [&] { g->monitoredBarrier({.timeout = 500ms, .waitAllRanks = true})->wait(); });
    EXPECT_THAT(what, HasSubstr("monitored_barrier#2 timed out after 500 ms: rank 1 did not "
                                "arrive"));
  }
  world().barrier()->wait();
  g.reset();
  store.reset();
  world().barrier()->wait();  // before rank 0 removes the store's directory
}

// A FileStore every rank opens: rank 0 picks its path in a temporary directory and broadcasts
// it. close() drops the store on every rank before rank 0 removes the directory.
class SharedFileStore {
 public:
  SharedFileStore() {
    char path[256] = {};
    if (world().rank() == 0) {
      dir_ = std::make_unique<testing::TempDir>();
      std::snprintf(path, sizeof(path), "%s/store", dir_->path().c_str());
    }
    world().broadcast(view(reinterpret_cast<uint8_t*>(path), sizeof(path)), {.root = 0})->wait();
    store = std::make_shared<FileStore>(path);
  }
  void close() {
    store.reset();
    world().barrier()->wait();
    dir_.reset();
  }

  std::shared_ptr<FileStore> store;

 private:
  std::unique_ptr<testing::TempDir> dir_;
};

std::shared_ptr<ProcessGroup> detailGroup(std::shared_ptr<Store> store) {
  ProcessGroupOptions options;
  options.timeout = 20s;
  options.debug = DebugLevel::kDetail;
  return createProcessGroup("mpi", std::move(store), world().rank(), world().size(), options);
}

// "1, 2, 3": the ranks other than 0.
std::string otherRanks() {
  std::string out;
  for (int r = 1; r < world().size(); ++r) out += (r > 1 ? ", " : "") + std::to_string(r);
  return out;
}

// LOOM_DEBUG=DETAIL with a store shared by the ranks: rank 0 reduces with sum, the others with
// max; every rank's allreduce fails before anything reaches MPI, with every signature and the
// ranks that called it; the group stays usable.
TEST(MpiDiagnostics, DetailModeMismatchThroughTheStoreFailsEveryRankWithBothSignatures) {
  SharedFileStore shared;
  auto g = detailGroup(shared.store);
  std::vector<int32_t> buf(4, 1);
  const ReduceOp op = g->rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax;
  const std::string what = messageOf<InvalidArgumentError>(
      [&] { g->allreduce(view(buf.data(), buf.size()), {.reduceOp = op})->wait(); });
  EXPECT_THAT(what, HasSubstr("rank " + std::to_string(g->rank()) +
                              ": collective #1 does not match across ranks (LOOM_DEBUG=DETAIL)"));
  EXPECT_THAT(what, HasSubstr("allreduce(dtype=int32, count=4, op=sum)#1 on ranks [0]"));
  EXPECT_THAT(
      what, HasSubstr("allreduce(dtype=int32, count=4, op=max)#1 on ranks [" + otherRanks() + "]"));
  EXPECT_FALSE(g->isBroken());
  // Skipped on every rank: the next collective lines up and sees the untouched buffers.
  ASSERT_TRUE(g->allreduce(view(buf.data(), buf.size()))->wait());
  EXPECT_EQ(buf[0], g->size());
  g.reset();
  shared.close();
}

// The same without a store (mpirun without MASTER_ADDR): the signatures travel by an MPI
// all-gather. Rank 0 calls allreduce, the others broadcast.
TEST(MpiDiagnostics, DetailModeMismatchWithoutAStoreGoesThroughMpi) {
  auto g = detailGroup(nullptr);
  std::vector<int32_t> buf(4, 1);
  const std::string what = messageOf<InvalidArgumentError>([&] {
    if (g->rank() == 0) {
      g->allreduce(view(buf.data(), buf.size()))->wait();
    } else {
      g->broadcast(view(buf.data(), buf.size()), {.root = 0})->wait();
    }
  });
  EXPECT_THAT(what, HasSubstr("collective #1 does not match across ranks (LOOM_DEBUG=DETAIL)"));
  EXPECT_THAT(what, HasSubstr("allreduce(dtype=int32, count=4, op=sum)#1 on ranks [0]"));
  EXPECT_THAT(
      what, HasSubstr("broadcast(dtype=int32, count=4, root=0)#1 on ranks [" + otherRanks() + "]"));
  EXPECT_FALSE(g->isBroken());
  ASSERT_TRUE(g->barrier()->wait());
  g.reset();
  world().barrier()->wait();
}

// With a shared store a timeout carries the analysis of every rank's flight record: rank 0's
// allreduce times out while the other ranks have issued nothing on the group (their listeners
// answer with their records), and the error says so. Then they join the allreduce, which
// completes the request MPI still holds.
TEST(MpiDiagnostics, TimeoutCarriesTheDiagnosisThroughTheStore) {
  SharedFileStore shared;
  ProcessGroupOptions options;
  // The other ranks' listeners get 3 s to answer (the report window, at most timeout / 2): a
  // loaded machine must not turn their records into "sent no flight record".
  options.timeout = 6000ms;
  options.failureReportWindow = 3000ms;
  auto g = createProcessGroup("mpi", shared.store, world().rank(), world().size(), options);
  // MPI may write a timed-out collective's buffer until every rank completed it.
  static std::vector<float> buf;
  buf.assign(100, 1.0f);
  if (g->rank() == 0) {
    auto w = g->allreduce(view(buf.data(), buf.size()));
    const std::string what = messageOf<TimeoutError>([&] { w->wait(); });
    EXPECT_THAT(what, HasSubstr("allreduce#1 timed out after 6000 ms"));
    // Rank 1 waits in the world group's recv of the go-ahead below: the analysis says so.
    EXPECT_THAT(what, HasSubstr("diagnosis: rank 1 never entered allreduce#1 of this group: it is "
                                "blocked in recv#"));
    EXPECT_THAT(what, HasSubstr("from rank 0 of another unnamed group of"));
    EXPECT_THAT(what, HasSubstr("ranks that sent no failure report"));
    EXPECT_TRUE(g->isBroken());
    // The group's cause is the whole story too.
    EXPECT_THAT(messageOf<IoError>([&] { g->barrier()->wait(); }),
                HasSubstr("diagnosis: rank 1 never entered allreduce#1 of this group"));
    for (int r = 1; r < g->size(); ++r) {
      int32_t go = 1;
      world().send(view(&go, 1), r, 80)->wait();
    }
  } else {
    int32_t go = 0;
    world().recv(view(&go, 1), 0, 80)->wait();
    EXPECT_TRUE(g->allreduce(view(buf.data(), buf.size()))->wait());
  }
  world().barrier()->wait();
  g.reset();
  shared.close();
}

}  // namespace
}  // namespace loom::mpi_testing
