// The hang analysis on synthetic records (a rank that never entered, a rank in another
// operation or group, a mismatched collective and which mismatch leads, a missing record,
// nothing stuck, absent ranks), the heartbeat, the dump's JSON form (round trip, corrupt and
// truncated input) and loom-doctor on dump files. A group's diagnostics at work (their threads,
// dumps of other groups, leaving, store load, clocks) are in group_diagnostics_test.cc; the
// flight recorder's ring is in flight_recorder_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "diagnostics/flight_recorder.h"
#include "diagnostics/group_diagnostics.h"
#include "diagnostics_test_util.h"
#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/process_group/diagnostics.h"
#include "loom/testing/errors.h"
#include "loom/testing/ranks.h"

namespace loom::diag {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

OpRecord record(uint64_t seq, OpType type, OpState state, int root = 0) {
  OpRecord r;
  r.id = seq;
  r.seq = seq;
  r.type = type;
  r.dtype = DType::kFloat32;
  r.count = 1000;
  r.bytes = 4000;
  r.root = root;
  r.state = state;
  r.issueUs = 1'000'000 * static_cast<int64_t>(seq);
  r.startUs = r.issueUs + 10;
  if (state == OpState::kDone || state == OpState::kFailed) r.endUs = r.startUs + 100;
  return r;
}

// Rank r's record: allreduce #1..#(last - 1) done, then `tail` for #last.
RankDump rankWith(int rank, int size, uint64_t done, std::vector<OpRecord> tail) {
  RankDump d;
  d.rank = rank;
  d.size = size;
  d.backend = "tcp";
  d.reason = "failure";
  d.capacity = 2000;
  for (uint64_t s = 1; s <= done; ++s)
    d.entries.push_back(record(s, OpType::kAllreduce, OpState::kDone));
  for (auto& r : tail) d.entries.push_back(r);
  for (const auto& r : d.entries) {
    if (isCollective(r.type)) d.lastSeq = r.seq;
  }
  d.recorded = d.entries.size();
  d.timeUs = 100'000'000;
  return d;
}

TEST(FlightRecordAnalysis, NamesTheRankThatNeverEnteredAndWhatItDoes) {
  std::vector<std::optional<RankDump>> dumps;
  for (int r = 0; r < 4; ++r) {
    if (r == 2) {
      dumps.push_back(rankWith(r, 4, 4, {}));
    } else {
      dumps.push_back(rankWith(r, 4, 4, {record(5, OpType::kAllreduce, OpState::kRunning)}));
    }
  }
  const std::string text = explain(dumps);
  EXPECT_THAT(text, HasSubstr("rank 2 never entered collective #5: it is idle since allreduce#4 "
                              "completed"));
  EXPECT_THAT(text, HasSubstr("ranks 0, 1, 3 wait in allreduce#5 (3.9 KiB float)"));
}

TEST(FlightRecordAnalysis, RankInAnotherOperationIsNamedWithIt) {
  std::vector<std::optional<RankDump>> dumps;
  for (int r = 0; r < 3; ++r) {
    dumps.push_back(rankWith(r, 3, 4, {record(5, OpType::kAllreduce, OpState::kRunning)}));
  }
  OpRecord send = record(3, OpType::kSend, OpState::kRunning, 1);
  send.id = 5;
  dumps[1] = rankWith(1, 3, 4, {send});
  const std::string text = explain(dumps);
  EXPECT_THAT(text, HasSubstr("rank 1 never entered collective #5: it is in send#3 to rank 1"));
  EXPECT_THAT(text, HasSubstr("ranks 0, 2 wait in allreduce#5"));
}

TEST(FlightRecordAnalysis, MismatchPrintsBothSignatures) {
  std::vector<std::optional<RankDump>> dumps;
  for (int r = 0; r < 4; ++r) {
    const OpType type = r == 1 ? OpType::kBroadcast : OpType::kAllreduce;
    dumps.push_back(rankWith(r, 4, 4, {record(5, type, OpState::kFailed)}));
  }
  const std::string text = explain(dumps);
  EXPECT_THAT(text, HasSubstr("mismatched collective #5"));
  EXPECT_THAT(text, HasSubstr("ranks 0, 2, 3 called allreduce(dtype=float, count=1000, op=sum)#5"));
  EXPECT_THAT(text, HasSubstr("rank 1 called broadcast(dtype=float, count=1000, root=0)#5"));
}

// Rank 3 still finished allreduce #4 when rank 1, at #5, found the mismatch and aborted: rank
// 3 failed at #4, and the mismatch at #5 leads the summary.
TEST(FlightRecordAnalysis, LaterMismatchLeadsTheSummary) {
  std::vector<std::optional<RankDump>> dumps;
  for (int r = 0; r < 3; ++r) {
    const OpType type = r == 1 ? OpType::kBroadcast : OpType::kAllreduce;
    dumps.push_back(rankWith(r, 4, 4, {record(5, type, OpState::kFailed)}));
  }
  dumps.push_back(rankWith(3, 4, 3, {record(4, OpType::kAllreduce, OpState::kFailed)}));
  const std::string text = explain(dumps);
  EXPECT_EQ(text.find("mismatched collective #5 (different signatures): ranks 0, 2 called "
                      "allreduce(dtype=float, count=1000, op=sum)#5; rank 1 called "
                      "broadcast(dtype=float, count=1000, root=0)#5; "),
            0u)
      << text;
  EXPECT_THAT(text, HasSubstr("rank 3 failed in allreduce#4"));
}

TEST(FlightRecordAnalysis, MissingRecordAndNothingStuck) {
  std::vector<std::optional<RankDump>> dumps;
  dumps.push_back(rankWith(0, 3, 7, {}));
  dumps.push_back(std::nullopt);
  dumps.push_back(rankWith(2, 3, 7, {}));
  const std::string text = explain(dumps);
  EXPECT_THAT(text, HasSubstr("completed every collective it issued (up to #7)"));
  EXPECT_THAT(text, HasSubstr("rank 1: no flight record"));

  dumps[0] = rankWith(0, 3, 6, {record(7, OpType::kAllreduce, OpState::kRunning)});
  dumps[2] = rankWith(2, 3, 6, {record(7, OpType::kAllreduce, OpState::kRunning)});
  EXPECT_THAT(explain(dumps),
              HasSubstr("ranks 0, 2 wait in allreduce#7 (3.9 KiB float); rank 1: no flight "
                        "record arrived (dead, stopped, or cut off from the store)"));
}

// This process's record of its other group "B" (size 2, parent ranks 0,1): its last collective
// `lastSeq`, and `op` when it has one.
OtherGroup groupB(int rank, uint64_t lastSeq, std::optional<OpRecord> op) {
  OtherGroup g;
  g.group = "B";
  g.parentRanks = {0, 1};
  g.rank = rank;
  g.size = 2;
  g.backend = "tcp";
  g.lastSeq = lastSeq;
  g.op = op;
  return g;
}

// Group "A" of the cross-group deadlock (docs/diagnostics.md, "Hangs across groups"): rank 0
// waits (failed) in A's allreduce #1; rank 1 has nothing in A and is in B's allreduce #1 since
// 30.1 s before its dump; rank 0's record of B: `rank0InB`.
std::vector<std::optional<RankDump>> crossGroupDumps(const OtherGroup& rank0InB) {
  RankDump zero = rankWith(0, 2, 0, {record(1, OpType::kAllreduce, OpState::kFailed)});
  RankDump one = rankWith(1, 2, 0, {});
  for (RankDump* d : {&zero, &one}) {
    d->group = "A";
    d->parentRanks = {0, 1};
  }
  OpRecord inB = record(1, OpType::kAllreduce, OpState::kRunning);
  inB.startUs = one.timeUs - 30'100'000;
  one.otherGroups = {groupB(1, 1, inB)};
  zero.otherGroups = {rank0InB};
  return {zero, one};
}

TEST(FlightRecordAnalysis, CrossGroupDeadlockNamesBothGroupsAndTheOrder) {
  const std::string text = explain(crossGroupDumps(groupB(0, 0, std::nullopt)));
  EXPECT_EQ(text.substr(0, text.find('\n')),
            "rank 1 never entered allreduce#1 of group \"A\" (parent ranks 0,1): it is blocked in "
            "allreduce#1 of group \"B\" (parent ranks 0,1; running for 30.1 s), which rank 0 has "
            "not entered: the ranks issue collectives on group \"A\" and group \"B\" in different "
            "orders (a cross-group deadlock); every rank must call collectives on groups that "
            "share ranks in the same order; rank 0 failed in allreduce#1 (3.9 KiB float)")
      << text;
  // Each rank's line says where its process is busy elsewhere.
  EXPECT_THAT(text, HasSubstr("\n  rank 1 has issued no operation; it is blocked in allreduce#1 of "
                              "group \"B\" (parent ranks 0,1; running for 30.1 s)"));

  // Rank 0 is rank 1 of B: said so. It idles in B after an earlier collective: still behind.
  OpRecord done = record(0, OpType::kBarrier, OpState::kDone);
  EXPECT_THAT(explain(crossGroupDumps(groupB(1, 0, done))),
              HasSubstr("which rank 0 has not entered (rank 0 is rank 1 there): the ranks"));
}

TEST(FlightRecordAnalysis, RankBlockedInAnotherGroupWithoutACycleIsNamedWithIt) {
  // Rank 0 entered B's allreduce #1 too (and finished it): rank 1 waits there for someone
  // else, no cycle between these two.
  OpRecord done = record(1, OpType::kAllreduce, OpState::kDone);
  const std::string text = explain(crossGroupDumps(groupB(0, 1, done)));
  EXPECT_THAT(text, HasSubstr("rank 1 never entered allreduce#1 of group \"A\" (parent ranks "
                              "0,1): it is blocked in allreduce#1 of group \"B\" (parent ranks "
                              "0,1; running for 30.1 s); rank 0 failed in allreduce#1"));
  EXPECT_THAT(text, Not(HasSubstr("cross-group deadlock")));

  // Unnamed groups (loom_torch's, a createProcessGroup without a name) are told by their size.
  std::vector<std::optional<RankDump>> dumps = crossGroupDumps(groupB(0, 0, std::nullopt));
  for (auto& d : dumps) {
    d->group.clear();
    d->parentRanks.clear();
    d->otherGroups[0].group.clear();
    d->otherGroups[0].parentRanks.clear();
  }
  EXPECT_THAT(explain(dumps),
              HasSubstr("rank 1 never entered allreduce#1 of this group: it is blocked in "
                        "allreduce#1 of another unnamed group of 2 ranks (running for 30.1 s), "
                        "which rank 0 has not entered: the ranks issue collectives on this group "
                        "and another unnamed group of 2 ranks in different orders (a cross-group "
                        "deadlock)"));

  // A rank with an unfinished operation of its own group is told as before.
  dumps = crossGroupDumps(groupB(0, 0, std::nullopt));
  OpRecord send = record(1, OpType::kSend, OpState::kRunning, 0);
  dumps[1]->entries = {send};
  EXPECT_THAT(explain(dumps), HasSubstr("rank 1 never entered collective #1: it is in send#1 to "
                                        "rank 0 (3.9 KiB float), running for"));
}

// The heartbeat's text round-trips, and the liveness check reads the process it names: this
// process (alive, heartbeat fresh or stale), a reaped child (dead), another host (only the
// heartbeat's age).
TEST(Heartbeat, RoundTripAndLiveness) {
  Heartbeat hb = localHeartbeat(::getpid(), 1'764'000'000'000'000);
  hb.beat = 7;
  hb.lastSeq = 42;
  hb.recorded = 50;
  const std::optional<Heartbeat> back = Heartbeat::parse(hb.text());
  ASSERT_TRUE(back.has_value()) << hb.text();
  EXPECT_EQ(back->text(), hb.text());
  EXPECT_FALSE(Heartbeat::parse("loom-heartbeat 2 1 2 3").has_value());
  EXPECT_FALSE(Heartbeat::parse("garbage").has_value());

  EXPECT_THAT(livenessOf(hb, hb.timeUs + 500'000), HasSubstr("alive, its heartbeat advancing"));
  EXPECT_THAT(livenessOf(hb, hb.timeUs + 10'000'000),
              HasSubstr("alive but not progressing: its process " + std::to_string(hb.pid)));
  EXPECT_THAT(livenessOf(hb, hb.timeUs + 10'000'000), HasSubstr("last heartbeat #7 10.0 s ago"));

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  Heartbeat gone = hb;
  gone.pid = child;
  EXPECT_THAT(livenessOf(gone, hb.timeUs), HasSubstr("dead: its process " + std::to_string(child)));

  Heartbeat off = hb;
  off.intervalMs = 0;  // heartbeats off: only the process says something
  EXPECT_THAT(livenessOf(off, hb.timeUs + 10'000'000), HasSubstr("heartbeats are off"));
  off.host = "elsewhere-" + hb.host;
  EXPECT_THAT(livenessOf(off, hb.timeUs + 10'000'000), HasSubstr("unknown: its process"));

  Heartbeat remote = hb;
  remote.host = "elsewhere-" + hb.host;
  EXPECT_THAT(livenessOf(remote, hb.timeUs + 10'000'000),
              HasSubstr("not progressing: no heartbeat for 10.0 s (dead or stopped"));
  EXPECT_THAT(livenessOf(remote, hb.timeUs + 100'000), HasSubstr("alive"));
}

TEST(FlightRecordAnalysis, AbsentRanksAreToldByTheirNote) {
  std::vector<std::optional<RankDump>> dumps(3);
  for (int r = 0; r < 2; ++r) {
    RankDump d;
    d.rank = r;
    d.size = 3;
    d.lastSeq = 1;
    OpRecord e;
    e.seq = 1;
    e.type = OpType::kAllreduce;
    e.dtype = DType::kFloat32;
    e.count = 2;
    e.bytes = 8;
    e.state = OpState::kFailed;
    d.entries.push_back(e);
    dumps[r] = d;
  }
  EXPECT_THAT(explain(dumps), HasSubstr("rank 2: no flight record arrived (dead, stopped"));
  EXPECT_THAT(explain(dumps, {"", "", "dead: its process 9 on h no longer exists"}),
              HasSubstr("ranks 0, 1 failed in allreduce#1 (8 B float); rank 2 sent no flight "
                        "record: dead: its process 9 on h no longer exists"));
}

TEST(FlightRecordJson, RoundTrip) {
  RankDump d = rankWith(1, 2, 2, {record(3, OpType::kReduce, OpState::kFailed, 1)});
  d.entries.back().peer = 0;
  d.group = "group/1";
  d.host = "node7";
  d.pid = 4242;
  const RankDump back = parseDump(toJson(d), "x.json");
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.size, 2);
  EXPECT_EQ(back.group, "group/1");
  EXPECT_EQ(back.host, "node7");
  EXPECT_EQ(back.pid, 4242);
  EXPECT_EQ(back.lastSeq, 3u);
  ASSERT_EQ(back.entries.size(), 3u);
  EXPECT_EQ(back.entries[2].type, OpType::kReduce);
  EXPECT_EQ(back.entries[2].state, OpState::kFailed);
  EXPECT_EQ(back.entries[2].peer, 0);
  EXPECT_EQ(back.entries[2].root, 1);
  EXPECT_EQ(back.entries[2].signature(), d.entries[2].signature());
  EXPECT_EQ(back.entries[2].endUs, d.entries[2].endUs);
}

// Version 2's parent ranks and other groups round-trip; a version 1 dump (written before them)
// is still read, with none; a bad other group is named by its path.
TEST(FlightRecordJson, OtherGroupsRoundTripAndVersion1StillReads) {
  RankDump d = rankWith(1, 2, 2, {});
  d.group = "A";
  d.parentRanks = {0, 3};
  OpRecord inB = record(7, OpType::kBroadcast, OpState::kRunning, 1);
  d.otherGroups = {groupB(1, 7, inB), groupB(0, 0, std::nullopt)};
  d.otherGroups[1].group = "";
  const std::string json = toJson(d);
  const RankDump back = parseDump(json, "x.json");
  EXPECT_EQ(back.parentRanks, (std::vector<int>{0, 3}));
  ASSERT_EQ(back.otherGroups.size(), 2u);
  const OtherGroup& b = back.otherGroups[0];
  EXPECT_EQ(b.group, "B");
  EXPECT_EQ(b.parentRanks, (std::vector<int>{0, 1}));
  EXPECT_EQ(b.rank, 1);
  EXPECT_EQ(b.size, 2);
  EXPECT_EQ(b.backend, "tcp");
  EXPECT_EQ(b.lastSeq, 7u);
  ASSERT_TRUE(b.op.has_value());
  EXPECT_EQ(b.op->signature(), inB.signature());
  EXPECT_EQ(b.op->state, OpState::kRunning);
  EXPECT_EQ(b.op->startUs, inB.startUs);
  EXPECT_EQ(back.otherGroups[1].group, "");
  EXPECT_FALSE(back.otherGroups[1].op.has_value());
  EXPECT_EQ(back.entries.size(), 2u);
  EXPECT_THAT(json, HasSubstr("\"version\": 2,"));

  // Version 1: no parent_ranks, no other_groups.
  std::string v1 = toJson(rankWith(0, 2, 3, {}));
  v1.replace(v1.find("\"version\": 2"), 12, "\"version\": 1");
  v1.erase(v1.find(" \"parent_ranks\""), v1.find(" \"entries\"") - v1.find(" \"parent_ranks\""));
  ASSERT_EQ(v1.find("other_groups"), std::string::npos) << v1;
  const RankDump old = parseDump(v1, "v1.json");
  EXPECT_EQ(old.entries.size(), 3u);
  EXPECT_TRUE(old.otherGroups.empty());
  EXPECT_TRUE(old.parentRanks.empty());
  EXPECT_THAT(loom::testing::messageOf<InvalidArgumentError>([&] {
                parseDump(std::string(v1).replace(v1.find("\"version\": 1"), 12, "\"version\": 3"),
                          "v3.json");
              }),
              HasSubstr("v3.json: format version 3 is not supported"));

  std::string bad = json;
  bad.replace(bad.find("\"broadcast\""), 11, "\"broadcasx\"");
  EXPECT_THAT(loom::testing::messageOf<InvalidArgumentError>([&] { parseDump(bad, "r.json"); }),
              HasSubstr("r.json: other_groups[0].op.op: unknown value 'broadcasx'"));
  bad = json;
  bad.replace(bad.find("\"parent_ranks\":[0,1]"), 20, "\"parent_ranks\":[0,1.5]");
  EXPECT_THAT(loom::testing::messageOf<InvalidArgumentError>([&] { parseDump(bad, "r.json"); }),
              HasSubstr("r.json: other_groups[0].parent_ranks[1]: 1.5 is not an integer"));
}

TEST(FlightRecordJson, CorruptOrTruncatedNamesTheFileAndOffset) {
  const std::string json = toJson(rankWith(0, 2, 3, {}));
  const std::string truncated = json.substr(0, json.size() / 2);
  const std::string message = loom::testing::messageOf<InvalidArgumentError>(
      [&] { parseDump(truncated, "dumps/rank0.json"); });
  EXPECT_THAT(message, HasSubstr("dumps/rank0.json"));
  EXPECT_THAT(message, HasSubstr("at byte " + std::to_string(truncated.size())));

  std::string corrupt = json;
  corrupt[corrupt.find("\"op\"") + 7] = '\x01';
  EXPECT_THAT(loom::testing::messageOf<InvalidArgumentError>([&] { parseDump(corrupt, "r.json"); }),
              HasSubstr("r.json: not a valid flight record: corrupt or truncated JSON at byte"));

  std::string badOp = json;
  badOp.replace(badOp.find("\"allreduce\""), 11, "\"allreduxe\"");
  EXPECT_THAT(loom::testing::messageOf<InvalidArgumentError>([&] { parseDump(badOp, "r.json"); }),
              HasSubstr("r.json: entries[0].op: unknown value 'allreduxe'"));
  EXPECT_THAT(loom::testing::messageOf<InvalidArgumentError>(
                  [&] { parseDump("{\"format\": \"other\"}", "r.json"); }),
              HasSubstr("format is 'other'"));
}

// Runs loom-doctor with `args`; returns its exit status and stdout + stderr.
std::pair<int, std::string> doctor(const std::string& args) {
  const std::string command = std::string(LOOM_DOCTOR_PATH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A malformed --attach is a usage error naming what is wrong (a port with letters after it was
// taken as the number before them, "abc" printed only "stoi", a relative file:// was accepted).
TEST(LoomDoctor, AMalformedAttachAddressIsAUsageError) {
  for (const auto& [url, want] : std::vector<std::pair<std::string, std::string>>{
           {"tcp://127.0.0.1:abc", "port='abc' is not valid"},
           {"tcp://127.0.0.1:1x", "port='1x' is not valid"},
           {"file://relative/path", "the path must be absolute"},
           {"udp://x:1", "expected tcp://host:port or file:///path"}}) {
    auto [status, out] = doctor("--attach " + url + " --world-size 2");
    EXPECT_EQ(status, 2) << url << ": " << out;
    EXPECT_THAT(out, HasSubstr(want)) << url;
  }
  // So are an unknown flag and a bad value (CLI11's own codes, 109 and 105, before).
  for (const std::string args : {"--bogus", "--attach tcp://h:1 --world-size -3"}) {
    auto [status, out] = doctor(args);
    EXPECT_EQ(status, 2) << args << ": " << out;
  }
}

TEST(LoomDoctor, ExplainsDumpsAndNamesCorruptAndMissingOnes) {
  loom::testing::TempDir dir;
  for (int r = 0; r < 4; ++r) {
    RankDump d = r == 2 ? rankWith(r, 4, 4, {})
                        : rankWith(r, 4, 4, {record(5, OpType::kAllreduce, OpState::kRunning)});
    writeFile(dir.file("loom-flight-default-rank" + std::to_string(r) + ".json"), toJson(d));
  }
  auto [status, out] = doctor(dir.path());
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("group default (4 ranks, 4 dumps)"));
  EXPECT_THAT(out, HasSubstr("rank 2 never entered collective #5: it is idle since allreduce#4"));
  EXPECT_THAT(out, HasSubstr("ranks 0, 1, 3 wait in allreduce#5"));

  // Rank 1's dump cut short, rank 3's gone: both named; the analysis goes on without them.
  const std::string rank1 = dir.file("loom-flight-default-rank1.json");
  const std::string full = toJson(rankWith(1, 4, 4, {}));
  writeFile(rank1, full.substr(0, 100));
  std::remove(dir.file("loom-flight-default-rank3.json").c_str());
  std::tie(status, out) = doctor(dir.path());
  EXPECT_EQ(status, 1) << out;
  EXPECT_THAT(out, HasSubstr(rank1 + ": not a valid flight record: corrupt or truncated JSON at "
                                     "byte 100 of 100"));
  EXPECT_THAT(out, HasSubstr("rank 1: no dump among the files given"));
  EXPECT_THAT(out, HasSubstr("rank 3: no dump among the files given"));
  EXPECT_THAT(out, HasSubstr("rank 2 never entered collective #5"));
}

}  // namespace
}  // namespace loom::diag
