// Leaving a group (group_diagnostics.h, "Leaving"): this rank's diagnostics stop using the
// store, and the process that hosts the store's server waits for the other ranks to do the same
// before it lets the server go.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "diagnostics/group_diagnostics_core.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"

namespace loom::diag {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr const char* kStoreHostKey = "flight/store-host";
// How long a leaving rank gives its threads to stop using the store (a listener must see its
// stop request; a beat or a clock sample in flight must end).
constexpr milliseconds kLeaveStopWait{2000};
// How often the host looks at the liveness of the ranks it still waits for.
constexpr milliseconds kLivenessPoll{200};

std::string byeKey(const std::string& nonce, int rank) {
  return "flight/bye/" + nonce + "/" + std::to_string(rank);
}

// Whether `rank` will not say goodbye: its process is gone, or it stopped progressing (its
// heartbeat no longer advances). A rank with heartbeats off, or alive, is waited for.
bool wontLeave(GroupDiagnostics::Core& core, int rank) {
  const int64_t now = core.clockUs() - core.clockOffsetUs.load(std::memory_order_relaxed);
  const std::optional<std::string> liveness = storedLiveness(*core.store, rank, now);
  return liveness && (liveness->rfind("dead:", 0) == 0 ||
                      liveness->find("not progressing") != std::string::npos);
}

// The host's wait for every other rank's goodbye, until `deadline`.
void awaitGoodbyes(GroupDiagnostics::Core& core, Clock::time_point deadline) {
  Store& store = *core.store;
  std::vector<int> missing;
  for (int r = 0; r < core.id.size; ++r) {
    if (r != core.id.rank) missing.push_back(r);
  }
  for (;;) {
    std::vector<int> still;
    std::vector<std::string> keys;
    for (int r : missing) {
      if (store.check({byeKey(core.storeHostNonce, r)})) continue;
      if (wontLeave(core, r)) continue;
      still.push_back(r);
      keys.push_back(byeKey(core.storeHostNonce, r));
    }
    missing = std::move(still);
    if (missing.empty()) return;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      std::string ranks;
      for (int r : missing) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      LOOM_LOG_INFO("rank ", core.id.rank, ": leaving the group, and with it the store this ",
                    "process hosts, before rank(s) ", ranks,
                    " left it (destroy_process_group / the group's destruction); their use of "
                    "the store will fail once this process exits");
      return;
    }
    try {
      store.wait(keys, std::min(left, kLivenessPoll));
      return;                        // every one said goodbye
    } catch (const TimeoutError&) {  // NOLINT(bugprone-empty-catch): look at liveness again
    }
  }
}

// The leaver's store work, on its own thread: stops the listener and a clock sample's wait,
// waits for this rank's threads to stop, then says goodbye (or, on the host, waits for the
// others').
void leaveOnThread(const std::shared_ptr<GroupDiagnostics::Core>& core, std::string clockKey,
                   milliseconds wait) {
  Store& store = *core->store;
  try {
    requestDump(store, core->id.rank, kStopReason);
    if (!clockKey.empty()) store.set(clockKey, "stop");
  } catch (const std::exception& e) {
    LOOM_LOG_INFO("rank ", core->id.rank,
                  ": could not stop the flight record listener: ", e.what());
  }
  bool stopped = false;
  {
    std::unique_lock<std::mutex> lock(core->mu);
    stopped = core->finished.wait_for(lock, kLeaveStopWait, [&] {
      return core->listenerDone && core->heartbeatDone && !core->clockRoundRunning.load();
    });
  }
  if (stopped && core->id.size > 1) {
    try {
      if (!core->storeHostNonce.empty()) {
        if (wait.count() > 0) awaitGoodbyes(*core, Clock::now() + wait);
      } else if (store.check({kStoreHostKey})) {
        store.set(byeKey(store.getString(kStoreHostKey), core->id.rank), "1");
      }
    } catch (const std::exception& e) {
      LOOM_LOG_INFO("rank ", core->id.rank, ": goodbye through the store: ", e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(core->mu);
    core->leaverDone = true;
  }
  core->finished.notify_all();
}

}  // namespace

void announceStoreHost(GroupDiagnostics::Core& core) {
  if (!core.id.hostsStore || core.id.size < 2) return;
  std::random_device rd;
  const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  core.storeHostNonce = std::to_string(nonce);
  core.store->set(kStoreHostKey, core.storeHostNonce);
}

void leaveGroup(const std::shared_ptr<GroupDiagnostics::Core>& core, milliseconds wait) {
  std::string clockKey;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    if (core->leaving) return;
    core->leaving = true;
    core->stopping = true;
    clockKey = core->clockWaitKey;
  }
  core->finished.notify_all();
  const Clock::time_point deadline = Clock::now() + kLeaveStopWait + wait + milliseconds(100);
  // The store may not answer (its host is stopped): its work runs on a thread of its own, and
  // this wait is bounded.
  try {
    std::thread(leaveOnThread, core, std::move(clockKey), wait).detach();
  } catch (const std::exception& e) {
    LOOM_LOG_INFO("rank ", core->id.rank, ": no thread to leave the group: ", e.what());
    return;  // the listener ends with the store
  }
  std::unique_lock<std::mutex> lock(core->mu);
  core->finished.wait_until(lock, deadline, [&] { return core->leaverDone; });
}

}  // namespace loom::diag
