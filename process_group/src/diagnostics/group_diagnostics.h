// GroupDiagnostics: what one ProcessGroup keeps for diagnostics (the flight recorder) and the
// machinery that gets its record out: dumps to the store and to files, a listener that
// answers other ranks' dump requests, SIGUSR1, and the failure analysis run on the spot.
// Private to loom_process_group.
//
// Contract
// - Owned by its ProcessGroup (created when flightRecorderEntries > 0). The recorder is written
//   on the hot path (flight_recorder.h); everything else here runs off it.
// - Store keys, under the group's store (a PrefixStore per group):
//     flight/<rank>                 the latest dump on request or SIGUSR1
//     flight/failure/<rank>         the record at a failure (published by the failing rank, or
//                                   by a live rank's listener when asked)
//     flight/request/<rank>/<n>     the n-th dump request to a rank (its value: the reason)
//     flight/requests/<rank>        how many requests a rank got (add); a listener starts
//                                   after the count it finds, so that a group never answers an
//                                   earlier group's requests on the same store
//     flight/requested              set once: the first failing rank asks every other rank
//     flight/analysis               the explanation; the first rank to compute one sets it and
//                                   every rank's error carries that one
//     flight/heartbeat/<rank>       the rank's heartbeat (Heartbeat below), rewritten every
//                                   heartbeat interval by a thread of its own
//     flight/clock/ready            set by rank 0 once its listener answers clock requests
//     flight/clock/<rank>/<n>       rank 0's answer to rank's n-th clock request ("t1 t2")
// - Clocks: every rank but 0 estimates its clock's offset to rank 0's, NTP-style, through the
//   store: t0 (its clock) as it posts a dump request "clock <rank> <n>" to rank 0's listener,
//   t1 as rank 0's listener wakes to it and t2 as it answers (rank 0's clock), t3 as the answer
//   wakes the rank; rank 0's clock minus this one's is ((t1 - t0) + (t2 - t3)) / 2, within half
//   the round trip (t3 - t0) - (t2 - t1). A round of three samples runs on a thread of its own
//   (started by the heartbeat thread as it starts, again at each beat until one round succeeded,
//   then every kClockRefreshBeats beats; its waits, up to 5 s, never delay a beat), after
//   flight/clock/ready; the sample with the smallest round trip of a round is kept. Heartbeats and
//   dumps carry the estimate (clockOffsetUs), so that readers put their times on rank 0's clock.
//   Without heartbeats there is no estimate.
// - The listener is one thread per group blocked in Store::wait on its next request key (the
//   TCPStore answers from the server, no polling; a FileStore polls). The destructor posts a
//   stop request and waits for it at most kListenerStopWait; a listener stuck in a store that
//   no longer answers is left to end with the store's deadline (it owns what it touches).
// - The heartbeat thread sleeps on a condition variable between beats; the first beat is
//   written by the constructor (also with heartbeats off: interval 0, no thread), so that a
//   rank stopped right after joining is still known by host and pid. A beat that fails with IoError
//   (the store is gone) ends the thread.
// - SIGUSR1: the first group with a recorder installs a handler when SIGUSR1 has its default
//   disposition (a program's own handler is never replaced). The handler only writes a byte
//   to a pipe; a process-wide thread reads it and dumps every live group (reason "SIGUSR1").
// - Leaving (leave(), the destructor): the listener, the heartbeat and a running clock round are
//   stopped, and waited for (a stop request to the listener, the clock sample's answer key set
//   by the leaver; at most kLeaveStopWait in all), so that this rank no longer uses the store.
//   Then the goodbye, for a store whose server runs in one of the ranks' processes (torch's
//   TCPStore runs it in rank 0 under env://; initProcessGroup's too): its server must not go
//   while another rank still uses it, or that rank's requests fail (torch's TCPStore client
//   prints each failure with a backtrace). The process that hosts it (Identity::hostsStore)
//   announces itself at construction under flight/store-host (a random nonce); every other rank,
//   as it leaves, sets flight/bye/<nonce>/<rank>; the host's leave(wait) waits until every other
//   rank said goodbye, or is dead or stuck (livenessOf), or `wait` passed. Only the host waits:
//   ranks that leave in different orders across groups never wait on each other. The store
//   work runs on a thread of its own (a store that does not answer holds up no destructor); the
//   caller waits for it at most kLeaveStopWait, plus `wait` on the host.
//   Keys: flight/store-host (the host's nonce), flight/bye/<nonce>/<rank>.
// - Dump files: <dumpDir>/loom-flight-<group>-rank<r>.json ("default" when the group has no
//   name), written to a temporary name and renamed, so a reader never sees half a file.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diagnostics/flight_recorder.h"
#include "loom/process_group/diagnostics.h"

namespace loom {
class Store;
}

