// The transport under the collectives, with thread ranks (ctest runs it once with same-host
// shared memory, as by default, and once with --tcp, test_paths.h): tagged matching and the
// unexpected-message queue, receives posted before and after the data, large messages (held in
// the socket until needed), sends nobody waits on, striping across connections, registered
// buffers, two Contexts on one store, and the waiting policies (busy, blocking, send steps).
// The error paths are in transport_errors_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <string>
#include <vector>

#include <time.h>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"
#include "transport_support.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;

TEST(Transport, TaggedMessagesMatchByTagInAnyOrder) {
  HashStore store;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, localOptions());
    Transport& t = ctx->transport();
    const Deadline deadline(10s);
    if (rank == 0) {
      std::vector<RequestPtr> sends;
      for (uint64_t tag = 1; tag <= 3; ++tag) {
        static const char* text[] = {"", "one", "two!", "three"};
        sends.push_back(t.isend(1, text[tag], std::strlen(text[tag]), tag));
      }
      // Two messages with the same tag arrive in the order they were sent.
      const int32_t a = 10, b = 20;
      sends.push_back(t.isend(1, &a, 4, 9));
      sends.push_back(t.isend(1, &b, 4, 9));
      for (auto& s : sends) ASSERT_TRUE(s->wait(deadline));
    } else {
      char three[5], one[3], two[4];
      // Receive in another order than sent: the earlier ones wait as unexpected messages.
      auto r3 = t.irecv(0, three, 5, 3);
      ASSERT_TRUE(r3->wait(deadline));
      auto r1 = t.irecv(0, one, 3, 1);
      auto r2 = t.irecv(0, two, 4, 2);
      ASSERT_TRUE(r2->wait(deadline));
      ASSERT_TRUE(r1->wait(deadline));
      EXPECT_EQ(std::string(three, 5), "three");
      EXPECT_EQ(std::string(one, 3), "one");
      EXPECT_EQ(std::string(two, 4), "two!");
      int32_t x = 0, y = 0;
      auto rx = t.irecv(0, &x, 4, 9);
      auto ry = t.irecv(0, &y, 4, 9);
      ASSERT_TRUE(ry->wait(deadline));
      ASSERT_TRUE(rx->wait(deadline));
      EXPECT_EQ(x, 10);
      EXPECT_EQ(y, 20);
    }
  });
}

TEST(Transport, LargeMessagePostedBeforeAndAfterArrival) {
  HashStore store;
  const size_t n = (size_t{64} << 20) + 3;
  std::latch posted(1);
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, localOptions());
    Transport& t = ctx->transport();
    const Deadline deadline(30s);
    std::vector<uint8_t> buf(n);
    if (rank == 0) {
      for (size_t i = 0; i < n; ++i) buf[i] = static_cast<uint8_t>(i * 7 + 1);
      posted.wait();  // the first message goes to a receive that is already posted
      auto s1 = t.isend(1, buf.data(), n, 1);
      auto s2 = t.isend(1, buf.data(), n, 2);  // the second arrives before its receive
      ASSERT_TRUE(s1->wait(deadline));
      ASSERT_TRUE(s2->wait(deadline));
    } else {
      auto r1 = t.irecv(0, buf.data(), n, 1);
      posted.count_down();
      ASSERT_TRUE(r1->wait(deadline));
      for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(buf[i], static_cast<uint8_t>(i * 7 + 1));
      ASSERT_EQ(buf[n - 1], static_cast<uint8_t>((n - 1) * 7 + 1));
      std::vector<uint8_t> second(n);
      auto r2 = t.irecv(0, second.data(), n, 2);
      ASSERT_TRUE(r2->wait(deadline));
      EXPECT_EQ(0, std::memcmp(buf.data(), second.data(), n));
    }
  });
}

