// loom-run end to end: the real binary run on launcher_test_worker (test_worker.cc).
//
// This test process makes itself a child subreaper, so anything loom-run leaves behind
// (workers, their children) is re-parented to it: "no orphans" is checked by reaping until
// waitpid says there are no children left, with a deadline, and by probing the recorded pids.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "loom/testing/ranks.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using loom::testing::TempDir;

const std::string kLoomRun = LOOM_RUN_PATH;
const std::string kWorker = LAUNCHER_TEST_WORKER_PATH;

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

struct Finished {
  int status = 0;
  bool timedOut = false;
  std::string out, err;
  Clock::duration took{};
  bool exitedWith(int code) const { return WIFEXITED(status) && WEXITSTATUS(status) == code; }
  std::string describe() const {
    std::string s = timedOut            ? "timed out"
                    : WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                        : "signal " + std::to_string(WTERMSIG(status));
    return s + "\n--- stdout ---\n" + out + "--- stderr ---\n" + err;
  }
};

class LoomRun {
 public:
  LoomRun(const TempDir& dir, const std::vector<std::string>& args)
      : out_(dir.file("stdout")), err_(dir.file("stderr")), start_(Clock::now()) {
    std::vector<std::string> all = {kLoomRun};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      const int o = open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(o, 1);
      dup2(e, 2);
      execv(argv[0], argv.data());
      _exit(126);
    }
  }
  ~LoomRun() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

  Finished finish(std::chrono::milliseconds timeout) {
    Finished f;
    const auto end = Clock::now() + timeout;
    for (;;) {
      const pid_t r = waitpid(pid_, &f.status, WNOHANG);
      if (r == pid_) break;
      if (Clock::now() >= end) {
        f.timedOut = true;
        kill(pid_, SIGKILL);
        waitpid(pid_, &f.status, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);  // poll interval, bounded by the deadline
    }
    reaped_ = true;
    f.took = Clock::now() - start_;
    f.out = readFile(out_);
    f.err = readFile(err_);
    return f;
  }

 private:
  std::string out_, err_;
  Clock::time_point start_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

Finished runLoomRun(const std::vector<std::string>& args, std::chrono::milliseconds timeout = 30s) {
  TempDir dir;
  LoomRun run(dir, args);
  return run.finish(timeout);
}

// Waits until every path exists.
bool waitForFiles(const std::vector<std::string>& paths, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    if (std::all_of(paths.begin(), paths.end(),
                    [](const std::string& p) { return std::filesystem::exists(p); })) {
      return true;
    }
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(5ms);  // poll interval, bounded by the deadline
  }
}

// Reaps re-parented orphans until none is left; false if some still live at the deadline
// (they are SIGKILLed then, so one failing test does not poison the next).
bool noDescendantsLeft(std::chrono::milliseconds timeout, const std::vector<pid_t>& known) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(-1, &status, WNOHANG);
    if (r == -1 && errno == ECHILD) return true;
    if (r > 0) continue;
    if (Clock::now() >= end) {
      for (pid_t p : known) kill(p, SIGKILL);
      while (waitpid(-1, &status, WNOHANG) > 0) {
      }
      return false;
    }
    std::this_thread::sleep_for(5ms);  // poll interval, bounded by the deadline
  }
}

bool processGone(pid_t pid) {
  if (kill(pid, 0) == -1 && errno == ESRCH) return true;
  // A zombie whose parent has not reaped it yet has stopped running too.
  const std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

TEST(LoomRun, ThreeWorkersSeeTheirRanks) {
  const Finished f =
      runLoomRun({"--nproc-per-node", "3", "sh", "-c", "echo $RANK/$WORLD_SIZE/$LOCAL_RANK"});
  ASSERT_TRUE(f.exitedWith(0)) << f.describe();
  auto got = lines(f.out);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"0/3/0", "1/3/1", "2/3/2"})) << f.describe();
}

