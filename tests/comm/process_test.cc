// Process ranks (forked before any thread exists) over a directory store: a collective
// across processes works, and when one rank is SIGKILLed in the middle of a loop of
// all-reduces, every other rank gets an IoError naming the dead rank within a few seconds,
// although the collective timeout is a minute.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"
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
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const int size = 3;
  const int victim = 2;
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, size, options());
    CollectiveOptions opts;
    opts.timeout = 60s;
    std::vector<float> buf(4096, 1.0f);
    for (uint64_t seq = 1;; ++seq) {
      if (rank == victim && seq == 20) ::kill(::getpid(), SIGKILL);
      opts.seq = seq;
      const auto start = std::chrono::steady_clock::now();
      try {
        allreduce(*ctx, buf.data(), buf.data(), buf.size(), DType::kFloat32, ReduceOp::kMax, opts);
      } catch (const IoError& e) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
        std::fprintf(stderr, "rank %d got: %s\n", rank, e.what());
        loom::testing::checkDeadPeerError(e, waited, 5s, "rank 2");
        return;
      }
      LOOM_CHECK(seq < 1000000, "never saw the failure");
    }
  });
  loom::testing::expectOnlyVictimKilled(children.waitAll(60s), victim);
}

}  // namespace
}  // namespace loom::comm::testing
