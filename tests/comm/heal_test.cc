// Connections that heal (comm/src/tcp/tcp_heal.cc), with process ranks over a FileStore on
// loopback (same-host connections heal only with ContextOptions::tcpHealLocal, set here):
// - a connection reset mid all-reduce (the transport's test hook resets one socket after some
//   bytes) is re-established and the all-reduce completes with exact results: 2 and 4 ranks,
//   one and two connections per pair, resets in both directions and twice in one operation;
// - a peer that is SIGKILLed still fails the others within seconds, naming it;
// - a peer that lives but cannot answer (SIGSTOPped) fails the rank that lost its connection
//   once the reconnect bound passes, saying so;
// - with healing off (tcpReconnectMs 0) the reset fails the all-reduce with an IoError;
// - and the replay ring keeps exactly the last bytes of a stream.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "killed_peer_case.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"
#include "tcp/replay_ring.h"
#include "tcp/tcp_transport.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;

ContextOptions healOptions(int sockets = 1, int reconnectMs = 10000) {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.sharedMemory = false;
  o.timeout = 60s;
  o.tcpSockets = sockets;
  o.tcpReconnectMs = reconnectMs;
  o.tcpHealLocal = true;
  return o;
}

tcp::TcpTransport& tcpOf(Context& ctx) {
  auto* t = dynamic_cast<tcp::TcpTransport*>(&ctx.transport());
  LOOM_CHECK(t != nullptr, "the Context's transport is ", ctx.transport().name(),
             ", expected the tcp transport");
  return *t;
}

// What rank r puts in element i at iteration `iter`: small integers, so every sum is exact.
int32_t valueOf(int r, size_t i, int iter) {
  return static_cast<int32_t>((r + 1) * 7 + static_cast<int>(i % 1013) + iter);
}

// `iters` all-reduces of `count` int32 (sum), each result checked element by element.
void allreduceChecked(Context& ctx, size_t count, int iters, uint64_t firstSeq) {
  const int size = ctx.size();
  std::vector<int32_t> buf(count);
  for (int iter = 0; iter < iters; ++iter) {
    for (size_t i = 0; i < count; ++i) buf[i] = valueOf(ctx.rank(), i, iter);
    CollectiveOptions opts;
    opts.seq = firstSeq + static_cast<uint64_t>(iter);
    opts.timeout = 60s;
    allreduce(ctx, buf.data(), buf.data(), count, DType::kInt32, ReduceOp::kSum, opts);
    for (size_t i = 0; i < count; ++i) {
      int32_t want = 0;
      for (int r = 0; r < size; ++r) want += valueOf(r, i, iter);
      LOOM_CHECK_EQ(buf[i], want, "rank ", ctx.rank(), ": element ", i, " of all-reduce ", iter);
    }
  }
}

struct ResetCase {
  int size;
  int sockets;
  bool bothWays;  // the peer resets the same connection from its end too
  int times;      // resets per armed connection
};

class HealReset : public ::testing::TestWithParam<ResetCase> {};

// 16 MiB all-reduces; before the first, rank 1 arms a reset of its connection(s) to every peer
// after 3 MiB of sending (the ring and halving-doubling algorithms send that much to some peers
// within one all-reduce), `times` times; with bothWays its peers arm theirs towards it too.
// Every result is exact, and rank 1's connections were re-established at least once.
TEST_P(HealReset, AllreduceCompletesExactly) {
  const ResetCase c = GetParam();
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int victim = 1;
  const size_t count = size_t{4} << 20;  // 16 MiB of int32
  children.spawnRanks(c.size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, c.size, healOptions(c.sockets));
    tcp::TcpTransport& tcp = tcpOf(*ctx);
    // One small all-reduce first: every connection is up and has carried data.
    allreduceChecked(*ctx, 1000, 1, 1);
    for (int peer = 0; peer < c.size; ++peer) {
      if (peer == rank) continue;
      for (int lane = 0; lane < c.sockets; ++lane) {
        LOOM_CHECK(tcp.heals(peer, lane), "connection ", lane, " to rank ", peer, " does not heal");
        if (rank == victim) tcp.testResetAfter(peer, lane, 3u << 20, c.times);
        if (c.bothWays && peer == victim) tcp.testResetAfter(peer, lane, 5u << 20, c.times);
      }
    }
    allreduceChecked(*ctx, count, 3, 2);
    if (rank == victim) {
      LOOM_CHECK(tcp.reconnects() >= c.times, "rank ", rank, " re-established ", tcp.reconnects(),
                 " connections, expected at least ", c.times);
    }
    std::fprintf(stderr, "rank %d: %d connection(s) re-established\n", rank, tcp.reconnects());
    LOOM_CHECK(!tcp.failed(), "the transport failed");
  });
  EXPECT_EQ(children.waitAllOk(120s), "");
}

INSTANTIATE_TEST_SUITE_P(Heal, HealReset,
                         ::testing::Values(ResetCase{2, 1, false, 1}, ResetCase{4, 1, false, 1},
                                           ResetCase{2, 2, false, 1}, ResetCase{4, 2, false, 1},
                                           ResetCase{2, 1, true, 2}, ResetCase{4, 1, true, 2}),
                         [](const auto& info) {
                           const ResetCase& c = info.param;
                           return std::to_string(c.size) + "ranks_" + std::to_string(c.sockets) +
                                  "sockets" + (c.bothWays ? "_both_ways" : "") +
                                  (c.times > 1 ? "_twice" : "");
                         });

