// Shepherd: the small process that stands between loom-run and one worker, so that no worker
// (nor anything it started) outlives loom-run, even when loom-run is SIGKILLed.
//
// How it works. loom-run forks a shepherd per worker. The shepherd makes itself the leader of a
// new process group (pgid == its pid), asks the kernel for a signal when loom-run dies
// (PR_SET_PDEATHSIG, re-checking getppid() to close the race with an early death), becomes a
// child subreaper, and forks the worker, which stays in the shepherd's process group, sets
// PR_SET_PDEATHSIG=SIGKILL towards the shepherd, and execs PROGRAM.
// - loom-run stops a worker by signalling the whole group (killpg): worker, shepherd and any
//   grandchildren get SIGTERM, then SIGKILL after the grace period.
// - If loom-run dies, the shepherd gets kParentDiedSignal, sends SIGTERM to its group, waits
//   up to the grace period for the worker, then SIGKILLs the group (itself included).
// - When the worker exits on its own, the shepherd sends SIGTERM to whatever is left in its
//   group and exits with the worker's status: the same exit code, or killed by the same signal.
//   loom-run therefore reads the worker's status from the shepherd's.
//
// The shepherd runs between fork and exec of a process that may have threads, so it uses only
// async-signal-safe calls: everything it needs (path, argv, envp) is built before the fork.
// PR_SET_PDEATHSIG fires when the *thread* that forked dies, so spawnShepherd() must be called
// from a thread that lives as long as loom-run (its main thread).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace loom::run {

// Signals that loom-run blocks (and reads through a signalfd); the shepherd inherits the mask.
sigset_t launcherSignals();

struct ShepherdSpec {
  std::string path;               // executable to run (already resolved)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // NAME=value entries, the worker's whole environment
  int stdoutFd = -1;              // write end to use as the worker's stdout, or -1 to inherit
  int stderrFd = -1;              // likewise for stderr
  std::chrono::milliseconds grace{5000};
};

// Forks a shepherd that runs the worker; returns the shepherd's pid (== its process group id).
// Throws IoError when fork fails. The caller must have blocked launcherSignals().
pid_t spawnShepherd(const ShepherdSpec& spec);

// Finds PROGRAM like execvp would: a name with '/' is used as is, otherwise the first
// executable file in $PATH. Returns "" when none is found.
std::string resolveProgram(const std::string& program);

}  // namespace loom::run
