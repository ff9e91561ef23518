// The nccl backend (process_group/src/nccl/) on a fake device (nccl_fake.h), no GPU: the
// (dtype, op) -> NCCL mapping and its refusals, point-to-point grouping, the caller's stream,
// waits that block the stream or the host, the event pool, unique-id versioning, the watchdog's
// abort and the cross-rank diagnosis, LOOM_DEBUG=DETAIL. Built with or without NCCL; about
// 3.5 s in all (3 of them the failure-diagnosis test: a 2 s deadline, a 1 s report window).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/process_group/nccl.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "nccl/nccl_api.h"
#include "nccl/nccl_backend.h"
#include "nccl/nccl_event_pool.h"
#include "nccl_fake.h"

namespace loom::nccl_detail {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <class E, class F>
std::string messageOf(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

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

// Device memory is never touched by the fake: any address will do.
alignas(8) char fakeMemory[1 << 12];
BufferView dev(DType dtype, size_t count, size_t offset = 0) {
  BufferView v;
  v.data = fakeMemory + offset;
  v.count = count;
  v.dtype = dtype;
  v.device = Device::cuda(0);
  return v;
}

struct Fixture {
  std::shared_ptr<FakeNccl> fake = std::make_shared<FakeNccl>();
  std::shared_ptr<HashStore> store = std::make_shared<HashStore>();
  ProcessGroupOptions options;
  Fixture() {
    options.timeout = milliseconds(30000);
    options.flightRecorderEntries = 0;
    options.heartbeatInterval = milliseconds(0);
  }
  // Rank 0 of a group of `size` (the fake needs no peers: their claims of their ranks, which
  // rank 0 waits for, are put in the store).
  std::shared_ptr<ProcessGroup> group(int size = 2) {
    for (int r = 1; r < size; ++r) store->set(claimKey(options.groupName, r), toBytes("peer"));
    return createProcessGroupNcclOn(fake, store, 0, size, options);
  }
};

// The NCCL calls only (no events).
const std::vector<std::string> kNcclCalls = {"groupStart", "groupEnd",  "send",   "recv",
                                             "allReduce",  "broadcast", "reduce", "allGather"};

TEST(NcclReduction, TableOfDtypesAndOps) {
  // (dtype, op) -> (NCCL type, NCCL op), or the refusal's words. c10d's semantics: bool sum and
  // max are logical or (max of 0/1 bytes), prod and min logical and (min).
  struct Row {
    DType dtype;
    ReduceOp op;
    const char* expected;  // "ncclType ncclOp" or "refused: <words>"
  };
  const Row rows[] = {
      {DType::kBool, ReduceOp::kSum, "ncclUint8 ncclMax"},
      {DType::kBool, ReduceOp::kMax, "ncclUint8 ncclMax"},
      {DType::kBool, ReduceOp::kBor, "ncclUint8 ncclMax"},
      {DType::kBool, ReduceOp::kProd, "ncclUint8 ncclMin"},
      {DType::kBool, ReduceOp::kMin, "ncclUint8 ncclMin"},
      {DType::kBool, ReduceOp::kBand, "ncclUint8 ncclMin"},
      {DType::kBool, ReduceOp::kAvg, "refused: avg is not defined for dtype bool"},
      {DType::kBool, ReduceOp::kBxor, "refused: NCCL has no bitwise reductions, so bxor on bool"},
      {DType::kFloat32, ReduceOp::kSum, "ncclFloat32 ncclSum"},
      {DType::kFloat32, ReduceOp::kAvg, "ncclFloat32 ncclAvg"},
      {DType::kFloat64, ReduceOp::kProd, "ncclFloat64 ncclProd"},
      {DType::kFloat16, ReduceOp::kMin, "ncclFloat16 ncclMin"},
      {DType::kBFloat16, ReduceOp::kAvg, "ncclBfloat16 ncclAvg"},
      {DType::kBFloat16, ReduceOp::kMax, "ncclBfloat16 ncclMax"},
      {DType::kInt8, ReduceOp::kSum, "ncclInt8 ncclSum"},
      {DType::kUInt8, ReduceOp::kMax, "ncclUint8 ncclMax"},
      {DType::kInt32, ReduceOp::kAvg, "ncclInt32 ncclAvg"},
      {DType::kInt64, ReduceOp::kMin, "ncclInt64 ncclMin"},
      {DType::kInt32, ReduceOp::kBand, "refused: NCCL has no bitwise reductions (band on int32)"},
      {DType::kUInt8, ReduceOp::kBor, "refused: NCCL has no bitwise reductions (bor on uint8)"},
      {DType::kInt64, ReduceOp::kBxor, "refused: NCCL has no bitwise reductions (bxor on int64)"},
  };
  for (const Row& row : rows) {
    const std::string name = std::string(dtypeName(row.dtype)) + " " + reduceOpName(row.op);
    const std::string expected = row.expected;
    if (expected.rfind("refused: ", 0) == 0) {
      EXPECT_THAT(messageOf<InvalidArgumentError>(
                      [&] { ncclReductionOf("rank 0", "allreduce", row.dtype, row.op); }),
                  HasSubstr(expected.substr(9)))
          << name;
      continue;
    }
    const NcclReduction r = ncclReductionOf("rank 0", "allreduce", row.dtype, row.op);
    EXPECT_EQ(std::string(ncclTypeName(r.type)) + " " + ncclOpName(r.op), expected) << name;
  }
  // Every dtype moves as its own NCCL type (bool as a byte).
  EXPECT_EQ(ncclTypeOf(DType::kBool), NcclType::kUint8);
  EXPECT_EQ(ncclTypeOf(DType::kFloat16), NcclType::kFloat16);
}

TEST(NcclReduction, TheGroupPassesTheMappingToNcclAndRefusesBeforeIssuing) {
  Fixture f;
  auto pg = f.group();
  AllreduceOptions sum;
  pg->allreduce(dev(DType::kBool, 4), sum);
  AllreduceOptions prod;
  prod.reduceOp = ReduceOp::kProd;
  pg->allreduce(dev(DType::kBool, 4), prod);
  AllreduceOptions avg;
  avg.reduceOp = ReduceOp::kAvg;
  pg->allreduce(dev(DType::kFloat32, 8), avg);
  ReduceScatterOptions rsMin;
  rsMin.reduceOp = ReduceOp::kMin;
  pg->reduceScatter(dev(DType::kBool, 8), dev(DType::kBool, 4, 64), rsMin);
  EXPECT_THAT(f.fake->callsOf({"allReduce", "reduceScatter"}),
              ElementsAre("allReduce(count=4, ncclUint8, ncclMax, internal0)",
                          "allReduce(count=4, ncclUint8, ncclMin, internal0)",
                          "allReduce(count=8, ncclFloat32, ncclAvg, internal0)",
                          "reduceScatter(count=4, ncclUint8, ncclMin)"));
  AllreduceOptions bxor;
  bxor.reduceOp = ReduceOp::kBxor;
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->allreduce(dev(DType::kInt32, 4), bxor); }),
              HasSubstr("rank 0: allreduce: NCCL has no bitwise reductions (bxor on int32)"));
  EXPECT_EQ(pg->lastSeq(), 4u);  // the refused one took no sequence number
}

