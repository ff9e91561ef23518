// The shared-memory point-to-point transport with thread ranks: same-host peers get it (and
// ContextOptions::sharedMemory = false gives tcp); messages of every size through tiny rings
// (wrap-around, padding, zero bytes), received in any order (unexpected messages, one still
// arriving when its receive is posted), all pairs at once without deadlock, a receive from a rank
// that closed its transport after its last message, abort from another thread reaching the peer,
// and the generic (forced) algorithms running over it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// `ringBytes` 0: the default ring size.
ContextOptions options(size_t ringBytes = 0) {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.timeout = 30s;
  o.shmRingBytes = ringBytes;
  return o;
}

uint8_t pattern(int from, int to, size_t message, size_t i) {
  return static_cast<uint8_t>(from * 131 + to * 31 + message * 7 + i * 13 + 1);
}

TEST(ShmTransport, SameHostPeersUseSharedMemoryUnlessSwitchedOff) {
  {
    HashStore store;
    loom::testing::runThreadRanks(2, [&](int rank) {
      auto ctx = Context::create(store, rank, 2, options());
      EXPECT_STREQ(ctx->transport().name(), "shm+tcp");
    });
  }
  ContextOptions off = options();
  off.sharedMemory = false;
  HashStore store;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, off);
    EXPECT_STREQ(ctx->transport().name(), "tcp");
  });
}

TEST(ShmTransport, EverySizeThroughATinyRingInAnyOrder) {
  const std::vector<size_t> sizes = {0, 1, 15, 16, 17, 4079, 4080, 4096, 4097, 100003};
  HashStore store;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options(4096));
    Transport& t = ctx->transport();
    ASSERT_STREQ(t.name(), "shm+tcp");
    const int peer = 1 - rank;
    const Deadline deadline(30s);
    // Both ranks send everything first (the rings fill; the receivers drain into unexpected
    // buffers), then receive in reverse order.
    std::vector<std::vector<uint8_t>> out(sizes.size()), in(sizes.size());
    std::vector<RequestPtr> sends, recvs;
    for (size_t m = 0; m < sizes.size(); ++m) {
      out[m].resize(sizes[m]);
      for (size_t i = 0; i < sizes[m]; ++i) out[m][i] = pattern(rank, peer, m, i);
      sends.push_back(t.isend(peer, out[m].data(), sizes[m], 100 + m));
    }
    for (size_t k = sizes.size(); k-- > 0;) {
      in[k].assign(sizes[k], 0xee);
      recvs.push_back(t.irecv(peer, in[k].data(), sizes[k], 100 + k));
      ASSERT_TRUE(recvs.back()->wait(deadline)) << "message " << k;
    }
    for (auto& s : sends) ASSERT_TRUE(s->wait(deadline));
    for (size_t m = 0; m < sizes.size(); ++m) {
      for (size_t i = 0; i < sizes[m]; ++i) {
        ASSERT_EQ(in[m][i], pattern(peer, rank, m, i)) << "message " << m << " byte " << i;
      }
    }
  });
}

TEST(ShmTransport, ReceivePostedWhileItsMessageIsArriving) {
  // The message is far larger than the ring: the receiver sees its header first (no receive
  // posted: it starts as an unexpected message), then posts the receive, which takes what
  // came and gets the rest directly.
  const size_t n = (size_t{1} << 20) + 5;
  HashStore store;
  std::latch started(1);
  // Rank 0 stays until rank 1 has checked its message: a sender that closes its transport
  // while rank 1's other receive (tag 8) is pending fails that receive, and with it rank 1.
  std::latch checked(1);
  struct CountDown {  // rank 1 counts down however it leaves (an assertion returns early)
    std::latch* latch;
    ~CountDown() {
      if (latch != nullptr) latch->count_down();
    }
  };
  loom::testing::runThreadRanks(2, [&](int rank) {
    const CountDown release{rank == 1 ? &checked : nullptr};
    auto ctx = Context::create(store, rank, 2, options(8192));
    Transport& t = ctx->transport();
    const Deadline deadline(30s);
    std::vector<uint8_t> buf(n);
    if (rank == 0) {
      for (size_t i = 0; i < n; ++i) buf[i] = pattern(0, 1, 0, i);
      auto s = t.isend(1, buf.data(), n, 7);
      started.count_down();
      ASSERT_TRUE(s->wait(deadline));
      checked.wait();
    } else {
      started.wait();
      uint8_t dummy = 0;
      // Poll another tag first so that the big message's header is drained unmatched.
      auto other = t.irecv(0, &dummy, 1, 8);
      EXPECT_FALSE(other->test());
      auto r = t.irecv(0, buf.data(), n, 7);
      ASSERT_TRUE(r->wait(deadline));
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], pattern(0, 1, 0, i)) << "byte " << i;
      t.abort("test over");  // `other` never completes
    }
  });
}

