// ProcessGroup with ranks as forked processes (tcp backend): every collective after init from
// the environment (TCPStore hosted by rank 0), 1000 outstanding all-reduces in order, and fault
// injection: SIGKILL one rank during an all-reduce (the others raise IoError naming it within
// 2x the timeout) and SIGSTOP one rank (the others raise TimeoutError naming it); RANK given
// to two processes fails every process at init naming both, and new group instances on one
// store (subgroups, a second group, new processes) are not taken for duplicates.
//
// Children never use gtest assertions (a failure there would be lost): they throw, and the
// child exits 1 with the message on stderr. Every child runs under a deadline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/init.h"
#include "loom/store/file_store.h"
#include "loom/store/prefix_store.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using testing::ChildProcesses;
using ::testing::HasSubstr;
using testing::TempDir;

constexpr int kWorld = 4;
constexpr milliseconds kChildDeadline(60000);

void require(bool cond, const std::string& what) {
  if (!cond) throw std::runtime_error(what);
}

std::shared_ptr<ProcessGroup> groupOverFileStore(const std::string& path, int rank,
                                                 milliseconds timeout) {
  FileStoreOptions storeOptions;
  storeOptions.timeout = milliseconds(30000);
  auto store = std::make_shared<FileStore>(path, storeOptions);
  ProcessGroupOptions options;
  options.timeout = timeout;
  return createProcessGroup("tcp", store, rank, kWorld, options);
}

// The ranks listed after "(dead, stopped, or not at this operation): " in a failure message.
std::string silentRanks(const std::string& what) {
  const std::string marker = "(dead, stopped, or not at this operation): ";
  const size_t at = what.find(marker);
  if (at == std::string::npos) return "";
  const size_t start = at + marker.size();
  return what.substr(start, what.find('\n', start) - start);
}

TEST(ProcessGroupProcesses, EveryCollectiveAfterInitFromEnvironment) {
  int port = 0;
  {
    net::Socket probe = net::listenOn("127.0.0.1", 0);
    port = net::localPort(probe.fd());
  }
  ChildProcesses children;
  children.spawnRanks(kWorld, [port](int rank) {
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(kWorld).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    InitOptions options;
    options.initMethod = "env://";
    options.pg.timeout = milliseconds(30000);
    InitResult init = initProcessGroup(options);
    require(init.env.launcher == "torchrun", "launcher " + init.env.launcher);
    require(init.pg->rank() == rank && init.pg->size() == kWorld, "rank/size from the environment");
    testing::checkEveryCollective(*init.pg, 1000);
    // Keep rank 0 (the store server) alive until everyone is done with the store.
    init.pg->barrier()->wait();
  });
  EXPECT_EQ(children.waitAllOk(kChildDeadline), "");
}

// Processes with RANK 0, 2 and 2 of world 3 init through `initMethod`; no rank 1 comes, so each
// must fail with an InvalidArgumentError well before the timeout. Returns their messages, in
// spawn order (children.pid(i) is the i-th process).
std::vector<std::string> initRankTwoTwice(const std::string& initMethod, ChildProcesses& children,
                                          const std::string& results) {
  const std::vector<int> ranks = {0, 2, 2};
  constexpr milliseconds kTimeout(30000);
  for (size_t i = 0; i < ranks.size(); ++i) {
    children.spawn([&, i] {
      setenv("RANK", std::to_string(ranks[i]).c_str(), 1);
      setenv("WORLD_SIZE", "3", 1);
      InitOptions options;
      options.initMethod = initMethod;
      options.pg.timeout = kTimeout;
      const auto start = std::chrono::steady_clock::now();
      std::string what;
      try {
        initProcessGroup(options);
        throw std::runtime_error("the group formed");
      } catch (const InvalidArgumentError& e) {
        what = e.what();
      }
      const auto took = std::chrono::steady_clock::now() - start;
      require(took < kTimeout / 3, "the error came after " +
                                       std::to_string(duration_cast<milliseconds>(took).count()) +
                                       " ms: " + what);
      FileStore(results).set("test/error/" + std::to_string(i), what);
    });
  }
  std::vector<std::string> errors;
  if (children.waitAllOk(kChildDeadline) != "") return errors;
  FileStore store(results);
  for (size_t i = 0; i < ranks.size(); ++i) {
    errors.push_back(store.getString("test/error/" + std::to_string(i)));
  }
  return errors;
}

