#include "shepherd.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/settings.h"

namespace loom::run {
namespace {

// Delivered to the shepherd by the kernel when loom-run (the thread that forked it) dies.
constexpr int kParentDiedSignal = SIGUSR1;

// Async-signal-safe write of a message to stderr, bounded: stderr is loom-run's own (a terminal,
// a pipe), and a reader that has stalled must not wedge a shepherd that blocks SIGTERM. Each
// piece waits at most 2 s for room (a pipe or terminal with room takes a short message whole),
// then the message is dropped: the exit status still says what happened.
void rawSay(const char* a, const char* b = "", const char* c = "") {
  for (const char* s : {a, b, c}) {
    size_t n = std::strlen(s);
    while (n > 0) {
      pollfd out{2, POLLOUT, 0};
      const int ready = ::poll(&out, 1, 2000);
      if (ready == 0 || (ready < 0 && errno != EINTR)) return;
      if (ready < 0) continue;
      const ssize_t w = ::write(2, s, n);
      if (w <= 0) {
        if (w == -1 && errno == EINTR) continue;
        return;
      }
      s += w;
      n -= static_cast<size_t>(w);
    }
  }
}

long long nowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Exits the way the worker did: same code, or killed by the same signal.
[[noreturn]] void mirrorStatus(int status) {
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
  rlimit noCore{0, 0};
  setrlimit(RLIMIT_CORE, &noCore);  // the worker dumped core already if it was going to
  signal(sig, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  sigprocmask(SIG_UNBLOCK, &only, nullptr);
  kill(getpid(), sig);
  _exit(128 + sig);
}

[[noreturn]] void workerMain(const ShepherdSpec& spec, char* const* argv, char* const* envp,
                             pid_t shepherd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != shepherd) _exit(128 + SIGKILL);
  const int devNull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devNull >= 0) dup2(devNull, 0);
  if (spec.stdoutFd >= 0) dup2(spec.stdoutFd, 1);
  if (spec.stderrFd >= 0) dup2(spec.stderrFd, 2);
  // Nothing of loom-run's (sockets, pipes, the signalfd) leaks into PROGRAM.
  close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(spec.path.c_str(), argv, envp);
  const int err = errno;
  rawSay("loom-run: cannot execute ", spec.path.c_str(), ": ");
  rawSay(strerrordesc_np(err), "\n");
  _exit(127);
}

// Reaps every exited child; returns true once the worker has been reaped (status stored).
bool reap(pid_t worker, int* workerStatus) {
  bool done = false;
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    if (pid == worker) {
      *workerStatus = status;
      done = true;
    }
  }
  return done;
}

[[noreturn]] void shepherdMain(const ShepherdSpec& spec, char* const* argv, char* const* envp,
                               pid_t parent, int readyFd) {
  setpgid(0, 0);
  prctl(PR_SET_NAME, "loom-shepherd");
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  sigset_t waitSet = launcherSignals();
  sigaddset(&waitSet, kParentDiedSignal);
  sigprocmask(SIG_BLOCK, &waitSet, nullptr);
  prctl(PR_SET_PDEATHSIG, kParentDiedSignal);
  if (getppid() != parent) _exit(128 + SIGKILL);  // loom-run died before we could watch it

  const pid_t shepherd = getpid();
  const pid_t worker = fork();
  if (worker == 0) workerMain(spec, argv, envp, shepherd);
  if (worker < 0) {
    rawSay("loom-run: fork of a worker failed: ", strerrordesc_np(errno), "\n");
    _exit(127);
  }
  // The worker is in our group now, so loom-run's killpg reaches it: let loom-run go on.
  const char ready = 1;
  while (write(readyFd, &ready, 1) == -1 && errno == EINTR) {
  }
  close_range(3, ~0U, 0);

  int workerStatus = 0;
  for (;;) {
    siginfo_t info{};
    const int sig = sigwaitinfo(&waitSet, &info);
    if (sig < 0) continue;  // EINTR
    if (sig == SIGCHLD) {
      if (reap(worker, &workerStatus)) {
        killpg(0, SIGTERM);  // leftovers of the worker; we block SIGTERM ourselves
        mirrorStatus(workerStatus);
      }
    } else if (sig == kParentDiedSignal) {
      killpg(0, SIGTERM);
      const long long end = nowMs() + spec.grace.count();
      bool done = false;
      while (!done) {
        const long long left = end - nowMs();
        if (left <= 0) break;
        timespec ts{static_cast<time_t>(left / 1000), static_cast<long>(left % 1000) * 1000000};
        sigset_t chld;
        sigemptyset(&chld);
        sigaddset(&chld, SIGCHLD);
        if (sigtimedwait(&chld, nullptr, &ts) == SIGCHLD) done = reap(worker, &workerStatus);
      }
      killpg(0, SIGKILL);  // the group, this shepherd included
      _exit(128 + SIGKILL);
    } else if (info.si_pid != parent) {
      // Someone signalled this shepherd directly rather than its group: pass it on.
      kill(worker, sig);
    }
    // Signals from loom-run come through killpg, so the worker already got them.
  }
}

}  // namespace

sigset_t launcherSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set, sig);
  return set;
}

pid_t spawnShepherd(const ShepherdSpec& spec) {
  // Everything the child needs is allocated here, before the fork.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int ready[2];
  LOOM_SYSCHECK(pipe2(ready, O_CLOEXEC), "pipe for the shepherd of ", spec.path);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) shepherdMain(spec, argv.data(), envp.data(), parent, ready[1]);
  const int forkErr = errno;
  ::close(ready[1]);
  if (pid < 0) ::close(ready[0]);
  LOOM_CHECK_T(IoError, pid > 0, "fork of the shepherd for ", spec.path,
               " failed: ", detail::errnoText(forkErr));
  setpgid(pid, pid);
  // Wait (bounded) until the worker exists inside the shepherd's group: a stop signal sent to
  // the group before then would reach the shepherd but never the worker. EOF (the shepherd
  // died early) or the deadline just let us go on; its exit status tells the rest.
  pollfd pfd{ready[0], POLLIN, 0};
  const Deadline deadline(milliseconds(10000));
  while (!deadline.expired()) {
    const int n = ::poll(&pfd, 1, deadline.pollTimeoutMs());
    if (n > 0 || (n < 0 && errno != EINTR)) break;
  }
  ::close(ready[0]);
  return pid;
}

std::string resolveProgram(const std::string& program) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return executable(program) ? program : "";
  const std::string dirs = settings::text("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + program;
    if (executable(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

}  // namespace loom::run