TEST(ShmTransport, AllPairsAtOnceWithSmallRings) {
  const int size = 4;
  const size_t n = 50000;
  HashStore store;
  loom::testing::runThreadRanks(size, [&](int rank) {
    auto ctx = Context::create(store, rank, size, options(4096));
    Transport& t = ctx->transport();
    const Deadline deadline(30s);
    std::vector<std::vector<uint8_t>> out(size), in(size);
    std::vector<RequestPtr> reqs;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      out[p].resize(n);
      for (size_t i = 0; i < n; ++i) out[p][i] = pattern(rank, p, 0, i);
      reqs.push_back(t.isend(p, out[p].data(), n, 1));
    }
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      in[p].resize(n);
      reqs.push_back(t.irecv(p, in[p].data(), n, 1));
    }
    for (auto& r : reqs) ASSERT_TRUE(r->wait(deadline));
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(in[p][i], pattern(p, rank, 0, i));
    }
  });
}

TEST(ShmTransport, PeerThatClosedAfterItsLastMessage) {
  HashStore store;
  std::latch closed(1);
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options());
    Transport& t = ctx->transport();
    if (rank == 1) {
      const int64_t v = 42;
      ASSERT_TRUE(t.isend(0, &v, 8, 3)->wait(Deadline(10s)));
      ctx.reset();  // goodbye
      closed.count_down();
      return;
    }
    closed.wait();
    int64_t v = 0;
    ASSERT_TRUE(t.irecv(1, &v, 8, 3)->wait(Deadline(10s)));  // sent before it closed
    EXPECT_EQ(v, 42);
    const auto start = Clock::now();
    try {
      t.irecv(1, &v, 8, 4)->wait(Deadline(20s));
      ADD_FAILURE() << "a receive from a closed peer completed";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("closed"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, 5s);
  });
}

TEST(ShmTransport, AbortFromAnotherThreadReachesThePeer) {
  HashStore store;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, options());
    Transport& t = ctx->transport();
    std::vector<uint8_t> buf(1000);
    auto r = t.irecv(1 - rank, buf.data(), buf.size(), 9);  // never sent
    std::thread aborter;
    if (rank == 0) {
      // Before or after rank 0 blocks: either way its wait and rank 1's must fail.
      aborter = std::thread([&] { ctx->abort("stopped by the test"); });
    }
    const auto start = Clock::now();
    try {
      r->wait(Deadline(20s));
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("stopped by the test"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, 5s);
    if (aborter.joinable()) aborter.join();
  });
}

TEST(ShmTransport, ForcedGenericAlgorithmsRunOverIt) {
  for (int size : {2, 3, 4}) {
    HashStore store;
    loom::testing::runThreadRanks(size, [&](int rank) {
      auto ctx = Context::create(store, rank, size, options(4096));
      ASSERT_STREQ(ctx->transport().name(), "shm+tcp");
      const float sum = size * (size + 1) / 2.0f;
      uint64_t seq = 0;
      for (Algorithm algo : {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kDirect}) {
        for (size_t count : {size_t{1}, size_t{1000}, size_t{70001}}) {
          CollectiveOptions opts;
          opts.algorithm = algo;
          opts.seq = ++seq;
          std::vector<float> buf(count, rank + 1.0f);
          allreduce(*ctx, buf.data(), buf.data(), count, DType::kFloat32, ReduceOp::kSum, opts);
          for (float v : buf) ASSERT_EQ(v, sum);
        }
      }
      for (Algorithm algo : {Algorithm::kChain, Algorithm::kTree, Algorithm::kDirect}) {
        CollectiveOptions opts;
        opts.algorithm = algo;
        opts.seq = ++seq;
        std::vector<int32_t> b(30001, rank == size - 1 ? 5 : 0);
        broadcast(*ctx, b.data(), b.size(), DType::kInt32, size - 1, opts);
        for (int32_t v : b) ASSERT_EQ(v, 5);
      }
      // send/recv around a ring
      std::vector<int64_t> mine(5000, rank), theirs(5000, -1);
      const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
      if (rank % 2 == 0) {
        send(*ctx, mine.data(), mine.size(), DType::kInt64, next, 11);
        recv(*ctx, theirs.data(), theirs.size(), DType::kInt64, prev, 11);
      } else {
        recv(*ctx, theirs.data(), theirs.size(), DType::kInt64, prev, 11);
        send(*ctx, mine.data(), mine.size(), DType::kInt64, next, 11);
      }
      for (int64_t v : theirs) ASSERT_EQ(v, prev);
    });
  }
}

// The arena's and the shm transport's settings reach them: odd slot and ring sizes, no
// spinning and the memfd still make a working Context. (The variables behind them are checked
// once, in tests/comm/settings_test.cc.)
TEST(ShmTransport, SettingsFromOptionsAreTaken) {
  ContextOptions o = options(8 << 10);
  o.shmSlotBytes = 64 << 10;
  o.shmSpinUs = 0;
  o.shmMemfd = true;
  HashStore store;
  loom::testing::runThreadRanks(2, [&](int rank) {
    auto ctx = Context::create(store, rank, 2, o);
    EXPECT_STREQ(ctx->transport().name(), "shm+tcp");
    std::vector<float> data(100000, static_cast<float>(rank + 1));
    allreduce(*ctx, data.data(), data.data(), data.size(), DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(data.front(), 3.0f);
    EXPECT_EQ(data.back(), 3.0f);
  });
}

}  // namespace
}  // namespace loom::comm::testing
