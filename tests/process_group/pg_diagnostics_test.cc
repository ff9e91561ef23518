// Diagnostics with ranks as forked processes (4 ranks, tcp backend over a FileStore): a rank
// that skips one all-reduce and a rank that calls broadcast where the others call all-reduce
// make every rank fail within the timeout + 5 s with one explanation naming the culprit, the
// sequence number and what it does instead (or both signatures); SIGUSR1 writes a dump while
// the job goes on.
//
// Children never use gtest assertions: they throw, and the child exits 1 with the message.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "loom/common/error.h"
#include "loom/process_group/diagnostics.h"
#include "loom/process_group/factory.h"
#include "loom/process_group/trace.h"
#include "loom/store/barrier.h"
#include "loom/store/file_store.h"
#include "loom/store/hash_store.h"
#include "loom/store/tcp_store.h"
#include "loom/testing/ranks.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using testing::ChildProcesses;
using testing::TempDir;

constexpr int kWorld = 4;
constexpr milliseconds kTimeout(3000);
constexpr milliseconds kChildDeadline(60000);

void require(bool cond, const std::string& what) {
  if (!cond) throw std::runtime_error(what);
}

struct Rank {
  std::shared_ptr<FileStore> store;
  std::shared_ptr<ProcessGroup> pg;
};

// The ranks' shared FileStore at `path`, its calls bounded at 30 s.
std::shared_ptr<FileStore> fileStore(const std::string& path) {
  FileStoreOptions storeOptions;
  storeOptions.timeout = milliseconds(30000);
  return std::make_shared<FileStore>(path, storeOptions);
}

Rank join(const std::string& path, int rank, const std::string& dumpDir = "") {
  Rank r;
  r.store = fileStore(path);
  ProcessGroupOptions options;
  options.timeout = kTimeout;
  options.dumpDir = dumpDir;
  // TCP between the ranks, so that a closed connection is seen at once.
  options.comm.context.sharedMemory = false;
  r.pg = createProcessGroup("tcp", r.store, rank, kWorld, options);
  return r;
}

// Runs `op` expecting an E (IoError unless said) within `bound`; returns its message (printed
// for the log).
template <class E = IoError, class F>
std::string failure(int rank, F&& op, milliseconds bound) {
  const auto start = Clock::now();
  try {
    op();
  } catch (const E& e) {
    const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    std::fprintf(stderr, "[rank %d] after %lld ms: %s\n", rank,
                 static_cast<long long>(waited.count()), e.what());
    require(waited <= bound, "rank " + std::to_string(rank) + " failed after " +
                                 std::to_string(waited.count()) + " ms, more than " +
                                 std::to_string(bound.count()));
    return e.what();
  }
  throw std::runtime_error("rank " + std::to_string(rank) + ": the collective succeeded");
}

void requireIn(const std::string& text, const std::string& part) {
  require(text.find(part) != std::string::npos, "expected '" + part + "' in: " + text);
}

// Every rank joins, runs allreduce #1-#4 on 1000 floats, waits until every rank finished #4
// (a store barrier: a rank that aborts at #5 fails every peer's transport at once, so a peer
// still reading its last #4 message would fail in #4, not in the scenario under test), then
// `fifth(rank, r, buf)` (which makes collective #5 fail); returns what the children reported
// ("" when all exited 0).
template <class F>
std::string afterFourAllreduces(F&& fifth) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    Rank r = join(path, rank);
    std::vector<float> buf(1000, 1.0f);
    for (int i = 0; i < 4; ++i) r.pg->allreduce(view(buf.data(), buf.size()))->wait();
    storeBarrier(*r.store, "four-allreduces-done", rank, kWorld, milliseconds(20000));
    fifth(rank, r, view(buf.data(), buf.size()));
  });
  return children.waitAllOk(kChildDeadline);
}