// NCCL has no reproducible mode: createProcessGroup refuses a request for it (factory_test);
// a group made directly says so whatever the comm options hold.
TEST(NcclReduction, NeverReproducible) {
  Fixture f;
  f.options.comm.context.reproducible = true;
  EXPECT_FALSE(f.group()->reproducible());
}

TEST(NcclPointToPoint, ConsecutiveSendRecvAreOneGroupIssuedAtTheNextCollective) {
  Fixture f;
  f.options.nccl.p2pBatchWindow = milliseconds(60000);  // only the next operation ends it
  auto pg = f.group(3);
  // The ring exchange: send right, receive from the left, then a collective.
  auto s = pg->send(dev(DType::kFloat32, 16), 1);
  auto r = pg->recv(dev(DType::kFloat32, 16, 64), 2);
  EXPECT_TRUE(f.fake->callsOf(kNcclCalls).empty()) << "issued before the batch ended";
  pg->allreduce(dev(DType::kInt32, 2, 256));
  EXPECT_THAT(f.fake->callsOf(kNcclCalls),
              ElementsAre("groupStart", "send(peer=1, count=16, ncclFloat32)",
                          "recv(peer=2, count=16, ncclFloat32)", "groupEnd",
                          "allReduce(count=2, ncclInt32, ncclSum, internal0)"));
  EXPECT_TRUE(s->wait());
  EXPECT_TRUE(r->wait());
  EXPECT_EQ(r->sourceRank(), 2);
}

