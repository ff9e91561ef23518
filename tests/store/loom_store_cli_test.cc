// The loom-store program end to end: it prints where it listens, serves clients, reports
// joins, names missing ranks on a join timeout, and stops cleanly on SIGTERM.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
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
  std::string readUntil(const std::string& text, milliseconds timeout, size_t from = 0) {
    Deadline d(timeout);
    while (output_.find(text, from) == std::string::npos && !d.expired()) {
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
    const std::string line = "listening on 127.0.0.1:";
    const auto at = readUntil(line, milliseconds(10000)).find(line);
    if (at == std::string::npos) return -1;
    const std::string out = readUntil("\n", milliseconds(10000), at);
    return std::stoi(out.substr(at + line.size()));
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

// A --timeout past a year (1e300 overflowed to 0 ms: the join failed at once) and --fsync
// without a directory to persist to (accepted, no effect) are usage errors.
TEST(LoomStoreProgram, FlagsThatCouldNotWorkAreUsageErrors) {
  StoreProgram huge({"--workers", "1", "--timeout", "1e300"});
  EXPECT_EQ(huge.wait(milliseconds(5000)), 2);
  EXPECT_NE(huge.readUntil("out of range", milliseconds(2000)).find("--timeout"),
            std::string::npos);
  StoreProgram fsync({"--fsync", "never"});
  EXPECT_EQ(fsync.wait(milliseconds(5000)), 2);
  EXPECT_NE(fsync.readUntil("--data-dir", milliseconds(2000)).find("--fsync applies to"),
            std::string::npos);
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

// --data-dir: loom-store killed with SIGKILL and started again on the same port has every key
// it had answered for, and a client with a reconnect timeout carries on through the restart.
TEST(LoomStoreProgram, KeysSurviveASigkilledStore) {
  char tmpl[] = "/tmp/loom_store_cli_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/data";
  auto program = std::make_unique<StoreProgram>(
      std::vector<std::string>{"--host", "127.0.0.1", "--port", "0", "--data-dir", dir});
  const int port = program->port();
  ASSERT_GT(port, 0);
  TCPStoreOptions o;
  o.timeout = milliseconds(30000);
  o.reconnectTimeout = milliseconds(60000);
  TCPStore store("127.0.0.1", port, o);
  store.set("rendezvous/round", std::string_view("3"));
  EXPECT_EQ(store.add("joined", 2), 2);
  ::kill(program->pid(), SIGKILL);
  EXPECT_EQ(program->wait(milliseconds(10000)), -SIGKILL);
  program = std::make_unique<StoreProgram>(std::vector<std::string>{
      "--host", "127.0.0.1", "--port", std::to_string(port), "--data-dir", dir});
  const std::string out = program->readUntil("listening on", milliseconds(10000));
  EXPECT_NE(out.find("2 key(s) loaded from " + dir), std::string::npos) << out;
  EXPECT_EQ(store.getString("rendezvous/round"), "3");
  EXPECT_EQ(store.add("joined", 1), 3);
  ::kill(program->pid(), SIGTERM);
  EXPECT_EQ(program->wait(milliseconds(10000)), 0);
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

}  // namespace
}  // namespace loom
