// loom-train --shrink-on-failure end to end, with the real programs: loom-run starts 4 ranks of
// loom-train (an MLP, SGD with momentum, a StepLR schedule, a fixed seed) with
// --on-worker-failure continue; a rank SIGKILLs itself in a known step, after its optimizer
// step (--test-kill), so the survivors hold an update they must take back. The survivors shrink
// to 3 ranks, go back to the last step all of them finished and train to the end. Their final
// checkpoint must equal, byte for byte, that of a 3-rank loom-train run resumed from the 4-rank
// run's checkpoint of that step (--keep-checkpoints keeps it). A second failure shrinks again;
// below --min-ranks the survivors fail. And loom-run's --on-worker-failure continue on its own.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/testing/ranks.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using loom::testing::TempDir;

const std::string kLoomRun = LOOM_RUN_PATH;
const std::string kLoomTrain = LOOM_TRAIN_PATH;
constexpr auto kRunDeadline = 180s;

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Finished {
  int status = 0;
  bool timedOut = false;
  std::string out, err;
  bool exitedWith(int code) const {
    return !timedOut && WIFEXITED(status) && WEXITSTATUS(status) == code;
  }
  std::string describe() const {
    const std::string how = timedOut            ? "timed out"
                            : WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                                : "signal " + std::to_string(WTERMSIG(status));
    return how + "\n--- stdout ---\n" + out + "--- stderr ---\n" + err;
  }
};

// Runs argv (stdout and stderr to files in `dir` named after `name`) and waits for it, at most
// kRunDeadline (then SIGKILL).
Finished runProgram(const TempDir& dir, const std::string& name,
                    const std::vector<std::string>& args) {
  const std::string outPath = dir.file(name + ".out"), errPath = dir.file(name + ".err");
  std::vector<std::string> all = args;
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    // Four ranks share two cores here: one kernel thread each.
    setenv("LOOM_AUTOGRAD_THREADS", "1", 1);
    execv(argv[0], argv.data());
    _exit(126);
  }
  Finished f;
  const auto end = Clock::now() + kRunDeadline;
  for (;;) {
    if (waitpid(pid, &f.status, WNOHANG) == pid) break;
    if (Clock::now() >= end) {
      f.timedOut = true;
      kill(pid, SIGKILL);
      waitpid(pid, &f.status, 0);
      break;
    }
    std::this_thread::sleep_for(10ms);  // poll interval, bounded by the deadline
  }
  f.out = readFile(outPath);
  f.err = readFile(errPath);
  return f;
}

// loom-run with NPROC ranks of loom-train on the test's model, data and schedule.
std::vector<std::string> trainJob(int nproc, const std::string& ckptDir, int steps,
                                  const std::vector<std::string>& extra, bool shrink) {
  std::vector<std::string> args = {kLoomRun, "--nproc-per-node", std::to_string(nproc),
                                   "--grace-period-s", "2"};
  if (shrink) {
    for (const char* a : {"--on-worker-failure", "continue"}) args.push_back(a);
  }
  for (const std::string& a : std::vector<std::string>{"--",
                                                       kLoomTrain,
                                                       "--in",
                                                       "8",
                                                       "--hidden",
                                                       "16,16",
                                                       "--classes",
                                                       "4",
                                                       "--batch",
                                                       "4",
                                                       "--samples",
                                                       "96",
                                                       "--seed",
                                                       "3",
                                                       "--lr",
                                                       "0.05",
                                                       "--momentum",
                                                       "0.9",
                                                       "--lr-schedule",
                                                       "step:4:0.5",
                                                       "--steps",
                                                       std::to_string(steps),
                                                       "--checkpoint-dir",
                                                       ckptDir,
                                                       "--checkpoint-every",
                                                       "1",
                                                       "--keep-checkpoints",
                                                       "--log",
                                                       ckptDir + "/loss.csv"}) {
    args.push_back(a);
  }
  if (shrink) {
    for (const char* a : {"--shrink-on-failure", "--shrink-window-s", "60"}) args.push_back(a);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string checkpoint(const std::string& dir, int step = -1) {
  return dir + (step < 0 ? "/checkpoint.safetensors"
                         : "/checkpoint-" + std::to_string(step) + ".safetensors");
}

// A 3-rank (or other) run resumed from `from` (a checkpoint file) up to `steps`.
Finished resumedRun(const TempDir& dir, const std::string& name, int nproc, const std::string& from,
                    int steps) {
  const std::string ckptDir = dir.file(name);
  std::filesystem::create_directories(ckptDir);
  std::filesystem::copy_file(from, checkpoint(ckptDir));
  return runProgram(dir, name, trainJob(nproc, ckptDir, steps, {"--resume"}, false));
}

// The CSV rows (without the header) of steps > after, as text.
std::vector<std::string> logRows(const std::string& csv, int after) {
  std::vector<std::string> rows;
  std::istringstream in(readFile(csv));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("step,", 0) == 0) continue;
    if (std::stoi(line.substr(0, line.find(','))) > after) rows.push_back(line);
  }
  return rows;
}

