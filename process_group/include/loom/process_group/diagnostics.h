// Diagnostics of a process group: the flight record (the last N operations of one rank), its
// JSON form, and the analysis that turns every rank's record into one explanation of a hang
// or a failure ("rank 2 never entered allreduce#5 ...; ranks 0, 1, 3 wait in allreduce#5 (8 B
// float)"). docs/diagnostics.md describes the JSON format and when dumps are written.
//
// Contract
// - Plain values and pure functions: no I/O, no shared state; safe on any thread. The
//   ProcessGroup keeps the ring (process_group.h: flightRecorderEntries, dumpFlightRecord) and
//   runs the analysis on the spot when a collective fails; loom-doctor runs the same analysis
//   on dump files.
// - parseDump never trusts its input: a truncated or corrupt dump is an InvalidArgumentError
//   naming the source (a file name) and the byte offset (or the field) at fault.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"

namespace loom {
class Store;
}

namespace loom::diag {

enum class OpState : uint8_t { kQueued, kRunning, kDone, kFailed };
const char* opStateName(OpState state);

// One operation as the flight recorder saw it.
struct OpRecord {
  uint64_t id = 0;   // 1, 2, ... in issue order, per group and rank
  uint64_t seq = 0;  // the operation's sequence number (per peer for send / recv)
  OpType type = OpType::kBarrier;
  DType dtype = DType::kUInt8;
  ReduceOp reduceOp = ReduceOp::kSum;
  int root = 0;  // root of rooted collectives; the peer of send / recv
  comm::Algorithm algorithm = comm::Algorithm::kAuto;  // kAuto: chosen per call (not known)
  uint64_t count = 0;
  uint64_t bytes = 0;
  OpState state = OpState::kQueued;
  int peer = -1;  // the rank a failed operation waited on, -1 when none was named
  // Microseconds since the Unix epoch; 0 = not yet.
  int64_t issueUs = 0;
  int64_t startUs = 0;
  int64_t endUs = 0;
  // Whether startUs and endUs (those set) are precise (the time-stamp counter: to the
  // microsecond) rather than the recorder's tick (up to about a millisecond late; see
  // docs/diagnostics.md, "Times"). stragglers() uses precise entries only.
  bool precise = true;

