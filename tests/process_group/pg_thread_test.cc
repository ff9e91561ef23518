// ProcessGroup API with ranks as threads over one HashStore (tcp backend): Work semantics,
// issue order, sequence numbers, argument checks and their messages, subgroups, debug-mode
// signature mismatches, abort and failure handling. The wide dtype/op/size sweep lives in the
// comm tests; here every collective is checked once for the API's wiring.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "loom/common/error.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"
#include "loom/process_group/diagnostics.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/init.h"
#include "loom/process_group/process_group.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;

ProcessGroupOptions quickOptions(milliseconds timeout = milliseconds(20000)) {
  ProcessGroupOptions options;
  options.timeout = timeout;
  options.debug = DebugLevel::kOff;
  return options;
}

// Runs fn(pg) on `size` thread ranks, each with its own tcp group over one HashStore.
void runGroups(int size, const ProcessGroupOptions& options,
               const std::function<void(ProcessGroup& pg)>& fn) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(size, [&](int rank) {
    auto pg = createProcessGroup("tcp", store, rank, size, options);
    fn(*pg);
  });
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

TEST(ProcessGroupThreads, EveryCollectiveOnce) {
  for (int size : {1, 2, 3, 4}) {
    SCOPED_TRACE("world size " + std::to_string(size));
    runGroups(size, quickOptions(), [&](ProcessGroup& pg) {
      ASSERT_EQ(pg.size(), size);
      ASSERT_EQ(pg.backendName(), "tcp");
      testing::checkEveryCollective(pg);
      // Empty buffers are legal everywhere.
      pg.allreduce(BufferView{nullptr, 0})->wait();
      pg.allgather(BufferView{nullptr, 0}, BufferView{nullptr, 0})->wait();
      pg.broadcast(BufferView{nullptr, 0})->wait();
    });
  }
}

TEST(ProcessGroupThreads, OutstandingOperationsCompleteInIssueOrder) {
  constexpr int kSize = 2;
  constexpr int kOps = 200;
  runGroups(kSize, quickOptions(), [](ProcessGroup& pg) {
    std::vector<std::vector<int32_t>> bufs(kOps, std::vector<int32_t>(4));
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < kOps; ++i) {
      std::fill(bufs[i].begin(), bufs[i].end(), i + pg.rank());
      works.push_back(pg.allreduce(view(bufs[i].data(), 4)));
      EXPECT_EQ(works.back()->seq(), static_cast<uint64_t>(i + 1));
    }
    works[kOps / 2]->wait();
    for (int i = 0; i <= kOps / 2; ++i) EXPECT_TRUE(works[i]->isCompleted()) << i;
    works.back()->wait();
    for (int i = 0; i < kOps; ++i) {
      EXPECT_TRUE(works[i]->isSuccess()) << i;
      EXPECT_EQ(bufs[i][0], 2 * i + 1) << i;
    }
  });
}

// Out of place: the output gets the result, the input stays (unless it is the output); in
// and out may be one buffer; counts that differ are refused before anything is issued.
TEST(ProcessGroupThreads, OutOfPlaceAllreduceBroadcastAndReduce) {
  runGroups(3, quickOptions(), [](ProcessGroup& pg) {
    const int r = pg.rank();
    const std::vector<int32_t> mine(5, r + 1);
    std::vector<int32_t> in = mine;
    std::vector<int32_t> out(5, -1);
    pg.allreduce(view(in.data(), 5), view(out.data(), 5))->wait();
    EXPECT_EQ(out, std::vector<int32_t>(5, 6));
    EXPECT_EQ(in, mine);
    pg.allreduce(view(in.data(), 5), view(in.data(), 5))->wait();  // in == out
    EXPECT_EQ(in, std::vector<int32_t>(5, 6));

    in = mine;
    std::fill(out.begin(), out.end(), -1);
    BroadcastOptions fromOne;
    fromOne.root = 1;
    // Non-roots pass no input.
    pg.broadcast(r == 1 ? view(in.data(), 5) : BufferView{}, view(out.data(), 5), fromOne)->wait();
    EXPECT_EQ(out, std::vector<int32_t>(5, 2));
    EXPECT_EQ(in, mine);

    std::fill(out.begin(), out.end(), -1);
    ReduceOptions toTwo;
    toTwo.root = 2;
    pg.reduce(view(in.data(), 5), r == 2 ? view(out.data(), 5) : BufferView{}, toTwo)->wait();
    EXPECT_EQ(out, std::vector<int32_t>(5, r == 2 ? 6 : -1));
    EXPECT_EQ(in, mine);
    pg.reduce(view(in.data(), 5), view(in.data(), 5), toTwo)->wait();  // in == out
    EXPECT_EQ(in, r == 2 ? std::vector<int32_t>(5, 6) : mine);

    const uint64_t seq = pg.lastSeq();
    std::vector<int32_t> longer(6);
    EXPECT_THAT(messageOf<InvalidArgumentError>(
                    [&] { pg.allreduce(view(in.data(), 5), view(longer.data(), 6)); }),
                HasSubstr("allreduce: input has 5 elements but output has 6"));
    if (r == 1) {
      EXPECT_THAT(messageOf<InvalidArgumentError>(
                      [&] { pg.broadcast(view(in.data(), 5), view(longer.data(), 6), fromOne); }),
                  HasSubstr("broadcast: input has 5 elements but output has 6"));
    }
    if (r == 2) {
      EXPECT_THAT(messageOf<InvalidArgumentError>(
                      [&] { pg.reduce(view(in.data(), 5), view(longer.data(), 6), toTwo); }),
                  HasSubstr("reduce: input has 5 elements but output has 6"));
    }
    std::vector<float> floats(5);
    EXPECT_THAT(messageOf<InvalidArgumentError>(
                    [&] { pg.allreduce(view(in.data(), 5), view(floats.data(), 5)); }),
                HasSubstr("allreduce: input and output dtypes differ (int32 vs float)"));
    EXPECT_EQ(pg.lastSeq(), seq);
  });
}

