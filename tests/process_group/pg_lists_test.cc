// The ProcessGroup methods that take lists (process_group_lists.cc), with ranks as threads over
// one HashStore (tcp backend): alltoallv, allgatherv, gatherv and reduceScatterv with uneven
// counts (zeros included), allreduceCoalesced, batchSendRecv (a ring exchange issued as one
// batch), monitoredBarrier (passing, and naming a rank that never arrives), and the argument
// checks with their messages. The dtype/op/world-size sweep of the uneven collectives lives in
// tests/comm (comm_sweep_uneven_test); here each method is checked for its wiring.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/process_group.h"
#include "loom/store/hash_store.h"
#include "loom/testing/errors.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::messageOf;

ProcessGroupOptions quickOptions(milliseconds timeout = milliseconds(20000)) {
  ProcessGroupOptions options;
  options.timeout = timeout;
  options.debug = DebugLevel::kOff;
  options.failureReportWindow = milliseconds(200);
  return options;
}

void runGroups(int size, const ProcessGroupOptions& options,
               const std::function<void(ProcessGroup& pg)>& fn) {
  auto store = std::make_shared<HashStore>();
  loom::testing::runThreadRanks(size, [&](int rank) {
    auto pg = createProcessGroup("tcp", store, rank, size, options);
    fn(*pg);
  });
}

size_t sumOf(const std::vector<size_t>& v) {
  return std::accumulate(v.begin(), v.end(), size_t{0});
}

// Rank r sends (r + j) % 3 elements to rank j (zeros included), element i = 100 r + 10 j + i.
size_t split(int r, int j) {
  return static_cast<size_t>((r + j) % 3);
}

TEST(ProcessGroupLists, AlltoallvWithUnevenSplits) {
  for (int size : {1, 2, 3, 4}) {
    SCOPED_TRACE("world size " + std::to_string(size));
    runGroups(size, quickOptions(), [&](ProcessGroup& pg) {
      const int rank = pg.rank();
      std::vector<size_t> inSplits, outSplits;
      for (int j = 0; j < size; ++j) {
        inSplits.push_back(split(rank, j));
        outSplits.push_back(split(j, rank));
      }
      std::vector<float> in, out(sumOf(outSplits), -1.0f);
      for (int j = 0; j < size; ++j) {
        for (size_t i = 0; i < inSplits[j]; ++i) in.push_back(100.0f * rank + 10.0f * j + i);
      }
      pg.alltoallv(view(in.data(), in.size()), inSplits, view(out.data(), out.size()), outSplits)
          ->wait();
      size_t at = 0;
      for (int j = 0; j < size; ++j) {
        for (size_t i = 0; i < outSplits[j]; ++i) {
          EXPECT_EQ(out[at++], 100.0f * j + 10.0f * rank + i) << "from rank " << j << " i " << i;
        }
      }
      // Empty splits: equal blocks, as c10d.
      std::vector<int32_t> even(2 * size), got(2 * size);
      std::iota(even.begin(), even.end(), 100 * rank);
      pg.alltoallv(view(even.data(), even.size()), {}, view(got.data(), got.size()), {})->wait();
      for (int j = 0; j < size; ++j) {
        EXPECT_EQ(got[2 * j], 100 * j + 2 * rank);
        EXPECT_EQ(got[2 * j + 1], 100 * j + 2 * rank + 1);
      }
    });
  }
}

TEST(ProcessGroupLists, AllgathervGathervAndReduceScatterv) {
  for (int size : {1, 2, 3, 4}) {
    SCOPED_TRACE("world size " + std::to_string(size));
    runGroups(size, quickOptions(), [&](ProcessGroup& pg) {
      const int rank = pg.rank();
      std::vector<size_t> counts;
      for (int r = 0; r < size; ++r) counts.push_back(r == 1 ? 0 : r + 2);
      const size_t total = sumOf(counts);
      std::vector<double> mine(counts[rank]);
      std::iota(mine.begin(), mine.end(), 10.0 * rank);

      std::vector<double> all(total, -1);
      pg.allgatherv(view(mine.data(), mine.size()), view(all.data(), all.size()), counts)->wait();
      std::vector<double> gathered(total, -1);
      const int root = size - 1;
      pg.gatherv(view(mine.data(), mine.size()), view(gathered.data(), gathered.size()), counts,
                 {.root = root})
          ->wait();
      size_t at = 0;
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < counts[r]; ++i, ++at) {
          EXPECT_EQ(all[at], 10.0 * r + i);
          if (rank == root) {
            EXPECT_EQ(gathered[at], 10.0 * r + i);
          }
        }
      }

      std::vector<int64_t> in(total), out(counts[rank], -1);
      std::iota(in.begin(), in.end(), int64_t{rank});  // element k = rank + k
      pg.reduceScatterv(view(in.data(), in.size()), view(out.data(), out.size()), counts)->wait();
      size_t offset = 0;
      for (int r = 0; r < rank; ++r) offset += counts[r];
      const int64_t rankSum = int64_t{size} * (size - 1) / 2;
      for (size_t i = 0; i < out.size(); ++i) {
        EXPECT_EQ(out[i], rankSum + int64_t{size} * static_cast<int64_t>(offset + i));
      }
    });
  }
}