TEST(LoomRun, SetsTorchrunEnvironment) {
  const Finished f = runLoomRun({"--nproc-per-node", "2", kWorker, "env"});
  ASSERT_TRUE(f.exitedWith(0)) << f.describe();
  auto got = lines(f.out);
  ASSERT_EQ(got.size(), 2u) << f.describe();
  std::sort(got.begin(), got.end());
  // One free port, the same for every worker.
  const auto port0 = got[0].substr(got[0].find("MASTER_PORT=") + 12);
  const auto port1 = got[1].substr(got[1].find("MASTER_PORT=") + 12);
  EXPECT_EQ(port0, port1);
  const int port = std::stoi(port0.substr(0, port0.find(' ')));
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
  for (int r = 0; r < 2; ++r) {
    const std::string rs = std::to_string(r);
    EXPECT_EQ(got[r].rfind("RANK=" + rs + " WORLD_SIZE=2 LOCAL_RANK=" + rs +
                               " LOCAL_WORLD_SIZE=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 ",
                           0),
              0u)
        << got[r];
    EXPECT_NE(got[r].find("LOOM_RESTART_COUNT=0"), std::string::npos) << got[r];
  }
  const Finished g = runLoomRun({"--nproc-per-node", "1", "--master-addr", "10.1.2.3",
                                 "--master-port", "29511", kWorker, "env"});
  ASSERT_TRUE(g.exitedWith(0)) << g.describe();
  EXPECT_NE(g.out.find("MASTER_ADDR=10.1.2.3 MASTER_PORT=29511 "), std::string::npos) << g.out;
}