TEST(ProcessGroupThreads, ArgumentChecksNameTheMistake) {
  auto store = std::make_shared<HashStore>();
  auto pg = createProcessGroup("tcp", store, 0, 1, quickOptions());
  std::vector<float> f(4);
  std::vector<int32_t> i4(4);
  std::vector<int32_t> i8(8);
  BroadcastOptions badRoot;
  badRoot.root = 1;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->broadcast(view(f.data(), 4), badRoot); }),
              HasSubstr("rank 0: broadcast: root 1 is out of range for a group of size 1"));
  ReduceOptions negRoot;
  negRoot.root = -1;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->reduce(view(f.data(), 4), negRoot); }),
              HasSubstr("root -1 is out of range"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->allgather(view(i4.data(), 4), view(i8.data(), 8)); }),
              HasSubstr("allgather: output has 8 elements; expected world size * input count = 1 * "
                        "4 = 4"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->allgather(view(f.data(), 4), view(i4.data(), 4)); }),
              HasSubstr("allgather: input and output dtypes differ (float vs int32)"));
  EXPECT_THAT(
      messageOf<InvalidArgumentError>(
          [&] { pg->reduceScatter(view(i8.data(), 8), view(i4.data(), 4)); }),
      HasSubstr("reduce_scatter: input has 8 elements; expected world size * output count"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->alltoall(view(i4.data(), 4), view(i8.data(), 8)); }),
              HasSubstr("alltoall: input has 4 elements but output has 8"));
  // Overlapping buffers that are not the in-place form, refused at the call (every backend).
  std::vector<int32_t> big(16);
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->allreduce(view(big.data(), 4), view(big.data() + 2, 4)); }),
              HasSubstr("allreduce: the output (4 elements at"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->allreduce(view(big.data(), 4), view(big.data() + 2, 4)); }),
              HasSubstr("without being its in-place form (one buffer, output == input)"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->allgather(view(big.data() + 1, 4), view(big.data(), 4)); }),
              HasSubstr("allgather: the output (4 elements at"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->reduceScatter(view(big.data(), 4), view(big.data() + 1, 4)); }),
              HasSubstr("reduce_scatter: the output (4 elements at"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->allgatherv(view(big.data() + 1, 4), view(big.data(), 4), {4}); }),
              HasSubstr("allgatherv: the output"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->reduceScatterv(view(big.data(), 4), view(big.data() + 3, 4), {4}); }),
              HasSubstr("reduce_scatterv: the output"));
  EXPECT_THAT(messageOf<InvalidArgumentError>(
                  [&] { pg->alltoall(view(big.data(), 4), view(big.data() + 1, 4)); }),
              HasSubstr("alltoall: the output"));
  AllreduceOptions band;
  band.reduceOp = ReduceOp::kBand;
  EXPECT_THAT(
      messageOf<InvalidArgumentError>([&] { pg->allreduce(view(f.data(), 4), band); }),
      HasSubstr("allreduce: reduce op band is bitwise and needs an integer dtype, got float"));
  EXPECT_NO_THROW(pg->allreduce(view(i4.data(), 4), band)->wait());
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->send(view(f.data(), 4), 0); }),
              HasSubstr("a rank cannot send to itself"));
  EXPECT_THAT(
      messageOf<InvalidArgumentError>([&] { pg->recv(view(f.data(), 4), 0, uint64_t{1} << 56); }),
      HasSubstr("recv: tag 72057594037927936 is too large"));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->recv(view(f.data(), 4), 3); }),
              HasSubstr("recv: source rank 3 is out of range"));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                pg->allreduce(BufferView{nullptr, 3});
              }),
              HasSubstr("allreduce: buffer is null but its count is 3"));
  EXPECT_THAT(
      messageOf<InvalidArgumentError>([&] { pg->allreduce(view(f.data(), 4, Device::cuda(0))); }),
      HasSubstr("the tcp backend takes CPU buffers, got a cuda:0 buffer"));
  AllreduceOptions zero;
  zero.timeout = milliseconds(0);
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->allreduce(view(f.data(), 4), zero); }),
              HasSubstr("timeout must be positive"));
  // Rejected calls take no sequence number.
  EXPECT_EQ(pg->lastSeq(), 1u);
  // The in-place forms run.
  EXPECT_NO_THROW(pg->allgather(view(big.data(), 4), view(big.data(), 4))->wait());
  EXPECT_NO_THROW(pg->reduceScatter(view(big.data(), 4), view(big.data(), 4))->wait());
}

