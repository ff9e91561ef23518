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

#include "killed_peer_case.h"
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
  runKilledPeerCase(options());
}

}  // namespace
}  // namespace loom::comm::testing