namespace loom::diag {

struct Identity {
  int rank = 0;
  int size = 1;
  std::string group;
  std::string backend;
  std::vector<int> parentRanks{};  // ProcessGroupOptions::parentRanks
  // This process hosts the server of the group's store: its exit takes the store away from
  // the other ranks ("Leaving").
  bool hostsStore = false;
};

class GroupDiagnostics {
 public:
  // `heartbeat`: the interval between heartbeats; 0 = none. `clockSkewUs` (tests only): added
  // to every time this rank's diagnostics read, as on a host whose clock is that far off.
  GroupDiagnostics(Identity identity, std::shared_ptr<Store> store, size_t entries,
                   comm::Algorithm algorithm, std::string dumpDir,
                   std::chrono::milliseconds heartbeat, int64_t clockSkewUs = 0);
  ~GroupDiagnostics();
  GroupDiagnostics(const GroupDiagnostics&) = delete;
  GroupDiagnostics& operator=(const GroupDiagnostics&) = delete;

  FlightRecorder& recorder();

  // Stops this rank's use of the store and says goodbye ("Leaving"); on the process that hosts
  // the store, waits up to `wait` for every other rank's goodbye. Idempotent (a later call
  // returns at once); never throws. The destructor calls it with no wait.
  void leave(std::chrono::milliseconds wait);

  // The record as JSON, written whole to the dump directory when one is set (never throws for
  // the file: a failed write is a warning). Returns the JSON of the newest `maxEntries`.
  std::string dumpLocal(const std::string& reason, size_t maxEntries = SIZE_MAX);
  // The record as JSON, written nowhere.
  std::string recordJson(const std::string& reason);
  // What a failure publishes in the store for the analysis: the newest entries only (the
  // analysis looks at the last collectives), so that gathering every rank's record stays small
  // at scale.
  static constexpr size_t kFailureEntries = 128;
  // dumpLocal, then published under flight/<rank> (or flight/failure/<rank> when the reason is
  // "failure"); may block on the store up to its timeout. Returns the JSON.
  std::string dump(const std::string& reason);

  struct Core;

 private:
  std::shared_ptr<Core> core_;
};

// What a rank's heartbeat says: where its process runs and how far it got.
struct Heartbeat {
  int64_t timeUs = 0;  // when it was written (Unix epoch, the rank's clock)
  int64_t pid = 0;
  uint64_t beat = 0;      // 1, 2, ...
  uint64_t lastSeq = 0;   // the last collective issued
  uint64_t recorded = 0;  // operations recorded
  int64_t intervalMs = 0;
  std::string host;   // hostname
  std::string pidNs;  // the pid namespace ("pid:[4026531836]"): pids compare only within one
  // The writer's clock minus rank 0's, and the estimate's bound (GroupDiagnostics, "Clocks");
  // 0, 0 when not estimated.
  int64_t clockOffsetUs = 0;
  int64_t clockErrorUs = 0;
  std::string text() const;
  // Nullopt when `text` is not a heartbeat.
  static std::optional<Heartbeat> parse(const std::string& text);
};

// This process's side of a liveness check: whether `hb`'s process can be looked at from here
// (same host and pid namespace), and what it is: "dead: ...", "alive but not progressing: ...",
// or, when it cannot be looked at, what the heartbeat's age says. `nowUs`: now on rank 0's
// clock (the reader's clock minus its clockOffsetUs); the heartbeat's time is put on rank 0's
// clock by its own clockOffsetUs, so that its age is right across hosts whose clocks disagree.
std::string livenessOf(const Heartbeat& hb, int64_t nowUs);

// ProcessGroup::stragglers: publishes `record` as round `round`'s, waits up to `timeout` for every
// rank's and computes the table; removes this rank's key of the round before. Every rank then
// says it has read them, and `waiter` (the rank whose process hosts the store) waits for that
// (bounded by `timeout`) before it returns: a program that exits right after stragglers() must
// not take the store away from ranks still reading it.
StragglerTable exchangeStragglers(Store& store, int rank, int size, const std::string& record,
                                  uint64_t round, std::chrono::milliseconds timeout, int waiter);

// The rank a failure message says it waited for ("... waiting for rank 3 ..."), or -1.
int peerNamedIn(const std::string& message);

// For the failure exchange (comm_backend_impl.h), on its own thread:
// publishes this rank's failure record (`ring`, JSON) and, when it is the first rank to fail,
// asks every other rank's listener for theirs.
void publishFailureRecord(Store& store, int rank, int size, const std::string& ring);
// Whether rank `rank`'s heartbeat names a process that is gone (same host and pid namespace:
// no such process, or a zombie). False when it cannot tell (another host, no heartbeat).
bool knownDead(Store& store, int rank);
// livenessOf rank `rank`'s heartbeat in `store` at `nowUs` (on rank 0's clock); nullopt when it
// has none, it is unreadable, or the store timed out.
std::optional<std::string> storedLiveness(Store& store, int rank, int64_t nowUs);
// Waits until every non-empty keyOf[r] is set, `deadline` passes, or every rank whose key is
// still missing is knownDead: a dead rank never publishes, so its wait ends at once instead of
// at the deadline. Polls liveness every 100 ms; a store that fails (not a timeout) throws.
void waitForRanks(Store& store, const std::vector<std::string>& keyOf,
                  std::chrono::steady_clock::time_point deadline);
// Waits until `deadline` for every rank's failure record (not for ranks known dead), explains
// them, and returns the group's one explanation (the first one set in the store).
std::string explainFailure(Store& store, int rank, int size,
                           std::chrono::steady_clock::time_point deadline);

}  // namespace loom::diag