TEST(ProcessGroupThreads, ATimeoutNamesTheOperationAndTheSilentRank) {
  auto options = quickOptions(milliseconds(1500));
  auto store = std::make_shared<HashStore>();
  std::promise<void> rank0Done;
  std::shared_future<void> rank0DoneFuture = rank0Done.get_future().share();
  testing::runThreadRanks(2, [&](int rank) {
    auto pg = createProcessGroup("tcp", store, rank, 2, options);
    std::vector<float> buf(1024, 1.0f);
    pg->allreduce(view(buf.data(), buf.size()))->wait();
    if (rank == 1) {
      // Rank 1 skips the second all-reduce: rank 0 must time out and name it.
      ASSERT_EQ(rank0DoneFuture.wait_for(std::chrono::seconds(30)), std::future_status::ready);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    auto work = pg->allreduce(view(buf.data(), buf.size()));
    try {
      work->wait();
      ADD_FAILURE() << "the all-reduce should time out";
    } catch (const TimeoutError& e) {
      const std::string what = e.what();
      EXPECT_THAT(what, HasSubstr("rank 0"));
      EXPECT_THAT(what, HasSubstr("allreduce#2"));
      EXPECT_THAT(what, HasSubstr("(dead, stopped, or not at this operation): 1"));
    }
    EXPECT_LE(std::chrono::steady_clock::now() - start, 2 * options.timeout);
    EXPECT_TRUE(pg->isBroken());
    // Every later operation fails at once, naming the cause.
    auto later = pg->barrier();
    EXPECT_TRUE(later->isCompleted());
    EXPECT_THAT(messageOf<IoError>([&] { later->wait(); }),
                HasSubstr("was not run: the group failed earlier"));
    rank0Done.set_value();
  });
}

// A store whose writes of failure reports stall until released (a store host that was
// SIGSTOPped); everything else is forwarded to a HashStore.
class StallingStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override {
    if (key.find("failure/") != std::string::npos) {
      std::unique_lock<std::mutex> lock(mu_);
      released_.wait_for(lock, std::chrono::seconds(30), [&] { return release_; });
    }
    inner_.set(key, value);
  }
  Bytes get(const std::string& key) override { return inner_.get(key); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_.add(key, delta); }
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return inner_.compareSet(key, expected, desired);
  }
  bool deleteKey(const std::string& key) override { return inner_.deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_.check(keys); }
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    inner_.wait(keys, timeout);
  }
  using Store::set;
  using Store::wait;
  int64_t numKeys() override { return inner_.numKeys(); }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      release_ = true;
    }
    released_.notify_all();
  }

 private:
  HashStore inner_;
  std::mutex mu_;
  std::condition_variable released_;
  bool release_ = false;
};

