// Process ranks (forked before any thread exists) over a directory store: a collective
// across processes works, and when one rank is SIGKILLed in the middle of a loop of
// all-reduces, every other rank gets an IoError naming the dead rank within a few seconds,
// although the collective timeout is a minute. Ranks whose arguments disagree where nothing
// else could tell (count 0 against N, another split of an uneven collective) fail at once
// with both signatures (issue 38). Two processes with one rank are refused at once, naming both.
// ctest runs it over shared memory (the arena, and the shm
// transport for the uneven collectives) and again with --tcp.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "killed_peer_case.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"
#include "signature.h"
#include "test_paths.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;

ContextOptions options() {
  ContextOptions o = comm::testing::testOptions();
  o.timeout = 20s;
  return o;
}

TEST(Processes, AllreduceAcrossProcesses) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int size = 3;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, options());
    for (size_t count : {size_t{1}, size_t{100000}}) {
      std::vector<double> buf(count, rank + 1.0);
      CollectiveOptions opts;
      opts.seq = count;
      allreduce(*ctx, buf.data(), buf.data(), count, DType::kFloat64, ReduceOp::kSum, opts);
      for (double v : buf) LOOM_CHECK_EQ(v, 6.0);
    }
  });
  EXPECT_EQ(children.waitAllOk(60s), "");
}

TEST(Processes, KilledPeerBecomesIoErrorNamingItWithinSeconds) {
  runKilledPeerCase(options());
}

// The collective timeout of the mismatch cases, and the bound their failure must beat: a third
// of it, generous for a loaded machine, while a mismatch found only at the deadline fails it.
constexpr auto kMismatchTimeout = 30s;
constexpr auto kMismatchBound = 10s;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs `call` on rank `rank` and checks that it fails with InvalidArgumentError well before
// the timeout, the message holding every one of `parts`.
void expectMismatch(int rank, const std::function<void()>& call,
                    const std::vector<std::string>& parts) {
  const auto start = std::chrono::steady_clock::now();
  try {
    call();
  } catch (const InvalidArgumentError& e) {
    const auto took = std::chrono::steady_clock::now() - start;
    LOOM_CHECK(took < kMismatchBound, "rank ", rank, ": the mismatch took ",
               std::chrono::duration_cast<std::chrono::milliseconds>(took).count(),
               " ms: ", e.what());
    for (const std::string& part : parts) {
      LOOM_CHECK(contains(e.what(), part), "rank ", rank, ": '", part, "' not in: ", e.what());
    }
    return;
  }
  LOOM_THROW(Error, "rank ", rank, ": no InvalidArgumentError");
}

// Two processes started with the same rank (a launcher bug, a copied environment): the second
// is refused when it claims the rank, and every other process of the group, the one holding
// the rank included, stops at once with the same InvalidArgumentError naming the rank and both
// processes, instead of one joining in the other's place or all waiting out the timeout.
// `claims` is each process's rank: one rank twice, and ranks missing, so that no group forms.
void expectDuplicateNamedEverywhere(int size, const std::vector<int>& claims, int duplicate) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  for (size_t i = 0; i < claims.size(); ++i) {
    const int rank = claims[i];
    children.spawn([&, rank, i] {
      FileStore store(dir.file("store"));
      const auto start = std::chrono::steady_clock::now();
      std::string what;
      try {
        Context::create(store, rank, size, options());
        LOOM_THROW(Error, "rank ", rank, ": the group formed");
      } catch (const InvalidArgumentError& e) {
        what = e.what();
      }
      const auto took = std::chrono::steady_clock::now() - start;
      LOOM_CHECK(took < kMismatchBound, "rank ", rank, ": the error came after ",
                 std::chrono::duration_cast<std::chrono::milliseconds>(took).count(),
                 " ms: ", what);
      store.set(detail::str("test/error/", i), what);
    });
  }
  ASSERT_EQ(children.waitAllOk(60s), "");
  FileStore store(dir.file("store"));
  std::vector<std::string> pids;
  for (size_t i = 0; i < claims.size(); ++i) {
    if (claims[i] == duplicate) pids.push_back(detail::str("pid ", children.pid(i)));
  }
  ASSERT_EQ(pids.size(), 2u);
  for (size_t i = 0; i < claims.size(); ++i) {
    const std::string what = store.getString(detail::str("test/error/", i));
    SCOPED_TRACE(detail::str("process ", i, " (rank ", claims[i], "): ", what));
    EXPECT_TRUE(contains(
        what, detail::str("rank ", duplicate, " of this group is claimed by two processes")));
    EXPECT_TRUE(contains(what, pids[0]) && contains(what, pids[1]));
  }
}

