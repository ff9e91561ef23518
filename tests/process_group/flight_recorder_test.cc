// The flight recorder's ring on its own: the last entries across wraparound and a capacity
// that is no power of two, the clocks its times come from, the tick stamps it takes for all but
// every Nth operation, in-order collectives told by the progress words, a reader racing the
// writer (consistent progress, no torn entry), and the peer a failure's text names. The
// analysis of dumps, their JSON form and loom-doctor are in diagnostics_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "diagnostics/flight_recorder.h"
#include "diagnostics/group_diagnostics.h"
#include "loom/process_group/diagnostics.h"

namespace loom::diag {
namespace {

using ::testing::HasSubstr;

OpDesc allreduceOp(uint64_t seq, size_t count) {
  OpDesc op;
  op.type = OpType::kAllreduce;
  op.dtype = DType::kFloat32;
  op.count = count;
  op.seq = seq;
  return op;
}

TEST(FlightRecorder, KeepsTheLastEntriesAcrossWraparound) {
  FlightRecorder rec(4, comm::Algorithm::kRing);
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    const uint64_t id = rec.recordIssue(allreduceOp(seq, seq));
    EXPECT_EQ(id, seq);
    if (seq <= 9) rec.recordStart(id);
    if (seq <= 8) rec.recordEnd(id, seq == 8, seq == 8 ? 3 : -1);
  }
  rec.recordEnd(2, false);  // overwritten long ago: dropped
  const std::vector<OpRecord> got = rec.snapshot();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(rec.recorded(), 10u);
  EXPECT_EQ(rec.lastSeq(), 10u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].id, 7 + i);
    EXPECT_EQ(got[i].seq, 7 + i);
    EXPECT_EQ(got[i].count, 7 + i);
    EXPECT_EQ(got[i].bytes, (7 + i) * 4);
    EXPECT_EQ(got[i].algorithm, comm::Algorithm::kRing);
  }
  EXPECT_EQ(got[0].state, OpState::kDone);
  EXPECT_EQ(got[1].state, OpState::kFailed);
  EXPECT_EQ(got[1].peer, 3);
  EXPECT_EQ(got[2].state, OpState::kRunning);
  EXPECT_EQ(got[3].state, OpState::kQueued);
  EXPECT_GT(got[0].endUs, 0);
  EXPECT_GE(got[0].endUs, got[0].startUs);
  EXPECT_EQ(got[3].startUs, 0);
}

// A capacity that is not a power of two: the ring has more slots (8 for 5), but a snapshot holds
// the newest `capacity` entries only, and an update for an entry past them is still dropped
// once its slot was reused.
TEST(FlightRecorder, ReportsExactlyTheCapacityWhenItIsNoPowerOfTwo) {
  FlightRecorder rec(5, comm::Algorithm::kAuto);
  for (uint64_t seq = 1; seq <= 12; ++seq) {
    rec.recordStart(rec.recordIssue(allreduceOp(seq, 1)));
  }
  rec.recordEnd(3, false);   // slot reused by id 11: dropped
  rec.recordEnd(12, false);  // the newest: kept
  const std::vector<OpRecord> got = rec.snapshot();
  ASSERT_EQ(got.size(), 5u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].id, 8 + i);
  EXPECT_EQ(got[3].state, OpState::kRunning);
  EXPECT_EQ(got[4].state, OpState::kDone);
  EXPECT_EQ(rec.recorded(), 12u);
}

// snapshot(newest) reads only the newest entries (what a dump of another group needs), never
// more than the ring keeps.
TEST(FlightRecorder, SnapshotOfTheNewestEntriesOnly) {
  FlightRecorder rec(5, comm::Algorithm::kAuto);
  EXPECT_TRUE(rec.snapshot(3).empty());
  for (uint64_t seq = 1; seq <= 7; ++seq) rec.recordStart(rec.recordIssue(allreduceOp(seq, 1)));
  std::vector<OpRecord> got = rec.snapshot(2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].id, 6u);
  EXPECT_EQ(got[1].id, 7u);
  EXPECT_EQ(got[1].state, OpState::kRunning);
  EXPECT_EQ(rec.snapshot(100).size(), 5u);
  EXPECT_TRUE(rec.snapshot(0).empty());
}

// Start and end come from the TSC when the CPU says it is invariant (what Linux shows as
// nonstop_tsc), and are converted to Unix microseconds: an operation that ran across a 20 ms
// sleep shows at least 20 ms between its start and end, and both lie between the system clock's
// readings around them; the issue time (coarse clock) is never after the start.
TEST(FlightRecorder, TimesAreUnixMicrosecondsFromTheRightClock) {
  FlightRecorder rec(16, comm::Algorithm::kAuto);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool nonstop = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      nonstop = line.find(" nonstop_tsc") != std::string::npos;
      break;
    }
  }