// The steps of the CSV's rows, in order.
std::vector<int> loggedSteps(const std::string& csv) {
  std::vector<int> steps;
  for (const std::string& row : logRows(csv, 0)) steps.push_back(std::stoi(row));
  return steps;
}

// "shrink took N ms" of shrink line `n`, -1 when absent.
long long shrinkMillis(const std::string& out, int n) {
  const auto line = out.find("loom-train: shrink " + std::to_string(n) + ":");
  if (line == std::string::npos) return -1;
  const auto took = out.find("shrink took ", line);
  if (took == std::string::npos) return -1;
  return std::stoll(out.substr(took + 12));
}

void expectSameFile(const std::string& got, const std::string& want, const std::string& what) {
  const std::string a = readFile(got), b = readFile(want);
  ASSERT_FALSE(b.empty()) << want;
  size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  EXPECT_TRUE(a == b) << what << ": " << got << " (" << a.size() << " bytes) differs from " << want
                      << " (" << b.size() << " bytes) from byte " << at;
}

TEST(LoomTrainShrink, SurvivorsOfAKilledRankEndWithTheWeightsOfAResumedThreeRankRun) {
  TempDir dir;
  const std::string a = dir.file("shrunk");
  const Finished run = runProgram(dir, "shrunk", trainJob(4, a, 14, {"--test-kill", "2:7"}, true));
  ASSERT_TRUE(run.exitedWith(0)) << run.describe();
  // loom-run let the survivors live and says what it lost.
  EXPECT_NE(run.err.find("rank 2 (local rank 2, pid "), std::string::npos) << run.describe();
  EXPECT_NE(run.err.find("was killed by signal 9 (SIGKILL); --on-worker-failure continue"),
            std::string::npos)
      << run.describe();
  EXPECT_NE(run.err.find("the job finished on the survivors: 3 of 4 worker(s) exited 0"),
            std::string::npos)
      << run.describe();
  // One line for the shrink: who, the new world, the step. The victim died after its update
  // of step 7, so step 6 is the last one every rank finished.
  EXPECT_NE(run.out.find("loom-train: shrink 1: lost rank 2 (dead: its process "),
            std::string::npos)
      << run.describe();
  EXPECT_NE(run.out.find("world 4 -> 3 (launch ranks 0,1,3); resuming from step 6 "),
            std::string::npos)
      << run.describe();
  // The dead rank was excluded at once, not waited for (the window is 60 s).
  const long long took = shrinkMillis(run.out, 1);
  EXPECT_GE(took, 0) << run.describe();
  EXPECT_LT(took, 60000) << run.describe();
  EXPECT_NE(run.out.find("loom-train: world 3, "), std::string::npos) << run.describe();
  EXPECT_NE(run.out.find("loom-train: shrink snapshots: "), std::string::npos) << run.describe();

  const Finished ref = resumedRun(dir, "reference", 3, checkpoint(a, 6), 14);
  ASSERT_TRUE(ref.exitedWith(0)) << ref.describe();
  EXPECT_NE(ref.err.find("at step 6"), std::string::npos) << ref.describe();
  expectSameFile(checkpoint(a), checkpoint(dir.file("reference")),
                 "the survivors' final checkpoint");
  // Not vacuous: training moved on after step 6.
  EXPECT_NE(readFile(checkpoint(a)), readFile(checkpoint(a, 6)));
  // The log holds every step once; the steps after the shrink are the resumed run's.
  std::vector<int> want;
  for (int s = 1; s <= 14; ++s) want.push_back(s);
  EXPECT_EQ(loggedSteps(a + "/loss.csv"), want) << readFile(a + "/loss.csv");
  EXPECT_EQ(logRows(a + "/loss.csv", 6), logRows(dir.file("reference") + "/loss.csv", 6));
}