// The progress thread stands aside while a thread waits and for a moment after: a send that
// nobody waits on must still finish once the sender stops waiting (here it spins on a flag,
// never touching the transport, right after a wait of its own).
TEST(Transport, SendNobodyWaitsOnFinishesAfterTheSenderStoppedWaiting) {
  HashStore store;
  const size_t n = size_t{32} << 20;  // far more than the socket buffers hold
  std::atomic<bool> received{false};
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, localOptions());
    Transport& t = ctx->transport();
    const Deadline deadline(30s);
    std::vector<uint8_t> buf(n, static_cast<uint8_t>(rank + 1));
    uint8_t token = 0;
    if (rank == 0) {
      auto s = t.isend(1, buf.data(), n, 2);
      auto r = t.irecv(1, &token, 1, 1);
      ASSERT_TRUE(r->wait(deadline));  // returns long before the 32 MiB are through
      while (!received.load() && !deadline.expired()) std::this_thread::yield();
      ASSERT_TRUE(received.load()) << "the send made no progress without a waiter";
      ASSERT_TRUE(s->wait(deadline));
    } else {
      auto s = t.isend(0, &token, 1, 1);
      ASSERT_TRUE(s->wait(deadline));
      auto r = t.irecv(0, buf.data(), n, 2);
      ASSERT_TRUE(r->wait(deadline));
      EXPECT_EQ(buf[0], 1);
      EXPECT_EQ(buf[n - 1], 1);
      received.store(true);
    }
  });
}

TEST(Transport, LargeUnexpectedMessageWaitsInTheSocketUntilNeeded) {
  // A large message nobody waits for is left in the socket; receiving a later message first
  // must still work (the large one is then buffered).
  HashStore store;
  const size_t n = size_t{8} << 20;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, localOptions());
    Transport& t = ctx->transport();
    const Deadline deadline(30s);
    std::vector<uint8_t> big(n);
    if (rank == 0) {
      for (size_t i = 0; i < n; ++i) big[i] = static_cast<uint8_t>(i % 251);
      const uint64_t small = 42;
      auto s1 = t.isend(1, big.data(), n, 1);
      auto s2 = t.isend(1, &small, 8, 2);
      ASSERT_TRUE(s1->wait(deadline));
      ASSERT_TRUE(s2->wait(deadline));
    } else {
      uint64_t small = 0;
      auto r2 = t.irecv(0, &small, 8, 2);
      ASSERT_TRUE(r2->wait(deadline));
      EXPECT_EQ(small, 42u);
      auto r1 = t.irecv(0, big.data(), n, 1);
      ASSERT_TRUE(r1->wait(deadline));
      for (size_t i = 0; i < n; i += 997) ASSERT_EQ(big[i], static_cast<uint8_t>(i % 251));
      // Over tcp the big message went through a buffer of its own (with several sockets per
      // peer, the part that shares the small one's socket; the small one may have too); the
      // shared-memory transport does not count.
      if (std::string(t.name()) == "tcp") {
        EXPECT_GE(t.unexpectedBytes(), n / 8);
        EXPECT_LE(t.unexpectedBytes(), n + 8);
      }
    }
    if (rank == 0) {
      EXPECT_EQ(t.unexpectedBytes(), 0u) << "rank 0 received nothing";
    }
  });
}

TEST(Transport, UnexpectedMessagesAreDescribedOldestFirstUntilReceived) {
  HashStore store;
  std::latch received(2);
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, localOptions());
    Transport& t = ctx->transport();
    std::vector<uint8_t> a(8, 1), b(16, 2);
    if (rank == 0) {
      ASSERT_TRUE(t.isend(1, a.data(), a.size(), 1)->wait(Deadline(10s)));
      ASSERT_TRUE(t.isend(1, b.data(), b.size(), 2)->wait(Deadline(10s)));
    } else {
      const std::string both = "none#0 step 1 (8 bytes), none#0 step 2 (16 bytes)";
      const auto end = Clock::now() + 10s;
      while (t.describeUnexpected(0) != both && Clock::now() < end) std::this_thread::yield();
      EXPECT_EQ(t.describeUnexpected(0), both);
      std::vector<uint8_t> in(16);
      ASSERT_TRUE(t.irecv(0, in.data(), 16, 2)->wait(Deadline(10s)));
      EXPECT_EQ(in, b);
      EXPECT_EQ(t.describeUnexpected(0), "none#0 step 1 (8 bytes)");
      ASSERT_TRUE(t.irecv(0, in.data(), 8, 1)->wait(Deadline(10s)));
      EXPECT_EQ(t.describeUnexpected(0), "");
    }
    received.arrive_and_wait();  // rank 0's context outlives rank 1's receives
  });
}

