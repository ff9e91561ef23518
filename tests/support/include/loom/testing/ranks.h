// Helpers for multi-rank tests (STYLE.md, Tests).
//
// runThreadRanks(n, fn): runs fn(rank) on n threads and rethrows the first exception with the
//   rank that raised it prefixed. Use for wide sweeps over a shared HashStore.
// ChildProcesses: forks ranks as processes. Fork before any thread exists in the test
//   process; each child runs its function, catches everything, and _exits with 0 (success),
//   1 (exception, message printed to stderr with the rank) or the code it asked for. The
//   parent waits with a deadline; the destructor SIGKILLs and reaps whatever still runs, so a
//   failing test never leaves orphans.
// TempDir: a fresh directory under $TMPDIR removed (recursively) on destruction.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace loom::testing {

void runThreadRanks(int worldSize, const std::function<void(int rank)>& fn);

struct ChildExit {
  pid_t pid = -1;
  bool exited = false;    // exited normally with `code`
  int code = -1;          // exit code when exited
  int signal = 0;         // terminating signal when !exited
  bool timedOut = false;  // still running at the deadline (then SIGKILLed)
  std::string describe() const;
  bool ok() const { return exited && code == 0; }
};

class ChildProcesses {
 public:
  ChildProcesses() = default;
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;
  ~ChildProcesses();

  // Forks one child that runs fn(); returns its index. An exception in fn exits with 1.
  int spawn(const std::function<void()>& fn, const std::string& name = "");
  // Forks n ranks running fn(rank).
  void spawnRanks(int n, const std::function<void(int rank)>& fn);

  pid_t pid(int index) const { return children_.at(index).pid; }
  size_t size() const { return children_.size(); }
  void kill(int index, int sig);

  // Waits for one child until the deadline; SIGKILLs it when the deadline passes.
  ChildExit wait(int index, std::chrono::milliseconds timeout);
  // Waits for all children; a child still running when `timeout` passes is SIGKILLed and
  // marked timedOut.
  std::vector<ChildExit> waitAll(std::chrono::milliseconds timeout);
  // waitAll and return "" when every child exited 0, else a description of each failure.
  std::string waitAllOk(std::chrono::milliseconds timeout);

 private:
  struct Child {
    pid_t pid;
    std::string name;
    std::optional<ChildExit> exit;
  };
  std::vector<Child> children_;
};

// For fault-injection tests where rank `victim` SIGKILLs itself: the victim died by SIGKILL
// and every other rank exited 0 (gtest expectations, one per rank).
void expectOnlyVictimKilled(const std::vector<ChildExit>& exits, int victim);

// Inside a surviving rank: the error raised after a peer died must arrive within `bound`, name
// `peerName` ("rank 2"), and not be a timeout. Throws (failing the child) otherwise.
void checkDeadPeerError(const std::exception& error, std::chrono::milliseconds waited,
                        std::chrono::milliseconds bound, const std::string& peerName);

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace loom::testing
