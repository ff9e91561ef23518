// The nccl backend's failure diagnosis with ranks as processes, on fake devices (nccl_fake.h),
// no GPU: a rank that is SIGKILLed is named as dead in the surviving rank's error, within the
// operation's timeout + 5 s; two processes claiming one rank both fail at creation naming both.
// Its own binary: it forks, so no thread may exist before. ~2 s.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "loom/common/error.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"
#include "nccl/nccl_backend.h"
#include "nccl_fake.h"

namespace loom::nccl_detail {
namespace {

using std::chrono::milliseconds;

alignas(8) char fakeMemory[64];

TEST(NcclFailureProcesses, ASigkilledRankIsNamedDeadWithinTheTimeoutPlusFiveSeconds) {
  testing::TempDir dir;
  const std::string storePath = dir.file("store");
  testing::ChildProcesses ranks;
  ranks.spawnRanks(2, [&](int rank) {
    auto store = std::make_shared<FileStore>(storePath);
    auto fake = std::make_shared<FakeNccl>();
    fake->stall = true;  // the all-reduce never completes: its peer is gone
    ProcessGroupOptions options;
    options.timeout = milliseconds(30000);
    options.heartbeatInterval = milliseconds(100);
    options.failureReportWindow = milliseconds(1000);
    auto pg = createProcessGroupNcclOn(fake, store, rank, 2, options);
    pg->barrier()->wait();  // both joined (the fake completes nothing, but enqueues it)
    if (rank == 1) {
      store->set("test/ready", std::string_view("1"));
      kill(getpid(), SIGKILL);
    }
    store->wait({"test/ready"}, milliseconds(30000));
    BufferView buf;
    buf.data = fakeMemory;
    buf.count = 4;
    buf.dtype = DType::kFloat32;
    buf.device = Device::cuda(0);
    AllreduceOptions quick;
    quick.timeout = milliseconds(2000);  // a report window of 1 s
    const auto start = std::chrono::steady_clock::now();
    try {
      pg->allreduce(buf, quick)->wait(milliseconds(60000));
    } catch (const IoError& e) {
      const auto took = std::chrono::steady_clock::now() - start;
      const std::string what = e.what();
      LOOM_CHECK(took < milliseconds(2000 + 5000), "the error came after ",
                 std::chrono::duration_cast<milliseconds>(took).count(), " ms: ", what);
      LOOM_CHECK(what.find("allreduce#2") != std::string::npos, "no operation named: ", what);
      LOOM_CHECK(what.find("rank 1") != std::string::npos && what.find("dead") != std::string::npos,
                 "rank 1 is not named dead: ", what);
      std::fprintf(stderr, "rank 0's error:\n%s\n", what.c_str());
      _exit(0);
    }
    LOOM_THROW(InvalidArgumentError, "the all-reduce did not fail");
  });
  const auto exits = ranks.waitAll(milliseconds(60000));
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_TRUE(exits[0].ok()) << exits[0].describe();
  EXPECT_FALSE(exits[1].exited) << exits[1].describe();
  EXPECT_EQ(exits[1].signal, SIGKILL) << exits[1].describe();
}

// Two processes started as rank 0 of two (a launcher bug): both are refused at group creation,
// before any device call, with an InvalidArgumentError naming both, well within the timeout
// (without the claim one of them met NCCL's rendezvous alone and waited for its timeout).
TEST(NcclFailureProcesses, RankZeroTwiceFailsBothAtCreationNamingBoth) {
  testing::TempDir dir;
  const std::string storePath = dir.file("store");
  constexpr milliseconds kTimeout(30000);
  testing::ChildProcesses ranks;
  for (int i = 0; i < 2; ++i) {
    ranks.spawn([&, i] {
      auto store = std::make_shared<FileStore>(storePath);
      auto fake = std::make_shared<FakeNccl>();
      ProcessGroupOptions options;
      options.timeout = kTimeout;
      const auto start = std::chrono::steady_clock::now();
      std::string what;
      try {
        createProcessGroupNcclOn(fake, store, 0, 2, options);
        LOOM_THROW(Error, "process ", i, ": the group formed");
      } catch (const InvalidArgumentError& e) {
        what = e.what();
      }
      const auto took = std::chrono::steady_clock::now() - start;
      LOOM_CHECK(took < kTimeout / 3, "process ", i, ": the error came after ",
                 std::chrono::duration_cast<milliseconds>(took).count(), " ms: ", what);
      LOOM_CHECK(fake->calls().empty(), "process ", i, ": the device was used: ", what);
      store->set("test/error/" + std::to_string(i), what);
    });
  }
  ASSERT_EQ(ranks.waitAllOk(milliseconds(60000)), "");
  FileStore store(storePath);
  for (int i = 0; i < 2; ++i) {
    const std::string what = store.getString("test/error/" + std::to_string(i));
    EXPECT_THAT(what, ::testing::HasSubstr("rank 0 of this group is claimed by two processes"));
    EXPECT_THAT(what, ::testing::HasSubstr("pid " + std::to_string(ranks.pid(0))));
    EXPECT_THAT(what, ::testing::HasSubstr("pid " + std::to_string(ranks.pid(1))));
  }
}

}  // namespace
}  // namespace loom::nccl_detail