// RANK given to two processes (a launcher bug, a copied environment): every process fails at
// init, well before the timeout, with an InvalidArgumentError naming the rank and both
// processes. Rank 1 never comes, so no group could form; without the claim every process waited
// for the timeout, and which of the two ranks 2 got connected was chance.
TEST(ProcessGroupProcesses, ARankGivenTwiceFailsEveryProcessAtInitNamingBoth) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  const std::vector<std::string> errors = initRankTwoTwice("file://" + path, children, path);
  ASSERT_EQ(errors.size(), 3u) << "a process did not fail as expected (see its output)";
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_THAT(errors[i], HasSubstr("rank 2 of this group is claimed by two processes")) << i;
    EXPECT_THAT(errors[i], HasSubstr("pid " + std::to_string(children.pid(1)))) << i;
    EXPECT_THAT(errors[i], HasSubstr("pid " + std::to_string(children.pid(2)))) << i;
  }
}

// The same over tcp://, where rank 0's process hosts the TCPStore and fails too (no rank 1
// comes): every process, the holder of rank 2 included, names the duplicate, not a lost store.
TEST(ProcessGroupProcesses, ARankGivenTwiceIsNamedAlsoWhenTheStoresHostFails) {
  TempDir dir;
  int port = 0;
  {
    net::Socket probe = net::listenOn("127.0.0.1", 0);
    port = net::localPort(probe.fd());
  }
  ChildProcesses children;
  const std::vector<std::string> errors =
      initRankTwoTwice("tcp://127.0.0.1:" + std::to_string(port), children, dir.file("results"));
  ASSERT_EQ(errors.size(), 3u) << "a process did not fail as expected (see its output)";
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_THAT(errors[i], HasSubstr("rank 2 of this group is claimed by two processes")) << i;
  }
}

// Legitimate new group instances on one store are not duplicates: subgroups (one prefix per
// newGroup), a subgroup of the same ranks again after the first was destroyed, a second world
// group after the first was destroyed (its own prefix), and then new processes (new pids) with a
// group of their own on the same store.
TEST(ProcessGroupProcesses, GroupsCreatedAgainOnOneStoreAreNotDuplicates) {
  TempDir dir;
  const std::string path = dir.file("store");
  auto groupOn = [&](const std::string& prefix, int rank) {
    auto store = std::make_shared<PrefixStore>(prefix, std::make_shared<FileStore>(path));
    ProcessGroupOptions options;
    options.timeout = milliseconds(30000);
    return createProcessGroup("tcp", store, rank, kWorld, options);
  };
  auto sumIs = [](ProcessGroup& pg, float expected) {
    std::vector<float> buf(3, static_cast<float>(pg.rank() + 1));
    pg.allreduce(view(buf.data(), buf.size()))->wait();
    require(buf[0] == expected, "all-reduce of group " + pg.options().groupName);
  };
  {
    ChildProcesses first;
    first.spawnRanks(kWorld, [&](int rank) {
      auto world = groupOn("a", rank);
      for (int round = 0; round < 2; ++round) {  // the second time, after the first is gone
        auto low = newGroup(*world, {0, 1});
        auto high = newGroup(*world, {1, 2, 3});
        if (low) sumIs(*low, 3.0f);
        if (high) sumIs(*high, 6.0f);  // its ranks 0, 1, 2
      }
      world->barrier()->wait();
      world.reset();
      auto again = groupOn("b", rank);
      sumIs(*again, 10.0f);
      again->barrier()->wait();
    });
    ASSERT_EQ(first.waitAllOk(kChildDeadline), "");
  }
  ChildProcesses second;
  second.spawnRanks(kWorld, [&](int rank) {
    auto world = groupOn("c", rank);
    sumIs(*world, 10.0f);
    auto sub = newGroup(*world, {0, 1});
    if (sub) sumIs(*sub, 3.0f);
    world->barrier()->wait();
  });
  EXPECT_EQ(second.waitAllOk(kChildDeadline), "");
}

TEST(ProcessGroupProcesses, ThousandOutstandingAllreducesCompleteInOrder) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    auto pg = groupOverFileStore(path, rank, milliseconds(30000));
    constexpr int kOps = 1000;
    constexpr size_t n = 8;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(n));
    std::vector<std::shared_ptr<Work>> works;
    works.reserve(kOps);
    for (int i = 0; i < kOps; ++i) {
      for (size_t j = 0; j < n; ++j) bufs[i][j] = static_cast<float>(i + rank + j);
      works.push_back(pg->allreduce(view(bufs[i].data(), n)));
    }
    for (int checkpoint : {kOps / 4, kOps / 2, kOps - 1}) {
      works[checkpoint]->wait();
      for (int i = 0; i <= checkpoint; ++i) {
        require(works[i]->isCompleted(), "allreduce#" + std::to_string(i + 1) +
                                             " not complete after allreduce#" +
                                             std::to_string(checkpoint + 1));
      }
    }
    for (int i = 0; i < kOps; ++i) {
      require(works[i]->seq() == static_cast<uint64_t>(i + 1), "sequence numbers");
      for (size_t j = 0; j < n; ++j) {
        const float want = static_cast<float>(kWorld * (i + j) + kWorld * (kWorld - 1) / 2);
        require(bufs[i][j] == want, "allreduce#" + std::to_string(i + 1) + " element " +
                                        std::to_string(j) + ": got " + std::to_string(bufs[i][j]) +
                                        ", expected " + std::to_string(want));
      }
    }
    pg->barrier()->wait();
  });
  EXPECT_EQ(children.waitAllOk(kChildDeadline), "");
}

