// WorkerGroup: the workers loom-run runs on this node, watched until they finish or fail.
//
// Contract
// - start() spawns one shepherded worker per local rank (see shepherd.h) with the environment
//   given; run() then watches them from a single poll loop: a signalfd for SIGCHLD and for
//   SIGINT/SIGTERM/SIGHUP sent to loom-run, and one pipe per worker stream when output is
//   prefixed ("[rank R] " on every line; a partial last line is flushed at EOF).
// - run() returns when every worker exited 0, or after stopping all of them because one failed
//   (non-zero exit or a signal), loom-run was signalled, or the `tick` callback asked to stop.
//   With options.continueOnFailure a failed worker is reported and the others keep running:
//   run() returns when every worker has exited, kSucceeded when some worker exited 0 and none
//   failed after the first success (the survivors finished the job; `lost` names the failed
//   ones), kWorkerFailed otherwise (firstFailure: the first failure, or the first one after a
//   success).
//   Stopping sends the signal (SIGTERM, or the one loom-run got) to each worker's process
//   group, waits up to the grace period, then SIGKILLs what is left; a second signal to
//   loom-run SIGKILLs at once. Every wait has a deadline.
// - Output goes through output.h's writer thread, so a stalled reader of loom-run's stdout or
//   stderr never stalls the loop: while an output is backed up the loop stops reading the pipes
//   that feed it (the workers feel the back-pressure, nothing is dropped) and goes on watching.
// - Not thread-safe: one thread runs a WorkerGroup. The caller blocks launcherSignals() before
//   any thread exists (SignalWatcher does it) so that the signals reach the signalfd.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace loom::run {

// Owns the signalfd for launcherSignals(); blocks them on construction (call it first in main).
class SignalWatcher {
 public:
  SignalWatcher();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;
  int fd() const { return fd_; }
  // Reads every pending signal number (non-blocking).
  std::vector<int> drain();

 private:
  int fd_ = -1;
};

// Queues "loom-run: <text>\n" (with the node prefix once set) for stderr as one write; never
// blocks (output.h).
void report(const std::string& text);
void setReportPrefix(const std::string& prefix);

struct WorkerExit {
  int rank = -1;
  int localRank = -1;
  pid_t pid = -1;
  int status = 0;  // as from waitpid
  bool failed() const;
  // "exited with code 7" / "was killed by signal 9 (SIGKILL)"
  std::string describe() const;
  // The code loom-run exits with for this failure: the exit code, or 128 + signal.
  int exitCode() const;
};

std::string signalName(int sig);

struct WorkerSpec {
  int rank = 0;
  int localRank = 0;
  std::vector<std::string> env;  // the worker's full environment
};

struct GroupResult {
  enum Kind { kSucceeded, kWorkerFailed, kSignalled, kStopRequested };
  Kind kind = kSucceeded;
  std::optional<WorkerExit> firstFailure;  // kWorkerFailed
  int signal = 0;                          // kSignalled: what loom-run received
  std::string stopReason;                  // kStopRequested: what tick() returned
  std::vector<WorkerExit> lost;            // continueOnFailure: every worker that failed
};

class WorkerGroup {
 public:
  struct Options {
    std::string path;               // resolved PROGRAM
    std::vector<std::string> argv;  // PROGRAM ARGS...
    bool prefixOutput = false;
    std::chrono::milliseconds grace{5000};
    // --on-worker-failure continue: a failed worker does not stop the others.
    bool continueOnFailure = false;
  };

  WorkerGroup(SignalWatcher& signals, Options options);
  ~WorkerGroup();  // SIGKILLs and reaps anything still running
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  void start(const std::vector<WorkerSpec>& workers);

  // tick() runs about every tickInterval while the workers run; a returned reason stops them.
  using Tick = std::function<std::optional<std::string>()>;
  GroupResult run(const Tick& tick = {},
                  std::chrono::milliseconds tickInterval = std::chrono::milliseconds(500));

 private:
  struct Stream {
    int fd = -1;  // read end, -1 once closed
    int out = 1;  // where lines go: 1 or 2
    std::string partial;
  };
  struct Worker {
    WorkerSpec spec;
    pid_t pid = -1;
    bool running = false;
    Stream streams[2];
  };

  void reapExited(std::vector<WorkerExit>& exits);
  // continueOnFailure: counts successes, records and reports failures (no worker is stopped).
  void noteExitsWhileContinuing(const std::vector<WorkerExit>& exits, GroupResult& result,
                                int& succeeded, std::optional<WorkerExit>& failedAfterSuccess);
  void signalAll(int sig);
  // drainAll: read the pipes even while loom-run's output is backed up (output.h).
  void pumpStreams(int timeoutMs, bool drainAll = false);
  void readStream(Worker& w, Stream& s, bool drainAll);
  void flushPartial(Worker& w, Stream& s);
  bool anyRunning() const;
  void closeStreams();

  SignalWatcher& signals_;
  Options options_;
  std::vector<Worker> workers_;
  std::vector<int> pendingSignals_;
};

}  // namespace loom::run