TEST(DiagnosticsProcesses, RankThatSkipsAnAllreduceIsNamedOnEveryRank) {
  EXPECT_EQ(afterFourAllreduces([](int rank, Rank& r, BufferView buf) {
              if (rank == 2) {
                // Rank 2 skips allreduce #5 and does something else until the others explained
                // it.
                r.store->wait({"flight/analysis"}, milliseconds(20000));
              }
              const std::string what = failure(
                  rank, [&] { r.pg->allreduce(buf)->wait(); }, kTimeout + milliseconds(5000));
              requireIn(what,
                        "diagnosis: rank 2 never entered collective #5: it is idle since "
                        "allreduce#4 completed");
              requireIn(what, "ranks 0, 1, 3");
              requireIn(what, "allreduce#5 (3.9 KiB float)");
            }),
            "");
}

// Every rank fails with an InvalidArgumentError: the ranks called different collectives.
TEST(DiagnosticsProcesses, MismatchedCollectivePrintsBothSignatures) {
  EXPECT_EQ(afterFourAllreduces([](int rank, Rank& r, BufferView buf) {
              const std::string what = failure<InvalidArgumentError>(
                  rank,
                  [&] {
                    if (rank == 1) {
                      r.pg->broadcast(buf)->wait();
                    } else {
                      r.pg->allreduce(buf)->wait();
                    }
                  },
                  kTimeout + milliseconds(2000));
              requireIn(what,
                        "diagnosis: mismatched collective #5 (different signatures): ranks 0, 2");
              // Rank 3 may still be finishing allreduce #4 when rank 1 aborts (then it never
              // issues #5).
              requireIn(what,
                        "called allreduce(dtype=float, count=1000, op=sum)#5; rank 1 called "
                        "broadcast(dtype=float, count=1000, root=0)#5");
            }),
            "");
}

// The classic cross-group deadlock: ranks 0 and 1 share groups "A" and "B" (newGroup of the
// same two ranks); rank 0 calls all_reduce on A, then on B, rank 1 on B, then on A. A's timeout
// (2 s) fails rank 0's all-reduce, and the diagnosis, from rank 1's answer, says where rank 1
// is (in B's all-reduce, which rank 0 has not entered) and that the groups were called in
// different orders. B's timeout is long: rank 0 enters B's all-reduce once it has A's error
// (whatever it says), which ends rank 1's wait there, so the test is bounded by A's timeout.
TEST(DiagnosticsProcesses, CrossGroupOrderDeadlockNamesBothGroupsAndTheOrder) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(2, [&](int rank) {
    auto store = fileStore(path);
    ProcessGroupOptions options;
    options.timeout = milliseconds(30000);
    options.comm.context.sharedMemory = false;
    auto world = createProcessGroup("tcp", store, rank, 2, options);
    ProcessGroupOptions optionsA = options;
    optionsA.groupName = "A";
    optionsA.timeout = milliseconds(2000);
    ProcessGroupOptions optionsB = options;
    optionsB.groupName = "B";
    auto groupA = newGroup(*world, {0, 1}, optionsA);
    auto groupB = newGroup(*world, {0, 1}, optionsB);
    std::vector<float> buf(1000, 1.0f);
    const BufferView v = view(buf.data(), buf.size());
    storeBarrier(*store, "groups-made", rank, 2, milliseconds(20000));
    if (rank == 1) {
      groupB->allreduce(v)->wait();
      return;  // never calls A's: rank 0 failed there
    }
    const std::string what = failure(
        0, [&] { groupA->allreduce(v)->wait(); }, optionsA.timeout + milliseconds(5000));
    groupB->allreduce(v)->wait();
    requireIn(what,
              "diagnosis: rank 1 never entered allreduce#1 of group \"A\" (parent ranks 0,1): it ");
    // Blocked there (running), or failed there when the machine was slow enough for B's 30 s.
    requireIn(what, "in allreduce#1 of group \"B\" (parent ranks 0,1; ");
    requireIn(what,
              "which rank 0 has not entered: the ranks issue collectives on group \"A\" and group "
              "\"B\" in different orders (a cross-group deadlock); every rank must call "
              "collectives on groups that share ranks in the same order");
    require(buf[0] == 2.0f, "B's all-reduce after A's failure");
  });
  EXPECT_EQ(children.waitAllOk(kChildDeadline), "");
}