TEST(ProcessGroupThreads, AStoreThatStallsDoesNotDelayTheError) {
  auto store = std::make_shared<StallingStore>();
  const auto options = quickOptions(milliseconds(1000));
  std::promise<void> rank0Done;
  std::shared_future<void> rank0DoneFuture = rank0Done.get_future().share();
  testing::runThreadRanks(2, [&](int rank) {
    auto pg = createProcessGroup("tcp", store, rank, 2, options);
    std::vector<float> buf(16, 1.0f);
    if (rank == 1) {
      ASSERT_EQ(rank0DoneFuture.wait_for(std::chrono::seconds(30)), std::future_status::ready);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    auto work = pg->allreduce(view(buf.data(), 16));
    const std::string what = messageOf<TimeoutError>([&] { work->wait(); });
    EXPECT_THAT(what, HasSubstr("allreduce#1"));
    EXPECT_THAT(what, HasSubstr("diagnosis: the store did not answer within"));
    EXPECT_LE(std::chrono::steady_clock::now() - start, 2 * options.timeout);
    rank0Done.set_value();
  });
  store->release();
}

TEST(ProcessGroupThreads, WaitWithATimeoutAbortsTheGroup) {
  auto store = std::make_shared<HashStore>();
  std::promise<void> aborted;
  std::shared_future<void> abortedFuture = aborted.get_future().share();
  testing::runThreadRanks(2, [&](int rank) {
    auto pg = createProcessGroup("tcp", store, rank, 2, quickOptions(milliseconds(3000)));
    std::vector<int32_t> buf(16, 1);
    if (rank == 0) {
      auto work = pg->allreduce(view(buf.data(), 16));
      EXPECT_THAT(messageOf<TimeoutError>([&] { work->wait(milliseconds(100)); }),
                  HasSubstr("rank 0: allreduce#1 did not complete within"));
      EXPECT_TRUE(pg->isBroken());
      EXPECT_THROW(work->wait(), IoError);
      aborted.set_value();
    } else {
      // Joins the all-reduce only after rank 0 gave up on it: it fails (closed connection,
      // or its own deadline), it does not hang.
      ASSERT_EQ(abortedFuture.wait_for(std::chrono::seconds(30)), std::future_status::ready);
      EXPECT_THROW(pg->allreduce(view(buf.data(), 16))->wait(), IoError);
    }
  });
}

TEST(ProcessGroupThreads, AbortFailsQueuedAndFutureOperationsAndDestroysCleanly) {
  auto store = std::make_shared<HashStore>();
  auto pg = createProcessGroup("tcp", store, 0, 1, quickOptions());
  pg->abort("test teardown");
  EXPECT_TRUE(pg->isBroken());
  std::vector<float> buf(4);
  auto work = pg->allreduce(view(buf.data(), 4));
  EXPECT_TRUE(work->isCompleted());
  EXPECT_THAT(messageOf<IoError>([&] { work->wait(); }), HasSubstr("aborted: test teardown"));
  pg.reset();  // must not hang
}

TEST(ProcessGroupThreads, NewGroupMembersGetASubgroupOthersGetNull) {
  runGroups(4, quickOptions(), [](ProcessGroup& pg) {
    auto odd = newGroup(pg, {3, 1});
    auto all = newGroup(pg, {0, 1, 2, 3});
    if (pg.rank() % 2 == 1) {
      ASSERT_NE(odd, nullptr);
      EXPECT_EQ(odd->size(), 2);
      EXPECT_EQ(odd->rank(), pg.rank() / 2);
      EXPECT_EQ(odd->options().groupName, "group/1");
      EXPECT_EQ(odd->who(),
                "rank " + std::to_string(pg.rank() / 2) + " of group/1 (parent ranks 1,3)");
      std::vector<int32_t> v(3, pg.rank());
      odd->allreduce(view(v.data(), 3))->wait();
      EXPECT_EQ(v, std::vector<int32_t>(3, 4));
    } else {
      EXPECT_EQ(odd, nullptr);
    }
    ASSERT_NE(all, nullptr);
    EXPECT_EQ(all->rank(), pg.rank());
    std::vector<int32_t> w(2, 1);
    all->allreduce(view(w.data(), 2))->wait();
    EXPECT_EQ(w[0], 4);
    // The parent is unaffected.
    pg.barrier()->wait();
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  newGroup(pg, {1, 1});
                }),
                HasSubstr("rank 1 appears twice"));
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  newGroup(pg, {0, 4});
                }),
                HasSubstr("rank 4 is out of range for a group of size 4"));
  });
}