TEST(NcclPointToPoint, EveryBatchSendRecvIsOneGroupAndAWaitIssuesAnOpenBatch) {
  Fixture f;
  f.options.nccl.p2pBatchWindow = milliseconds(60000);
  auto pg = f.group(2);
  std::vector<PointToPointOp> ops(3);
  ops[0] = {OpType::kSend, dev(DType::kInt8, 8), 1, 0};
  ops[1] = {OpType::kRecv, dev(DType::kInt8, 8, 64), 1, 0};
  ops[2] = {OpType::kSend, dev(DType::kInt8, 4, 128), 1, 0};
  auto works = pg->batchSendRecv(ops);
  EXPECT_THAT(f.fake->callsOf(kNcclCalls),
              ElementsAre("groupStart", "send(peer=1, count=8, ncclInt8)",
                          "recv(peer=1, count=8, ncclInt8)", "send(peer=1, count=4, ncclInt8)",
                          "groupEnd"));
  for (auto& w : works) EXPECT_TRUE(w->wait());
  // A lone send is issued (as its own group) when its Work is waited on.
  f.fake->clearCalls();
  auto s = pg->send(dev(DType::kUInt8, 3), 1);
  EXPECT_TRUE(f.fake->callsOf(kNcclCalls).empty());
  EXPECT_TRUE(s->wait());
  EXPECT_THAT(f.fake->callsOf(kNcclCalls),
              ElementsAre("groupStart", "send(peer=1, count=3, ncclUint8)", "groupEnd"));
  // ... or polled.
  f.fake->clearCalls();
  auto q = pg->recv(dev(DType::kUInt8, 3), 1);
  EXPECT_TRUE(eventually([&] { return q->isCompleted(); }));
  EXPECT_THAT(f.fake->callsOf(kNcclCalls),
              ElementsAre("groupStart", "recv(peer=1, count=3, ncclUint8)", "groupEnd"));
}

TEST(NcclPointToPoint, ABatchNobodyEndsIsIssuedAfterTheWindow) {
  Fixture f;
  f.options.nccl.p2pBatchWindow = milliseconds(20);
  auto pg = f.group(2);
  auto s = pg->send(dev(DType::kFloat64, 5), 1);
  EXPECT_TRUE(eventually([&] { return f.fake->callsOf({"groupEnd"}).size() == 1; }));
  EXPECT_THAT(f.fake->callsOf(kNcclCalls),
              ElementsAre("groupStart", "send(peer=1, count=5, ncclFloat64)", "groupEnd"));
  EXPECT_TRUE(eventually([&] { return s->isCompleted(); }));
}

TEST(NcclPointToPoint, AnySourceAndTagsAreRefused) {
  Fixture f;
  auto pg = f.group(2);
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->recvAnySource(dev(DType::kInt8, 4)); }),
              HasSubstr("recv from any source: NCCL receives from one named rank only"));
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->send(dev(DType::kInt8, 4), 1, 7); }),
              HasSubstr("NCCL has no message tags (got tag 7); use tag 0"));
  std::vector<PointToPointOp> ops = {{OpType::kRecv, dev(DType::kInt8, 4), 1, 3}};
  EXPECT_THAT(messageOf<InvalidArgumentError>([&] { pg->batchSendRecv(ops); }),
              HasSubstr("NCCL has no message tags (got tag 3)"));
  EXPECT_TRUE(f.fake->callsOf(kNcclCalls).empty());
}

