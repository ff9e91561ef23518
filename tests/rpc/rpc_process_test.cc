// RPC between processes: a callee that dies fails the calls pending on it within seconds (an
// IoError naming it, not a timeout), and the process-wide API (initRpc ... shutdown) runs
// across ranks started by loom::spawn with a TCPStore on MASTER_ADDR:MASTER_PORT.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "loom/common/deadline.h"
#include "loom/common/settings.h"
#include "loom/rpc/rpc.h"
#include "loom/spawn/spawn.h"
#include "loom/store/file_store.h"
#include "loom/store/tcp_store.h"
#include "loom/testing/ranks.h"

namespace loom::rpc {
namespace {

using std::chrono::milliseconds;
using testing::ChildProcesses;
using testing::TempDir;

// True when `pid` has exited: gone, or a zombie its parent has not reaped yet.
bool processEnded(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return true;
  const size_t paren = line.rfind(") ");
  return paren == std::string::npos || line[paren + 2] == 'Z' || line[paren + 2] == 'X';
}

TEST(RpcProcessTest, DeadCalleeFailsPendingCallsWithinSeconds) {
  TempDir dir;
  ChildProcesses children;
  children.spawnRanks(2, [&](int rank) {
    auto store = std::make_shared<FileStore>(dir.file("store"));
    Registry f;
    f.add("block", [] {
      std::this_thread::sleep_for(milliseconds(30000));
      return false;
    });
    f.add("die", [] { ::kill(::getpid(), SIGKILL); });
    RpcOptions options;
    options.timeout = milliseconds(60000);
    RpcAgent agent(rank == 0 ? "caller" : "callee", rank, 2, store, f, options);
    if (rank == 1) {
      std::this_thread::sleep_for(milliseconds(60000));  // killed long before
      throw std::runtime_error("callee was not killed");
    }
    Future pending = agent.rpcAsync("callee", "block");
    agent.rpcAsync("callee", "die");
    const auto start = std::chrono::steady_clock::now();
    try {
      pending.wait();
      throw std::runtime_error("the pending call succeeded although its callee died");
    } catch (const IoError& e) {
      const auto waited =
          std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
      testing::checkDeadPeerError(e, waited, milliseconds(10000), "worker 'callee' (rank 1)");
      LOOM_CHECK(std::string(e.what()).find("'block'") != std::string::npos, e.what());
    }
    // Later calls fail fast with the same cause instead of waiting for their timeout.
    try {
      agent.rpcSync("callee", "block");
      throw std::runtime_error("a call to a dead callee succeeded");
    } catch (const TimeoutError& e) {
      throw std::runtime_error(std::string("a call to a dead callee timed out: ") + e.what());
    } catch (const IoError& e) {
      LOOM_CHECK(std::string(e.what()).find("broke earlier") != std::string::npos, e.what());
    }
    agent.shutdown(false);
  });
  const auto exits = children.waitAll(milliseconds(90000));
  testing::expectOnlyVictimKilled(exits, 1);
}

TEST(RpcProcessTest, ACallerDyingMidCallLeavesTheCalleeServingOthers) {
  TempDir dir;
  ChildProcesses children;
  children.spawnRanks(3, [&](int rank) {
    auto store = std::make_shared<FileStore>(dir.file("store"));
    Registry f;
    // "slow" answers once the dying caller is gone, so its answer has nowhere to go.
    f.add("slow", [store] {
      store->wait({"dead"}, milliseconds(30000));
      return 1;
    });
    f.add("add", [](int a, int b) { return a + b; });
    RpcOptions options;
    options.timeout = milliseconds(30000);
    const char* names[] = {"callee", "doomed", "healthy"};
    RpcAgent agent(names[rank], rank, 3, store, f, options);
    if (rank == 1) {
      Future never = agent.rpcAsync("callee", "slow");
      store->set("doomed/called", "1");
      ::kill(::getpid(), SIGKILL);
    }
    if (rank == 2) {
      store->wait({"doomed/called"}, milliseconds(30000));
      // Once the doomed caller has exited (a zombie until the test reaps it) its sockets are
      // closed; then let the callee's "slow" answer into the void.
      const pid_t doomed = static_cast<pid_t>(std::stol(store->getString("pid/1")));
      const Deadline deadline(milliseconds(30000));
      while (!processEnded(doomed) && !deadline.expired()) {
        std::this_thread::sleep_for(milliseconds(5));
      }
      LOOM_CHECK(processEnded(doomed), "the doomed caller (pid ", doomed, ") did not die");
      store->set("dead", "1");
      for (int i = 0; i < 50; ++i) {
        LOOM_CHECK_EQ(agent.rpcSync("callee", "add", args(i, 1)).get<int>(), i + 1);
      }
      store->set("healthy/done", "1");
    }
    if (rank == 0) store->wait({"healthy/done"}, milliseconds(60000));
    agent.shutdown(false);
  });
  // Each child publishes its pid (the healthy caller waits for the doomed one to be gone).
  {
    FileStore store(dir.file("store"));
    store.set("pid/1", std::to_string(children.pid(1)));
  }
  const auto exits = children.waitAll(milliseconds(90000));
  testing::expectOnlyVictimKilled(exits, 1);
}

TEST(RpcProcessTest, ProcessWideApiAcrossSpawnedRanks) {
  constexpr int kWorld = 3;
  spawn(kWorld, [](int rank) {
    const std::string host = settings::text("MASTER_ADDR").value();
    const int port = static_cast<int>(settings::integer("MASTER_PORT").value());
    TCPStoreOptions so;
    so.isServer = rank == 0;
    so.numWorkers = kWorld;
    so.timeout = milliseconds(30000);
    auto store = std::make_shared<TCPStore>(host, port, so);
    functions().add("add", [](int a, int b) { return a + b; });
    functions().add("rank_of", [rank] { return rank; });
    RpcOptions options;
    options.timeout = milliseconds(30000);
    initRpc("worker" + std::to_string(rank), rank, kWorld, store, options);
    const std::string next = "worker" + std::to_string((rank + 1) % kWorld);
    LOOM_CHECK_EQ(rpcSync(next, "rank_of").get<int>(), (rank + 1) % kWorld);
    LOOM_CHECK_EQ(rpcAsync(next, "add", args(rank, 100)).waitAs<int>(), rank + 100);
    RRef ref = remote(next, "add", args(rank, 1000));
    LOOM_CHECK_EQ(ref.toHereAs<int>(), rank + 1000);
    LOOM_CHECK_EQ(workerInfo(next).rank, (rank + 1) % kWorld);
    shutdown();
    // A second agent after shutdown: names can change.
    initRpc("again" + std::to_string(rank), rank, kWorld, store, [] {
      RpcOptions o;
      o.prefix = "rpc2";
      o.timeout = milliseconds(30000);
      return o;
    }());
    LOOM_CHECK_EQ(rpcSync("again0", "add", args(1, 2)).get<int>(), 3);
    shutdown();
    // Rank 0 serves the store: it leaves last, once everyone is past its last barrier.
    store->set("left/" + std::to_string(rank), "1");
    if (rank == 0) store->wait({"left/0", "left/1", "left/2"});
  });
}

}  // namespace
}  // namespace loom::rpc
