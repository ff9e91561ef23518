// spawn: fork the ranks, watch them from one poll loop, stop them all when one fails.
//
// How it works. Before forking, the parent opens one pipe per rank (close-on-exec) and flushes
// stdio so that buffered output is not written twice. Child r closes every read end, sets its
// rank variables, runs fn(r) and reports: an exception's "<type>: <message>" goes down its
// pipe before it _exits with 1. The parent then loops until every child is reaped: it polls
// the read ends (collecting the messages, so a long one never blocks a child) with a short
// tick, reaps exited children with waitpid(WNOHANG), and on the first failure, or when the
// deadline passes, sends SIGTERM to everyone still running, waits up to the grace period and
// SIGKILLs the rest. Polling with a tick (not SIGCHLD) leaves the caller's signal handling
// alone.
#include "loom/spawn/spawn.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <typeinfo>

#include "loom/common/logging.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"

namespace loom {

namespace {

constexpr size_t kMaxChildMessage = 16 * 1024;
constexpr int kTickMs = 20;

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int pipeFd = -1;  // read end; -1 once EOF
  bool running = false;
  int status = 0;  // from waitpid, once reaped
  std::string message;
};

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                             std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

// What the child sends up its pipe for the exception in flight.
std::string describeCurrentException() {
  try {
    throw;
  } catch (const std::exception& e) {
    return demangle(typeid(e).name()) + ": " + e.what();
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    return (type != nullptr ? demangle(type->name()) : std::string("unknown")) +
           ": (not a std::exception)";
  }
}

void writeAll(int fd, const std::string& text) {
  size_t done = 0;
  const size_t n = std::min(text.size(), kMaxChildMessage);
  while (done < n) {
    const ssize_t w = ::write(fd, text.data() + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}

[[noreturn]] void runChild(int rank, int nprocs, const SpawnFn& fn, const SpawnOptions& options,
                           int port, pid_t parent, int pipeFd) {
  // Die with the parent; re-check the parent in case it died before prctl.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  int code = 0;
  try {
    const std::string r = std::to_string(rank);
    const std::string n = std::to_string(nprocs);
    const std::string p = std::to_string(port);
    ::setenv("RANK", r.c_str(), 1);
    ::setenv("LOCAL_RANK", r.c_str(), 1);
    ::setenv("WORLD_SIZE", n.c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", n.c_str(), 1);
    ::setenv("MASTER_ADDR", options.masterAddr.c_str(), 1);
    ::setenv("MASTER_PORT", p.c_str(), 1);
    for (const auto& [name, value] : options.env) ::setenv(name.c_str(), value.c_str(), 1);
    fn(rank);
  } catch (...) {
    writeAll(pipeFd, describeCurrentException());
    code = 1;
  }
  std::fflush(nullptr);
  ::_exit(code);
}

int pickFreePort(const std::string& host) {
  net::Socket s = net::listenOn(host, 0, 1);
  return net::localPort(s.fd());
}

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           signalName(WTERMSIG(status)) + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

bool failed(int status) {
  return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
}

class Joiner {
 public:
  Joiner(std::vector<Child>& children, milliseconds grace) : children_(children), grace_(grace) {}

  // Unwinding (fork failed half way, or an exception in the loop) still leaves no child behind.
  ~Joiner() {
    try {
      stopAll(SIGKILL, milliseconds(2000));
    } catch (...) {
    }
    for (Child& c : children_) {
      if (c.pipeFd >= 0) ::close(c.pipeFd);
    }
  }

  bool anyRunning() const {
    for (const Child& c : children_) {
      if (c.running) return true;
    }
    return false;
  }

  // Reads what the pipes hold and reaps exited children; returns the newly failed, in rank
  // order of reaping.
  std::vector<Child*> step(int timeoutMs) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (Child& c : children_) {
      if (c.pipeFd >= 0) {
        fds.push_back({c.pipeFd, POLLIN, 0});
        owners.push_back(&c);
      }
    }
    if (!fds.empty()) {
      const int ready = ::poll(fds.data(), fds.size(), timeoutMs);
      if (ready < 0 && errno != EINTR) LOOM_SYSCHECK(ready, "poll on the ranks' pipes");
      for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
        if (fds[i].revents != 0) drain(*owners[i]);
      }
    } else if (timeoutMs > 0) {
      ::usleep(static_cast<useconds_t>(timeoutMs) * 1000);
    }
    std::vector<Child*> newlyFailed;
    for (Child& c : children_) {
      if (!c.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(c.pid, &status, WNOHANG);
      if (got == c.pid) {
        c.running = false;
        c.status = status;
        // The message was written before exit, so the pipe holds all of it now: read until
        // empty and close. Not until EOF: a process the rank forked without exec holds the
        // write end too, for as long as it lives.
        drainAfterExit(c);
        if (failed(status)) newlyFailed.push_back(&c);
      } else if (got < 0 && errno != EINTR) {
        LOOM_SYSCHECK(got, "waitpid(", c.pid, ") for rank ", c.rank);
      }
    }
    return newlyFailed;
  }

  // SIGTERM (or `sig`) to every running child, then SIGKILL after `grace`, then reap.
  void stopAll(int sig, milliseconds grace) {
    for (Child& c : children_) {
      if (c.running) ::kill(c.pid, sig);
    }
    Deadline deadline(grace);
    while (anyRunning() && !deadline.expired()) step(kTickMs);
    for (Child& c : children_) {
      if (c.running) ::kill(c.pid, SIGKILL);
    }
    // SIGKILL cannot be ignored; the bound only guards against a child stuck in the kernel.
    Deadline reap(milliseconds(10000));
    while (anyRunning() && !reap.expired()) step(kTickMs);
  }

  milliseconds grace() const { return grace_; }

 private:
  void drain(Child& c) {
    char buf[4096];
    const ssize_t r = ::read(c.pipeFd, buf, sizeof(buf));
    if (r > 0) {
      if (c.message.size() < kMaxChildMessage) c.message.append(buf, static_cast<size_t>(r));
      return;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
    ::close(c.pipeFd);
    c.pipeFd = -1;
  }

  // The read end is non-blocking: every read returns at once, and EAGAIN means the exited
  // child wrote nothing more.
  void drainAfterExit(Child& c) {
    char buf[4096];
    while (c.pipeFd >= 0) {
      const ssize_t r = ::read(c.pipeFd, buf, sizeof(buf));
      if (r > 0) {
        if (c.message.size() < kMaxChildMessage) c.message.append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      ::close(c.pipeFd);
      c.pipeFd = -1;
    }
  }

  std::vector<Child>& children_;
  milliseconds grace_;
};

}  // namespace

std::string signalName(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return "signal " + std::to_string(sig);
  }
}

void spawn(int nprocs, const SpawnFn& fn, const SpawnOptions& options) {
  LOOM_CHECK(nprocs >= 1, "spawn: nprocs must be at least 1, got ", nprocs);
  LOOM_CHECK(static_cast<bool>(fn), "spawn: fn is empty; expected a function of the rank");
  LOOM_CHECK(options.grace.count() >= 0, "spawn: grace must not be negative, got ",
             options.grace.count(), " ms");
  LOOM_CHECK(options.masterPort >= 0 && options.masterPort <= 65535,
             "spawn: masterPort must be in [0, 65535] (0 = pick a free one), got ",
             options.masterPort);
  milliseconds timeout = options.timeout;
  if (timeout.count() <= 0) {
    timeout = std::chrono::seconds(settings::integer("LOOM_SPAWN_TIMEOUT").value_or(86400));
  }
  const int port = options.masterPort != 0 ? options.masterPort : pickFreePort(options.masterAddr);
  const pid_t parent = ::getpid();

  std::vector<Child> children(static_cast<size_t>(nprocs));
  Joiner joiner(children, options.grace);
  std::fflush(nullptr);
  for (int rank = 0; rank < nprocs; ++rank) {
    int fds[2];
    LOOM_SYSCHECK(::pipe2(fds, O_CLOEXEC), "spawn: pipe for rank ", rank);
    // The parent's read end never blocks (Joiner::drainAfterExit); the child's write end does.
    if (::fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0) {
      const int err = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      LOOM_THROW(IoError, "spawn: O_NONBLOCK on rank ", rank,
                 "'s pipe failed: ", detail::errnoText(err), " (the ranks started are stopped)");
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      for (int i = 0; i < rank; ++i) {
        if (children[static_cast<size_t>(i)].pipeFd >= 0) ::close(children[i].pipeFd);
      }
      runChild(rank, nprocs, fn, options, port, parent, fds[1]);
    }
    ::close(fds[1]);
    if (pid < 0) {
      const int err = errno;
      ::close(fds[0]);
      LOOM_THROW(IoError, "spawn: fork for rank ", rank, " of ", nprocs,
                 " failed: ", detail::errnoText(err), " (the ranks started are stopped)");
    }
    Child& c = children[static_cast<size_t>(rank)];
    c.rank = rank;
    c.pid = pid;
    c.pipeFd = fds[0];
    c.running = true;
  }

  Deadline deadline(timeout);
  while (joiner.anyRunning()) {
    std::vector<Child*> newlyFailed = joiner.step(std::min(kTickMs, deadline.pollTimeoutMs()));
    if (!newlyFailed.empty()) {
      // Several may fail in one tick (a peer's death fails the others); the lowest rank that
      // raised an exception is the likeliest root cause, else the lowest rank.
      Child* first = newlyFailed.front();
      for (Child* c : newlyFailed) {
        if (!c->message.empty() && first->message.empty()) first = c;
      }
      joiner.stopAll(SIGTERM, options.grace);
      const int status = first->status;
      const bool signalled = WIFSIGNALED(status);
      std::ostringstream what;
      what << "spawn: rank " << first->rank << " (pid " << first->pid << ") of " << nprocs << " ";
      if (!first->message.empty()) {
        what << "raised " << first->message;
      } else {
        what << describeStatus(status);
      }
      what << "; the other ranks were stopped";
      throw SpawnError(what.str(), first->rank, first->pid, signalled ? -1 : WEXITSTATUS(status),
                       signalled ? WTERMSIG(status) : 0, first->message);
    }
    if (deadline.expired() && joiner.anyRunning()) {
      std::ostringstream still;
      int count = 0;
      for (const Child& c : children) {
        if (!c.running) continue;
        still << (count++ == 0 ? "" : ", ") << "rank " << c.rank << " (pid " << c.pid << ")";
      }
      joiner.stopAll(SIGTERM, options.grace);
      LOOM_THROW(TimeoutError, "spawn: timed out after ", deadline.elapsed().count(),
                 " ms waiting for ", count, " of ", nprocs, " ranks: ", still.str(),
                 " still running; stopped them (SIGTERM, then SIGKILL after ",
                 options.grace.count(), " ms)");
    }
  }
}

int spawnMain(int nprocs, const SpawnFn& fn, const SpawnOptions& options) {
  try {
    const std::optional<long long> rank = settings::integer("RANK");
    const std::optional<long long> worldSize = settings::integer("WORLD_SIZE");
    if (rank && worldSize) {
      LOOM_CHECK(*rank < *worldSize, "RANK=", *rank, " must be less than WORLD_SIZE=", *worldSize);
      try {
        fn(static_cast<int>(*rank));
      } catch (...) {
        std::cerr << "spawnMain: rank " << *rank << " of " << *worldSize << " raised "
                  << describeCurrentException() << std::endl;
        return 1;
      }
      return 0;
    }
    spawn(nprocs, fn, options);
    return 0;
  } catch (const SpawnError& e) {
    std::cerr << e.what() << std::endl;
    if (e.signal() != 0) return 128 + e.signal();
    return e.exitCode() != 0 ? e.exitCode() : 1;
  } catch (const std::exception& e) {
    std::cerr << "spawnMain: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace loom