#if defined(__x86_64__)
  EXPECT_EQ(FlightRecorder::tscIsInvariant(), nonstop) << "CPUID and /proc/cpuinfo disagree";
#endif
  EXPECT_EQ(rec.usesTsc(), FlightRecorder::tscIsInvariant());
  const auto unixUs = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const int64_t before = unixUs();
  const uint64_t id = rec.recordIssue(allreduceOp(1, 1));
  rec.recordStart(id);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  rec.recordEnd(id, false);
  const int64_t after = unixUs();
  const std::vector<OpRecord> got = rec.snapshot();
  ASSERT_EQ(got.size(), 1u);
  const OpRecord& r = got[0];
  // The conversion's own error is well under a millisecond; 1 ms of slack either side.
  EXPECT_GE(r.startUs, before - 1000);
  EXPECT_LE(r.endUs, after + 1000);
  EXPECT_GE(r.endUs - r.startUs, 20000 - 1000);
  EXPECT_LE(r.issueUs, r.startUs);
  EXPECT_GT(r.issueUs, before - 100000);  // the coarse clock: a few ms of resolution
}

// With a tick published (the comm backend's worker napping while waiters run operations), an
// operation whose sequence number is not a multiple of preciseEvery reads no clock: its issue,
// start and end are the tick, marked not precise, and convert to the tick's Unix time. The
// multiples are timed precisely on the TSC as before, and so is every operation once the tick
// is withdrawn. stragglers() skips the tick-stamped ones.
TEST(FlightRecorder, TickStampsAllButEveryNthOperationWhilePublished) {
  FlightRecorder rec(64, comm::Algorithm::kAuto);
  rec.setPreciseEvery(5);  // rounded up to 8
  EXPECT_EQ(rec.preciseEvery(), 8u);
  const auto steadyNs = [] {
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch() /
                                 std::chrono::nanoseconds(1));
  };
  const auto unixUs = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  // The tick is 30 ms old by the time the operations run: their times show that age.
  const int64_t tickUnixUs = unixUs();
  rec.publishTick(steadyNs());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  for (uint64_t seq = 1; seq <= 16; ++seq) {
    const uint64_t id = rec.recordIssue(allreduceOp(seq, 1));
    rec.recordStart(id);
    rec.recordEnd(id, false);
  }
  rec.publishTick(0);
  const int64_t untickedFrom = unixUs();
  const uint64_t id = rec.recordIssue(allreduceOp(17, 1));
  rec.recordStart(id);
  rec.recordEnd(id, false);
  const std::vector<OpRecord> got = rec.snapshot();
  ASSERT_EQ(got.size(), 17u);
  for (const OpRecord& r : got) {
    SCOPED_TRACE(r.describe());
    EXPECT_EQ(r.state, OpState::kDone);
    const bool sampled = r.seq % 8 == 0;
    EXPECT_EQ(r.precise, sampled || r.seq == 17);
    if (r.seq == 17) {
      EXPECT_GE(r.startUs, untickedFrom - 1000);
    } else if (sampled) {
      EXPECT_GE(r.startUs, tickUnixUs + 30000 - 1000);  // read after the sleep
      // Issued while the tick was published: the issue time is the tick.
      EXPECT_NEAR(static_cast<double>(r.issueUs), static_cast<double>(tickUnixUs), 1000.0);
    } else {
      // All three are the tick: 30 ms before the operations ran, to well under a millisecond.
      EXPECT_NEAR(static_cast<double>(r.startUs), static_cast<double>(tickUnixUs), 1000.0);
      EXPECT_EQ(r.endUs, r.startUs);
      EXPECT_EQ(r.issueUs, r.startUs);
    }
    EXPECT_LE(r.issueUs, r.startUs);
    EXPECT_LE(r.startUs, r.endUs);
  }
  // The JSON form keeps the flag.
  RankDump d;
  d.rank = 0;
  d.size = 1;
  d.entries = got;
  const RankDump back = parseDump(toJson(d), "test");
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(back.entries[i].precise, got[i].precise);
  // Only the precise ones count as arrivals.
  std::vector<std::optional<RankDump>> dumps{d};
  EXPECT_EQ(stragglers(dumps).ranks[0].collectives, 3u);  // seqs 8, 16, 17
}

int64_t unixNowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t steadyNowNs() {
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch() /
                               std::chrono::nanoseconds(1));
}

