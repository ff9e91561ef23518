// spawn(): the rank variables reach the children, a failing rank (exception, exit code, signal)
// stops the others and is named in the parent's error, a hung rank ends in a TimeoutError, and
// nothing is left running afterwards. The children report to the parent through files in a
// temp dir (a gtest assertion in a forked child would be lost).
#include "loom/spawn/spawn.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "loom/common/deadline.h"
#include "loom/common/settings.h"
#include "loom/testing/errors.h"
#include "loom/testing/ranks.h"
#include "loom/testing/scoped_env.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
using testing::TempDir;

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path + ".tmp");
  out << text;
  out.close();
  ::rename((path + ".tmp").c_str(), path.c_str());
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Sleeps up to `limit` (a child's own bound, so a broken spawn still leaves no orphan for long).
void idle(milliseconds limit) {
  std::this_thread::sleep_for(limit);
}

bool processGone(pid_t pid) {
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

pid_t readPid(const std::string& path) {
  return static_cast<pid_t>(std::stol(readFile(path)));
}

// In a child: waits (bounded) until `path` exists.
void waitForFile(const std::string& path) {
  const Deadline deadline(milliseconds(30000));
  while (::access(path.c_str(), F_OK) != 0) {
    if (deadline.expired()) throw TimeoutError("no " + path + " after 30 s");
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// In a child: fail only once every rank has written its pid, so that the test can check that
// the others were stopped (a rank stopped before it wrote its pid would leave no trace).
void waitForPidFiles(const TempDir& dir, int n) {
  for (int r = 0; r < n; ++r) waitForFile(dir.file("pid" + std::to_string(r)));
}

TEST(SpawnTest, EveryRankRunsWithItsVariables) {
  TempDir dir;
  SpawnOptions options;
  options.env = {{"LOOM_RUN_ID", "spawn-test"}};
  spawn(
      3,
      [&](int rank) {
        std::ostringstream s;
        s << rank << ' ' << settings::integer("RANK").value() << ' '
          << settings::integer("WORLD_SIZE").value() << ' '
          << settings::integer("LOCAL_RANK").value() << ' '
          << settings::integer("LOCAL_WORLD_SIZE").value() << ' '
          << settings::text("MASTER_ADDR").value() << ' '
          << settings::integer("MASTER_PORT").value() << ' '
          << settings::text("LOOM_RUN_ID").value();
        writeFile(dir.file("rank" + std::to_string(rank)), s.str());
      },
      options);
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream in(readFile(dir.file("rank" + std::to_string(rank))));
    int fnRank = -1, envRank = -1, world = -1, localRank = -1, localWorld = -1;
    std::string addr, masterPort, runId;
    in >> fnRank >> envRank >> world >> localRank >> localWorld >> addr >> masterPort >> runId;
    EXPECT_EQ(fnRank, rank);
    EXPECT_EQ(envRank, rank);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(localRank, rank);
    EXPECT_EQ(localWorld, 3);
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_EQ(runId, "spawn-test");
    if (rank == 0) port = masterPort;
    EXPECT_EQ(masterPort, port) << "every rank must get the same MASTER_PORT";
  }
  EXPECT_NE(port, "0");
}

TEST(SpawnTest, FailingRankStopsTheOthersAndIsNamed) {
  TempDir dir;
  SpawnOptions options;
  options.grace = milliseconds(2000);
  try {
    spawn(
        4,
        [&](int rank) {
          writeFile(dir.file("pid" + std::to_string(rank)), std::to_string(::getpid()));
          if (rank == 2) {
            waitForPidFiles(dir, 4);
            throw InvalidArgumentError("batch 17 has 3 columns, expected 4");
          }
          idle(milliseconds(60000));
        },
        options);
    FAIL() << "spawn returned although rank 2 threw";
  } catch (const SpawnError& e) {
    EXPECT_EQ(e.rank(), 2);
    EXPECT_EQ(e.exitCode(), 1);
    EXPECT_EQ(e.signal(), 0);
    EXPECT_EQ(e.childMessage(), "loom::InvalidArgumentError: batch 17 has 3 columns, expected 4");
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 2"), std::string::npos) << what;
    EXPECT_NE(what.find("of 4"), std::string::npos) << what;
    EXPECT_NE(what.find("batch 17 has 3 columns"), std::string::npos) << what;
    EXPECT_EQ(e.pid(), readPid(dir.file("pid2")));
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(processGone(readPid(dir.file("pid" + std::to_string(r))))) << "rank " << r;
  }
}

TEST(SpawnTest, RankKilledBySignalIsNamedWithTheSignal) {
  TempDir dir;
  try {
    spawn(3, [&](int rank) {
      writeFile(dir.file("pid" + std::to_string(rank)), std::to_string(::getpid()));
      if (rank == 1) {
        waitForPidFiles(dir, 3);
        ::kill(::getpid(), SIGKILL);
      }
      idle(milliseconds(60000));
    });
    FAIL() << "spawn returned although rank 1 was killed";
  } catch (const SpawnError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.signal(), SIGKILL);
    EXPECT_EQ(e.exitCode(), -1);
    EXPECT_EQ(e.childMessage(), "");
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("killed by signal 9 (SIGKILL)"), std::string::npos) << what;
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(processGone(readPid(dir.file("pid" + std::to_string(r))))) << "rank " << r;
  }
}

TEST(SpawnTest, ExitCodeIsCarried) {
  try {
    spawn(2, [](int rank) {
      if (rank == 0) ::_exit(7);
      idle(milliseconds(60000));
    });
    FAIL() << "spawn returned although rank 0 exited 7";
  } catch (const SpawnError& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_EQ(e.exitCode(), 7);
    EXPECT_NE(std::string(e.what()).find("exited with code 7"), std::string::npos) << e.what();
  }
}

// A rank that forks a process without exec leaves it holding the rank's pipe: spawn() must not
// wait for that process to close it (it waited for EOF on a blocking read: as long as the
// grandchild lived).
TEST(SpawnTest, AProcessARankForkedDoesNotHoldUpSpawn) {
  TempDir dir;
  const auto grandchild = [&](int rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::sleep(30);
      ::_exit(0);
    }
    writeFile(dir.file("grandchild" + std::to_string(rank)), std::to_string(pid));
  };
  const auto started = std::chrono::steady_clock::now();
  spawn(2, [&](int rank) { grandchild(rank); });
  const auto returned = std::chrono::steady_clock::now() - started;
  try {
    spawn(2, [&](int rank) {
      grandchild(rank + 2);
      if (rank == 1) {
        // Fail only once rank 0 has forked and recorded its grandchild: rank 0 stopped before
        // that would leave no pid to clean up (seen in a clean-clone CI run: stol on a missing
        // file, and an orphan holding ctest's pipe for 30 s).
        waitForFile(dir.file("grandchild2"));
        throw InvalidArgumentError("rank 1 gave up");
      }
    });
    ADD_FAILURE() << "spawn returned although rank 1 threw";
  } catch (const SpawnError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.childMessage(), "loom::InvalidArgumentError: rank 1 gave up");
  }
  const auto failed = std::chrono::steady_clock::now() - started;
  for (int r = 0; r < 4; ++r) {
    const std::string file = dir.file("grandchild" + std::to_string(r));
    if (::access(file.c_str(), F_OK) == 0)
      ::kill(readPid(file), SIGKILL);
    else
      ADD_FAILURE() << "rank " << r % 2 << " of spawn " << r / 2 + 1 << " recorded no grandchild";
  }
  // The grandchildren sleep 30 s; spawn's own tick is 20 ms.
  EXPECT_LT(returned, std::chrono::seconds(20));
  EXPECT_LT(failed, std::chrono::seconds(20));
}

