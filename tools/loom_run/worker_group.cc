#include "worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "output.h"
#include "shepherd.h"

namespace loom::run {
namespace {

std::string& reportPrefix() {
  static std::string prefix = "loom-run: ";
  return prefix;
}

// Long lines without a newline are flushed in pieces of this size.
constexpr size_t kMaxLine = 64 * 1024;

}  // namespace

void setReportPrefix(const std::string& prefix) {
  reportPrefix() = prefix;
}

void report(const std::string& text) {
  output::write(2, reportPrefix() + text + "\n");
}

std::string signalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

bool WorkerExit::failed() const {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

std::string WorkerExit::describe() const {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + signalName(sig) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

int WorkerExit::exitCode() const {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

SignalWatcher::SignalWatcher() {
  const sigset_t set = launcherSignals();
  LOOM_SYSCHECK(sigprocmask(SIG_BLOCK, &set, nullptr), "blocking signals");
  fd_ = LOOM_SYSCHECK(signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC), "signalfd");
  signal(SIGPIPE, SIG_IGN);
}

SignalWatcher::~SignalWatcher() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<int> SignalWatcher::drain() {
  std::vector<int> out;
  signalfd_siginfo info{};
  while (::read(fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    out.push_back(static_cast<int>(info.ssi_signo));
  }
  return out;
}

WorkerGroup::WorkerGroup(SignalWatcher& signals, Options options)
    : signals_(signals), options_(std::move(options)) {}

WorkerGroup::~WorkerGroup() {
  for (auto& w : workers_) {
    if (!w.running) continue;
    killpg(w.pid, SIGKILL);
    int status = 0;
    while (waitpid(w.pid, &status, 0) == -1 && errno == EINTR) {
    }
  }
  closeStreams();
}

void WorkerGroup::start(const std::vector<WorkerSpec>& workers) {
  LOOM_CHECK(workers_.empty(), "a WorkerGroup starts once; make a new one to restart");
  workers_.resize(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    Worker& w = workers_[i];
    w.spec = workers[i];
    ShepherdSpec spec;
    spec.path = options_.path;
    spec.argv = options_.argv;
    spec.env = w.spec.env;
    spec.grace = options_.grace;
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    if (options_.prefixOutput) {
      for (int s = 0; s < 2; ++s) {
        LOOM_SYSCHECK(pipe2(pipes[s], O_CLOEXEC), "pipe for rank ", w.spec.rank, " output");
      }
      spec.stdoutFd = pipes[0][1];
      spec.stderrFd = pipes[1][1];
    }
    w.pid = spawnShepherd(spec);
    w.running = true;
    if (options_.prefixOutput) {
      for (int s = 0; s < 2; ++s) {
        ::close(pipes[s][1]);
        fcntl(pipes[s][0], F_SETFL, O_NONBLOCK);
        w.streams[s].fd = pipes[s][0];
        w.streams[s].out = s == 0 ? 1 : 2;
      }
    }
  }
}

void WorkerGroup::noteExitsWhileContinuing(const std::vector<WorkerExit>& exits,
                                           GroupResult& result, int& succeeded,
                                           std::optional<WorkerExit>& failedAfterSuccess) {
  for (const auto& e : exits) {
    if (!e.failed()) {
      ++succeeded;
      continue;
    }
    result.lost.push_back(e);
    if (succeeded > 0 && !failedAfterSuccess) failedAfterSuccess = e;
    int left = 0;
    for (const auto& w : workers_) left += w.running ? 1 : 0;
    report("rank " + std::to_string(e.rank) + " (local rank " + std::to_string(e.localRank) +
           ", pid " + std::to_string(e.pid) + ") " + e.describe() +
           "; --on-worker-failure continue: " +
           (left > 0 ? std::to_string(left) + " worker(s) still running go on"
                     : std::string("no worker is left running")));
  }
}

bool WorkerGroup::anyRunning() const {
  for (const auto& w : workers_) {
    if (w.running) return true;
  }
  return false;
}

void WorkerGroup::reapExited(std::vector<WorkerExit>& exits) {
  for (auto& w : workers_) {
    if (!w.running) continue;
    int status = 0;
    const pid_t r = waitpid(w.pid, &status, WNOHANG);
    if (r == w.pid) {
      w.running = false;
      exits.push_back({w.spec.rank, w.spec.localRank, w.pid, status});
    }
  }
}

void WorkerGroup::signalAll(int sig) {
  for (const auto& w : workers_) {
    if (w.running) killpg(w.pid, sig);
  }
}

void WorkerGroup::flushPartial(Worker& w, Stream& s) {
  if (s.partial.empty()) return;
  output::write(s.out, "[rank " + std::to_string(w.spec.rank) + "] " + s.partial + "\n");
  s.partial.clear();
}

void WorkerGroup::readStream(Worker& w, Stream& s, bool drainAll) {
  char buf[16384];
  for (;;) {
    // A stalled reader of loom-run's output stalls the worker, not loom-run (output.h).
    if (!drainAll && output::pending(s.out) >= output::kHighWater) return;
    const ssize_t n = ::read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      s.partial.append(buf, static_cast<size_t>(n));
      // Emit every complete line, each with its prefix, as one write.
      std::string out;
      size_t begin = 0;
      for (size_t nl; (nl = s.partial.find('\n', begin)) != std::string::npos; begin = nl + 1) {
        out += "[rank " + std::to_string(w.spec.rank) + "] ";
        out.append(s.partial, begin, nl + 1 - begin);
      }
      s.partial.erase(0, begin);
      if (!out.empty()) output::write(s.out, std::move(out));
      if (s.partial.size() >= kMaxLine) flushPartial(w, s);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    // EOF or a read error: the stream is over; flush a last line without newline.
    flushPartial(w, s);
    ::close(s.fd);
    s.fd = -1;
    return;
  }
}

void WorkerGroup::pumpStreams(int timeoutMs, bool drainAll) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, Stream*>> owners;
  fds.push_back({signals_.fd(), POLLIN, 0});
  owners.emplace_back(nullptr, nullptr);
  fds.push_back({output::wakeFd(), POLLIN, 0});
  owners.emplace_back(nullptr, nullptr);
  for (auto& w : workers_) {
    for (auto& s : w.streams) {
      if (s.fd < 0) continue;
      if (!drainAll && output::pending(s.out) >= output::kHighWater) continue;
      fds.push_back({s.fd, POLLIN, 0});
      owners.emplace_back(&w, &s);
    }
  }
  const int n = ::poll(fds.data(), fds.size(), timeoutMs);
  if (n <= 0) return;  // timeout or EINTR
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    if (i == 0) {
      for (int sig : signals_.drain()) pendingSignals_.push_back(sig);
    } else if (i == 1) {
      output::clearWake();  // an output drained: its workers' pipes are polled again
    } else {
      readStream(*owners[i].first, *owners[i].second, drainAll);
    }
  }
}

void WorkerGroup::closeStreams() {
  for (auto& w : workers_) {
    for (auto& s : w.streams) {
      if (s.fd < 0) continue;
      flushPartial(w, s);
      ::close(s.fd);
      s.fd = -1;
    }
  }
}

GroupResult WorkerGroup::run(const Tick& tick, std::chrono::milliseconds tickInterval) {
  GroupResult result;
  int stopSignal = 0;  // 0 while the workers run undisturbed
  int succeeded = 0;   // continueOnFailure: workers that exited 0 so far
  std::optional<WorkerExit> failedAfterSuccess;
  auto nextTick = Clock::now() + tickInterval;
  std::vector<WorkerExit> exits;

  // Phase 1: watch until every worker is done or something asks us to stop them.
  while (stopSignal == 0 && anyRunning()) {
    const auto untilTick =
        std::chrono::duration_cast<milliseconds>(nextTick - Clock::now()).count();
    pumpStreams(static_cast<int>(std::clamp<long long>(untilTick, 0, 1000)));
    for (int sig : pendingSignals_) {
      if (sig != SIGCHLD && stopSignal == 0) {
        result.kind = GroupResult::kSignalled;
        result.signal = sig;
        stopSignal = sig;
        report("got " + signalName(sig) + "; forwarding it to the workers");
      }
    }
    pendingSignals_.clear();
    exits.clear();
    reapExited(exits);
    if (options_.continueOnFailure) {
      noteExitsWhileContinuing(exits, result, succeeded, failedAfterSuccess);
      exits.clear();
    }
    for (const auto& e : exits) {
      if (!e.failed() || result.firstFailure) continue;
      result.firstFailure = e;
      if (stopSignal == 0) {
        result.kind = GroupResult::kWorkerFailed;
        stopSignal = SIGTERM;
      }
      report("rank " + std::to_string(e.rank) + " (local rank " + std::to_string(e.localRank) +
             ", pid " + std::to_string(e.pid) + ") " + e.describe() + " (first failure)");
    }
    // nextTick moves on even without a tick: otherwise pumpStreams would poll with timeout 0
    // from the first interval on and this loop would spin, taking a core from the workers.
    if (stopSignal == 0 && Clock::now() >= nextTick && anyRunning()) {
      if (auto reason = tick ? tick() : std::nullopt) {
        result.kind = GroupResult::kStopRequested;
        result.stopReason = *reason;
        stopSignal = SIGTERM;
      }
      nextTick = Clock::now() + tickInterval;
    }
  }

  // Phase 2: stop the rest: the signal, the grace period, then SIGKILL.
  if (anyRunning()) {
    int left = 0;
    for (const auto& w : workers_) left += w.running ? 1 : 0;
    report("stopping " + std::to_string(left) + " worker(s) with " + signalName(stopSignal) +
           ", SIGKILL after " + std::to_string(options_.grace.count()) + " ms");
    signalAll(stopSignal);
    const Deadline grace(options_.grace);
    std::optional<Deadline> afterKill;
    while (anyRunning()) {
      if (!afterKill && grace.expired()) {
        report("grace period over; sending SIGKILL");
        signalAll(SIGKILL);
        afterKill.emplace(milliseconds(10000));
      }
      if (afterKill && afterKill->expired()) {
        report("some workers did not die within 10 s of SIGKILL; giving up on them");
        break;
      }
      pumpStreams(afterKill ? afterKill->pollTimeoutMs(milliseconds(50))
                            : grace.pollTimeoutMs(milliseconds(50)));
      for (int sig : pendingSignals_) {
        if (sig != SIGCHLD && !afterKill) {
          report("got " + signalName(sig) + " while stopping; sending SIGKILL now");
          signalAll(SIGKILL);
          afterKill.emplace(milliseconds(10000));
        }
      }
      pendingSignals_.clear();
      exits.clear();
      reapExited(exits);
    }
  }

  if (options_.continueOnFailure && result.kind == GroupResult::kSucceeded) {
    // Every worker exited on its own: the survivors finished the job, unless none exited 0
    // or one failed after another had already finished.
    if (succeeded == 0 && !result.lost.empty()) {
      result.kind = GroupResult::kWorkerFailed;
      result.firstFailure = result.lost.front();
      report("every worker failed; the first failure: rank " +
             std::to_string(result.firstFailure->rank) + " " + result.firstFailure->describe());
    } else if (failedAfterSuccess) {
      result.kind = GroupResult::kWorkerFailed;
      result.firstFailure = failedAfterSuccess;
      report("rank " + std::to_string(failedAfterSuccess->rank) + " " +
             failedAfterSuccess->describe() +
             " after another worker had finished: the job did not end cleanly");
    } else if (!result.lost.empty()) {
      std::string lost;
      for (const auto& e : result.lost) {
        lost += (lost.empty() ? "" : ", ") + std::string("rank ") + std::to_string(e.rank) + " (" +
                e.describe() + ")";
      }
      report("the job finished on the survivors: " + std::to_string(succeeded) + " of " +
             std::to_string(workers_.size()) + " worker(s) exited 0; lost: " + lost);
    }
  }

  // Phase 3: let the pipes drain (bounded: a leftover grandchild may hold one open). What is in
  // them is read whole, past kHighWater: the workers are gone, so it is at most a pipe's worth
  // each, and the writer thread writes it on while loom-run goes on (output.h).
  const Deadline drain(milliseconds(2000));
  for (;;) {
    bool open = false;
    for (const auto& w : workers_) {
      for (const auto& s : w.streams) open = open || s.fd >= 0;
    }
    if (!open || drain.expired()) break;
    pumpStreams(drain.pollTimeoutMs(milliseconds(100)), /*drainAll=*/true);
  }
  closeStreams();
  return result;
}

}  // namespace loom::run
