// The loom-store program end to end: it prints where it listens, serves clients, reports
// joins, names missing ranks on a join timeout, and stops cleanly on SIGTERM.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/store/tcp_store.h"

namespace loom {
namespace {

using std::chrono::milliseconds;

// loom-store as a child process with its stdout and stderr on one pipe.
class StoreProgram {
 public:
  explicit StoreProgram(std::vector<std::string> args) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      std::vector<char*> argv;
      static std::string bin = LOOM_STORE_BIN;
      argv.push_back(bin.data());
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      _exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~StoreProgram() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
  }
  // Reads output until `text` appears or the deadline passes; returns everything read.
  std::string readUntil(const std::string& text, milliseconds timeout) {
    Deadline d(timeout);
    while (output_.find(text) == std::string::npos && !d.expired()) {
      pollfd pfd{out_, POLLIN, 0};
      if (::poll(&pfd, 1, d.pollTimeoutMs()) != 1) continue;
      char buf[512];
      const ssize_t r = ::read(out_, buf, sizeof(buf));
      if (r <= 0) break;
      output_.append(buf, static_cast<size_t>(r));
    }
    return output_;
  }
  int port() {
    const std::string out = readUntil("\n", milliseconds(10000));
    const auto at = out.find("listening on 127.0.0.1:");
    if (at == std::string::npos) return -1;
    return std::stoi(out.substr(at + 23));
  }
  // Exit code, or -signal, or 999 when it did not exit in time.
  int wait(milliseconds timeout) {
    Deadline d(timeout);
    int status = 0;
    while (!d.expired()) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
      ::usleep(1000);  // poll interval, bounded by the deadline
    }
    return 999;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  std::string output_;
};

TEST(LoomStoreProgram, ServesReportsJoinsAndStopsOnSigterm) {
  StoreProgram program({"--host", "127.0.0.1", "--port", "0", "--workers", "2"});
  const int port = program.port();
  ASSERT_GT(port, 0);
  TCPStoreOptions o;
  o.timeout = milliseconds(5000);
  o.rank = 0;
  TCPStore a("127.0.0.1", port, o);
  o.rank = 1;
  TCPStore b("127.0.0.1", port, o);
  a.set("k", std::string_view("v"));
  EXPECT_EQ(b.getString("k"), "v");
  const std::string out = program.readUntil("2/2 workers joined", milliseconds(5000));
  EXPECT_NE(out.find("2/2 workers joined"), std::string::npos) << out;
  ::kill(program.pid(), SIGTERM);
  EXPECT_EQ(program.wait(milliseconds(5000)), 0);
}

TEST(LoomStoreProgram, JoinTimeoutNamesMissingRanks) {
  StoreProgram program(
      {"--host", "127.0.0.1", "--port", "0", "--workers", "3", "--timeout", "0.5"});
  const int port = program.port();
  ASSERT_GT(port, 0);
  TCPStoreOptions o;
  o.timeout = milliseconds(5000);
  o.rank = 1;
  TCPStore one("127.0.0.1", port, o);
  EXPECT_EQ(program.wait(milliseconds(5000)), 1);
  const std::string out = program.readUntil("missing ranks", milliseconds(2000));
  EXPECT_NE(out.find("1/3 workers joined"), std::string::npos) << out;
  EXPECT_NE(out.find("missing ranks: 0, 2"), std::string::npos) << out;
}

TEST(LoomStoreProgram, AddressInUseIsReported) {
  StoreProgram first({"--host", "127.0.0.1", "--port", "0"});
  const int port = first.port();
  ASSERT_GT(port, 0);
  StoreProgram second({"--host", "127.0.0.1", "--port", std::to_string(port)});
  EXPECT_EQ(second.wait(milliseconds(5000)), 1);
  const std::string out = second.readUntil("in use", milliseconds(2000));
  EXPECT_NE(out.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << out;
  EXPECT_NE(out.find("in use"), std::string::npos) << out;
}

}  // namespace
}  // namespace loom
