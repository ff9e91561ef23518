// loom-run --nnodes MIN:MAX end to end: three agents ("hosts") on this machine meet at a
// persisting store server that none of them hosts; one agent is SIGKILLed and the other two go
// on in a new round; a new agent is taken into the round after; a node whose workers keep
// failing leaves after --max-restarts and the others finish without it.
//
// The workers (launcher_test_worker elastic) append "tag=.. round=.. rank=.. world=.. node=..
// nnodes=.." to DIR/rounds when they start, then wait for DIR/finish and exit 0.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/store/tcp_store_server.h"
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

struct Start {
  std::string tag;
  int round = -1, rank = -1, world = -1, node = -1, nnodes = -1;
};

std::vector<Start> starts(const std::string& dir) {
  std::vector<Start> out;
  std::istringstream in(readFile(dir + "/rounds"));
  for (std::string line; std::getline(in, line);) {
    Start s;
    std::istringstream fields(line);
    for (std::string f; fields >> f;) {
      const auto eq = f.find('=');
      const std::string k = f.substr(0, eq), v = f.substr(eq + 1);
      if (k == "tag") s.tag = v;
      if (k == "round") s.round = std::stoi(v);
      if (k == "rank") s.rank = std::stoi(v);
      if (k == "world") s.world = std::stoi(v);
      if (k == "node") s.node = std::stoi(v);
      if (k == "nnodes") s.nnodes = std::stoi(v);
    }
    out.push_back(s);
  }
  return out;
}

// The starts of one round.
std::vector<Start> ofRound(const std::vector<Start>& all, int round) {
  std::vector<Start> out;
  for (const auto& s : all) {
    if (s.round == round) out.push_back(s);
  }
  return out;
}

// The first round, after `after`, in which every one of `tags` started nproc workers, nobody
// else did, and the world was theirs; -1 when none by the deadline.
int waitForRound(const std::string& dir, int after, const std::set<std::string>& tags, int nproc,
                 std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    const auto all = starts(dir);
    std::set<int> rounds;
    for (const auto& s : all) {
      if (s.round > after) rounds.insert(s.round);
    }
    for (int round : rounds) {
      const auto these = ofRound(all, round);
      std::map<std::string, int> perTag;
      for (const auto& s : these) ++perTag[s.tag];
      bool match = perTag.size() == tags.size();
      // ... and they formed the world (a node that left before starting its workers was
      // still counted in its round's world).
      for (const auto& s : these) {
        match = match && s.world == static_cast<int>(tags.size()) * nproc;
      }
      for (const auto& tag : tags) match = match && perTag[tag] == nproc;
      if (match) return round;
    }
    if (Clock::now() >= end) return -1;
    std::this_thread::sleep_for(20ms);  // poll interval, bounded by the deadline
  }
}

// A round's workers form one world: ranks 0..world-1 once each, node ranks 0..nnodes-1, a
// node's ranks contiguous from node * nproc.
void expectOneWorld(const std::vector<Start>& round, int nnodes, int nproc) {
  std::set<int> ranks;
  std::map<std::string, int> nodeOfTag;
  for (const auto& s : round) {
    EXPECT_EQ(s.world, nnodes * nproc);
    EXPECT_EQ(s.nnodes, nnodes);
    EXPECT_TRUE(ranks.insert(s.rank).second) << "rank " << s.rank << " twice";
    EXPECT_GE(s.rank, s.node * nproc);
    EXPECT_LT(s.rank, (s.node + 1) * nproc);
    auto [it, fresh] = nodeOfTag.emplace(s.tag, s.node);
    if (!fresh) {
      EXPECT_EQ(it->second, s.node) << s.tag;
    }
  }
  EXPECT_EQ(static_cast<int>(ranks.size()), nnodes * nproc);
  std::set<int> nodes;
  for (const auto& [tag, node] : nodeOfTag) nodes.insert(node);
  EXPECT_EQ(static_cast<int>(nodes.size()), nnodes);
}

class Agent {
 public:
  Agent(const TempDir& dir, const std::string& tag, const std::vector<std::string>& args)
      : tag_(tag), err_(dir.file("agent." + tag + ".err")) {
    std::vector<std::string> all = {kLoomRun};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      const int e = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(e, 2);
      dup2(e, 1);
      execv(argv[0], argv.data());
      _exit(126);
    }
  }
  ~Agent() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  void kill9() { kill(pid_, SIGKILL); }
  // The wait status, or -1 when it did not exit in time (then it is SIGKILLed).
  int finish(std::chrono::milliseconds timeout) {
    const auto end = Clock::now() + timeout;
    int status = 0;
    for (;;) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) break;
      if (Clock::now() >= end) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        reaped_ = true;
        return -1;
      }
      std::this_thread::sleep_for(10ms);  // poll interval, bounded by the deadline
    }
    reaped_ = true;
    return status;
  }
  std::string log() const { return "--- agent " + tag_ + " ---\n" + readFile(err_); }

 private:
  std::string tag_, err_;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