  // "allreduce#5", "send#3 to rank 1" (OpDesc::describe).
  std::string describe() const;
  // "allreduce(dtype=float, count=2, op=sum)#5" (OpDesc::signature).
  std::string signature() const;
};

// What the dumping process does in another of its live groups (with a flight recorder) when
// the dump is taken: a hang across two groups (a rank blocked in group B's collective never
// enters group A's) is told from these.
struct OtherGroup {
  std::string group;             // its ProcessGroupOptions::groupName ("" unnamed)
  std::vector<int> parentRanks;  // its ProcessGroupOptions::parentRanks (newGroup's members)
  int rank = 0;                  // this process's rank in it
  int size = 0;
  std::string backend;
  uint64_t lastSeq = 0;  // sequence number of the last collective issued there
  // Its oldest unfinished operation (queued or running: the one this process is blocked in or
  // running there), else its newest operation (done or failed: idle since); nullopt when it
  // has issued none. Times on the dumping rank's clock, as the dump's.
  std::optional<OpRecord> op;
};

// One rank's flight record, as dumped.
struct RankDump {
  int rank = 0;
  int size = 0;
  std::string group;             // ProcessGroupOptions::groupName ("" for the default group)
  std::vector<int> parentRanks;  // ProcessGroupOptions::parentRanks (empty: not a subgroup)
  std::string backend;           // "tcp", "verbs", "nccl"
  std::string host;
  int64_t pid = 0;
  std::string reason;     // why it was dumped: "SIGUSR1", "request", "failure", ...
  int64_t timeUs = 0;     // when, in microseconds since the Unix epoch
  uint64_t capacity = 0;  // ring entries
  uint64_t recorded = 0;  // operations recorded in all (older ones were overwritten)
  uint64_t lastSeq = 0;   // sequence number of the last collective issued
  // This rank's clock minus the group's rank 0's, as estimated (NTP-style, through the store;
  // docs/diagnostics.md, "Clocks"), and the estimate's bound: the true offset lies within
  // clockOffsetUs +- clockErrorUs. Every time in the dump is in this rank's clock; subtract
  // clockOffsetUs for rank 0's. 0, 0: not estimated (rank 0, heartbeats off, an old dump).
  int64_t clockOffsetUs = 0;
  int64_t clockErrorUs = 0;
  std::vector<OpRecord> entries;  // oldest first
  // This process's other live groups, in the order they were created (version 2; empty in
  // older dumps).
  std::vector<OtherGroup> otherGroups;
};

// 2: parent_ranks and other_groups. parseDump reads versions 1 and 2.
inline constexpr int kDumpFormatVersion = 2;

std::string toJson(const RankDump& dump);
// Throws InvalidArgumentError "<source>: ... at byte <offset>" or "<source>: <field>: ...".
RankDump parseDump(const std::string& text, const std::string& source);

// The analysis: `dumps[r]` is rank r's record, or nullopt when it never arrived (dead,
// stopped, or cut off from the store). Finds the first collective that did not complete on
// every rank and says who never entered it and what they do instead, who issued a different
// collective at that sequence number (both signatures), who waits in it, and whose record is
// missing. A rank that never entered it but is inside an operation of another group of its
// process (RankDump::otherGroups) is named with that operation, and when a rank waiting here
// has not entered that one, the two groups' different call orders are named (a cross-group
// deadlock). The first line is the summary; further lines ("  rank 2: ...") give each rank's
// current operation. `absentWhy[r]`, when given and not empty, says why rank r has no record
// (from its heartbeat: "dead: ...", "alive but not progressing: ...").
std::string explain(const std::vector<std::optional<RankDump>>& dumps,
                    const std::vector<std::string>& absentWhy = {});

// A live job, from outside (loom-doctor --attach): asks every rank's listener of the group whose
// keys live in `store` (the group's PrefixStore, e.g. "default_pg" for initProcessGroup) for a
// dump now and collects them for up to `wait`; a rank that does not answer is nullopt. Blocks
// at most about `wait` (plus the store's own deadline for a store that stopped answering).
std::vector<std::optional<RankDump>> collectLive(Store& store, int size,
                                                 std::chrono::milliseconds wait);

}  // namespace loom::diag

namespace loom::diag {

// For each rank without a record in `dumps`, why, from its heartbeat in the group's `store`
// (flight/heartbeat/<rank>): "dead: its process 4242 on node7 no longer exists (...)", "alive but
// not progressing: its process ... is stopped ...", or what the heartbeat's age says when the
// process is on another host. Empty for ranks with a record; a store that fails leaves the notes
// it could not read empty. For explain()'s `absentWhy`. `nowUs`: now on the group's rank 0's
// clock (heartbeat ages are measured on it); unset: this host's clock, uncorrected.
std::vector<std::string> absentNotes(Store& store,
                                     const std::vector<std::optional<RankDump>>& dumps,
                                     std::optional<int64_t> nowUs = std::nullopt);

}  // namespace loom::diag

namespace loom::diag {

// Stragglers: per collective, each rank's arrival (its start time in the flight record) relative
// to the earliest rank's; aggregated per rank over the collectives every record holds and every
// rank completed. The latest to arrive is the one the others waited for.
struct StragglerRow {
  int rank = 0;
  uint64_t collectives = 0;  // collectives in the sample
  double p50LatenessUs = 0;  // lateness: this rank's start minus the earliest start
  double p99LatenessUs = 0;
  double maxLatenessUs = 0;
  uint64_t lastArrivals = 0;  // collectives where this rank arrived last
};
struct StragglerTable {
  uint64_t firstSeq = 0, lastSeq = 0;  // the collectives sampled (0, 0: none)
  std::vector<StragglerRow> ranks;     // one per rank with a record, by rank
  // The rank with the highest p50 lateness (ties: more last arrivals), -1 when no sample.
  int slowest() const;
  // One line per rank and a summary ("slowest rank: 2 (p50 +31.0 us, p99 +120.0 us, last in
  // 87% of 1000 collectives)").
  std::string format() const;
};
// Start times are put on rank 0's clock first (each record's clockOffsetUs subtracted), so that
// ranks on hosts whose clocks disagree compare as well as the offsets were estimated.
StragglerTable stragglers(const std::vector<std::optional<RankDump>>& dumps);

}  // namespace loom::diag
