#include "loom/testing/ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "loom/common/error.h"
#include "loom/common/settings.h"

namespace loom::testing {

void runThreadRanks(int worldSize, const std::function<void(int rank)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  int firstRank = -1;
  std::string firstWhat;
  std::vector<std::thread> threads;
  threads.reserve(worldSize);
  for (int rank = 0; rank < worldSize; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) {
          first = std::current_exception();
          firstRank = rank;
          firstWhat = e.what();
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) {
          first = std::current_exception();
          firstRank = rank;
          firstWhat = "unknown exception";
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) {
    throw std::runtime_error("rank " + std::to_string(firstRank) + ": " + firstWhat);
  }
}

std::string ChildExit::describe() const {
  std::string out = "pid " + std::to_string(pid);
  if (timedOut) return out + " did not finish before the deadline (killed)";
  if (exited) return out + " exited with code " + std::to_string(code);
  return out + " killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

ChildProcesses::~ChildProcesses() {
  for (auto& child : children_) {
    if (child.exit) continue;
    ::kill(child.pid, SIGKILL);
    int status = 0;
    while (waitpid(child.pid, &status, 0) == -1 && errno == EINTR) {
    }
  }
}

int ChildProcesses::spawn(const std::function<void()>& fn, const std::string& name) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == -1) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int code = 0;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[child %s] exception: %s\n", name.c_str(), e.what());
      code = 1;
    } catch (...) {
      std::fprintf(stderr, "[child %s] unknown exception\n", name.c_str());
      code = 1;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
  }
  children_.push_back({pid, name, std::nullopt});
  return static_cast<int>(children_.size()) - 1;
}

void ChildProcesses::spawnRanks(int n, const std::function<void(int rank)>& fn) {
  for (int rank = 0; rank < n; ++rank) {
    spawn([&fn, rank] { fn(rank); }, "rank " + std::to_string(rank));
  }
}

void ChildProcesses::kill(int index, int sig) {
  ::kill(children_.at(index).pid, sig);
}

namespace {

ChildExit decode(pid_t pid, int status) {
  ChildExit e;
  e.pid = pid;
  if (WIFEXITED(status)) {
    e.exited = true;
    e.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
  }
  return e;
}

}  // namespace

ChildExit ChildProcesses::wait(int index, std::chrono::milliseconds timeout) {
  auto& child = children_.at(index);
  if (child.exit) return *child.exit;
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(child.pid, &status, WNOHANG);
    if (r == child.pid) {
      child.exit = decode(child.pid, status);
      return *child.exit;
    }
    if (r == -1 && errno != EINTR) {
      ChildExit e;
      e.pid = child.pid;
      child.exit = e;
      return e;
    }
    if (std::chrono::steady_clock::now() >= end) {
      ::kill(child.pid, SIGKILL);
      while (waitpid(child.pid, &status, 0) == -1 && errno == EINTR) {
      }
      ChildExit e = decode(child.pid, status);
      e.timedOut = true;
      child.exit = e;
      return e;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::vector<ChildExit> ChildProcesses::waitAll(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::vector<ChildExit> out;
  for (size_t i = 0; i < children_.size(); ++i) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    out.push_back(wait(static_cast<int>(i), std::max(left, std::chrono::milliseconds(0))));
  }
  return out;
}

std::string ChildProcesses::waitAllOk(std::chrono::milliseconds timeout) {
  const auto exits = waitAll(timeout);
  std::string failures;
  for (size_t i = 0; i < exits.size(); ++i) {
    if (!exits[i].ok()) {
      failures += "[" + (children_[i].name.empty() ? std::to_string(i) : children_[i].name) + "] " +
                  exits[i].describe() + "\n";
    }
  }
  return failures;
}

void expectOnlyVictimKilled(const std::vector<ChildExit>& exits, int victim) {
  for (size_t rank = 0; rank < exits.size(); ++rank) {
    if (static_cast<int>(rank) == victim) {
      EXPECT_EQ(exits[rank].signal, SIGKILL) << exits[rank].describe();
    } else {
      EXPECT_TRUE(exits[rank].ok()) << "rank " << rank << ": " << exits[rank].describe();
    }
  }
}

void checkDeadPeerError(const std::exception& error, std::chrono::milliseconds waited,
                        std::chrono::milliseconds bound, const std::string& peerName) {
  LOOM_CHECK(waited < bound, "the error took ", waited.count(), " ms (bound ", bound.count(),
             " ms): ", error.what());
  LOOM_CHECK(std::string(error.what()).find(peerName) != std::string::npos,
             "the error does not name ", peerName, ": ", error.what());
  LOOM_CHECK(dynamic_cast<const TimeoutError*>(&error) == nullptr, "got a timeout: ", error.what());
}

TempDir::TempDir() {
  std::string tmpl = settings::text("TMPDIR").value_or("/tmp") + "/loom-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace loom::testing