// The caller's stream in the fake's log: what the "ready" event was recorded on, and what a
// wait makes wait.
TEST(NcclStreams, OrderedAfterTheCallersStreamAndWaitBlocksThatStreamNotTheHost) {
  Fixture f;
  f.fake->stall = true;  // nothing completes until completeAll(): wait() must not block
  auto pg = f.group(1);
  auto w = pg->allreduce(dev(DType::kFloat32, 4));
  // Default: the legacy default stream, then the internal stream waits for it.
  const auto calls = f.fake->calls();
  const auto at =
      std::find(calls.begin(), calls.end(), "allReduce(count=4, ncclFloat32, ncclSum, internal0)");
  ASSERT_NE(at, calls.end());
  ASSERT_GE(at - calls.begin(), 2);
  EXPECT_THAT(*(at - 2), ::testing::MatchesRegex("recordEvent\\(e[0-9]+, legacy\\)"));
  EXPECT_THAT(*(at - 1), ::testing::MatchesRegex("streamWaitEvent\\(internal0, e[0-9]+\\)"));
  EXPECT_THAT(*(at + 1), ::testing::MatchesRegex("recordEvent\\(e[0-9]+, internal0\\)"));
  f.fake->clearCalls();
  EXPECT_TRUE(w->wait());
  EXPECT_FALSE(w->isCompleted());
  EXPECT_THAT(f.fake->callsOf({"streamWaitEvent", "synchronizeEvent"}),
              ElementsAre(::testing::MatchesRegex("streamWaitEvent\\(legacy, e[0-9]+\\)")));
  f.fake->completeAll();
  EXPECT_TRUE(w->isCompleted());
  f.fake->stall = false;

  // A guard on the thread wins, for the issue and for the wait.
  f.fake->clearCalls();
  {
    NcclStreamGuard guard(reinterpret_cast<void*>(uintptr_t{0x5000}));
    EXPECT_EQ(NcclStreamGuard::current(), reinterpret_cast<void*>(uintptr_t{0x5000}));
    f.fake->stall = true;
    pg->allreduce(dev(DType::kFloat32, 4))->wait();
    f.fake->completeAll();
    f.fake->stall = false;
  }
  EXPECT_EQ(NcclStreamGuard::current(), nullptr);
  EXPECT_THAT(f.fake->callsOf({"recordEvent(e", "streamWaitEvent(user"}),
              ::testing::Contains(::testing::MatchesRegex("recordEvent\\(e[0-9]+, user20480\\)")));
  EXPECT_THAT(f.fake->callsOf({"streamWaitEvent(user"}),
              ElementsAre(::testing::MatchesRegex("streamWaitEvent\\(user20480, e[0-9]+\\)")));
  // wait(timeout) blocks the host: past its short spin it waits in cudaEventSynchronize until
  // the operation completes (here: when another thread sees it sleep there and completes it).
  f.fake->clearCalls();
  f.fake->stall = true;
  auto blocked = pg->allreduce(dev(DType::kFloat32, 4));
  std::thread device([&] {
    eventually([&] { return !f.fake->callsOf({"synchronizeEvent"}).empty(); });
    f.fake->completeAll();
  });
  EXPECT_TRUE(blocked->wait(milliseconds(30000)));
  device.join();
  EXPECT_THAT(f.fake->callsOf({"synchronizeEvent", "streamWaitEvent(legacy"}),
              ElementsAre(::testing::MatchesRegex("synchronizeEvent\\(e[0-9]+\\)")));
  // A completed operation is not slept on: the spin sees it done.
  f.fake->stall = false;
  f.fake->clearCalls();
  EXPECT_TRUE(pg->allreduce(dev(DType::kFloat32, 4))->wait(milliseconds(30000)));
  EXPECT_TRUE(f.fake->callsOf({"synchronizeEvent"}).empty());
}

TEST(NcclStreams, PerThreadDefaultStreamAndTheGroupsStreamOption) {
  {
    Fixture f;
    f.options.nccl.perThreadDefaultStream = true;
    f.fake->stall = true;
    auto pg = f.group(1);
    pg->barrier()->wait();
    f.fake->completeAll();
    EXPECT_THAT(
        f.fake->callsOf({"recordEvent(e"}),
        ::testing::Contains(::testing::MatchesRegex("recordEvent\\(e[0-9]+, perthread\\)")));
    EXPECT_THAT(f.fake->callsOf({"streamWaitEvent(perthread"}), ::testing::SizeIs(1));
  }
  {
    Fixture f;
    f.options.nccl.stream = reinterpret_cast<void*>(uintptr_t{0x6000});
    f.options.nccl.blockingWait = true;
    f.fake->stall = true;
    auto pg = f.group(1);
    std::thread device([&] {
      eventually([&] { return !f.fake->callsOf({"synchronizeEvent"}).empty(); });
      f.fake->completeAll();
    });
    EXPECT_TRUE(pg->barrier()->wait());
    device.join();
    EXPECT_THAT(
        f.fake->callsOf({"recordEvent(e"}),
        ::testing::Contains(::testing::MatchesRegex("recordEvent\\(e[0-9]+, user24576\\)")));
    // blockingWait: wait() blocks the host instead of the stream.
    EXPECT_THAT(f.fake->callsOf({"streamWaitEvent(user", "synchronizeEvent"}),
                ElementsAre(::testing::MatchesRegex("synchronizeEvent\\(e[0-9]+\\)")));
  }
}