// Rank 0 too: under --on-worker-failure continue loom-run hosts the store (LOOM_AGENT_STORE), so
// the rank that used to host it can die like any other and the new rank 0 writes the log and
// the checkpoints on.
TEST(LoomTrainShrink, RankZeroDiesAndTheSurvivorsKeepTheStoreAndFinish) {
  TempDir dir;
  const std::string a = dir.file("shrunk");
  const Finished run = runProgram(dir, "shrunk", trainJob(4, a, 14, {"--test-kill", "0:7"}, true));
  ASSERT_TRUE(run.exitedWith(0)) << run.describe();
  EXPECT_NE(run.err.find("the job finished on the survivors: 3 of 4 worker(s) exited 0; lost: "
                         "rank 0"),
            std::string::npos)
      << run.describe();
  EXPECT_NE(run.out.find("loom-train: shrink 1: lost rank 0 (dead: its process "),
            std::string::npos)
      << run.describe();
  EXPECT_NE(run.out.find("world 4 -> 3 (launch ranks 1,2,3); resuming from step 6 "),
            std::string::npos)
      << run.describe();
  const Finished ref = resumedRun(dir, "reference", 3, checkpoint(a, 6), 14);
  ASSERT_TRUE(ref.exitedWith(0)) << ref.describe();
  expectSameFile(checkpoint(a), checkpoint(dir.file("reference")),
                 "the survivors' final checkpoint after rank 0 died");
  std::vector<int> want;
  for (int s = 1; s <= 14; ++s) want.push_back(s);
  EXPECT_EQ(loggedSteps(a + "/loss.csv"), want) << readFile(a + "/loss.csv");
}

TEST(LoomTrainShrink, ASecondFailureShrinksAgain) {
  TempDir dir;
  const std::string a = dir.file("shrunk");
  const Finished run = runProgram(
      dir, "shrunk", trainJob(4, a, 14, {"--test-kill", "2:5", "--test-kill", "1:10"}, true));
  ASSERT_TRUE(run.exitedWith(0)) << run.describe();
  EXPECT_NE(run.out.find("shrink 1: lost rank 2 (dead: "), std::string::npos) << run.describe();
  EXPECT_NE(run.out.find("world 4 -> 3 (launch ranks 0,1,3); resuming from step 4 "),
            std::string::npos)
      << run.describe();
  EXPECT_NE(run.out.find("shrink 2: lost rank 1 (dead: "), std::string::npos) << run.describe();
  EXPECT_NE(run.out.find("world 3 -> 2 (launch ranks 0,3); resuming from step 9 "),
            std::string::npos)
      << run.describe();
  EXPECT_NE(run.err.find("the job finished on the survivors: 2 of 4 worker(s) exited 0"),
            std::string::npos)
      << run.describe();

  // The reference goes the same way: 3 ranks from step 4 to 9, then 2 ranks from 9 to 14.
  const Finished three = resumedRun(dir, "three", 3, checkpoint(a, 4), 9);
  ASSERT_TRUE(three.exitedWith(0)) << three.describe();
  expectSameFile(checkpoint(a, 9), checkpoint(dir.file("three")), "step 9, after the 1st shrink");
  const Finished two = resumedRun(dir, "two", 2, checkpoint(dir.file("three")), 14);
  ASSERT_TRUE(two.exitedWith(0)) << two.describe();
  expectSameFile(checkpoint(a), checkpoint(dir.file("two")), "the final checkpoint");
}

TEST(LoomTrainShrink, BelowMinRanksTheSurvivorsFail) {
  TempDir dir;
  const Finished run = runProgram(
      dir, "shrunk",
      trainJob(4, dir.file("shrunk"), 8, {"--test-kill", "3:3", "--min-ranks", "4"}, true));
  EXPECT_FALSE(run.timedOut) << run.describe();
  EXPECT_FALSE(run.exitedWith(0)) << run.describe();
  EXPECT_NE(run.err.find("fewer than minSize 4"), std::string::npos) << run.describe();
  EXPECT_NE(run.err.find("every worker failed"), std::string::npos) << run.describe();
}

TEST(LoomTrainShrink, BadFlagsAreRefusedNamingThem) {
  TempDir dir;
  const Finished minRanks = runProgram(dir, "min", {kLoomTrain, "--min-ranks", "2"});
  EXPECT_TRUE(minRanks.exitedWith(2)) << minRanks.describe();
  EXPECT_NE(minRanks.err.find("--min-ranks is for --shrink-on-failure"), std::string::npos)
      << minRanks.describe();
  const Finished kill = runProgram(dir, "kill", {kLoomTrain, "--steps", "1", "--test-kill", "1-3"});
  EXPECT_TRUE(kill.exitedWith(1)) << kill.describe();
  EXPECT_NE(kill.err.find("--test-kill '1-3' is not RANK:STEP"), std::string::npos)
      << kill.describe();
  const Finished zero =
      runProgram(dir, "zero", {kLoomTrain, "--steps", "1", "--zero", "--shrink-on-failure"});
  EXPECT_TRUE(zero.exitedWith(1)) << zero.describe();
  EXPECT_NE(zero.err.find("--shrink-on-failure does not work with --zero"), std::string::npos)
      << zero.describe();
}

