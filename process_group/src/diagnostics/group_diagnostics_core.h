// GroupDiagnostics::Core (group_diagnostics.h): what a group's diagnostics share with their
// threads (the listener, the heartbeat, the clock rounds, the SIGUSR1 watcher), and what
// group_diagnostics.cc and group_diagnostics_clock.cc (the clock offset estimate) both use.
// Private to loom_process_group.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "diagnostics/flight_recorder.h"
#include "diagnostics/group_diagnostics.h"
#include "loom/common/socket.h"
#include "loom/store/store.h"

namespace loom::diag {

// The store keys of dump requests (group_diagnostics.h, "Store keys").
inline std::string requestKey(int rank, int64_t n) {
  return "flight/request/" + std::to_string(rank) + "/" + std::to_string(n);
}
inline std::string requestCountKey(int rank) {
  return "flight/requests/" + std::to_string(rank);
}
inline std::string heartbeatKey(int rank) {
  return "flight/heartbeat/" + std::to_string(rank);
}
// The reason of the request that ends a listener.
constexpr const char* kStopReason = "stop";

// Asks `rank`'s listener for a dump with `reason`.
inline void requestDump(Store& store, int rank, const std::string& reason) {
  const int64_t n = store.add(requestCountKey(rank), 1);
  store.set(requestKey(rank, n), reason);
}

inline int64_t unixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct GroupDiagnostics::Core {
  Identity id;
  std::shared_ptr<Store> store;
  FlightRecorder recorder;
  std::string dumpDir;
  std::string host = net::hostname();
  // The process that made the group: a fork() child inherits its parent's live groups, which
  // are not its own (other_groups.cc leaves them out of its dumps).
  const long pid = static_cast<long>(::getpid());
  const std::chrono::milliseconds heartbeatInterval;
  const int64_t clockSkewUs;  // tests only: this rank's clock reads that far off
  // The estimate of this rank's clock minus rank 0's (GroupDiagnostics, "Clocks").
  std::atomic<int64_t> clockOffsetUs{0};
  std::atomic<int64_t> clockErrorUs{0};
  uint64_t clockRequests = 0;                  // the clock round's thread (one at a time)
  std::atomic<bool> clockReady{false};         // rank 0 answers clock requests
  std::atomic<bool> clockEstimated{false};     // a round succeeded
  std::atomic<bool> clockRoundRunning{false};  // a round's thread runs

  // The threads' ends and stop (under mu, signalled by `finished`): the listener's and the
  // heartbeat's ends, set by each as it returns; `stopping`, set by leaveGroup (or a failed
  // construction); `leaving`: leaveGroup ran; `leaverDone`: its thread ended.
  std::mutex mu;
  std::condition_variable finished;
  bool listenerDone = false;
  bool heartbeatDone = true;  // false while a heartbeat thread runs
  bool stopping = false;
  bool leaving = false;
  bool leaverDone = false;
  // The key a clock sample waits on for rank 0's answer (empty: none), so that leaveGroup can
  // end the wait by setting it (group_diagnostics_clock.cc).
  std::string clockWaitKey;
  uint64_t beats = 0;  // heartbeat thread (and the constructor, before it starts)
  // This process hosts the store's server: the key its goodbye waits on (group_diagnostics.h,
  // "Leaving"); empty otherwise.
  std::string storeHostNonce;

  Core(Identity i, std::shared_ptr<Store> s, size_t entries, comm::Algorithm algorithm,
       std::string dir, std::chrono::milliseconds heartbeat, int64_t skew)
      : id(std::move(i)),
        store(std::move(s)),
        recorder(entries, algorithm),
        dumpDir(std::move(dir)),
        heartbeatInterval(heartbeat),
        clockSkewUs(skew) {}

  // The clock every time of this rank's diagnostics comes from (Unix microseconds).
  int64_t clockUs() const { return unixMicros() + clockSkewUs; }

  // group_diagnostics.cc: writes this rank's heartbeat (flight/heartbeat/<rank>).
  void beat();
  // The record now, its times on this rank's clock.
  RankDump snapshot(const std::string& reason) const;
  // GroupDiagnostics::dumpLocal, dump; writeFile: the dump file (a warning when it fails).
  std::string dumpLocal(const std::string& reason, size_t maxEntries);
  void writeFile(const std::string& json) const;
  std::string dump(const std::string& reason);
};

// The clock offset estimate (group_diagnostics.h, "Clocks"; group_diagnostics_clock.cc).
// Set by rank 0 once its listener answers clock requests.
constexpr const char* kClockReadyKey = "flight/clock/ready";
// The reason of a clock request to rank 0's listener: "clock <rank> <n>".
constexpr const char* kClockReason = "clock ";
// Every how many heartbeats a round runs after the first successful one.
constexpr uint64_t kClockRefreshBeats = 60;

// Rank 0's listener, to "clock <rank> <n>": when it woke to the request (t1) and now (t2).
void answerClock(GroupDiagnostics::Core& core, const std::string& reason, int64_t t1);
// group_diagnostics_leave.cc (group_diagnostics.h, "Leaving"). announceStoreHost: in the
// constructor, when this process hosts the store, says so under flight/store-host. leaveGroup:
// GroupDiagnostics::leave and the destructor.
void announceStoreHost(GroupDiagnostics::Core& core);
void leaveGroup(const std::shared_ptr<GroupDiagnostics::Core>& core,
                std::chrono::milliseconds wait);

// A round of the clock estimate, on a thread of its own (its waits may outlast a heartbeat
// interval: on a store that polls, rank 0's listener answers up to a second late): waits for
// rank 0's listener to answer clock requests, then takes the best of its samples as the
// estimate. Clears core->clockRoundRunning when it ends.
void clockRound(std::shared_ptr<GroupDiagnostics::Core> core);

}  // namespace loom::diag