TEST(NcclEvents, ThePoolReusesEventsOnceNobodyHoldsThem) {
  auto fake = std::make_shared<FakeNccl>();
  EventPool pool(fake, 2);
  auto a = pool.acquire();
  auto b = pool.acquire();
  EXPECT_NE(a.get(), b.get());
  void* aEvent = a.get();
  auto aCopy = a;
  a.reset();
  auto c = pool.acquire();  // a is still held (aCopy): a new one
  EXPECT_NE(c.get(), aEvent);
  EXPECT_EQ(pool.created(), 3u);
  aCopy.reset();
  auto d = pool.acquire();  // now a's event comes back
  EXPECT_EQ(d.get(), aEvent);
  EXPECT_EQ(pool.created(), 3u);
  b.reset();
  c.reset();
  d.reset();
  EXPECT_EQ(pool.idle(), 2u);  // keep = 2: the third went back to CUDA
  EXPECT_EQ(fake->eventsCreated(), 3);

  // A group reuses its events: the "ready" event of each operation goes back at once, an
  // operation's own once its Work and the watchdog dropped it (the code before the pool created
  // and destroyed two per operation).
  Fixture f;
  auto pg = f.group(1);
  for (int i = 0; i < 200; ++i) pg->allreduce(dev(DType::kFloat32, 4))->wait();
  EXPECT_LE(f.fake->eventsCreated(), 202);
  auto w = pg->allreduce(dev(DType::kFloat32, 4));
  EXPECT_TRUE(eventually([&] { return w->isCompleted(); }));
}

TEST(NcclUniqueId, VersionedPerIncarnationAndNeverReadFromAnEarlierOne) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> got(3);
  loom::testing::runThreadRanks(3, [&](int rank) {
    got[rank] = exchangeUniqueId(*store, "g", rank, rank == 0 ? std::string(128, 'A') : "", 128,
                                 milliseconds(30000));
  });
  for (const auto& g : got) EXPECT_EQ(g, std::string(128, 'A'));
  EXPECT_TRUE(store->check({uniqueIdKey("g", 1)}));
  // Incarnation 2: rank 1 arrives first and must not read incarnation 1's id.
  EXPECT_THAT(
      messageOf<TimeoutError>([&] { exchangeUniqueId(*store, "g", 1, "", 128, milliseconds(50)); }),
      HasSubstr("no NCCL unique id under nccl/g/2/unique_id"));
  // (rank 1 is now at incarnation 2 and rank 2 at 1: every rank counts its own.)
  EXPECT_EQ(exchangeUniqueId(*store, "g", 0, std::string(128, 'B'), 128, milliseconds(50)),
            std::string(128, 'B'));
  EXPECT_EQ(exchangeUniqueId(*store, "g", 2, "", 128, milliseconds(50)), std::string(128, 'B'));
  store->set(uniqueIdKey("other", 1), toBytes("short"));
  EXPECT_THAT(
      messageOf<IoError>([&] { exchangeUniqueId(*store, "other", 1, "", 128, milliseconds(50)); }),
      HasSubstr("store key nccl/other/1/unique_id holds 5 bytes; expected an "
                "ncclUniqueId of 128 bytes"));
  // Groups over one store: the default group's keys are its own.
  EXPECT_EQ(uniqueIdKey("", 3), "nccl/default/3/unique_id");
}

TEST(NcclUniqueId, AGroupRecreatedOnTheSameStoreUsesItsNextIncarnation) {
  Fixture f;
  f.options.groupName = "trainer";
  f.group(1).reset();
  f.group(1).reset();
  EXPECT_TRUE(f.store->check({uniqueIdKey("trainer", 1), uniqueIdKey("trainer", 2)}));
  EXPECT_FALSE(f.store->check({uniqueIdKey("trainer", 3)}));
  EXPECT_THAT(f.fake->callsOf({"commInitRank"}), ::testing::SizeIs(2));
}

