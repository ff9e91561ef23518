// Stores shared by forked processes: 8 clients on one TCPStore, the server dying under a
// waiting client, 4 writers on one FileStore, values surviving a killed writer. Every fork
// happens before this process starts any thread (servers run in their own child).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <stdexcept>

#include "loom/common/error.h"
#include "loom/store/barrier.h"
#include "loom/store/file_store.h"
#include "loom/store/tcp_store.h"
#include "loom/store/tcp_store_server.h"
#include "loom/testing/ranks.h"

namespace loom::testing {
namespace {

using std::chrono::milliseconds;

void require(bool cond, const std::string& what) {
  if (!cond) throw std::runtime_error(what);
}

// A TCPStoreServer in a child process; the parent learns its port through a pipe and stops it
// by closing the other pipe. With dieWhenWaiting > 0 the server process SIGKILLs itself as
// soon as that many requests are parked in it (a crash at a known point).
class ServerProcess {
 public:
  explicit ServerProcess(ChildProcesses& procs, int dieWhenWaiting = 0) {
    int portPipe[2];
    int stopPipe[2];
    if (::pipe(portPipe) != 0 || ::pipe(stopPipe) != 0) throw std::runtime_error("pipe");
    index_ = procs.spawn(
        [&] {
          ::close(portPipe[0]);
          ::close(stopPipe[1]);
          TCPStoreServer server(TCPStoreServerOptions{"127.0.0.1", 0, "", -1});
          const int port = server.port();
          require(::write(portPipe[1], &port, sizeof(port)) == sizeof(port), "write port");
          for (;;) {
            pollfd stop{stopPipe[0], POLLIN, 0};
            if (::poll(&stop, 1, dieWhenWaiting > 0 ? 1 : -1) == 1) return;  // parent closed it
            if (dieWhenWaiting > 0 && server.numWaiting() >= dieWhenWaiting) ::raise(SIGKILL);
          }
        },
        "server");
    ::close(portPipe[1]);
    ::close(stopPipe[0]);
    stopFd_ = stopPipe[1];
    pollfd pfd{portPipe[0], POLLIN, 0};
    require(::poll(&pfd, 1, 10000) == 1, "server process did not report its port");
    require(::read(portPipe[0], &port_, sizeof(port_)) == sizeof(port_), "read port");
    ::close(portPipe[0]);
  }
  ~ServerProcess() { closeStop(); }
  void closeStop() {
    if (stopFd_ >= 0) ::close(stopFd_);
    stopFd_ = -1;
  }
  int port() const { return port_; }
  int index() const { return index_; }

 private:
  int index_ = -1;
  int port_ = 0;
  int stopFd_ = -1;
};

TCPStoreOptions options(int rank) {
  TCPStoreOptions o;
  o.rank = rank;
  o.timeout = milliseconds(20000);
  return o;
}

TEST(StoreMultiProcess, EightClientProcessesOnOneTCPStore) {
  constexpr int kRanks = 8;
  constexpr int kAdds = 100;
  ChildProcesses procs;
  ServerProcess server(procs);
  const int port = server.port();
  ChildProcesses ranks;
  ranks.spawnRanks(kRanks, [port](int rank) {
    TCPStore store("127.0.0.1", port, options(rank));
    for (int i = 0; i < kAdds; ++i) store.add("count", 1);
    store.set("pid/" + std::to_string(rank), std::to_string(::getpid()));
    storeBarrier(store, "done", rank, kRanks);
    require(store.getString("count") == std::to_string(kRanks * kAdds),
            "count after the barrier is " + store.getString("count"));
    std::vector<std::string> keys;
    for (int r = 0; r < kRanks; ++r) keys.push_back("pid/" + std::to_string(r));
    const auto pids = store.multiGet(keys);
    require(pids.size() == kRanks, "multiGet size");
  });
  EXPECT_EQ(ranks.waitAllOk(milliseconds(30000)), "");
  TCPStore check("127.0.0.1", port, options(-1));
  EXPECT_EQ(check.getString("count"), std::to_string(kRanks * kAdds));
  server.closeStop();
  EXPECT_TRUE(procs.wait(server.index(), milliseconds(10000)).ok());
}

TEST(StoreMultiProcess, ServerDyingDuringGetIsAPromptIoError) {
  ChildProcesses procs;
  ServerProcess server(procs, /*dieWhenWaiting=*/1);
  const int port = server.port();
  ChildProcesses client;
  client.spawn(
      [port] {
        TCPStore store("127.0.0.1", port, options(1));  // 20 s timeout
        Deadline d(milliseconds(0));
        try {
          store.get("never");
        } catch (const TimeoutError& e) {
          throw std::runtime_error(std::string("a dead server must not look like a timeout: ") +
                                   e.what());
        } catch (const IoError& e) {
          const std::string what = e.what();
          require(what.find("127.0.0.1:" + std::to_string(port)) != std::string::npos,
                  "error does not name the server: " + what);
          require(d.elapsed() < milliseconds(5000), "error came late: " + what);
          return;
        }
        throw std::runtime_error("get returned although the server died");
      },
      "client");
  EXPECT_EQ(client.waitAllOk(milliseconds(10000)), "");
  EXPECT_EQ(procs.wait(server.index(), milliseconds(10000)).signal, SIGKILL);
}

TEST(StoreMultiProcess, FourProcessesTimesHundredAddsOnOneFileStore) {
  TempDir dir;
  const std::string path = dir.file("store");
  // Created before the fork: children inheriting it must reopen, not share the lock.
  FileStore inherited(path);
  ChildProcesses ranks;
  ranks.spawnRanks(4, [&](int rank) {
    std::unique_ptr<FileStore> own;
    Store* store = &inherited;
    if (rank % 2 == 1) {
      own = std::make_unique<FileStore>(path);
      store = own.get();
    }
    for (int i = 0; i < 100; ++i) store->add("count", 1);
    store->set("rank/" + std::to_string(rank), std::string_view("done"));
  });
  EXPECT_EQ(ranks.waitAllOk(milliseconds(30000)), "");
  FileStore check(path);
  EXPECT_EQ(check.getString("count"), "400");
  EXPECT_EQ(check.numKeys(), 5);
}

TEST(StoreMultiProcess, FileStoreValuesSurviveAKilledWriter) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses procs;
  procs.spawn([&] {
    FileStore s(path);
    s.set("before-crash", std::string_view("kept"));
    s.add("n", 41);
    ::raise(SIGKILL);
  });
  const ChildExit exit = procs.wait(0, milliseconds(10000));
  EXPECT_EQ(exit.signal, SIGKILL) << exit.describe();
  FileStore s(path);
  EXPECT_EQ(s.getString("before-crash"), "kept");
  EXPECT_EQ(s.add("n", 1), 42);
}

TEST(StoreMultiProcess, BarrierAcrossProcessesNamesTheMissingRank) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses ranks;
  ranks.spawnRanks(3, [&](int rank) {
    FileStore store(path);
    try {
      storeBarrier(store, "start", rank, 4, milliseconds(500));
    } catch (const TimeoutError& e) {
      const std::string what = e.what();
      require(what.find("3/4 ranks arrived; missing ranks: 3") != std::string::npos, what);
      return;
    }
    throw std::runtime_error("barrier passed with a rank missing");
  });
  EXPECT_EQ(ranks.waitAllOk(milliseconds(20000)), "");
}

}  // namespace
}  // namespace loom::testing