// Rank 3 gets `sig` (SIGSTOP or SIGKILL, sent to itself) after allreduce #4; ranks 0-2 run #5
// and must fail within the timeout + 5 s with `expected` in their error. Returns what went
// wrong ("" when nothing did).
std::string rankThreeGets(int sig, const std::vector<std::string>& expected) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    Rank r = join(path, rank);
    std::vector<float> buf(1000, 1.0f);
    for (int i = 0; i < 4; ++i) r.pg->allreduce(view(buf.data(), buf.size()))->wait();
    storeBarrier(*r.store, "four-allreduces-done", rank, kWorld, milliseconds(20000));
    if (rank == 3) {
      ::raise(sig);
      throw std::runtime_error("rank 3 went on after signal " + std::to_string(sig));
    }
    const std::string what = failure(
        rank, [&] { r.pg->allreduce(view(buf.data(), buf.size()))->wait(); },
        kTimeout + milliseconds(5000));
    for (const std::string& part : expected) requireIn(what, part);
  });
  std::string problems;
  for (int i = 0; i < 3; ++i) {
    const testing::ChildExit e = children.wait(i, kChildDeadline);
    if (!e.ok()) problems += "rank " + std::to_string(i) + ": " + e.describe() + "\n";
  }
  // A stopped rank 3 is still there: it ends here.
  children.kill(3, SIGKILL);
  const testing::ChildExit three = children.wait(3, kChildDeadline);
  if (three.exited || three.signal != SIGKILL) problems += "rank 3: " + three.describe() + "\n";
  return problems;
}

// Done-when 3 of issue 17: a stopped rank is alive but not progressing, a killed one is dead.
TEST(DiagnosticsProcesses, StoppedRankIsNamedAliveButNotProgressing) {
  EXPECT_EQ(rankThreeGets(SIGSTOP, {"rank 3 sent no flight record: alive but not progressing: its "
                                    "process",
                                    "is stopped (SIGSTOP", "last heartbeat #"}),
            "");
}

TEST(DiagnosticsProcesses, KilledRankIsNamedDead) {
  EXPECT_EQ(rankThreeGets(SIGKILL, {"rank 3 sent no flight record: dead: its process"}), "");
}