// A group that runs its collectives one at a time in issue order (the comm backend): while
// the tick is published, an unsampled collective's start and end go to the progress words,
// and the snapshot derives its state from them; its end is the first progress mark that saw
// it ended. Sampled operations, large ones, point-to-point ones and everything run without a
// tick are written to their entries as before.
TEST(FlightRecorder, InOrderCollectivesAreToldByTheProgressWords) {
  FlightRecorder rec(64, comm::Algorithm::kAuto);
  rec.setPreciseEvery(8);
  rec.setCollectivesInOrder(true);
  const int64_t t0 = unixNowUs();
  rec.publishTick(steadyNowNs());
  // Issued as ProcessGroup::postLocked does: the id and whether it is in order, in the OpDesc.
  const auto issue = [&](OpDesc op) {
    op.recordInOrder = true;  // recordIssue sets it either way
    op.recordId = rec.recordIssue(op, &op.recordInOrder);
    return op;
  };
  std::vector<OpDesc> ops;
  // seq 3 moves 64 KiB: always precise.
  for (uint64_t seq = 1; seq <= 9; ++seq)
    ops.push_back(issue(allreduceOp(seq, seq == 3 ? 16384 : 2)));
  OpDesc send;
  send.type = OpType::kSend;
  send.dtype = DType::kFloat32;
  send.count = 2;
  send.seq = 1;
  send = issue(send);
  EXPECT_FALSE(send.recordInOrder);
  for (const OpDesc& op : ops) EXPECT_EQ(op.recordInOrder, op.seq != 3 && op.seq != 8) << op.seq;
  const auto start = [&](size_t i) { rec.recordStart(ops[i]); };
  const auto end = [&](size_t i, bool failed, int peer = -1) {
    rec.recordEnd(ops[i], failed, peer);
  };
  // #1-#5 run (#3 precisely); then 20 ms pass and the tick thread marks their ends.
  for (size_t i = 0; i < 5; ++i) {
    start(i);
    end(i, false);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t t1 = unixNowUs();
  rec.publishTick(steadyNowNs());
  // #6 starts and is still running; #7 fails after starting on the progress words; #8, #9
  // and the send are queued.
  start(5);
  std::vector<OpRecord> got = rec.snapshot();
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(got[i].describe());
    EXPECT_EQ(got[i].state, OpState::kDone);
    EXPECT_EQ(got[i].precise, i == 2);
    EXPECT_LE(got[i].issueUs, got[i].startUs);
    EXPECT_LE(got[i].startUs, got[i].endUs);
    if (i != 2) {
      // Ended before the mark 20 ms later, which is what it reports (late by up to a nap).
      EXPECT_NEAR(static_cast<double>(got[i].endUs), static_cast<double>(t1), 1000.0);
      EXPECT_GE(got[i].startUs, t0 - 1000);
    }
  }
  // #4 started once #3 (precise) ended.
  EXPECT_GE(got[3].startUs, got[2].endUs);
  EXPECT_EQ(got[5].state, OpState::kRunning);
  EXPECT_FALSE(got[5].precise);
  EXPECT_NEAR(static_cast<double>(got[5].startUs), static_cast<double>(t1), 1000.0);
  for (size_t i = 6; i < 10; ++i) EXPECT_EQ(got[i].state, OpState::kQueued) << got[i].describe();

  end(5, false);  // after the last mark: its end is "before now"
  start(6);
  end(6, true, 3);
  // #8 is sampled: its entry; then the tick is withdrawn, and #9 runs on its entry, precisely.
  start(7);
  end(7, false);
  rec.publishTick(0);
  start(8);
  const int64_t beforeNine = unixNowUs();
  end(8, false);
  rec.recordStart(send);
  rec.recordEnd(send, false);
  got = rec.snapshot();
  ASSERT_EQ(got.size(), 10u);
  EXPECT_EQ(got[5].state, OpState::kDone);
  // Withdrawing the tick marked #6's end with the clock.
  EXPECT_GE(got[5].endUs, t1 - 1000);
  EXPECT_LE(got[5].endUs, unixNowUs() + 1000);
  EXPECT_EQ(got[6].state, OpState::kFailed);
  EXPECT_EQ(got[6].peer, 3);
  EXPECT_NEAR(static_cast<double>(got[6].startUs), static_cast<double>(t1), 1000.0)
      << "the failed operation keeps the start it had on the progress words";
  EXPECT_GE(got[6].endUs, got[6].startUs);
  EXPECT_EQ(got[7].state, OpState::kDone);
  EXPECT_TRUE(got[7].precise);
  EXPECT_EQ(got[8].state, OpState::kDone);
  EXPECT_TRUE(got[8].precise) << "no tick: timed on its entry";
  EXPECT_GE(got[8].endUs, beforeNine - 1000);
  EXPECT_EQ(got[9].type, OpType::kSend);
  EXPECT_EQ(got[9].state, OpState::kDone);
}