TEST(ProcessGroupLists, AllreduceCoalescedReducesEveryBufferAsOneOperation) {
  runGroups(3, quickOptions(), [](ProcessGroup& pg) {
    const float r = static_cast<float>(pg.rank() + 1);
    std::vector<float> a(5, r), b(0), c(100000, 2 * r), d(1, -r);
    const uint64_t before = pg.lastSeq();
    pg.allreduceCoalesced({view(a.data(), a.size()), view(b.data(), b.size()),
                           view(c.data(), c.size()), view(d.data(), d.size())},
                          {.reduceOp = ReduceOp::kMax})
        ->wait();
    EXPECT_EQ(pg.lastSeq(), before + 1);  // one operation
    for (float v : a) EXPECT_EQ(v, 3.0f);
    for (float v : c) EXPECT_EQ(v, 6.0f);
    EXPECT_EQ(d[0], -1.0f);
    // One buffer, and none.
    pg.allreduceCoalesced({view(a.data(), a.size())})->wait();
    EXPECT_EQ(a[0], 9.0f);
    pg.allreduceCoalesced({})->wait();

    std::vector<int32_t> wrong(2);
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  pg.allreduceCoalesced({view(a.data(), a.size()), view(wrong.data(), 2)});
                }),
                HasSubstr("buffer 1 is int32 on cpu but buffer 0 is float"));
  });
}

TEST(ProcessGroupLists, BatchSendRecvRingExchange) {
  for (int size : {2, 3, 4}) {
    SCOPED_TRACE("world size " + std::to_string(size));
    runGroups(size, quickOptions(), [&](ProcessGroup& pg) {
      const int rank = pg.rank();
      const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
      // Large enough that a send does not complete before its receive is posted.
      std::vector<int32_t> right(1 << 20, rank), left(1 << 20, -1);
      std::vector<int32_t> small(3, 7 * rank), fromPrev(3, -1);
      auto works = pg.batchSendRecv({
          {OpType::kSend, view(right.data(), right.size()), next, 1},
          {OpType::kRecv, view(left.data(), left.size()), prev, 1},
          {OpType::kSend, view(small.data(), small.size()), next, 2},
          {OpType::kRecv, view(fromPrev.data(), fromPrev.size()), prev, 2},
      });
      ASSERT_EQ(works.size(), 4u);
      for (auto& w : works) w->wait();
      EXPECT_EQ(left.front(), prev);
      EXPECT_EQ(left.back(), prev);
      EXPECT_EQ(fromPrev[2], 7 * prev);
      EXPECT_EQ(works[0]->opName(), "send");
      EXPECT_EQ(works[1]->opName(), "recv");
    });
  }
}

TEST(ProcessGroupLists, BatchSendRecvChecksEveryEntryBeforeIssuingAny) {
  runGroups(2, quickOptions(), [](ProcessGroup& pg) {
    std::vector<float> buf(4);
    const uint64_t before = pg.lastSeq();
    const std::string message = messageOf<InvalidArgumentError>([&] {
      pg.batchSendRecv({{OpType::kSend, view(buf.data(), 4), 1 - pg.rank(), 0},
                        {OpType::kRecv, view(buf.data(), 4), 5, 0}});
    });
    EXPECT_THAT(message, HasSubstr("recv: source rank 5 is out of range"));
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  pg.batchSendRecv({{OpType::kAllreduce, view(buf.data(), 4), 0, 0}});
                }),
                HasSubstr("entry 0 is a allreduce"));
    EXPECT_EQ(pg.lastSeq(), before);
    // Nothing was issued: a plain exchange still matches.
    auto works = pg.batchSendRecv({{OpType::kSend, view(buf.data(), 4), 1 - pg.rank(), 0},
                                   {OpType::kRecv, view(buf.data(), 4), 1 - pg.rank(), 0}});
    for (auto& w : works) w->wait();
  });
}

