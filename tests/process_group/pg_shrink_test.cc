// shrinkGroup with ranks as forked processes over a FileStore (no rank hosts the store): one
// rank is SIGKILLed mid all-reduce, the three survivors agree on [0, 1, 2] and run every
// collective correctly on the new group, then shrink again after a second death; a rank that
// reports after the decision is excluded with a clear error, never half-included; excluded
// ranks are not waited for.
//
// Children never use gtest assertions: they throw, and the child exits 1 with the message.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "loom/common/error.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/shrink.h"
#include "loom/store/file_store.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
using testing::ChildProcesses;
using testing::TempDir;

constexpr int kWorld = 4;
constexpr milliseconds kChildDeadline(90000);

void require(bool cond, const std::string& what) {
  if (!cond) throw std::runtime_error(what);
}

std::shared_ptr<ProcessGroup> group(const std::string& path, int rank, milliseconds timeout) {
  FileStoreOptions storeOptions;
  storeOptions.timeout = milliseconds(60000);
  auto store = std::make_shared<FileStore>(path, storeOptions);
  ProcessGroupOptions options;
  options.timeout = timeout;
  return createProcessGroup("tcp", store, rank, kWorld, options);
}

std::string ranksOf(const ProcessGroup& pg) {
  std::string out;
  for (int r : pg.options().parentRanks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

// All-reduce of (parent rank + 1) over the members: the closed form names who took part.
void checkSumOfMembers(ProcessGroup& pg, int parentRank, long long want) {
  std::vector<int64_t> buf(1000, parentRank + 1);
  pg.allreduce(view(buf.data(), buf.size()))->wait();
  for (int64_t v : buf) {
    require(v == want, pg.who() + ": all-reduce gave " + std::to_string(v) + ", expected " +
                           std::to_string(want));
  }
}

TEST(ShrinkGroup, SurvivorsOfASigkillShrinkAndRunEveryCollective) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    auto pg = group(path, rank, milliseconds(10000));
    checkSumOfMembers(*pg, rank, 1 + 2 + 3 + 4);
    std::vector<float> buf(1 << 20, 1.0f);
    try {
      auto work = pg->allreduce(view(buf.data(), buf.size()));
      if (rank == 3) raise(SIGKILL);
      work->wait();
      throw std::runtime_error("the all-reduce succeeded although rank 3 was killed");
    } catch (const IoError&) {
    }
    // Long enough for every survivor to see the failure, however slow the machine.
    ShrinkOptions options;
    options.joinWindow = milliseconds(10000);
    auto small = shrinkGroup(*pg, options);
    pg.reset();  // the old group is done with
    require(small != nullptr, "no group from shrinkGroup");
    require(small->size() == 3 && small->rank() == rank,
            "rank " + std::to_string(small->rank()) + " of " + std::to_string(small->size()));
    require(ranksOf(*small) == "0,1,2", "members " + ranksOf(*small));
    testing::checkEveryCollective(*small, 1000);  // expects to be the group's first collectives
    checkSumOfMembers(*small, rank, 1 + 2 + 3);

    // A second death: rank 1 goes, ranks 0 and 2 shrink again (a fresh key namespace).
    std::vector<float> more(1 << 20, 1.0f);
    try {
      auto work = small->allreduce(view(more.data(), more.size()));
      if (rank == 1) raise(SIGKILL);
      work->wait();
      throw std::runtime_error("the all-reduce succeeded although rank 1 was killed");
    } catch (const IoError&) {
    }
    auto smaller = shrinkGroup(*small, options);
    small.reset();
    require(smaller->size() == 2, "size " + std::to_string(smaller->size()));
    require(ranksOf(*smaller) == "0,2", "members " + ranksOf(*smaller));
    testing::checkEveryCollective(*smaller, 1000);
    checkSumOfMembers(*smaller, rank, 1 + 3);
    smaller->barrier()->wait();
  });
  const auto exits = children.waitAll(kChildDeadline);
  for (int rank = 0; rank < kWorld; ++rank) {
    if (rank == 3 || rank == 1) {
      EXPECT_EQ(exits[rank].signal, SIGKILL) << "rank " << rank << ": " << exits[rank].describe();
    } else {
      EXPECT_TRUE(exits[rank].ok()) << "rank " << rank << ": " << exits[rank].describe();
    }
  }
}

TEST(ShrinkGroup, ARankThatReportsAfterTheDecisionIsExcluded) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    auto pg = group(path, rank, milliseconds(30000));
    pg->barrier()->wait();  // ranks 0-2 reach shrinkGroup together, well within the window
    ShrinkOptions options;
    options.joinWindow = milliseconds(5000);
    if (rank == 3) {
      // Late: report only once the others have decided (without it, after their window).
      pg->store()->wait({"shrink/1/members"}, milliseconds(60000));
      try {
        shrinkGroup(*pg, options);
        throw std::runtime_error("the late rank was admitted");
      } catch (const IoError& e) {
        const std::string what = e.what();
        require(
            what.find("excluded") != std::string::npos && what.find("[0,1,2]") != std::string::npos,
            "the late rank's error: " + what);
      }
      return;
    }
    auto small = shrinkGroup(*pg, options);
    require(small->size() == 3 && ranksOf(*small) == "0,1,2", "members " + ranksOf(*small));
    checkSumOfMembers(*small, rank, 1 + 2 + 3);
    small->barrier()->wait();
  });
  EXPECT_EQ(children.waitAllOk(kChildDeadline), "");
}

TEST(ShrinkGroup, ExcludedRanksAreNotWaitedForNorAdmitted) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    auto pg = group(path, rank, milliseconds(30000));
    // A join window longer than the children's deadline: the decision can only come from
    // every expected rank being there.
    ShrinkOptions options;
    options.joinWindow = milliseconds(600000);
    options.excludeRanks = {0};
    if (rank == 0) return;  // alive, but leaving the job
    auto small = shrinkGroup(*pg, options);
    require(small->size() == 3 && ranksOf(*small) == "1,2,3", "members " + ranksOf(*small));
    require(small->rank() == rank - 1, "new rank " + std::to_string(small->rank()));
    checkSumOfMembers(*small, rank, 2 + 3 + 4);
    small->barrier()->wait();
  });
  EXPECT_EQ(children.waitAllOk(kChildDeadline), "");
}

}  // namespace
}  // namespace loom