TEST(LoomRun, FailingWorkerStopsTheJobAndNamesRankAndCode) {
  // Ranks 0 and 2 would wait 60 s: the job must end long before that.
  const Finished f = runLoomRun({"--nproc-per-node", "3", kWorker, "fail", "1", "7"});
  ASSERT_TRUE(f.exitedWith(7)) << f.describe();
  EXPECT_LT(f.took, 15s) << f.describe();
  EXPECT_NE(f.err.find("rank 1 (local rank 1"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("exited with code 7"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("job failed"), std::string::npos) << f.err;
}

TEST(LoomRun, WorkerKilledBySignalIsReportedAs128PlusSignal) {
  const Finished f = runLoomRun({"--nproc-per-node", "2", kWorker, "selfkill", "0"});
  ASSERT_TRUE(f.exitedWith(128 + SIGKILL)) << f.describe();
  EXPECT_NE(f.err.find("rank 0 (local rank 0"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("killed by signal 9 (SIGKILL)"), std::string::npos) << f.err;
}

TEST(LoomRun, WorkerIgnoringSigtermIsKilledAfterGracePeriod) {
  const Finished f = runLoomRun(
      {"--nproc-per-node", "3", "--grace-period-s", "0.5", kWorker, "stubborn", "2", "3"});
  ASSERT_TRUE(f.exitedWith(3)) << f.describe();
  EXPECT_NE(f.err.find("SIGKILL"), std::string::npos) << f.err;
  EXPECT_LT(f.took, 15s) << f.describe();
}

// Starts 3 "sleep" workers (each with a grandchild), waits for their pid files, sends `sig` to
// loom-run, and checks that every worker and grandchild is gone soon after.
void checkNoOrphansAfter(int sig) {
  TempDir dir;
  TempDir files;
  LoomRun run(dir,
              {"--nproc-per-node", "3", "--grace-period-s", "2", kWorker, "sleep", files.path()});
  std::vector<std::string> paths;
  for (int r = 0; r < 3; ++r) {
    paths.push_back(files.file("pid." + std::to_string(r)));
    paths.push_back(files.file("child." + std::to_string(r)));
  }
  ASSERT_TRUE(waitForFiles(paths, 20s)) << "workers never wrote their pid files";
  std::vector<pid_t> pids;
  for (const auto& p : paths) pids.push_back(std::stoi(readFile(p)));
  ASSERT_EQ(kill(run.pid(), sig), 0);
  const Finished f = run.finish(20s);
  ASSERT_FALSE(f.timedOut) << f.describe();
  if (sig == SIGKILL) {
    EXPECT_TRUE(WIFSIGNALED(f.status) && WTERMSIG(f.status) == SIGKILL) << f.describe();
  } else {
    EXPECT_TRUE(f.exitedWith(128 + sig)) << f.describe();
    // The workers got the very signal loom-run got.
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(readFile(files.file("sig." + std::to_string(r))), std::to_string(sig) + "\n")
          << "rank " << r;
    }
  }
  EXPECT_TRUE(noDescendantsLeft(20s, pids)) << "processes outlived loom-run";
  for (pid_t p : pids) EXPECT_TRUE(processGone(p)) << "pid " << p << " still runs";
}

TEST(LoomRun, SigtermToLauncherLeavesNoWorker) {
  checkNoOrphansAfter(SIGTERM);
}
TEST(LoomRun, SigintToLauncherIsForwarded) {
  checkNoOrphansAfter(SIGINT);
}
TEST(LoomRun, SigkillToLauncherLeavesNoWorker) {
  checkNoOrphansAfter(SIGKILL);
}

TEST(LoomRun, MaxRestartsRestartsTheGroup) {
  // Rank 0 fails in attempts 0 and 1 and succeeds in attempt 2.
  const Finished ok = runLoomRun({"--nproc-per-node", "2", "--max-restarts", "2",
                                  "--grace-period-s", "1", kWorker, "flaky", "0", "5", "2"});
  ASSERT_TRUE(ok.exitedWith(0)) << ok.describe();
  EXPECT_NE(ok.err.find("restart 1 of 2 after: rank 0 (local rank 0) exited with code 5"),
            std::string::npos)
      << ok.err;
  EXPECT_NE(ok.err.find("restart 2 of 2"), std::string::npos) << ok.err;

  const Finished fail = runLoomRun({"--nproc-per-node", "2", "--max-restarts", "1",
                                    "--grace-period-s", "1", kWorker, "flaky", "0", "5", "2"});
  ASSERT_TRUE(fail.exitedWith(5)) << fail.describe();
  EXPECT_NE(fail.err.find("restart 1 of 1"), std::string::npos) << fail.err;
  EXPECT_NE(fail.err.find("no restarts left"), std::string::npos) << fail.err;
}

TEST(LoomRun, RedirectPrefixTagsEveryLine) {
  const Finished f = runLoomRun({"--nproc-per-node", "2", "--redirect-prefix", kWorker, "chatter"});
  ASSERT_TRUE(f.exitedWith(0)) << f.describe();
  auto out = lines(f.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[rank 0] out one 0", "[rank 0] out two 0",
                                           "[rank 0] partial 0", "[rank 1] out one 1",
                                           "[rank 1] out two 1", "[rank 1] partial 1"}))
      << f.describe();
  auto err = lines(f.err);
  std::sort(err.begin(), err.end());
  EXPECT_EQ(err, (std::vector<std::string>{"[rank 0] err one 0", "[rank 1] err one 1"}))
      << f.describe();
  // Without the flag the output passes through untouched.
  const Finished plain = runLoomRun({"--nproc-per-node", "1", kWorker, "chatter"});
  EXPECT_EQ(plain.out, "out one 0\nout two 0\npartial 0") << plain.describe();
}