TEST(ProcessGroupThreads, NewGroupWithDifferentListsIsNamed) {
  auto store = std::make_shared<HashStore>();
  testing::runThreadRanks(3, [&](int rank) {
    auto pg = createProcessGroup("tcp", store, rank, 3, quickOptions(milliseconds(1000)));
    if (rank == 2) {
      EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                    newGroup(*pg, {0, 1, 2});
                  }),
                  HasSubstr("this rank passed ranks [0,1,2] but rank 0 passed [0,2]"));
    } else if (rank == 0) {
      // Rank 0 believes in {0, 2} and waits for a rank 2 that never comes.
      EXPECT_THROW(newGroup(*pg, {0, 2}), TimeoutError);
    } else {
      EXPECT_EQ(newGroup(*pg, {0, 2}), nullptr);
    }
  });
}

TEST(ProcessGroupThreads, DebugModeNamesAMismatchedCollectiveAndStaysUsable) {
  auto options = quickOptions();
  options.debug = DebugLevel::kDetail;
  runGroups(3, options, [](ProcessGroup& pg) {
    std::vector<float> buf(16, 1.0f);
    pg.allreduce(view(buf.data(), 16))->wait();
    // Rank 2 passes a different count in the second collective.
    const size_t count = pg.rank() == 2 ? 15 : 16;
    auto work = pg.allreduce(view(buf.data(), count));
    const std::string what = messageOf<InvalidArgumentError>([&] { work->wait(); });
    EXPECT_THAT(what, HasSubstr("collective #2 does not match across ranks (LOOM_DEBUG=DETAIL)"));
    EXPECT_THAT(what, HasSubstr("allreduce(dtype=float, count=16, op=sum)#2 on ranks [0, 1]"));
    EXPECT_THAT(what, HasSubstr("allreduce(dtype=float, count=15, op=sum)#2 on ranks [2]"));
    EXPECT_FALSE(pg.isBroken());
    // A different collective altogether.
    std::shared_ptr<Work> other;
    if (pg.rank() == 0) {
      other = pg.broadcast(view(buf.data(), 16));
    } else {
      other = pg.allreduce(view(buf.data(), 16));
    }
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] { other->wait(); }),
                HasSubstr("broadcast(dtype=float, count=16, root=0)#3 on ranks [0]"));
    // Matching calls work again.
    std::fill(buf.begin(), buf.end(), 1.0f);
    pg.allreduce(view(buf.data(), 16))->wait();
    EXPECT_EQ(buf[0], 3.0f);
    // Barrier under DETAIL (TORCH_DISTRIBUTED_DEBUG=DETAIL breaks it): checked and run.
    pg.barrier()->wait();
    std::shared_ptr<Work> mixed =
        pg.rank() == 1 ? pg.barrier() : pg.allreduce(view(buf.data(), 16));
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] { mixed->wait(); }),
                HasSubstr("barrier()#6 on ranks [1]"));
    pg.barrier()->wait();
  });
}

// Stragglers (issue 17): rank 2 starts every all-reduce late; the table every rank gets names it.
// Every operation timed precisely (by default one in 16 is, plus those run while the
// worker publishes no tick).
TEST(ProcessGroupThreads, StragglerTableNamesTheLateRank) {
  ProcessGroupOptions options = quickOptions();
  options.flightRecorderPreciseEvery = 1;
  runGroups(4, options, [](ProcessGroup& pg) {
    std::vector<float> buf(16, 1.0f);
    constexpr int kRounds = 10;
    for (int i = 0; i < kRounds; ++i) {
      if (pg.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      pg.allreduce(view(buf.data(), 16))->wait();
    }
    const diag::StragglerTable table = pg.stragglers();
    ASSERT_EQ(table.ranks.size(), 4u);
    EXPECT_EQ(table.slowest(), 2) << table.format();
    EXPECT_EQ(table.ranks[2].collectives, static_cast<uint64_t>(kRounds)) << table.format();
    // Sleeping before each start, rank 2 arrives last in (nearly) every one.
    EXPECT_GE(table.ranks[2].lastArrivals, static_cast<uint64_t>(kRounds / 2)) << table.format();
    EXPECT_NE(table.format().find("slowest rank: 2 ("), std::string::npos) << table.format();
    // A second round works on the same store.
    pg.allreduce(view(buf.data(), 16))->wait();
    EXPECT_EQ(pg.stragglers().ranks.size(), 4u);
  });
}

TEST(ProcessGroupThreads, InitMethodsFileAndTcpWithExplicitRanks) {
  testing::TempDir dir;
  int port = 0;
  {
    net::Socket probe = net::listenOn("127.0.0.1", 0);
    port = net::localPort(probe.fd());
  }
  for (const std::string& url :
       {"file://" + dir.file("store"), "tcp://127.0.0.1:" + std::to_string(port)}) {
    SCOPED_TRACE(url);
    std::vector<std::shared_ptr<Store>> stores(3);
    testing::runThreadRanks(3, [&](int rank) {
      InitOptions options;
      options.initMethod = url;
      options.rank = rank;
      options.worldSize = 3;
      options.pg = quickOptions();
      InitResult init = initProcessGroup(options);
      ASSERT_EQ(init.pg->rank(), rank);
      ASSERT_EQ(init.pg->size(), 3);
      testing::checkEveryCollective(*init.pg);
      init.pg->barrier()->wait();
      init.pg.reset();
      stores[rank] = init.store;  // rank 0's TCPStore hosts the server: keep it until all are done
    });
  }
}

TEST(ProcessGroupThreads, InitFromAnIncompleteEnvironmentNamesTheVariable) {
  if (settings::value("RANK") || settings::value("SLURM_PROCID") ||
      settings::value("OMPI_COMM_WORLD_RANK")) {
    GTEST_SKIP() << "this process runs under a launcher";
  }
  InitOptions options;
  options.initMethod = "env://";
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { initProcessGroup(options); }),
              HasSubstr("RANK is not set"));
  options.initMethod = "ftp://x";
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { initProcessGroup(options); }),
              HasSubstr("init method 'ftp://x' is not valid"));
}