TEST(Transport, RegisterBufferReturnsAHandleWithoutKey) {
  HashStore store;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, localOptions());
    Transport& t = ctx->transport();
    std::vector<uint8_t> buf(4096, static_cast<uint8_t>(rank + 1));
    const RegisteredBuffer handle = t.registerBuffer(buf.data(), buf.size());
    EXPECT_EQ(handle.data, buf.data());
    EXPECT_EQ(handle.bytes, buf.size());
    EXPECT_EQ(handle.rkey, 0u);  // tcp and shm: nothing a peer could write through
    if (rank == 0) {
      ASSERT_TRUE(t.isend(1, buf.data(), buf.size(), 3)->wait(Deadline(10s)));
    } else {
      ASSERT_TRUE(t.irecv(0, buf.data(), buf.size(), 3)->wait(Deadline(10s)));
      EXPECT_EQ(buf[4095], 1);
    }
    t.unregisterBuffer(handle);
  });
}

// Several connections per peer (ContextOptions::tcpSockets): messages from 256 KiB are cut
// into one part per connection; every size, in both directions at once, arrives whole, and a
// size mismatch of a striped message is still an error naming both sizes of its part.
TEST(Transport, MessagesStripedAcrossSocketsArriveWhole) {
  HashStore store;
  loom::testing::runThreadRanks(2, [&](int rank) {
    ContextOptions o = localOptions();
    o.sharedMemory = false;
    o.tcpSockets = 3;
    auto ctx = Context::create(store, rank, 2, o);
    Transport& t = ctx->transport();
    const int peer = 1 - rank;
    uint64_t tag = 1;
    for (size_t bytes : {size_t{0}, size_t{1}, (size_t{256} << 10) - 1, size_t{256} << 10,
                         (size_t{1} << 20) + 3, (size_t{5} << 20) + 7}) {
      std::vector<uint8_t> out(bytes), in(bytes, 0);
      for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 7 + rank);
      auto r = t.irecv(peer, in.data(), bytes, tag);
      auto s = t.isend(peer, out.data(), bytes, tag);
      ASSERT_TRUE(s->wait(Deadline(20s)));
      ASSERT_TRUE(r->wait(Deadline(20s)));
      EXPECT_EQ(r->bytes(), bytes);
      for (size_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(in[i], static_cast<uint8_t>(i * 7 + peer)) << "byte " << i << " of " << bytes;
      }
      ++tag;
    }
  });
}

TEST(Transport, TwoContextsOnOneStoreWithPrefixes) {
  // Like a process group and a subgroup: independent contexts used alternately.
  HashStore store;
  loom::testing::runThreadRanks(3, [&](int rank) {
    ContextOptions a = localOptions(), b = localOptions();
    a.storePrefix = "group_a";
    b.storePrefix = "group_b";
    auto ctxA = Context::create(store, rank, 3, a);
    auto ctxB = Context::create(store, rank, 3, b);
    for (uint64_t seq = 1; seq <= 20; ++seq) {
      int64_t x = rank + 1, y = rank * 10;
      CollectiveOptions opts;
      opts.seq = seq;
      allreduce(*ctxA, &x, &x, 1, DType::kInt64, ReduceOp::kSum, opts);
      allreduce(*ctxB, &y, &y, 1, DType::kInt64, ReduceOp::kMax, opts);
      ASSERT_EQ(x, 6);
      ASSERT_EQ(y, 20);
    }
  });
}

// Both ways of waiting deliver the same bytes: blocking in poll() at once (busyPollUs 0) and
// polling without blocking while bytes move (the default), on messages that cross the socket
// buffers many times, in both directions at once.
TEST(Transport, BusyAndBlockingWaitersDeliverTheSameBytes) {
  for (int busyUs : {0, 1000}) {
    SCOPED_TRACE(::testing::Message() << "busyPollUs " << busyUs);
    HashStore store;
    const size_t n = (size_t{24} << 20) + 5;
    loom::testing::runThreadRanks(2, [&](int rank) {
      ContextOptions o = localOptions();
      o.sharedMemory = false;  // the tcp transport's waiters
      o.busyPollUs = busyUs;
      auto ctx = Context::create(store, rank, 2, o);
      Transport& t = ctx->transport();
      const Deadline deadline(60s);
      const int peer = 1 - rank;
      std::vector<uint8_t> out(n), in(n);
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 13 + rank);
      for (uint64_t round = 1; round <= 3; ++round) {
        auto r = t.irecv(peer, in.data(), n, round);
        auto s = t.isend(peer, out.data(), n, round);
        ASSERT_TRUE(r->wait(deadline));
        ASSERT_TRUE(s->wait(deadline));
        for (size_t i = 0; i < n; i += 4099) {
          ASSERT_EQ(in[i], static_cast<uint8_t>(i * 13 + peer)) << "byte " << i;
        }
        ASSERT_EQ(in[n - 1], static_cast<uint8_t>((n - 1) * 13 + peer));
      }
    });
  }
}