// A rank that another process claimed (nccl_backend.h, claimGroupRank): the second claimant is
// refused before it touches the device, naming both, and a rank waiting for the others' claims
// stops at once with the same error instead of meeting NCCL's rendezvous alone.
TEST(NcclClaim, ARankHeldByAnotherProcessIsRefusedAndStopsTheWaitingRanks) {
  auto store = std::make_shared<HashStore>();
  store->set(claimKey("g", 1), toBytes("host-b\n4242\nboot\n17"));  // another process's claim
  std::string waiting;
  std::thread rank0([&] {
    waiting = messageOf<InvalidArgumentError>(
        [&] { claimGroupRank(*store, "g", 0, 3, milliseconds(30000)); });
  });
  auto fake = std::make_shared<FakeNccl>();
  ProcessGroupOptions options;
  options.groupName = "g";
  options.timeout = milliseconds(30000);
  const Deadline took(milliseconds(30000));
  const std::string refused = messageOf<InvalidArgumentError>(
      [&] { createProcessGroupNcclOn(fake, store, 1, 3, options); });
  rank0.join();
  EXPECT_LT(took.elapsed().count(), 10000);
  EXPECT_THAT(refused, HasSubstr("rank 1 of this group is claimed by two processes: host host-b, "
                                 "pid 4242 (first) and host "));
  EXPECT_THAT(refused, HasSubstr("each process must have its own RANK (0..2)"));
  EXPECT_THAT(waiting, HasSubstr("rank 0: nccl group setup stopped: another rank's setup failed: "
                                 "rank 1 of this group is claimed by two processes"));
  EXPECT_THAT(fake->calls(), ::testing::IsEmpty());  // refused before any device call
}

TEST(NcclClaim, ARankThatNeverClaimsIsNamedAtTheDeadline) {
  HashStore store;
  EXPECT_THAT(messageOf<TimeoutError>([&] { claimGroupRank(store, "", 0, 3, milliseconds(50)); }),
              HasSubstr("nccl group setup timed out after"));
  EXPECT_THAT(messageOf<TimeoutError>([&] { claimGroupRank(store, "", 0, 3, milliseconds(50)); }),
              HasSubstr("rank(s) 1, 2 never joined"));
}

// The same processes (here threads of one) creating the group again on one store find their
// own claims: not a duplicate.
TEST(NcclClaim, TheSameProcessesCreatingTheGroupAgainAreNotDuplicates) {
  auto store = std::make_shared<HashStore>();
  loom::testing::runThreadRanks(2, [&](int rank) {
    ProcessGroupOptions options;
    options.timeout = milliseconds(30000);
    options.flightRecorderEntries = 0;
    options.heartbeatInterval = milliseconds(0);
    for (int round = 0; round < 2; ++round) {
      createProcessGroupNcclOn(std::make_shared<FakeNccl>(), store, rank, 2, options).reset();
    }
  });
  EXPECT_TRUE(store->check({uniqueIdKey("", 2)}));
}

TEST(NcclUniqueId, DevicePicking) {
  EXPECT_EQ(pickDevice(-1, 3, 7, 2), 1);   // LOCAL_RANK modulo the count
  EXPECT_EQ(pickDevice(-1, -1, 7, 4), 3);  // the rank when LOCAL_RANK is unset
  EXPECT_EQ(pickDevice(1, 0, 0, 2), 1);
  EXPECT_THAT(messageOf<InvalidArgumentError>([] { pickDevice(2, 0, 0, 2); }),
              HasSubstr("device 2 requested but only 2 CUDA device(s) are visible"));
  EXPECT_THROW(pickDevice(-1, 0, 0, 0), NotAvailableError);
  Fixture f;
  f.fake->devices = 0;
  EXPECT_THAT(messageOf<NotAvailableError>([&] { f.group(1); }),
              HasSubstr("no CUDA device is usable by this process ("));
  EXPECT_EQ(f.store->numKeys(), 0);  // before the store is touched
}