std::vector<std::string> agentArgs(int port, const std::string& runId, const std::string& dir,
                                   const std::string& tag, int nproc, int maxRestarts,
                                   bool fail = false) {
  std::vector<std::string> args = {"--nproc-per-node",
                                   std::to_string(nproc),
                                   "--nnodes",
                                   "2:3",
                                   "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port),
                                   "--run-id",
                                   runId,
                                   "--node-timeout-s",
                                   "5",
                                   "--rdzv-last-call-s",
                                   "1",
                                   "--rdzv-timeout-s",
                                   "60",
                                   "--grace-period-s",
                                   "2",
                                   "--max-restarts",
                                   std::to_string(maxRestarts),
                                   "--",
                                   kWorker,
                                   "elastic",
                                   dir,
                                   tag};
  if (fail) args.push_back("fail");
  return args;
}

bool exitedWith(int status, int code) {
  return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == code;
}

// Between the kill and the rejoin the store server itself restarts (from its data directory, on
// the same port): the agents reconnect and the job goes on.
TEST(ElasticLaunch, TwoOfThreeGoOnAfterOneIsKilledAndARejoiningNodeIsTakenIn) {
  TempDir dir;
  loom::TCPStoreServerOptions so;
  so.host = "127.0.0.1";
  so.token = "";
  so.dataDir = dir.file("store");
  auto server = std::make_unique<loom::TCPStoreServer>(so);
  const int port = server->port();
  const std::string d = dir.path();
  constexpr int kNproc = 2;
  std::map<std::string, std::unique_ptr<Agent>> agents;
  for (const std::string tag : {"A", "B", "C"}) {
    agents[tag] = std::make_unique<Agent>(dir, tag, agentArgs(port, "kill", d, tag, kNproc, 0));
  }
  auto logs = [&] {
    std::string out = readFile(d + "/rounds");
    for (auto& [tag, agent] : agents) out += agent->log();
    return out;
  };
  const int first = waitForRound(d, -1, {"A", "B", "C"}, kNproc, 60s);
  ASSERT_GE(first, 0) << logs();
  expectOneWorld(ofRound(starts(d), first), 3, kNproc);

  agents["C"]->kill9();
  const int second = waitForRound(d, first, {"A", "B"}, kNproc, 60s);
  ASSERT_GT(second, first) << logs();
  expectOneWorld(ofRound(starts(d), second), 2, kNproc);

  server.reset();
  so.port = port;
  server = std::make_unique<loom::TCPStoreServer>(so);
  EXPECT_GT(server->numKeysLoaded(), 0);

  agents["D"] = std::make_unique<Agent>(dir, "D", agentArgs(port, "kill", d, "D", kNproc, 0));
  const int third = waitForRound(d, second, {"A", "B", "D"}, kNproc, 60s);
  ASSERT_GT(third, second) << logs();
  expectOneWorld(ofRound(starts(d), third), 3, kNproc);

  std::ofstream(d + "/finish") << "1";
  for (const std::string tag : {"A", "B", "D"}) {
    const int status = agents[tag]->finish(60s);
    EXPECT_TRUE(exitedWith(status, 0)) << tag << " status " << status << "\n" << logs();
  }
  const int killed = agents["C"]->finish(10s);
  EXPECT_TRUE(killed >= 0 && WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL) << killed;
}

TEST(ElasticLaunch, ANodeWhoseWorkersKeepFailingLeavesAndTheOthersFinish) {
  TempDir dir;
  loom::TCPStoreServerOptions so;
  so.host = "127.0.0.1";
  so.token = "";
  loom::TCPStoreServer server(so);
  const std::string d = dir.path();
  std::map<std::string, std::unique_ptr<Agent>> agents;
  for (const std::string tag : {"A", "B", "C"}) {
    agents[tag] = std::make_unique<Agent>(
        dir, tag, agentArgs(server.port(), "flaky", d, tag, 1, 1, /*fail=*/tag == "C"));
  }
  auto logs = [&] {
    std::string out = readFile(d + "/rounds");
    for (auto& [tag, agent] : agents) out += agent->log();
    return out;
  };
  // C's workers exit 3 in every round; with --max-restarts 1 it leaves after its second failure.
  const int cStatus = agents["C"]->finish(90s);
  EXPECT_TRUE(exitedWith(cStatus, 3)) << "C status " << cStatus << "\n" << logs();
  int cRounds = 0;
  for (const auto& s : starts(d)) cRounds += s.tag == "C" ? 1 : 0;
  EXPECT_EQ(cRounds, 2) << logs();
  EXPECT_NE(agents["C"]->log().find("more than --max-restarts 1"), std::string::npos) << logs();

  const int without = waitForRound(d, -1, {"A", "B"}, 1, 60s);
  ASSERT_GE(without, 0) << logs();
  expectOneWorld(ofRound(starts(d), without), 2, 1);
  std::ofstream(d + "/finish") << "1";
  for (const std::string tag : {"A", "B"}) {
    const int status = agents[tag]->finish(60s);
    EXPECT_TRUE(exitedWith(status, 0)) << tag << " status " << status << "\n" << logs();
  }
}

