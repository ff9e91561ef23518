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

#include "loom/store/file_store.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/testing/ranks.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;

ContextOptions options() {
  ContextOptions o;
  o.host = "127.0.0.1";
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
        const auto waited = std::chrono::steady_clock::now() - start;
        std::fprintf(stderr, "rank %d got: %s\n", rank, e.what());
        LOOM_CHECK(waited < 5s, "the error took ",
                   std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(), " ms");
        LOOM_CHECK(std::string(e.what()).find("rank 2") != std::string::npos,
                   "the error does not name rank 2: ", e.what());
        LOOM_CHECK(dynamic_cast<const TimeoutError*>(&e) == nullptr, "got a timeout");
        return;
      }
      LOOM_CHECK(seq < 1000000, "never saw the failure");
    }
  });
  const auto exits = children.waitAll(60s);
  for (int rank = 0; rank < size; ++rank) {
    if (rank == victim) {
      EXPECT_EQ(exits[rank].signal, SIGKILL) << exits[rank].describe();
    } else {
      EXPECT_TRUE(exits[rank].ok()) << "rank " << rank << ": " << exits[rank].describe();
    }
  }
}

}  // namespace
}  // namespace loom::comm::testing
