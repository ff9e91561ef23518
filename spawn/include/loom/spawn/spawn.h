// spawn: start N ranks of a function as forked processes, like torch.multiprocessing.spawn.
//
// Contract
// - spawn(nprocs, fn, options) forks nprocs children from the calling thread. Child r sets
//   RANK=r, LOCAL_RANK=r, WORLD_SIZE=LOCAL_WORLD_SIZE=nprocs, MASTER_ADDR and MASTER_PORT (the
//   variables loom-run and torchrun set, so initProcessGroup("env://") and TCPStore rendezvous
//   work unchanged), plus options.env, then runs fn(r) and _exits: 0 when fn returned, 1 when
//   it threw (the exception's type and message travel to the parent through a pipe), or the
//   code fn passed to exit(). A child never returns into the caller's code.
// - The parent joins the children. When one fails (non-zero exit or killed by a signal) it
//   stops the others (SIGTERM, then SIGKILL after options.grace), reaps everything and throws
//   SpawnError naming the first failing rank, its pid, and its exception message, exit code or
//   signal. When options.timeout passes first it stops them the same way and throws
//   TimeoutError naming the ranks still running. Every wait is bounded; spawn returns only once
//   every child it started is reaped (after SIGKILL it waits up to 10 s more for a child stuck
//   in the kernel, then gives up on it).
// - Children die with the parent (PR_SET_PDEATHSIG=SIGKILL towards the calling thread, which
//   waits in spawn for as long as they live), so a killed parent leaves no orphans.
// - Fork-based, as torch's "fork" start method: only the calling thread exists in a child, so
//   call spawn before the process starts threads of its own (a thread holding a lock at fork
//   time leaves that lock held in every child). Not thread-safe: one spawn per process at a time.
// - The program-level form spawnMain() lets one program run either standalone (it spawns the
//   ranks itself) or under a launcher (loom-run, torchrun, srun: it runs the one rank the
//   launcher gave it), and turns failures into an exit code.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/common/error.h"

namespace loom {

struct SpawnOptions {
  // The job's store address handed to the children as MASTER_ADDR / MASTER_PORT. Port 0 picks
  // a port that is free when spawn starts (bound and released by the parent: another process
  // could take it before rank 0 listens; set a port when that matters).
  std::string masterAddr = "127.0.0.1";
  int masterPort = 0;
  // How long spawn waits for all children; 0 takes LOOM_SPAWN_TIMEOUT (default 24 h).
  milliseconds timeout{0};
  // After a failure or the timeout: how long the others get between SIGTERM and SIGKILL.
  milliseconds grace{5000};
  // Extra NAME=value pairs set in every child (after the rank variables, so they can override).
  std::vector<std::pair<std::string, std::string>> env;
};

// A child failed. what(): "spawn: rank 1 (pid 4242) of 4 raised loom::IoError: ...; the other
// ranks were stopped".
class SpawnError : public Error {
 public:
  SpawnError(const std::string& what, int rank, pid_t pid, int exitCode, int signal,
             std::string childMessage)
      : Error(what),
        rank_(rank),
        pid_(pid),
        exitCode_(exitCode),
        signal_(signal),
        childMessage_(std::move(childMessage)) {}

  int rank() const { return rank_; }
  pid_t pid() const { return pid_; }
  // The exit code, or -1 when the child was killed by a signal.
  int exitCode() const { return exitCode_; }
  // The terminating signal, or 0 when the child exited.
  int signal() const { return signal_; }
  // "<type>: <message>" of the exception the child raised; "" when it raised none.
  const std::string& childMessage() const { return childMessage_; }

 private:
  int rank_;
  pid_t pid_;
  int exitCode_;
  int signal_;
  std::string childMessage_;
};

using SpawnFn = std::function<void(int rank)>;

// Runs fn(rank) for rank in [0, nprocs) in forked children and joins them (see the contract).
void spawn(int nprocs, const SpawnFn& fn, const SpawnOptions& options = {});

// For a program's main(): when RANK and WORLD_SIZE are set (a launcher started this process)
// it runs fn(RANK) here; otherwise it spawns `nprocs` ranks. Returns the exit code main()
// should return: 0 on success; after a failure it prints the error to stderr and returns the
// failing rank's exit code, 128 + its signal, or 1.
int spawnMain(int nprocs, const SpawnFn& fn, const SpawnOptions& options = {});

// "SIGKILL", "SIGTERM", ... ("signal 42" when unnamed).
std::string signalName(int sig);

}  // namespace loom