#ifdef LOOM_TRAIN_PATH
// Issue 22's scenario with a real trainer: three nodes train loom-train with DDP and
// checkpoints; one node is SIGKILLed; the other two start a new round and go on from the last
// checkpoint (loom-train --resume) until the end. Their workers failed because a peer died, so
// neither is charged a restart (they run with --max-restarts 0).
TEST(ElasticLaunch, LoomTrainGoesOnFromTheLastCheckpointAfterANodeIsKilled) {
  TempDir dir;
  loom::TCPStoreServerOptions so;
  so.host = "127.0.0.1";
  so.token = "";
  loom::TCPStoreServer server(so);
  const std::string d = dir.path();
  const std::string ckpt = d + "/ckpt/checkpoint.safetensors";
  constexpr int kSteps = 3000;
  std::map<std::string, std::unique_ptr<Agent>> agents;
  for (const std::string tag : {"A", "B", "C"}) {
    std::vector<std::string> args = agentArgs(server.port(), "train", d, tag, 1, 0);
    args.erase(std::find(args.begin(), args.end(), "--") + 1, args.end());
    for (const std::string& a : {std::string(LOOM_TRAIN_PATH),
                                 std::string("--hidden"),
                                 std::string("16"),
                                 std::string("--in"),
                                 std::string("8"),
                                 std::string("--classes"),
                                 std::string("4"),
                                 std::string("--batch"),
                                 std::string("4"),
                                 std::string("--samples"),
                                 std::string("1200"),
                                 std::string("--steps"),
                                 std::to_string(kSteps),
                                 std::string("--checkpoint-dir"),
                                 d + "/ckpt",
                                 std::string("--checkpoint-every"),
                                 std::string("10"),
                                 std::string("--resume"),
                                 std::string("--log"),
                                 d + "/loss.csv"}) {
      args.push_back(a);
    }
    agents[tag] = std::make_unique<Agent>(dir, tag, args);
  }
  auto logs = [&] {
    std::string out;
    for (auto& [tag, agent] : agents) out += agent->log();
    return out;
  };
  const auto end = Clock::now() + 120s;
  while (!std::filesystem::exists(ckpt) && Clock::now() < end) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(std::filesystem::exists(ckpt)) << logs();
  agents["C"]->kill9();
  for (const std::string tag : {"A", "B"}) {
    const int status = agents[tag]->finish(300s);
    EXPECT_TRUE(exitedWith(status, 0)) << tag << " status " << status << "\n" << logs();
  }
  const std::string all = logs();
  // A later round of two nodes (agents that start far apart may add rounds before the kill),
  // in which the trainer resumed from a checkpoint past step 0.
  bool twoNodeRound = false;
  std::istringstream lines(all);
  for (std::string l; std::getline(lines, l);) {
    const auto at = l.find("round ");
    if (at != std::string::npos && l.find(": 2 node(s)") != std::string::npos &&
        l.compare(at, 8, "round 0:") != 0) {
      twoNodeRound = true;
    }
  }
  EXPECT_TRUE(twoNodeRound) << all;
  const std::string marker = "resumed from " + ckpt + " at step ";
  const auto resumed = all.find(marker);
  ASSERT_NE(resumed, std::string::npos) << all;
  const long long step = std::stoll(all.substr(resumed + marker.size()));
  EXPECT_GT(step, 0);
  EXPECT_LT(step, kSteps);
  EXPECT_EQ(step % 10, 0);
  EXPECT_EQ(all.find("leaves the job"), std::string::npos) << all;
  // The loss log reaches the last step.
  std::istringstream csv(readFile(d + "/loss.csv"));
  std::string line, last;
  while (std::getline(csv, line)) last = line;
  EXPECT_EQ(last.substr(0, last.find(',')), std::to_string(kSteps)) << last;
}
#endif

}  // namespace