// loom-run --on-worker-failure continue, with a shell as the worker.
TEST(LoomRunOnWorkerFailure, ContinueLetsTheOthersFinishAndExitsZero) {
  TempDir dir;
  const std::string marker = dir.file("shepherd1");
  // Rank 1 leaves its shepherd's pid and SIGKILLs itself; the others finish once loom-run has
  // reaped that shepherd (a success before the failure would fail the job). Bounded: 60 s.
  const Finished run =
      runProgram(dir, "continue",
                 {kLoomRun, "--nproc-per-node", "3", "--on-worker-failure", "continue", "sh", "-c",
                  "if [ \"$RANK\" = 1 ]; then echo $PPID > " + marker + ".tmp; mv " + marker +
                      ".tmp " + marker + "; kill -9 $$; fi; for i in $(seq 1200); do if [ -s " +
                      marker + " ] && ! kill -0 $(cat " + marker +
                      ") 2>/dev/null; then break; fi; sleep 0.05; "
                      "done; echo \"rank $RANK done $LOOM_RUN_ON_WORKER_FAILURE\""});
  ASSERT_TRUE(run.exitedWith(0)) << run.describe();
  EXPECT_NE(run.out.find("rank 0 done continue"), std::string::npos) << run.describe();
  EXPECT_NE(run.out.find("rank 2 done continue"), std::string::npos) << run.describe();
  EXPECT_NE(run.err.find("rank 1 (local rank 1, pid "), std::string::npos) << run.describe();
  EXPECT_NE(run.err.find("the job finished on the survivors: 2 of 3 worker(s) exited 0; lost: "
                         "rank 1 (was killed by signal 9 (SIGKILL))"),
            std::string::npos)
      << run.describe();
}

TEST(LoomRunOnWorkerFailure, EveryWorkerFailingFailsTheJobWithTheFirstCode) {
  TempDir dir;
  const Finished run = runProgram(
      dir, "all",
      {kLoomRun, "--nproc-per-node", "2", "--on-worker-failure", "continue", "sh", "-c", "exit 4"});
  EXPECT_TRUE(run.exitedWith(4)) << run.describe();
  EXPECT_NE(run.err.find("every worker failed; the first failure: rank "), std::string::npos)
      << run.describe();
}

TEST(LoomRunOnWorkerFailure, AFailureAfterAWorkerFinishedFailsTheJob) {
  TempDir dir;
  const std::string marker = dir.file("shepherd0");
  // Rank 0 leaves its shepherd's pid and exits 0; rank 1 exits 3 once loom-run has reaped that
  // shepherd (its pid is gone), so loom-run has seen the success first. Bounded: 60 s.
  const Finished run =
      runProgram(dir, "late",
                 {kLoomRun, "--nproc-per-node", "2", "--on-worker-failure", "continue", "sh", "-c",
                  "if [ \"$RANK\" = 0 ]; then echo $PPID > " + marker + ".tmp; mv " + marker +
                      ".tmp " + marker + "; exit 0; fi; for i in $(seq 1200); do if [ -s " +
                      marker + " ] && ! kill -0 $(cat " + marker +
                      ") 2>/dev/null; then exit 3; fi; sleep 0.05; "
                      "done; exit 9"});
  EXPECT_TRUE(run.exitedWith(3)) << run.describe();
  EXPECT_NE(run.err.find("after another worker had finished: the job did not end cleanly"),
            std::string::npos)
      << run.describe();
}

TEST(LoomRunOnWorkerFailure, ContinueIsRefusedAcrossNodesAndBadValuesAreNamed) {
  TempDir dir;
  const Finished nodes = runProgram(
      dir, "nodes",
      {kLoomRun, "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "0", "--master-addr",
       "127.0.0.1", "--master-port", "29999", "--on-worker-failure", "continue", "true"});
  EXPECT_TRUE(nodes.exitedWith(2)) << nodes.describe();
  EXPECT_NE(nodes.err.find("--on-worker-failure continue works on a single node only"),
            std::string::npos)
      << nodes.describe();
  const Finished bad = runProgram(
      dir, "bad", {kLoomRun, "--nproc-per-node", "1", "--on-worker-failure", "later", "true"});
  EXPECT_TRUE(bad.exitedWith(2)) << bad.describe();
  EXPECT_NE(bad.err.find("--on-worker-failure"), std::string::npos) << bad.describe();
}

}  // namespace