TEST(SpawnTest, HungRankTimesOutAndIsKilledEvenWhenItIgnoresSigterm) {
  SpawnOptions options;
  options.timeout = milliseconds(1500);
  options.grace = milliseconds(300);
  const std::string message = testing::messageOf<TimeoutError>([&] {
    spawn(
        3,
        [&](int rank) {
          if (rank == 1) {
            ::signal(SIGTERM, SIG_IGN);
            idle(milliseconds(60000));
          }
        },
        options);
  });
  EXPECT_NE(message.find("1 of 3 ranks: rank 1 (pid"), std::string::npos) << message;
  EXPECT_NE(message.find("SIGKILL after 300 ms"), std::string::npos) << message;
  // The pid the error names is gone (read from the message: under load the rank may not have
  // reached its own pid file before the timeout).
  const size_t at = message.find("rank 1 (pid ");
  ASSERT_NE(at, std::string::npos) << message;
  EXPECT_TRUE(processGone(static_cast<pid_t>(std::stol(message.substr(at + 12)))));
}

TEST(SpawnTest, SpawnMainReturnsTheFailingRanksCode) {
  EXPECT_EQ(spawnMain(2, [](int) {}), 0);
  EXPECT_EQ(spawnMain(2,
                      [](int rank) {
                        if (rank == 1) ::_exit(5);
                      }),
            5);
  EXPECT_EQ(spawnMain(2,
                      [](int rank) {
                        if (rank == 0) ::kill(::getpid(), SIGTERM);
                      }),
            128 + SIGTERM);
}

TEST(SpawnTest, SpawnMainUnderALauncherRunsTheGivenRankHere) {
  testing::ScopedEnv rank("RANK", "3");
  testing::ScopedEnv world("WORLD_SIZE", "4");
  const pid_t self = ::getpid();
  int ran = -1;
  pid_t where = -1;
  EXPECT_EQ(spawnMain(2,
                      [&](int r) {
                        ran = r;
                        where = ::getpid();
                      }),
            0);
  EXPECT_EQ(ran, 3);
  EXPECT_EQ(where, self);
  EXPECT_EQ(spawnMain(2, [](int) { throw IoError("lost the store"); }), 1);
}

TEST(SpawnTest, BadArgumentsAreRejected) {
  EXPECT_THROW(spawn(0, [](int) {}), InvalidArgumentError);
  EXPECT_THROW(spawn(2, SpawnFn()), InvalidArgumentError);
  SpawnOptions options;
  options.masterPort = 70000;
  EXPECT_THROW(spawn(
                   2, [](int) {}, options),
               InvalidArgumentError);
}

}  // namespace
}  // namespace loom