TEST(ProcessGroupThreads, LargeSendRecvRingsDoNotDeadlock) {
  runGroups(3, quickOptions(milliseconds(20000)), [](ProcessGroup& pg) {
    const int r = pg.rank();
    const int p = pg.size();
    const size_t n = 1 << 20;  // 4 MiB: more than the socket buffers hold
    std::vector<float> msg(n);
    std::vector<float> got(n);
    for (int round = 0; round < 4; ++round) {
      std::fill(msg.begin(), msg.end(), static_cast<float>(r + 10 * round));
      auto sent = pg.send(view(msg.data(), n), (r + 1) % p, /*tag=*/round);
      auto recvd = pg.recv(view(got.data(), n), (r + p - 1) % p, /*tag=*/round);
      recvd->wait();
      sent->wait();
      EXPECT_EQ(got[n - 1], static_cast<float>((r + p - 1) % p + 10 * round));
    }
  });
}

// c10d users post the receive first; point-to-point operations are not queued behind each
// other, so a ring where every rank issues recv before send must complete.
TEST(ProcessGroupThreads, RecvIssuedBeforeSendInARingCompletes) {
  runGroups(3, quickOptions(milliseconds(20000)), [](ProcessGroup& pg) {
    const int r = pg.rank();
    const int p = pg.size();
    for (size_t n : {size_t{4}, size_t{1} << 20}) {
      std::vector<float> msg(n, static_cast<float>(r));
      std::vector<float> got(n, -1.0f);
      auto recvd = pg.recv(view(got.data(), n), (r + p - 1) % p, /*tag=*/7);
      auto sent = pg.send(view(msg.data(), n), (r + 1) % p, /*tag=*/7);
      recvd->wait();
      sent->wait();
      EXPECT_EQ(got[n - 1], static_cast<float>((r + p - 1) % p));
    }
  });
}

TEST(ProcessGroupThreads, ARecvThatNeverMatchesTimesOutNamingPeerAndBytes) {
  auto store = std::make_shared<HashStore>();
  std::promise<void> rank0Done;
  std::shared_future<void> rank0DoneFuture = rank0Done.get_future().share();
  testing::runThreadRanks(2, [&](int rank) {
    auto pg = createProcessGroup("tcp", store, rank, 2, quickOptions(milliseconds(1000)));
    if (rank == 1) {
      ASSERT_EQ(rank0DoneFuture.wait_for(std::chrono::seconds(30)), std::future_status::ready);
      return;
    }
    std::vector<int64_t> buf(100);
    auto work = pg->recv(view(buf.data(), 100), 1, /*tag=*/5);
    const std::string what = messageOf<TimeoutError>([&] { work->wait(); });
    EXPECT_THAT(what, HasSubstr("rank 0: recv#1 from rank 1 timed out after 1000 ms waiting to "
                                "receive from rank 1"));
    EXPECT_THAT(what, HasSubstr("800 of 800 bytes outstanding (tag 5)"));
    rank0Done.set_value();
  });
}

}  // namespace
}  // namespace loom