// Done-when 4 of issue 17: rank 0 hosts the TCPStore and is killed; the survivors fail within
// seconds (not the timeout: their connections to rank 0 close) saying that the store host died,
// and the analysis, which needs the store, does not hold them.
TEST(DiagnosticsProcesses, KilledStoreHostIsNamed) {
  TempDir dir;
  const std::string bootPath = dir.file("boot");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    FileStoreOptions bootOptions;
    bootOptions.timeout = milliseconds(30000);
    FileStore boot(bootPath, bootOptions);  // only to learn the TCPStore's port
    TCPStoreOptions storeOptions;
    storeOptions.timeout = milliseconds(30000);
    storeOptions.rank = rank;
    std::shared_ptr<TCPStore> store;
    if (rank == 0) {
      storeOptions.isServer = true;
      storeOptions.numWorkers = kWorld;
      storeOptions.waitForWorkers = false;
      store = std::make_shared<TCPStore>("127.0.0.1", 0, storeOptions);
      boot.set("port", std::to_string(store->port()));
    } else {
      store =
          std::make_shared<TCPStore>("127.0.0.1", std::stoi(boot.getString("port")), storeOptions);
    }
    ProcessGroupOptions options;
    options.timeout = kTimeout;
    options.comm.context.sharedMemory = false;
    options.storeHostRank = 0;
    auto pg = createProcessGroup("tcp", store, rank, kWorld, options);
    std::vector<float> buf(1000, 1.0f);
    for (int i = 0; i < 4; ++i) pg->allreduce(view(buf.data(), buf.size()))->wait();
    if (rank == 0) {
      // Dies once every survivor is past its last store call before #5.
      std::vector<std::string> armed;
      for (int r = 1; r < kWorld; ++r) armed.push_back("armed/" + std::to_string(r));
      store->wait(armed, milliseconds(20000));
      ::raise(SIGKILL);
    }
    store->set("armed/" + std::to_string(rank), "1");
    const std::string what = failure(
        rank, [&] { pg->allreduce(view(buf.data(), buf.size()))->wait(); },
        kTimeout + milliseconds(2000));
    requireIn(what, "diagnosis: the store host died: rank 0, which hosts the store, is gone");
    requireIn(what, "TCPStore");
  });
  std::string problems;
  const testing::ChildExit zero = children.wait(0, kChildDeadline);
  if (zero.exited || zero.signal != SIGKILL) problems += "rank 0: " + zero.describe() + "\n";
  for (int i = 1; i < kWorld; ++i) {
    const testing::ChildExit e = children.wait(i, kChildDeadline);
    if (!e.ok()) problems += "rank " + std::to_string(i) + ": " + e.describe() + "\n";
  }
  EXPECT_EQ(problems, "");
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(DiagnosticsProcesses, Sigusr1WritesADumpWhileTheJobGoesOn) {
  TempDir dir;
  const std::string path = dir.file("store");
  const std::string dumps = dir.file("dumps");
  ASSERT_EQ(::mkdir(dumps.c_str(), 0700), 0);
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    Rank r = join(path, rank, dumps);
    std::vector<float> buf(16, 1.0f);
    for (int i = 0; i < 3; ++i) r.pg->allreduce(view(buf.data(), buf.size()))->wait();
    const std::string file = dumps + "/loom-flight-default-rank2.json";
    if (rank == 0) {
      // Rank 0 signals rank 2, as an operator would.
      const pid_t victim = std::stoi(r.store->getString("pid/2"));
      require(::kill(victim, SIGUSR1) == 0, "kill(SIGUSR1)");
    }
    if (rank == 2) {
      r.store->set("pid/2", std::to_string(::getpid()));
      const auto until = Clock::now() + milliseconds(10000);
      while (readFile(file).empty()) {
        require(Clock::now() < until, "no dump in " + file + " 10 s after SIGUSR1");
        std::this_thread::sleep_for(milliseconds(5));  // poll interval of a deadline loop
      }
      const diag::RankDump d = diag::parseDump(readFile(file), file);
      require(d.reason == "SIGUSR1" && d.rank == 2 && d.size == kWorld, "dump header");
      require(d.entries.size() == 3 && d.lastSeq == 3, "three entries");
      for (const auto& e : d.entries) {
        require(e.state == diag::OpState::kDone && e.type == OpType::kAllreduce,
                "entry " + e.describe() + " is a done allreduce");
      }
      // Published in the store too.
      require(diag::parseDump(r.store->getString("flight/2"), "store").rank == 2, "store dump");
    }
    // The job goes on.
    for (int i = 0; i < 3; ++i) r.pg->allreduce(view(buf.data(), buf.size()))->wait();
    require(buf[0] == 4096.0f, "all-reduce results after the dump");
    r.pg->barrier()->wait();
  });
  EXPECT_EQ(children.waitAllOk(kChildDeadline), "");
}