// A reader of loom-run's stdout that stalls (a paused pager) must not stall loom-run: rank 0
// floods stdout past what the pipe and loom-run's queue hold, rank 1 fails after 1 s, and
// loom-run must stop rank 0 while nobody reads. Once the reader is back, every line rank 0 got
// out before it was stopped arrives, in order.
TEST(LoomRun, AStalledReaderOfItsOutputDoesNotStopItsSupervision) {
  TempDir dir;
  TempDir files;
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const std::string errPath = dir.file("stderr");
  std::vector<std::string> all = {kLoomRun,
                                  "--nproc-per-node",
                                  "2",
                                  "--redirect-prefix",
                                  "--grace-period-s",
                                  "2",
                                  kWorker,
                                  "flood",
                                  files.path(),
                                  "1",
                                  "3"};
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    const int e = open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out[1], 1);
    dup2(e, 2);
    execv(argv[0], argv.data());
    _exit(126);
  }
  close(out[1]);
  // Nobody reads stdout until rank 0 got loom-run's SIGTERM.
  const bool stopped = waitForFiles({files.file("sig.0")}, 20s);
  const auto stoppedAfter = Clock::now() - start;
  std::string text;
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  int status = 0;
  bool reaped = false;
  const auto end = Clock::now() + 30s;
  for (;;) {
    char buf[65536];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;  // loom-run and everything holding the pipe are gone
    if (Clock::now() >= end) {
      kill(pid, SIGKILL);
      break;
    }
    std::this_thread::sleep_for(5ms);  // poll interval, bounded by the deadline
  }
  close(out[0]);
  reaped = waitpid(pid, &status, 0) == pid;
  const std::string err = readFile(errPath);
  ASSERT_TRUE(stopped) << "rank 0 was not stopped while stdout was not read\n" << err;
  EXPECT_LT(stoppedAfter, 15s);
  ASSERT_TRUE(reaped);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << err;
  EXPECT_NE(err.find("rank 1 (local rank 1"), std::string::npos) << err;
  EXPECT_NE(err.find("exited with code 3 (first failure)"), std::string::npos) << err;
  // More than the pipe (64 KiB) went through, and rank 0's lines arrive whole and in order; its
  // last line may be cut short by the SIGTERM.
  const std::vector<std::string> got = lines(text);
  ASSERT_GT(text.size(), size_t{1} << 20) << "too little output to have filled the pipe";
  for (size_t i = 0; i + 1 < got.size(); ++i) {
    ASSERT_EQ(got[i], "[rank 0] flood 0 " + std::to_string(i)) << "line " << i;
  }
}

TEST(LoomRun, BadFlagsGiveUsageAndExitCode2) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"true"},
      {"--nproc-per-node", "0", "true"},
      {"--nproc-per-node", "x", "true"},
      {"--nproc-per-node", "2", "--bogus", "true"},
      {"--nproc-per-node", "2"},
      {"--nproc-per-node", "2", "--nnodes", "2", "--master-addr", "10.0.0.1", "true"},
      {"--nproc-per-node", "2", "--nnodes", "2", "--master-port", "29500", "true"},
      {"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "--master-addr", "a",
       "--master-port", "1", "true"},
      {"--nproc-per-node", "2", "--master-port", "70000", "true"},
      {"--nproc-per-node", "2", "--grace-period-s", "-1", "true"},
      {"--nproc-per-node", "2", "--max-restarts", "-1", "true"},
      {"--nproc-per-node", "2", "--rdzv-endpoint", "no-port", "true"},
      {"--nproc-per-node", "2", "--rdzv-endpoint", "host:99999", "true"},
      // Trailing characters after the port were dropped (stoi): 29500abc was 29500.
      {"--nproc-per-node", "2", "--rdzv-endpoint", "host:29500abc", "true"},
      {"--nproc-per-node", "2", "--rdzv-endpoint", "host:+80", "true"},
  };
  for (const auto& args : bad) {
    const Finished f = runLoomRun(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_TRUE(f.exitedWith(2)) << joined << "\n" << f.describe();
    EXPECT_NE(f.err.find("usage: loom-run"), std::string::npos) << joined << "\n" << f.err;
  }
  const Finished notFound = runLoomRun({"--nproc-per-node", "1", "no-such-program-xyz"});
  EXPECT_TRUE(notFound.exitedWith(127)) << notFound.describe();
  EXPECT_NE(notFound.err.find("'no-such-program-xyz' not found"), std::string::npos);

  const Finished help = runLoomRun({"--help"});
  EXPECT_TRUE(help.exitedWith(0)) << help.describe();
  for (const char* word :
       {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
        "--max-restarts", "--redirect-prefix", "--grace-period-s", "--rdzv-timeout-s",
        "--node-timeout-s", "--run-id", "--rdzv-endpoint", "LOCAL_WORLD_SIZE", "MASTER_PORT",
        "LOOM_RESTART_COUNT", "128+"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << "help does not mention " << word;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Orphans of loom-run come to us, so the tests can see (and reap) them.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