// Healing on: a SIGKILLed rank still fails the others within seconds, naming it (its listener
// refuses the redial, or the accepting side's probe).
TEST(Heal, KilledPeerStillFailsOthersWithinSeconds) {
  runKilledPeerCase(healOptions());
}

// A live peer that cannot answer (rank 0 stops itself) while rank 1's connection to it is
// reset: rank 1 fails once the bound (1.5 s) passes, with an IoError saying the connection
// could not be re-established and where the stream stood, well before the operation's 60 s.
TEST(Heal, ReconnectBoundPassedFailsSayingSo) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int size = 2;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, healOptions(1, 1500));
    allreduceChecked(*ctx, 1000, 1, 1);
    if (rank == 0) {
      store.set("heal/stopping", std::to_string(::getpid()));
      ::raise(SIGSTOP);  // the parent kills it once rank 1 is done
      return;
    }
    // Reset only once rank 0 is stopped: a reset it can still answer heals at once, and then
    // the all-reduce waits for the stopped rank until its own timeout.
    store.wait({"heal/stopping"}, 30s);
    const std::string stat = "/proc/" + toString(store.get("heal/stopping")) + "/stat";
    const auto stopBy = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      std::ifstream in(stat);
      std::string line;
      std::getline(in, line);
      const size_t paren = line.rfind(')');
      if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T') break;
      LOOM_CHECK(std::chrono::steady_clock::now() < stopBy, "rank 0 did not stop: ", line);
      std::this_thread::sleep_for(1ms);  // polling the peer's state, bounded above
    }
    tcpOf(*ctx).testResetAfter(0, 0, 1);
    std::vector<int32_t> buf(1000, 1);
    CollectiveOptions opts;
    opts.seq = 2;
    opts.timeout = 60s;
    const auto start = std::chrono::steady_clock::now();
    try {
      allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kInt32, ReduceOp::kSum, opts);
    } catch (const IoError& e) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      std::fprintf(stderr, "rank 1 got after %lld ms: %s\n", static_cast<long long>(waited.count()),
                   e.what());
      const std::string what = e.what();
      LOOM_CHECK(what.find("could not be re-established within 1500 ms") != std::string::npos,
                 "the error does not name the bound: ", what);
      LOOM_CHECK(what.find("rank 0") != std::string::npos, "the error does not name rank 0");
      LOOM_CHECK(waited < 30s, "the failure took ", waited.count(), " ms");
      // Aborted, the Context's destructor does not say goodbye to the stopped peer: it only
      // joins its threads (an _exit here left them running: ThreadSanitizer's thread leak).
      ctx->abort("the test is done");
      ctx.reset();
      ::_exit(0);
    }
    LOOM_THROW(InvalidArgumentError, "the all-reduce with a stopped peer succeeded");
  });
  const loom::testing::ChildExit one = children.wait(1, 60s);
  children.kill(0, SIGKILL);
  children.waitAll(10s);
  EXPECT_TRUE(one.ok()) << one.describe();
}

// Healing off: the reset fails the all-reduce on the rank that reset with an IoError that says
// so, and its peer too (as before connections healed).
TEST(Heal, HealingOffResetFailsTheOperation) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int size = 2;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, healOptions(1, 0));
    allreduceChecked(*ctx, 1000, 1, 1);
    tcp::TcpTransport& tcp = tcpOf(*ctx);
    LOOM_CHECK(!tcp.heals(1 - rank, 0), "connections heal with tcpReconnectMs 0");
    if (rank == 1) tcp.testResetAfter(0, 0, 1 << 20);
    try {
      allreduceChecked(*ctx, size_t{4} << 20, 1, 2);
    } catch (const IoError& e) {
      std::fprintf(stderr, "rank %d got: %s\n", rank, e.what());
      if (rank == 1) {
        LOOM_CHECK(std::string(e.what()).find("reset by the test hook") != std::string::npos,
                   "rank 1's error does not say the hook reset the connection: ", e.what());
      }
      return;
    }
    LOOM_THROW(InvalidArgumentError, "rank ", rank, ": the all-reduce succeeded after a reset");
  });
  EXPECT_EQ(children.waitAllOk(60s), "");
}

TEST(ReplayRing, KeepsTheLastCapacityBytesAndRefusesOlder) {
  tcp::ReplayRing ring(10);
  std::vector<uint8_t> stream(100);
  std::iota(stream.begin(), stream.end(), uint8_t{0});
  std::vector<uint8_t> out;
  ring.append(stream.data(), 4);  // [0, 4)
  ASSERT_TRUE(ring.copyFrom(1, out));
  EXPECT_EQ(out, std::vector<uint8_t>(stream.begin() + 1, stream.begin() + 4));
  ring.append(stream.data() + 4, 9);  // [0, 13): keeps [3, 13), wrapping
  EXPECT_EQ(ring.begin(), 3u);
  EXPECT_EQ(ring.end(), 13u);
  EXPECT_FALSE(ring.copyFrom(2, out));
  ASSERT_TRUE(ring.copyFrom(3, out));
  EXPECT_EQ(out, std::vector<uint8_t>(stream.begin() + 3, stream.begin() + 13));
  ring.append(stream.data() + 13, 25);  // more than the capacity at once: keeps [28, 38)
  EXPECT_EQ(ring.begin(), 28u);
  ASSERT_TRUE(ring.copyFrom(30, out));
  EXPECT_EQ(out, std::vector<uint8_t>(stream.begin() + 30, stream.begin() + 38));
  ASSERT_TRUE(ring.copyFrom(38, out));
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(ring.copyFrom(39, out));
}

}  // namespace
}  // namespace loom::comm::testing