TEST(Processes, RankZeroTwiceOfTwoFailsBothNamingBoth) {
  expectDuplicateNamedEverywhere(2, {0, 0}, 0);
}

TEST(Processes, ADuplicateRankStopsTheWholeGroupNamingIt) {
  expectDuplicateNamedEverywhere(4, {0, 1, 1, 3}, 1);  // rank 2 never comes
}

// Issue 38: a rank that passes count 0 used to return before any message, leaving the rank
// that passed N waiting for its whole timeout. Now both fail at once, naming both signatures.
TEST(Processes, CountZeroAgainstNFailsEveryRankAtOnceNamingBoth) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  children.spawnRanks(2, [&](int rank) {
    FileStore store(dir.file("store"));
    ContextOptions o = options();
    o.timeout = kMismatchTimeout;
    auto ctx = Context::create(store, rank, 2, o);
    std::vector<float> buf(1000, 1.0f);
    CollectiveOptions opts;
    opts.seq = 3;
    opts.timeout = kMismatchTimeout;
    const size_t count = rank == 0 ? 0 : buf.size();
    expectMismatch(
        rank,
        [&] {
          allreduce(*ctx, buf.data(), buf.data(), count, DType::kFloat32, ReduceOp::kSum, opts);
        },
        {"allreduce(dtype=float, count=0, op=sum)", "allreduce(dtype=float, count=1000, op=sum)"});
  });
  EXPECT_EQ(children.waitAllOk(60s), "");
}

// The rooted case: a broadcast whose root passes count 0 while the other rank passes N. The
// rank that receives fails at once with both signatures; the root's part may already be done
// (over the arena it only posts; a root's broadcast never waits for the others there), else it
// fails at once too. Nobody waits for the deadline.
TEST(Processes, ABroadcastOfCountZeroAgainstNFailsTheReceiverAtOnce) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  children.spawnRanks(2, [&](int rank) {
    FileStore store(dir.file("store"));
    ContextOptions o = options();
    o.timeout = kMismatchTimeout;
    auto ctx = Context::create(store, rank, 2, o);
    std::vector<int32_t> buf(64, rank);
    CollectiveOptions opts;
    opts.seq = 5;
    opts.timeout = kMismatchTimeout;
    const std::vector<std::string> both = {"broadcast(dtype=int32, count=0, root=0)",
                                           "broadcast(dtype=int32, count=64, root=0)"};
    if (rank == 1) {
      expectMismatch(
          rank, [&] { broadcast(*ctx, buf.data(), buf.size(), DType::kInt32, 0, opts); }, both);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      broadcast(*ctx, buf.data(), 0, DType::kInt32, 0, opts);
    } catch (const InvalidArgumentError& e) {
      for (const std::string& part : both) {
        LOOM_CHECK(contains(e.what(), part), "rank 0: '", part, "' not in: ", e.what());
      }
    }
    LOOM_CHECK(std::chrono::steady_clock::now() - start < kMismatchBound,
               "rank 0: the broadcast's root waited for its deadline");
  });
  EXPECT_EQ(children.waitAllOk(60s), "");
}

// Issue 38: the uneven collectives carry the count of each message's block and a digest of the
// whole count vector: ranks whose split sizes differ fail at their first message, both ranks
// with both signatures, instead of a size error deep in a transport (or, for a block one rank
// thinks empty, a wait until the deadline).
TEST(Processes, AnUnevenSplitMismatchIsNamedOnEveryRankAtOnce) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const std::vector<size_t> counts0 = {3, 0}, counts1 = {3, 2};
  auto digest = [](const std::vector<size_t>& counts) {
    char text[48];
    std::snprintf(text, sizeof(text), "counts digest 0x%016llx",
                  static_cast<unsigned long long>(countsDigest(counts)));
    return std::string(text);
  };
  const std::string digest0 = digest(counts0), digest1 = digest(counts1);
  children.spawnRanks(2, [&](int rank) {
    FileStore store(dir.file("store"));
    ContextOptions o = options();
    o.timeout = kMismatchTimeout;
    auto ctx = Context::create(store, rank, 2, o);
    std::vector<float> in(3, 1.0f), out(5);
    CollectiveOptions opts;
    opts.seq = 4;
    opts.timeout = kMismatchTimeout;
    expectMismatch(rank,
                   [&] {
                     allgatherv(*ctx, in.data(), out.data(), rank == 0 ? counts0 : counts1,
                                DType::kFloat32, opts);
                   },
                   {"allgatherv#4", digest0, digest1});
  });
  EXPECT_EQ(children.waitAllOk(60s), "");
}

}  // namespace
}  // namespace loom::comm::testing