// LOOM_TRACE (traceDir): each of 2 ranks writes its trace (collectives with seq and bytes, a
// user span through trace.h as DDP would add), loom-trace merge joins them, and the merged file
// follows the Chrome trace-event format (checked here field by field).
TEST(DiagnosticsProcesses, TraceOfTwoRanksMergesIntoOneValidFile) {
  TempDir dir;
  const std::string path = dir.file("store");
  const std::string traces = dir.file("traces");
  ASSERT_EQ(::mkdir(traces.c_str(), 0700), 0);
  ChildProcesses children;
  children.spawnRanks(2, [&](int rank) {
    auto store = fileStore(path);
    ProcessGroupOptions options;
    options.timeout = kTimeout;
    options.traceDir = traces;
    auto pg = createProcessGroup("tcp", store, rank, 2, options);
    require(trace::enabled(), "the trace is open");
    std::vector<float> buf(256, 1.0f);
    {
      trace::Span step("backward", "ddp", "\"step\": 1");
      for (int i = 0; i < 3; ++i) pg->allreduce(view(buf.data(), buf.size()))->wait();
    }
    pg->broadcast(view(buf.data(), 16), {.root = 1})->wait();
    pg.reset();  // writes the file
    require(!trace::enabled(), "the trace is closed with the group that opened it");
  });
  ASSERT_EQ(children.waitAllOk(kChildDeadline), "");

  const std::string merged = dir.file("merged.json");
  const std::string command =
      std::string(LOOM_TRACE_PATH) + " merge -o " + merged + " " + traces + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0;) out.append(chunk, n);
  const int status = ::pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;

  // A merge that reads nothing (a mistyped path) fails and leaves the earlier output whole; it
  // wrote an empty trace over it.
  const std::string before = readFile(merged);
  const std::string typo =
      std::string(LOOM_TRACE_PATH) + " merge -o " + merged + " " + traces + "-typo 2>&1";
  FILE* typoPipe = ::popen(typo.c_str(), "r");
  ASSERT_NE(typoPipe, nullptr);
  std::string typoOut;
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, typoPipe)) > 0;) typoOut.append(chunk, n);
  const int typoStatus = ::pclose(typoPipe);
  EXPECT_TRUE(WIFEXITED(typoStatus) && WEXITSTATUS(typoStatus) == 1) << typoOut;
  EXPECT_NE(typoOut.find("is not written"), std::string::npos) << typoOut;
  EXPECT_EQ(readFile(merged), before);

  const nlohmann::json doc = nlohmann::json::parse(readFile(merged));
  ASSERT_TRUE(doc.is_object() && doc["traceEvents"].is_array());
  std::set<int> processNames;
  std::map<int, std::vector<std::string>> collectives;  // pid -> names in order
  std::map<int, int> spans;
  for (const auto& e : doc["traceEvents"]) {
    ASSERT_TRUE(e["name"].is_string()) << e;
    ASSERT_TRUE(e["ph"].is_string()) << e;
    ASSERT_TRUE(e["pid"].is_number_integer() && e["tid"].is_number_integer()) << e;
    const std::string ph = e["ph"];
    const int pid = e["pid"];
    if (ph == "M") {
      ASSERT_TRUE(e["args"]["name"].is_string() || e["args"]["sort_index"].is_number()) << e;
      if (e["name"] == "process_name") processNames.insert(pid);
      continue;
    }
    ASSERT_EQ(ph, "X") << e;
    ASSERT_TRUE(e["ts"].is_number_integer() && e["dur"].is_number_integer()) << e;
    ASSERT_GE(e["dur"].get<int64_t>(), 0) << e;
    if (e["cat"] == "collective") {
      collectives[pid].push_back(e["name"]);
      ASSERT_TRUE(e["args"]["seq"].is_number_integer() && e["args"]["bytes"].is_number_integer())
          << e;
      if (e["name"] == "allreduce#1") {
        EXPECT_EQ(e["args"]["bytes"], 1024) << e;
      }
    } else if (e["cat"] == "ddp") {
      ++spans[pid];
      EXPECT_EQ(e["name"], "backward");
      EXPECT_EQ(e["args"]["step"], 1);
    }
  }
  EXPECT_EQ(processNames, (std::set<int>{0, 1}));
  const std::vector<std::string> expected = {"allreduce#1", "allreduce#2", "allreduce#3",
                                             "broadcast#4"};
  EXPECT_EQ(collectives[0], expected);
  EXPECT_EQ(collectives[1], expected);
  EXPECT_EQ(spans[0], 1);
  EXPECT_EQ(spans[1], 1);
}