// Ranks 1..3 each send rank 0 one message, in an order rank 0 does not know; rank 0 receives
// them from any source and learns each sender from its Work. A plain recv reports its peer.
// Over shared memory and over tcp, with messages small (buffered on arrival) and large (tcp
// leaves them on the wire until a receive is posted).
TEST(ProcessGroupLists, RecvFromAnySourceReportsTheSender) {
  for (bool sharedMemory : {true, false}) {
    for (size_t count : {size_t{1000}, size_t{1} << 18}) {
      SCOPED_TRACE(std::string(sharedMemory ? "shm" : "tcp") + ", count " + std::to_string(count));
      ProcessGroupOptions options = quickOptions();
      options.comm.context.sharedMemory = sharedMemory;
      runGroups(4, options, [&](ProcessGroup& pg) {
        if (pg.rank() != 0) {
          std::vector<int64_t> msg(count, 10 * pg.rank());
          pg.send(view(msg.data(), msg.size()), 0, 5)->wait();
          int64_t x = pg.rank();
          pg.send(view(&x, 1), 0, 6)->wait();
          return;
        }
        std::vector<int> senders;
        for (int i = 0; i < 3; ++i) {
          std::vector<int64_t> msg(count, -1);
          auto work = pg.recvAnySource(view(msg.data(), msg.size()), 5);
          work->wait();
          const int source = work->sourceRank();
          EXPECT_EQ(msg.front(), 10 * source);
          EXPECT_EQ(msg.back(), 10 * source);
          senders.push_back(source);
        }
        std::sort(senders.begin(), senders.end());
        EXPECT_EQ(senders, (std::vector<int>{1, 2, 3}));
        for (int peer = 1; peer < 4; ++peer) {
          int64_t x = -1;
          auto work = pg.recv(view(&x, 1), peer, 6);
          work->wait();
          EXPECT_EQ(x, peer);
          EXPECT_EQ(work->sourceRank(), peer);
        }
      });
    }
  }
}

TEST(ProcessGroupLists, RecvFromAnySourceTimesOutNamingTheTag) {
  runGroups(2, quickOptions(), [](ProcessGroup& pg) {
    if (pg.rank() != 0) return;
    int64_t x = 0;
    auto work = pg.recvAnySource(view(&x, 1), 9, {.timeout = milliseconds(300)});
    EXPECT_THAT(messageOf<TimeoutError>([&] { work->wait(); }),
                HasSubstr("recv from any source timed out after 300 ms: no rank of 2 sent tag 9"));
    EXPECT_EQ(work->sourceRank(), -1);
  });
}

TEST(ProcessGroupLists, UnevenArgumentsAreCheckedOnTheCallersThread) {
  runGroups(2, quickOptions(), [](ProcessGroup& pg) {
    std::vector<float> in(5), out(5);
    const uint64_t before = pg.lastSeq();
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  pg.alltoallv(view(in.data(), 5), {2, 2}, view(out.data(), 5), {2, 3});
                }),
                HasSubstr("alltoallv: inSplits [2, 2] add up to 4 elements but the input has 5"));
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  pg.alltoallv(view(in.data(), 5), {5}, view(out.data(), 5), {2, 3});
                }),
                HasSubstr("inSplits [5] has 1 entries; expected one per rank (2)"));
    EXPECT_THAT(messageOf<InvalidArgumentError>(
                    [&] { pg.alltoallv(view(in.data(), 5), {}, view(out.data(), 5), {}); }),
                HasSubstr("5 elements do not split into 2 equal blocks"));
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  pg.allgatherv(view(in.data(), 1), view(out.data(), 5), {2, 3});
                }),
                HasSubstr("allgatherv: input has 1 elements but counts [2, 3] give rank"));
    EXPECT_THAT(
        messageOf<InvalidArgumentError>([&] {
          pg.reduceScatterv(view(in.data(), 5), view(out.data(), 2), {2, 2});
        }),
        HasSubstr("reduce_scatterv: counts [2, 2] add up to 4 elements but the input has 5"));
    EXPECT_THAT(messageOf<InvalidArgumentError>([&] {
                  pg.gatherv(view(in.data(), 2), view(out.data(), 5), {2, 2}, {.root = 3});
                }),
                HasSubstr("gatherv: root 3 is out of range"));
    EXPECT_EQ(pg.lastSeq(), before);
  });
}