TEST(NcclFailure, TheWatchdogAbortsAtTheDeadlineAndEveryWorkFails) {
  Fixture f;
  f.fake->stall = true;
  f.options.timeout = milliseconds(30000);
  auto pg = f.group(1);
  AllreduceOptions quick;
  quick.timeout = milliseconds(50);
  auto w = pg->allreduce(dev(DType::kFloat32, 4), quick);
  EXPECT_FALSE(w->isCompleted());  // pending, and polling does not block
  EXPECT_TRUE(eventually([&] { return f.fake->aborts() == 1; }));
  EXPECT_THAT(messageOf<TimeoutError>([&] { w->wait(); }),
              HasSubstr("allreduce#1 (16 bytes) timed out after 50 ms (NCCL watchdog; the "
                        "communicator was aborted)"));
  EXPECT_TRUE(pg->isBroken());
  EXPECT_THAT(messageOf<IoError>([&] { pg->barrier()->wait(); }),
              HasSubstr("was not run: the group failed earlier"));
  EXPECT_EQ(f.fake->aborts(), 1);
}

TEST(NcclFailure, ABoundedHostWaitEndsWhenTheWatchdogAbortsAtItsDeadline) {
  Fixture f;
  f.fake->stall = true;
  auto pg = f.group(1);
  auto w = pg->allreduce(dev(DType::kFloat32, 4));  // its own deadline: 30 s
  // The wait blocks in cudaEventSynchronize; the watchdog's abort at 50 ms ends it.
  EXPECT_THAT(messageOf<TimeoutError>([&] { w->wait(milliseconds(50)); }),
              HasSubstr("timed out after 50 ms in a bounded wait"));
  EXPECT_EQ(f.fake->aborts(), 1);
  EXPECT_THAT(f.fake->callsOf({"synchronizeEvent"}), ::testing::SizeIs(1));
}

// Two ranks as threads, each with its own fake device, over one store: rank 1 never issues
// the all-reduce, rank 0's times out and its error carries the flight records' diagnosis.
TEST(NcclFailure, TheErrorNamesTheRankThatNeverArrived) {
  auto store = std::make_shared<HashStore>();
  std::string error0;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto fake = std::make_shared<FakeNccl>();
    fake->stall = true;
    ProcessGroupOptions options;
    options.timeout = milliseconds(30000);
    options.heartbeatInterval = milliseconds(100);
    options.failureReportWindow = milliseconds(1000);
    auto pg = createProcessGroupNcclOn(fake, store, rank, 2, options);
    if (rank == 0) {
      AllreduceOptions quick;
      // The report window is min(failureReportWindow, timeout / 2): 1 s for rank 1's record.
      quick.timeout = milliseconds(2000);
      // A host-blocking wait: the watchdog's abort at 2 s ends it.
      error0 = messageOf<TimeoutError>(
          [&] { pg->allreduce(dev(DType::kFloat32, 4), quick)->wait(milliseconds(30000)); });
      store->set("test/done", toBytes("1"));
    } else {
      store->wait({"test/done"}, milliseconds(30000));  // alive, never entering allreduce#1
    }
  });
  EXPECT_THAT(error0, HasSubstr("allreduce#1"));
  EXPECT_THAT(error0, HasSubstr("rank 1 never entered collective #1"));
}

TEST(NcclDebug, DetailChecksSignaturesAcrossRanksAndTheGroupStaysUsable) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(2);
  std::vector<char> usable(2);  // not vector<bool>: the ranks write their own element at once
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto fake = std::make_shared<FakeNccl>();
    ProcessGroupOptions options;
    options.timeout = milliseconds(30000);
    options.debug = DebugLevel::kDetail;
    options.flightRecorderEntries = 0;
    auto pg = createProcessGroupNcclOn(fake, store, rank, 2, options);
    errors[rank] = messageOf<InvalidArgumentError>(
        [&] { pg->allreduce(dev(DType::kFloat32, rank == 0 ? 4 : 8))->wait(); });
    // Nothing was enqueued for the mismatch; the next collective runs.
    usable[rank] =
        pg->allreduce(dev(DType::kFloat32, 4))->wait() && fake->callsOf({"allReduce"}).size() == 1;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("count=4")) << r;
    EXPECT_THAT(errors[r], HasSubstr("count=8")) << r;
    EXPECT_TRUE(usable[r]) << r;
  }
}

}  // namespace
}  // namespace loom::nccl_detail