// A trace survives its process: of 3 ranks that trace 3 all-reduces, rank 0 is SIGKILLed once
// the flusher (every second) has written them, rank 1 calls abort() and rank 2 segfaults (both
// with the events still in the buffer: the fatal-signal handler writes them). loom-trace merge
// reads the three unterminated files (exit 0) and finds every rank's all-reduces.
TEST(DiagnosticsProcesses, TraceOfRanksThatCrashOrAreKilledStillMerges) {
  TempDir dir;
  const std::string path = dir.file("store");
  const std::string traces = dir.file("traces");
  ASSERT_EQ(::mkdir(traces.c_str(), 0700), 0);
  ChildProcesses children;
  children.spawnRanks(3, [&](int rank) {
    auto store = fileStore(path);
    ProcessGroupOptions options;
    options.timeout = kTimeout;
    options.traceDir = traces;
    auto pg = createProcessGroup("tcp", store, rank, 3, options);
    std::vector<float> buf(256, 1.0f);
    for (int i = 0; i < 3; ++i) pg->allreduce(view(buf.data(), buf.size()))->wait();
    // No rank dies while a peer may still read from it.
    storeBarrier(*store, "traced", rank, 3, milliseconds(20000));
    if (rank == 0) {
      const std::string file = traces + "/loom-trace-rank0.json";
      const auto deadline = Clock::now() + milliseconds(10000);
      while (readFile(file).find("allreduce#3") == std::string::npos) {
        require(Clock::now() < deadline, "the flusher wrote nothing within 10 s");
        std::this_thread::sleep_for(milliseconds(20));
      }
      ::kill(::getpid(), SIGKILL);
    }
    if (rank == 1) std::abort();
    ::raise(SIGSEGV);
  });
  const std::vector<testing::ChildExit> exits = children.waitAll(kChildDeadline);
  ASSERT_EQ(exits.size(), 3u);
  EXPECT_EQ(exits[0].signal, SIGKILL) << exits[0].describe();
  EXPECT_EQ(exits[1].signal, SIGABRT) << exits[1].describe();
  EXPECT_EQ(exits[2].signal, SIGSEGV) << exits[2].describe();

  const std::string merged = dir.file("merged.json");
  const std::string command =
      std::string(LOOM_TRACE_PATH) + " merge -o " + merged + " " + traces + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0;) out.append(chunk, n);
  const int status = ::pclose(pipe);
  std::fprintf(stderr, "%s", out.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("unterminated"), std::string::npos) << out;
  const nlohmann::json doc = nlohmann::json::parse(readFile(merged));
  std::map<int, std::vector<std::string>> collectives;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "collective") collectives[e["pid"]].push_back(e["name"]);
  }
  const std::vector<std::string> expected = {"allreduce#1", "allreduce#2", "allreduce#3"};
  for (int r = 0; r < 3; ++r) EXPECT_EQ(collectives[r], expected) << "rank " << r;
}

