// The verbs backend on a real RDMA device: two processes, createProcessGroup("verbs"),
// all-reduce and broadcast, large messages (many fragments and credit returns). Skipped with
// a one-line reason when no RDMA device is visible (always the case in CI).
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "loom/comm/verbs.h"
#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/work.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

using namespace std::chrono_literals;

TEST(VerbsDevice, TwoProcessesAllreduceAndBroadcast) {
  std::string why;
  if (!comm::verbsAvailable(&why)) GTEST_SKIP() << "no RDMA device (" << why << ")";
  loom::testing::TempDir dir;
  const std::string path = dir.file("store");
  loom::testing::ChildProcesses children;
  children.spawnRanks(2, [&](int rank) {
    auto store = std::make_shared<FileStore>(path);
    ProcessGroupOptions o;
    o.timeout = 20s;
    auto pg = createProcessGroup("verbs", store, rank, 2, o);
    for (size_t n : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
      std::vector<float> buf(n, static_cast<float>(rank + 1));
      pg->allreduce(view(buf.data(), n))->wait();
      for (float v : buf) LOOM_CHECK(v == 3.0f, "allreduce gave ", v, " for n=", n);
      std::vector<int32_t> b(n, rank == 1 ? 7 : 0);
      pg->broadcast(view(b.data(), n), {.root = 1})->wait();
      for (int32_t v : b) LOOM_CHECK(v == 7, "broadcast gave ", v, " for n=", n);
    }
  });
  EXPECT_EQ(children.waitAllOk(50s), "");
}

}  // namespace
}  // namespace loom