TEST(ProcessGroupProcesses, SigkillDuringAllreduceRaisesIoErrorNamingTheDeadRank) {
  constexpr int kVictim = 2;
  constexpr milliseconds kTimeout(4000);
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    auto pg = groupOverFileStore(path, rank, kTimeout);
    std::vector<float> buf(1 << 22, 1.0f);  // 16 MiB: the victim dies mid-transfer
    pg->allreduce(view(buf.data(), 1024))->wait();
    const auto start = std::chrono::steady_clock::now();
    try {
      // The victim dies right after the barrier, so a rank still finishing the barrier sees
      // the death there (barrier#2) rather than in the all-reduce (allreduce#3).
      pg->barrier()->wait();
      auto work = pg->allreduce(view(buf.data(), buf.size()));
      if (rank == kVictim) raise(SIGKILL);
      work->wait();
      throw std::runtime_error("the all-reduce succeeded although rank 2 was killed");
    } catch (const IoError& e) {
      const auto elapsed = std::chrono::steady_clock::now() - start;
      const std::string what = e.what();
      std::fprintf(
          stderr, "[rank %d] after %lld ms: %s\n", rank,
          static_cast<long long>(std::chrono::duration_cast<milliseconds>(elapsed).count()),
          what.c_str());
      require(elapsed <= 2 * kTimeout, "the error took longer than 2x the timeout");
      require(what.find("allreduce#3") != std::string::npos ||
                  what.find("barrier#2") != std::string::npos,
              "the message names the operation");
      require(silentRanks(what) == "2",
              "the message names rank 2 as the rank that went silent: " + what);
    }
    // The group fails fast from now on and is destroyed cleanly.
    auto later = pg->allreduce(view(buf.data(), 16));
    require(later->isCompleted() && !later->isSuccess(), "a later operation fails at once");
    pg.reset();
  });
  const auto exits = children.waitAll(kChildDeadline);
  for (int rank = 0; rank < kWorld; ++rank) {
    if (rank == kVictim) {
      EXPECT_EQ(exits[rank].signal, SIGKILL) << exits[rank].describe();
    } else {
      EXPECT_TRUE(exits[rank].ok()) << "rank " << rank << ": " << exits[rank].describe();
    }
  }
}

TEST(ProcessGroupProcesses, SigstopRaisesTimeoutErrorNamingTheStoppedRank) {
  constexpr int kVictim = 2;
  constexpr milliseconds kTimeout(3000);
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    auto pg = groupOverFileStore(path, rank, kTimeout);
    std::vector<float> buf(4096, 1.0f);
    pg->allreduce(view(buf.data(), buf.size()))->wait();
    pg->barrier()->wait();
    if (rank == kVictim) {
      raise(SIGSTOP);  // hangs here until the parent kills it
      throw std::runtime_error("the stopped rank was resumed");
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      pg->allreduce(view(buf.data(), buf.size()))->wait();
      throw std::runtime_error("the all-reduce succeeded although rank 2 was stopped");
    } catch (const TimeoutError& e) {
      const auto elapsed = std::chrono::steady_clock::now() - start;
      const std::string what = e.what();
      std::fprintf(
          stderr, "[rank %d] after %lld ms: %s\n", rank,
          static_cast<long long>(std::chrono::duration_cast<milliseconds>(elapsed).count()),
          what.c_str());
      require(elapsed <= 2 * kTimeout, "the error took longer than 2x the timeout");
      require(what.find("allreduce#3") != std::string::npos, "the message names allreduce#3");
      require(silentRanks(what) == "2",
              "the message names rank 2 as the rank that went silent: " + what);
    }
    pg.reset();
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    if (rank == kVictim) continue;
    const auto exit = children.wait(rank, kChildDeadline);
    EXPECT_TRUE(exit.ok()) << "rank " << rank << ": " << exit.describe();
  }
  children.kill(kVictim, SIGKILL);
  EXPECT_EQ(children.wait(kVictim, kChildDeadline).signal, SIGKILL);
}

}  // namespace
}  // namespace loom