// One trace per process, whatever its groups do: the group that opened it goes first (the
// broken group after a shrink) and the other group's operations still reach the file, which
// ends once, with nothing dropped; a restarted worker (LOOM_RESTART_COUNT 1) writes its own
// file instead of truncating the failed attempt's; a rank a launcher stops with SIGTERM writes
// what it had not flushed yet.
TEST(DiagnosticsProcesses, TraceOutlivesItsFirstGroupKeepsRestartsAndFlushesOnSigterm) {
  TempDir dir;
  const std::string traces = dir.file("traces");
  ASSERT_EQ(::mkdir(traces.c_str(), 0700), 0);
  auto traced = [&](const std::string& name) {
    ProcessGroupOptions options;
    options.timeout = kTimeout;
    options.traceDir = traces;
    options.groupName = name;
    return createProcessGroup("tcp", std::make_shared<HashStore>(), 0, 1, options);
  };
  auto allreduces = [](ProcessGroup& pg, int n) {
    std::vector<float> buf(64, 1.0f);
    for (int i = 0; i < n; ++i) pg.allreduce(view(buf.data(), buf.size()))->wait();
  };
  ChildProcesses first;
  first.spawn([&] {
    auto a = traced("first");
    auto b = traced("second");
    allreduces(*a, 1);
    a.reset();  // the group that opened the trace goes first
    allreduces(*b, 2);
  });
  ASSERT_EQ(first.waitAllOk(kChildDeadline), "");
  const std::string attempt0 = readFile(traces + "/loom-trace-rank0.json");
  EXPECT_NE(attempt0.find("\"collectives second\""), std::string::npos) << attempt0;
  // Parses: one whole array, ended once.
  size_t secondOps = 0;
  for (const auto& e : nlohmann::json::parse(attempt0)) {
    if (e["name"] == "trace_end") {
      EXPECT_EQ(e["args"]["dropped"], 0) << attempt0;
    }
    if (e["ph"] == "X" && e["cat"] == "collective" && e["name"] != "allreduce#1") ++secondOps;
  }
  EXPECT_EQ(secondOps, 1u) << "the second group's allreduce#2 is missing\n" << attempt0;

  ChildProcesses restarted;
  restarted.spawn([&] {
    ::setenv("LOOM_RESTART_COUNT", "1", 1);
    auto pg = traced("first");
    allreduces(*pg, 3);
    ::raise(SIGTERM);  // within the flusher's second, the group open: only the handler writes
  });
  const std::vector<testing::ChildExit> exits = restarted.waitAll(kChildDeadline);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal, SIGTERM) << exits[0].describe();
  EXPECT_EQ(readFile(traces + "/loom-trace-rank0.json"), attempt0) << "attempt 0's trace changed";
  const std::string attempt1 = readFile(traces + "/loom-trace-rank0-restart1.json");
  EXPECT_NE(attempt1.find("allreduce#3"), std::string::npos) << attempt1;
  EXPECT_EQ(attempt1.find("trace_end"), std::string::npos)
      << "the group was not open: " << attempt1;
}

// loom-doctor --attach asks a live job's ranks for their records through the store.
TEST(DiagnosticsProcesses, DoctorAttachesToALiveJob) {
  TempDir dir;
  const std::string path = dir.file("store");
  ChildProcesses children;
  children.spawnRanks(kWorld, [&](int rank) {
    Rank r = join(path, rank);
    std::vector<float> buf(16, 1.0f);
    for (int i = 0; i < 3; ++i) r.pg->allreduce(view(buf.data(), buf.size()))->wait();
    r.store->set("ready/" + std::to_string(rank), "1");
    r.store->wait({"done"}, milliseconds(30000));
  });
  FileStoreOptions storeOptions;
  storeOptions.timeout = milliseconds(30000);
  FileStore store(path, storeOptions);
  std::vector<std::string> ready;
  for (int r = 0; r < kWorld; ++r) ready.push_back("ready/" + std::to_string(r));
  store.wait(ready, milliseconds(30000));

  const std::string command = std::string(LOOM_DOCTOR_PATH) + " --attach file://" + path +
                              " --world-size 4 --prefix '' --wait-ms 10000 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0;) out.append(chunk, n);
  const int status = ::pclose(pipe);
  std::fprintf(stderr, "%s", out.c_str());
  store.set("done", "1");
  EXPECT_EQ(children.waitAllOk(kChildDeadline), "");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("every rank with a flight record completed every collective it issued (up "
                     "to #3)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("rank 2 is idle since allreduce#3 completed"), std::string::npos) << out;
  EXPECT_EQ(out.find("no answer"), std::string::npos) << out;
}

}  // namespace
}  // namespace loom