// Snapshots `rec` until `writerDone` is set, passing each snapshot to `check`, which returns
// a problem ("" for none); returns the first problem and expects at least one snapshot.
std::string snapshotWhileWriting(
    const FlightRecorder& rec, const std::atomic<bool>& writerDone,
    const std::function<std::string(const std::vector<OpRecord>&)>& check) {
  size_t snapshots = 0;
  std::string problem;
  while (!writerDone && problem.empty()) {
    problem = check(rec.snapshot());
    ++snapshots;
  }
  EXPECT_GT(snapshots, 0u);
  return problem;
}

// An in-order writer (issue, start, end on the progress words) with a tick thread publishing
// every 100 us and a reader snapshotting: every entry is whole, done entries have times in
// order, and in-order collectives complete in order (no queued or running entry before a
// done one).
TEST(FlightRecorder, ConcurrentReaderSeesInOrderProgressConsistently) {
  FlightRecorder rec(64, comm::Algorithm::kAuto);
  rec.setPreciseEvery(16);
  rec.setCollectivesInOrder(true);
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    while (!stop) {
      rec.publishTick(steadyNowNs());
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    rec.publishTick(0);
  });
  std::thread writer([&] {
    for (uint64_t seq = 1; seq <= 200000; ++seq) {
      OpDesc op = allreduceOp(seq, seq % 1000 + 1);
      op.recordId = rec.recordIssue(op, &op.recordInOrder);
      rec.recordStart(op);
      rec.recordEnd(op, false);
    }
    stop = true;
  });
  const std::string problem =
      snapshotWhileWriting(rec, stop, [](const std::vector<OpRecord>& got) -> std::string {
        bool pending = false;  // a queued or running entry seen
        for (size_t i = 0; i < got.size(); ++i) {
          const OpRecord& r = got[i];
          if (r.seq != r.id || r.count != r.seq % 1000 + 1) {
            return "torn entry id " + std::to_string(r.id);
          }
          if (r.state == OpState::kDone && (r.startUs == 0 || r.endUs < r.startUs)) {
            return "done without times in order at id " + std::to_string(r.id);
          }
          if (r.state == OpState::kDone && pending) {
            return "id " + std::to_string(r.id) + " done after an unfinished one";
          }
          if (i > 0 && r.id <= got[i - 1].id) return "ids out of order";
          if (r.state != OpState::kDone) pending = true;
        }
        return "";
      });
  writer.join();
  ticker.join();
  EXPECT_EQ(problem, "");
  const std::vector<OpRecord> got = rec.snapshot();
  ASSERT_EQ(got.size(), 64u);
  for (const OpRecord& r : got) EXPECT_EQ(r.state, OpState::kDone) << r.describe();
}

// A reader snapshots while a writer records as fast as it can: every entry it returns is whole
// (count and bytes agree with its seq), ids are consecutive, and the reader never blocks the
// writer for long.
TEST(FlightRecorder, ConcurrentReaderSeesNoTornEntry) {
  FlightRecorder rec(64, comm::Algorithm::kAuto);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t seq = 1; seq <= 200000; ++seq) {
      const uint64_t id = rec.recordIssue(allreduceOp(seq, seq * 3));
      rec.recordStart(id);
      rec.recordEnd(id, false);
    }
    stop = true;
  });
  const std::string problem =
      snapshotWhileWriting(rec, stop, [](const std::vector<OpRecord>& got) -> std::string {
        for (size_t i = 0; i < got.size(); ++i) {
          const OpRecord& r = got[i];
          if (r.seq != r.id || r.count != r.seq * 3 || r.bytes != r.count * 4) {
            return "torn entry id " + std::to_string(r.id);
          }
          if (r.state == OpState::kDone && (r.startUs == 0 || r.endUs == 0)) {
            return "done without times at id " + std::to_string(r.id);
          }
          if (i > 0 && r.id <= got[i - 1].id) return "ids out of order";
        }
        return "";
      });
  writer.join();
  EXPECT_EQ(problem, "");
}

TEST(FlightRecorder, PeerNamedInAFailure) {
  EXPECT_EQ(peerNamedIn("rank 3: allreduce#5 timed out after 3000 ms waiting to receive from rank "
                        "2 (127.0.0.1:1): 4000 of 4000 bytes outstanding"),
            2);
  EXPECT_EQ(peerNamedIn("rank 0: barrier#2 failed while waiting to send to rank 11: reset"), 11);
  EXPECT_EQ(peerNamedIn("arena: waiting for rank(s) 1, 3"), 1);
  EXPECT_EQ(peerNamedIn("rank 0: aborted"), -1);
}

}  // namespace
}  // namespace loom::diag