// Rank 1 sends 3 elements where rank 0 expects 2: rank 0's failure is an InvalidArgumentError
// (the caller's arguments disagree between ranks) naming the operation, both ranks and both
// sizes; the group is broken afterwards. Rank 1's own exchange may complete before rank 0
// notices; if it fails, it fails with the same type and rank 0's report.
TEST(ProcessGroupLists, SplitsThatDisagreeBetweenRanksNameBoth) {
  std::string error;
  std::string peerError;
  runGroups(2, quickOptions(milliseconds(10000)), [&](ProcessGroup& pg) {
    std::vector<float> in(4, 1.0f), out(4);
    const std::vector<size_t> inSplits =
        pg.rank() == 0 ? std::vector<size_t>{1, 1} : std::vector<size_t>{3, 1};
    const std::vector<size_t> outSplits =
        pg.rank() == 0 ? std::vector<size_t>{1, 2} : std::vector<size_t>{1, 1};
    auto work = pg.alltoallv(view(in.data(), sumOf(inSplits)), inSplits,
                             view(out.data(), sumOf(outSplits)), outSplits);
    try {
      work->wait();
      if (pg.rank() == 0) ADD_FAILURE() << "rank 0 received more bytes than it expects";
    } catch (const InvalidArgumentError& e) {
      (pg.rank() == 0 ? error : peerError) = e.what();
    }
    if (pg.rank() == 1 && peerError.empty()) {
      // The group is broken: rank 1's next collective fails with the root cause.
      float x = 1.0f;
      try {
        pg.allreduce(view(&x, 1))->wait();
        ADD_FAILURE() << "the group went on after rank 0's failure";
      } catch (const Error& e) {
        peerError = e.what();
      }
    }
  });
  // Every message of an uneven collective carries its block's count (its signature), so the
  // mismatch is found in the first message and both ranks' blocks are named.
  for (const std::string& e : {error, peerError}) {
    EXPECT_THAT(e, HasSubstr("mismatched collective #1"));
    EXPECT_THAT(e, HasSubstr("rank 1 called alltoallv(dtype=float, block of 3 elements)"));
    EXPECT_THAT(e, HasSubstr("rank 0 called alltoallv(dtype=float, block of 2 elements)"));
  }
  EXPECT_THAT(error, HasSubstr("alltoallv#1"));
}

TEST(ProcessGroupLists, MonitoredBarrierPasses) {
  runGroups(3, quickOptions(), [](ProcessGroup& pg) {
    for (int i = 0; i < 3; ++i) pg.monitoredBarrier({.timeout = milliseconds(10000)})->wait();
    // The group goes on with ordinary collectives.
    float x = 1.0f;
    pg.allreduce(view(&x, 1))->wait();
    EXPECT_EQ(x, 3.0f);
  });
}

// Rank 2 never calls the barrier: rank 0 names it once the (short) timeout passed, and the
// other ranks fail with rank 0's verdict, all within a bounded time.
TEST(ProcessGroupLists, MonitoredBarrierNamesTheRankThatNeverArrives) {
  for (bool waitAll : {false, true}) {
    SCOPED_TRACE(waitAll ? "waitAllRanks" : "first missing rank");
    std::vector<std::string> errors(4);
    const auto start = std::chrono::steady_clock::now();
    runGroups(4, quickOptions(), [&](ProcessGroup& pg) {
      if (pg.rank() == 2 || (waitAll && pg.rank() == 3)) return;
      try {
        pg.monitoredBarrier({.timeout = milliseconds(500), .waitAllRanks = waitAll})->wait();
      } catch (const TimeoutError& e) {
        errors[pg.rank()] = e.what();
      }
    });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
    if (waitAll) {
      EXPECT_THAT(errors[0], HasSubstr("monitored_barrier#1 timed out after 500 ms: ranks 2, 3 "
                                       "did not arrive"));
    } else {
      EXPECT_THAT(errors[0], HasSubstr("rank 2 did not arrive"));
      EXPECT_THAT(errors[3], HasSubstr("rank 2 did not arrive"));
    }
    EXPECT_THAT(errors[1], HasSubstr("monitored_barrier#1 failed on rank 0"));
  }
}

}  // namespace
}  // namespace loom
