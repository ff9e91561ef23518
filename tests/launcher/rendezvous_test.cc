// The multi-node rendezvous over a HashStore, nodes as threads (the store is the only thing
// they share, as the loom-run processes of real nodes share a TCPStore).
#include "rendezvous.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "elastic_rendezvous.h"
#include "launch_options.h"
#include "loom/common/error.h"
#include "loom/store/hash_store.h"
#include "loom/testing/ranks.h"

namespace loom::run {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

RendezvousOptions nodeOptions(int nnodes, int node, int nproc) {
  RendezvousOptions o;
  o.runId = "job";
  o.nnodes = nnodes;
  o.nodeRank = node;
  o.nprocPerNode = nproc;
  o.hostname = "host" + std::to_string(node);
  o.endpoint = "test-store:1";
  o.rdzvTimeout = 5000ms;
  o.nodeTimeout = 5000ms;
  return o;
}

TEST(Rendezvous, NodesAgreeOnTheWorld) {
  HashStore store;
  const std::vector<int> nprocs = {2, 3, 1};
  std::vector<World> worlds(3);
  loom::testing::runThreadRanks(3, [&](int node) {
    Rendezvous r(store, nodeOptions(3, node, nprocs[node]));
    worlds[node] = r.join(0, [] { return 4242; });
  });
  const std::vector<int> offsets = {0, 2, 5};
  for (int node = 0; node < 3; ++node) {
    EXPECT_EQ(worlds[node].worldSize, 6);
    EXPECT_EQ(worlds[node].rankOffset, offsets[node]);
    EXPECT_EQ(worlds[node].workerPort, 4242);
    EXPECT_EQ(worlds[node].nprocs, nprocs);
    EXPECT_EQ(worlds[node].hosts, (std::vector<std::string>{"host0", "host1", "host2"}));
  }
}

TEST(Rendezvous, MissingNodeIsNamed) {
  HashStore store;
  std::vector<std::string> errors(2);
  loom::testing::runThreadRanks(2, [&](int node) {
    auto o = nodeOptions(3, node, 1);
    o.rdzvTimeout = 300ms;
    Rendezvous r(store, o);
    try {
      r.join(0, [] { return 1; });
    } catch (const TimeoutError& e) {
      errors[node] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_THAT(e, HasSubstr("node(s) 2 of 3 never arrived (arrived: 0, 1)"));
    EXPECT_THAT(e, HasSubstr("test-store:1"));
    EXPECT_THAT(e, HasSubstr("generation 0"));
  }
  // Node 0 itself missing: the others also wait for its worker port.
  HashStore store2;
  auto o = nodeOptions(2, 1, 1);
  o.rdzvTimeout = 200ms;
  Rendezvous r(store2, o);
  try {
    r.join(0, [] { return 1; });
    FAIL() << "join without node 0 returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("node(s) 0 of 2 never arrived (arrived: 1)"));
  }
}

TEST(Rendezvous, DisagreeingMaxRestartsIsAnError) {
  HashStore store;
  std::vector<std::string> errors(2);
  loom::testing::runThreadRanks(2, [&](int node) {
    auto o = nodeOptions(2, node, 1);
    o.maxRestarts = node;  // 0 and 1
    Rendezvous r(store, o);
    try {
      r.join(0, [] { return 1; });
    } catch (const InvalidArgumentError& e) {
      errors[node] = e.what();
    }
  });
  EXPECT_THAT(errors[0], HasSubstr("node 1 (host1) runs with --max-restarts 1 but node 0 with 0"));
  EXPECT_THAT(errors[1], HasSubstr("node 0 (host0) runs with --max-restarts 0 but node 1 with 1"));
}

TEST(Rendezvous, EndIsSeenByEveryNodeAndFirstReasonWins) {
  HashStore store;
  Rendezvous a(store, nodeOptions(2, 0, 1));
  Rendezvous b(store, nodeOptions(2, 1, 1));
  std::thread t([&] { b.join(0, [] { return 1; }); });
  a.join(0, [] { return 1; });
  t.join();
  EXPECT_EQ(a.poll(), std::nullopt);
  EXPECT_EQ(b.poll(), std::nullopt);
  EXPECT_EQ(b.markEnded("node 1: rank 1 exited with code 7"), "node 1: rank 1 exited with code 7");
  EXPECT_EQ(a.markEnded("node 0: later"), "node 1: rank 1 exited with code 7");
  EXPECT_EQ(a.poll(), "node 1: rank 1 exited with code 7");
  b.ackEnd();
  const auto others = a.waitForOthers(2000ms);
  EXPECT_TRUE(others.gaveUp.empty());
  EXPECT_EQ(others.ended, "node 1: rank 1 exited with code 7");

  // A restart is a fresh generation: nothing of generation 0's end leaks into it.
  std::thread t2([&] { b.join(1, [] { return 2; }); });
  const World w = a.join(1, [] { return 2; });
  t2.join();
  EXPECT_EQ(w.generation, 1);
  EXPECT_EQ(w.workerPort, 2);
  EXPECT_EQ(a.poll(), std::nullopt);
}

TEST(Rendezvous, SilentNodeEndsTheGeneration) {
  HashStore store;
  auto oa = nodeOptions(2, 0, 1);
  oa.nodeTimeout = 300ms;
  Rendezvous a(store, oa);
  Rendezvous b(store, nodeOptions(2, 1, 1));
  std::thread t([&] { b.join(0, [] { return 1; }); });
  a.join(0, [] { return 1; });
  t.join();
  b.poll();  // node 1 beats once, then goes quiet
  const auto start = Clock::now();
  std::optional<std::string> ended;
  while (!ended && Clock::now() - start < 5s) {
    ended = a.poll();
    std::this_thread::sleep_for(20ms);  // poll interval, bounded by the 5 s deadline
  }
  ASSERT_TRUE(ended.has_value());
  EXPECT_THAT(*ended, HasSubstr("node 1 sent no heartbeat for"));
  // ... and the other nodes learn it through the store.
  EXPECT_EQ(b.poll(), ended);
}

TEST(Rendezvous, DoneNodesAreNotTakenForDead) {
  HashStore store;
  auto oa = nodeOptions(2, 0, 1);
  oa.nodeTimeout = 200ms;
  Rendezvous a(store, oa);
  Rendezvous b(store, nodeOptions(2, 1, 1));
  std::thread t([&] { b.join(0, [] { return 1; }); });
  a.join(0, [] { return 1; });
  t.join();
  b.markDone();
  const auto start = Clock::now();
  while (Clock::now() - start < 500ms) {
    EXPECT_EQ(a.poll(), std::nullopt);
    std::this_thread::sleep_for(20ms);  // polls through a window longer than nodeTimeout
  }
  const auto others = a.waitForOthers(1000ms);
  EXPECT_TRUE(others.gaveUp.empty());
  EXPECT_EQ(others.ended, std::nullopt);
}

TEST(Rendezvous, WaitForOthersGivesUpOnSilentNodes) {
  HashStore store;
  auto oa = nodeOptions(3, 0, 1);
  oa.nodeTimeout = 200ms;
  Rendezvous a(store, oa);
  Rendezvous b(store, nodeOptions(3, 1, 1));
  Rendezvous c(store, nodeOptions(3, 2, 1));
  std::thread tb([&] { b.join(0, [] { return 1; }); });
  std::thread tc([&] { c.join(0, [] { return 1; }); });
  a.join(0, [] { return 1; });
  tb.join();
  tc.join();
  b.ackEnd();
  const auto start = Clock::now();
  EXPECT_EQ(a.waitForOthers(10000ms).gaveUp, std::vector<int>{2});
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(Rendezvous, InterruptStopsAWait) {
  HashStore store;
  // Node 1 never comes. The first check lets join() go on waiting; the next one, made while
  // it waits, says stop.
  int checks = 0;
  Rendezvous r(store, nodeOptions(2, 0, 1), [&] { return ++checks > 1; });
  EXPECT_THROW(r.join(0, [] { return 1; }), RendezvousInterrupted);
  EXPECT_EQ(checks, 2);
}

ParseOutcome parse(std::vector<std::string> args) {
  args.insert(args.begin(), "loom-run");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parseLaunchOptions(static_cast<int>(argv.size()), argv.data());
}

TEST(LaunchOptions, ParsesEveryFlag) {
  const auto p = parse({"--nproc-per-node",
                        "4",
                        "--nnodes",
                        "3",
                        "--node-rank",
                        "2",
                        "--master-addr",
                        "10.0.0.1",
                        "--master-port",
                        "29500",
                        "--max-restarts",
                        "2",
                        "--redirect-prefix",
                        "--grace-period-s",
                        "1.5",
                        "--rdzv-timeout-s",
                        "20",
                        "--node-timeout-s",
                        "7",
                        "--run-id",
                        "exp1",
                        "prog",
                        "--flag",
                        "x"});
  ASSERT_EQ(p.kind, ParseOutcome::kRun) << p.text;
  const auto& o = p.options;
  EXPECT_EQ(o.nprocPerNode, 4);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.nodeRank, 2);
  EXPECT_EQ(o.masterAddr, "10.0.0.1");
  EXPECT_EQ(o.masterPort, 29500);
  EXPECT_EQ(o.maxRestarts, 2);
  EXPECT_TRUE(o.redirectPrefix);
  EXPECT_EQ(o.gracePeriod, 1500ms);
  EXPECT_EQ(o.rdzvTimeout, 20000ms);
  EXPECT_EQ(o.nodeTimeout, 7000ms);
  EXPECT_EQ(o.runId, "exp1");
  // Flags after PROGRAM belong to PROGRAM.
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--flag", "x"}));
}

TEST(LaunchOptions, DoubleDashSeparatesTheProgram) {
  const auto p = parse({"--nproc-per-node", "1", "--", "-weird", "--nnodes", "5"});
  ASSERT_EQ(p.kind, ParseOutcome::kRun) << p.text;
  EXPECT_EQ(p.options.nnodes, 1);
  EXPECT_EQ(p.options.command, (std::vector<std::string>{"-weird", "--nnodes", "5"}));
}

TEST(LaunchOptions, ErrorsNameTheProblem) {
  EXPECT_THAT(parse({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "5", "--master-addr",
                     "a", "--master-port", "1", "p"})
                  .text,
              HasSubstr("--node-rank 5 is out of range"));
  EXPECT_THAT(parse({"--nproc-per-node", "2", "--nnodes", "2", "--master-port", "1", "p"}).text,
              HasSubstr("needs --master-addr"));
  EXPECT_THAT(parse({"--nproc-per-node", "2", "--run-id", "a/b", "p"}).text,
              HasSubstr("--run-id 'a/b'"));
  EXPECT_THAT(parse({"--nproc-per-node", "2", "--frob", "p"}).text,
              HasSubstr("unknown option '--frob'"));
  EXPECT_EQ(parse({"--help"}).kind, ParseOutcome::kHelp);
  EXPECT_THAT(parse({"--nproc-per-node", "1", "--nnodes", "2:3", "p"}).text,
              HasSubstr("needs --rdzv-endpoint"));
  EXPECT_THAT(parse({"--nproc-per-node", "1", "--nnodes", "3:2", "p"}).text,
              HasSubstr("--nnodes '3:2' is not valid"));
  EXPECT_THAT(parse({"--nproc-per-node", "1", "--nnodes", "0", "p"}).text,
              HasSubstr("--nnodes '0' is not valid"));
  // A value that is not a number is named as such, not as out of range (CLI::Range's wording).
  EXPECT_THAT(parse({"--nproc-per-node", "x", "p"}).text,
              HasSubstr("'x' is not a whole number; expected 1 to 4096"));
  EXPECT_THAT(parse({"--nproc-per-node", "2.5", "p"}).text, HasSubstr("not a whole number"));
  EXPECT_THAT(parse({"--nproc-per-node", "0", "p"}).text,
              HasSubstr("'0' is out of range; expected 1 to 4096"));
  EXPECT_THAT(parse({"--nproc-per-node", "1", "--grace-period-s", "abc", "p"}).text,
              HasSubstr("'abc' is not a number; expected 0 to 3600"));
  EXPECT_EQ(parse({"--nproc-per-node", "1", "--grace-period-s", "0.25", "p"}).kind,
            ParseOutcome::kRun);
  EXPECT_THAT(parse({"--nproc-per-node", "1", "--nnodes", "1:2", "--node-rank", "0",
                     "--rdzv-endpoint", "h:1", "p"})
                  .text,
              HasSubstr("--node-rank has no meaning"));
}

TEST(LaunchOptions, FlagsThatDoNothingInThisKindOfRunAreNamed) {
  const auto single = parse({"--nproc-per-node", "2", "--rdzv-endpoint", "localhost:29400",
                             "--rdzv-timeout-s", "30", "p"});
  ASSERT_EQ(single.kind, ParseOutcome::kRun) << single.text;
  EXPECT_THAT(single.unused,
              ElementsAre(HasSubstr("--rdzv-endpoint has no effect with --nnodes 1"),
                          HasSubstr("--rdzv-timeout-s has no effect with --nnodes 1")));
  const auto node0 =
      parse({"--nproc-per-node", "2", "--nnodes", "2", "--master-addr", "a", "--master-port", "1",
             "--rdzv-endpoint", "h:2", "--rdzv-last-call-s", "1", "p"});
  ASSERT_EQ(node0.kind, ParseOutcome::kRun) << node0.text;
  EXPECT_THAT(node0.unused, ElementsAre(HasSubstr("--rdzv-last-call-s has no effect"),
                                        HasSubstr("--rdzv-endpoint has no effect on node 0")));
  // Where they are used, nothing is said.
  EXPECT_THAT(
      parse({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "a",
             "--master-port", "1", "--rdzv-endpoint", "h:2", "--rdzv-timeout-s", "5", "p"})
          .unused,
      IsEmpty());
  EXPECT_THAT(parse({"--nproc-per-node", "2", "--nnodes", "1:2", "--rdzv-endpoint", "h:2",
                     "--rdzv-last-call-s", "1", "p"})
                  .unused,
              IsEmpty());
  EXPECT_THAT(parse({"--nproc-per-node", "2", "p"}).unused, IsEmpty());
}

TEST(LaunchOptions, ElasticNodes) {
  const auto p = parse({"--nproc-per-node", "2", "--nnodes", "2:4", "--rdzv-endpoint",
                        "store:29400", "--rdzv-last-call-s", "0.5", "prog"});
  ASSERT_EQ(p.kind, ParseOutcome::kRun) << p.text;
  EXPECT_TRUE(p.options.elastic);
  EXPECT_EQ(p.options.minNodes, 2);
  EXPECT_EQ(p.options.maxNodes, 4);
  EXPECT_EQ(p.options.lastCall, 500ms);
  EXPECT_EQ(p.options.rdzvHost, "store");
  EXPECT_EQ(p.options.rdzvPort, 29400);
  EXPECT_FALSE(parse({"--nproc-per-node", "1", "--nnodes", "3", "--master-addr", "a",
                      "--master-port", "1", "p"})
                   .options.elastic);
}

ElasticOptions elasticOptions(int agent, int minNodes, int maxNodes) {
  ElasticOptions o;
  o.runId = "job";
  o.minNodes = minNodes;
  o.maxNodes = maxNodes;
  o.nprocPerNode = agent + 1;
  o.hostname = "host" + std::to_string(agent);
  o.address = "10.0.0." + std::to_string(agent);
  o.endpoint = "test-store:1";
  o.rdzvTimeout = 10000ms;
  o.lastCall = 100ms;
  return o;
}

TEST(ElasticRendezvous, MaxAgentsCloseTheRoundAndAgreeOnTheWorld) {
  HashStore store;
  std::vector<ElasticWorld> worlds(3);
  loom::testing::runThreadRanks(3, [&](int agent) {
    ElasticOptions o = elasticOptions(agent, 2, 3);
    o.lastCall = 60000ms;  // only MAX arrivals can close the round in time
    ElasticRendezvous r(store, o);
    worlds[agent] = r.join(r.currentRound(), [] { return 4242; });
  });
  std::vector<int> nodeOf(3);
  for (int agent = 0; agent < 3; ++agent) {
    EXPECT_EQ(worlds[agent].generation, 0);
    EXPECT_EQ(worlds[agent].nnodes, 3);
    EXPECT_EQ(worlds[agent].worldSize, 1 + 2 + 3);
    EXPECT_EQ(worlds[agent].workerPort, 4242);
    nodeOf[worlds[agent].nodeRank] = agent;
  }
  // Node ranks are a permutation; offsets follow node order; everyone names node 0's address.
  int offset = 0;
  for (int node = 0; node < 3; ++node) {
    const ElasticWorld& w = worlds[nodeOf[node]];
    EXPECT_EQ(w.rankOffset, offset);
    offset += nodeOf[node] + 1;
    EXPECT_EQ(w.masterAddr, "10.0.0." + std::to_string(nodeOf[0]));
  }
}

TEST(ElasticRendezvous, ALateAgentIsTakenIntoTheNextRound) {
  HashStore store;
  std::vector<ElasticWorld> first(2), second(3);
  std::atomic<int> firstClosed{0};
  loom::testing::runThreadRanks(3, [&](int agent) {
    ElasticRendezvous r(store, elasticOptions(agent, 2, 3));
    if (agent == 2) {
      // Arrives once round 0 is closed with the other two.
      while (firstClosed.load() < 2) std::this_thread::sleep_for(1ms);
      EXPECT_FALSE(r.newcomers(0, 2).has_value());
      second[agent] = r.join(r.currentRound(), [] { return 2; });
      return;
    }
    first[agent] = r.join(r.currentRound(), [] { return 1; });
    ++firstClosed;
    // The running nodes see the newcomer, end the round and meet it in the next one, as
    // loom-run's agents do. On a loaded machine the newcomer can miss round 1 too (it closes
    // 100 ms after the last arrival with MIN nodes): then it is still waiting, and the running
    // nodes end that round as well, until it is in.
    const Deadline deadline(10000ms);
    ElasticWorld world = first[agent];
    do {
      std::optional<std::string> why;
      while (!(why = r.newcomers(world.generation, world.nnodes)) && !deadline.expired()) {
        std::this_thread::sleep_for(1ms);
      }
      ASSERT_TRUE(why.has_value());
      EXPECT_THAT(*why, HasSubstr("waiting to join"));
      r.advance(world.generation);
      world = r.join(world.generation + 1, [] { return 2; });
    } while (world.nnodes < 3 && !deadline.expired());
    second[agent] = world;
  });
  for (int agent = 0; agent < 2; ++agent) EXPECT_EQ(first[agent].nnodes, 2);
  for (int agent = 0; agent < 3; ++agent) {
    EXPECT_GE(second[agent].generation, 1);
    EXPECT_EQ(second[agent].generation, second[0].generation);
    EXPECT_EQ(second[agent].nnodes, 3);
    EXPECT_EQ(second[agent].worldSize, 6);
  }
}

// An arrival that never published itself (its agent died right after arriving) cannot take
// part: the round it was admitted to is abandoned and the live agents meet in the next one.
TEST(ElasticRendezvous, ARoundWithADeadArrivalGivesWayToTheNext) {
  HashStore store;
  store.add("loom-run/job/g0/arrivals", 1);  // the dead arrival: node 0 of round 0
  std::vector<ElasticWorld> worlds(2);
  loom::testing::runThreadRanks(2, [&](int agent) {
    ElasticOptions o = elasticOptions(agent, 2, 3);
    o.rdzvTimeout = 60000ms;
    ElasticRendezvous r(store, o);
    worlds[agent] = r.join(r.currentRound(), [] { return 7; });
  });
  for (int agent = 0; agent < 2; ++agent) {
    EXPECT_GE(worlds[agent].generation, 1);
    EXPECT_EQ(worlds[agent].nnodes, 2);
    EXPECT_EQ(worlds[agent].worldSize, 1 + 2);
    EXPECT_EQ(worlds[agent].generation, worlds[0].generation);
  }
  EXPECT_NE(worlds[0].nodeRank, worlds[1].nodeRank);
}

TEST(ElasticRendezvous, FewerThanMinAgentsTimeOutSayingHowMany) {
  HashStore store;
  ElasticOptions o = elasticOptions(0, 2, 3);
  o.rdzvTimeout = 300ms;
  ElasticRendezvous r(store, o);
  try {
    r.join(r.currentRound(), [] { return 1; });
    FAIL() << "a round of 1 node was admitted with MIN 2";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("only 1 node(s) arrived"));
    EXPECT_THAT(e.what(), HasSubstr("at least 2"));
  }
}

}  // namespace
}  // namespace loom::run