// A waiter polls without blocking only while bytes move: waiting on a peer that sends nothing
// for a while must block after busyPollUs, not burn the core until the message comes.
TEST(Transport, BusyWaiterBlocksOnceNothingMoves) {
  HashStore store;
  std::atomic<double> waiterCpuMs{-1};
  loom::testing::runThreadRanks(2, [&](int rank) {
    ContextOptions o = localOptions();
    o.sharedMemory = false;  // the tcp transport's waiters
    o.busyPollUs = 2000;
    auto ctx = Context::create(store, rank, 2, o);
    Transport& t = ctx->transport();
    const Deadline deadline(30s);
    std::vector<uint8_t> buf(size_t{1} << 20, 7);
    if (rank == 0) {
      std::this_thread::sleep_for(600ms);  // the behaviour under test: a peer silent for 600 ms
      ASSERT_TRUE(t.isend(1, buf.data(), buf.size(), 1)->wait(deadline));
    } else {
      timespec before{}, after{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &before);
      ASSERT_TRUE(t.irecv(0, buf.data(), buf.size(), 1)->wait(deadline));
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &after);
      waiterCpuMs = static_cast<double>(after.tv_sec - before.tv_sec) * 1e3 +
                    static_cast<double>(after.tv_nsec - before.tv_nsec) * 1e-6;
    }
  });
  // About 2 ms of polling, then blocked; receiving 1 MiB costs well under 100 ms of CPU even
  // on a loaded machine, while polling for the whole 600 ms would cost several hundred.
  EXPECT_GE(waiterCpuMs.load(), 0.0);
  EXPECT_LT(waiterCpuMs.load(), 200.0) << "the waiter kept polling while nothing moved";
}

TEST(Transport, BusyPollOutOfRangeIsAnError) {
  HashStore store;
  ContextOptions o = localOptions(2s);
  o.busyPollUs = 20'000'000;
  try {
    Context::create(store, 0, 1, o);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgumentError& e) {
    expectContains(e.what(), "ContextOptions::busyPollUs is 20000000");
    expectContains(e.what(), "10000000]");
  }
}

// The tcp settings reach the transport: 64 KiB sendmsg steps and no busy polling still move a
// message of many steps intact. (The environment variables behind them are checked once, in
// settings_test.cc.)
TEST(Transport, TcpSendStepsAndBlockingWaitsFromOptions) {
  HashStore store;
  const size_t n = (size_t{3} << 20) + 1;  // many send steps of 64 KiB
  loom::testing::runThreadRanks(2, [&](int rank) {
    ContextOptions o = localOptions();
    o.sharedMemory = false;
    o.tcpSendBytes = 64 << 10;
    o.busyPollUs = 0;
    auto ctx = Context::create(store, rank, 2, o);
    Transport& t = ctx->transport();
    const Deadline deadline(30s);
    std::vector<uint8_t> buf(n);
    if (rank == 0) {
      for (size_t i = 0; i < n; ++i) buf[i] = static_cast<uint8_t>(i * 5 + 3);
      ASSERT_TRUE(t.isend(1, buf.data(), n, 1)->wait(deadline));
    } else {
      ASSERT_TRUE(t.irecv(0, buf.data(), n, 1)->wait(deadline));
      for (size_t i = 0; i < n; i += 997) ASSERT_EQ(buf[i], static_cast<uint8_t>(i * 5 + 3));
      ASSERT_EQ(buf[n - 1], static_cast<uint8_t>((n - 1) * 5 + 3));
    }
  });
}

}  // namespace
}  // namespace loom::comm
