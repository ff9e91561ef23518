// The clock offset estimate of a group's diagnostics (group_diagnostics.h, "Clocks"): every rank
// but 0 estimates its clock minus rank 0's, NTP-style, through dump requests to rank 0's listener
// and its answers in the store (flight/clock/<rank>/<n>).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>

#include "diagnostics/group_diagnostics_core.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"

namespace loom::diag {

namespace {

using std::chrono::milliseconds;

std::string clockReplyKey(int rank, uint64_t n) {
  return "flight/clock/" + std::to_string(rank) + "/" + std::to_string(n);
}
// Clock samples per round.
constexpr int kClockSamples = 3;
// A clock round's waits: for rank 0's listener to start, and for each answer.
constexpr milliseconds kClockWait{5000};

// One NTP-style sample through rank 0's listener: this rank's clock minus rank 0's and the round
// trip, or nullopt when rank 0 did not answer within `wait`.
struct ClockSample {
  int64_t offsetUs = 0;
  int64_t roundTripUs = 0;
};
std::optional<ClockSample> sampleClock(GroupDiagnostics::Core& core, milliseconds wait) {
  Store& store = *core.store;
  const uint64_t n = ++core.clockRequests;
  const std::string reply = clockReplyKey(core.id.rank, n);
  {
    // leaveGroup ends the wait below by setting `reply` (its value then parses as no answer).
    std::lock_guard<std::mutex> lock(core.mu);
    if (core.stopping) return std::nullopt;
    core.clockWaitKey = reply;
  }
  struct Clear {
    GroupDiagnostics::Core& core;
    ~Clear() {
      std::lock_guard<std::mutex> lock(core.mu);
      core.clockWaitKey.clear();
    }
  } clear{core};
  const int64_t k = store.add(requestCountKey(0), 1);
  const int64_t t0 = core.clockUs();
  store.set(requestKey(0, k), detail::str(kClockReason, core.id.rank, " ", n));
  try {
    store.wait({reply}, wait);
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
  const int64_t t3 = core.clockUs();
  std::istringstream in(store.getString(reply));
  try {
    store.deleteKey(reply);
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): a store that cannot
    // delete (torch 1.13's Python stores) keeps the answer: a few bytes per sample
  }
  int64_t t1 = 0;
  int64_t t2 = 0;
  if (!(in >> t1 >> t2)) return std::nullopt;
  ClockSample sample;
  // theta = ((t1 - t0) + (t2 - t3)) / 2 is rank 0's clock minus this one's.
  sample.offsetUs = -((t1 - t0) + (t2 - t3)) / 2;
  sample.roundTripUs = std::max<int64_t>((t3 - t0) - (t2 - t1), 0);
  return sample;
}

// A round of kClockSamples samples; the one with the smallest round trip becomes the estimate
// (its error bound: half that round trip). False when rank 0 answered none.
bool estimateClock(GroupDiagnostics::Core& core, milliseconds wait) {
  std::optional<ClockSample> best;
  for (int i = 0; i < kClockSamples; ++i) {
    const std::optional<ClockSample> s = sampleClock(core, wait);
    if (!s) break;  // rank 0 does not answer (yet): the next round tries again
    if (!best || s->roundTripUs < best->roundTripUs) best = s;
  }
  if (!best) return false;
  core.clockOffsetUs.store(best->offsetUs, std::memory_order_relaxed);
  core.clockErrorUs.store((best->roundTripUs + 1) / 2, std::memory_order_relaxed);
  return true;
}

}  // namespace

void answerClock(GroupDiagnostics::Core& core, const std::string& reason, int64_t t1) {
  std::istringstream in(reason.substr(std::strlen(kClockReason)));
  int rank = -1;
  uint64_t n = 0;
  if (!(in >> rank >> n) || rank < 0) return;
  core.store->set(clockReplyKey(rank, n), detail::str(t1, " ", core.clockUs()));
}

void clockRound(std::shared_ptr<GroupDiagnostics::Core> core) {
  try {
    if (!core->clockReady.load()) {
      // In slices, so that a leaving group's round ends within one (only rank 0 sets the key).
      constexpr milliseconds kSlice{250};
      for (milliseconds waited{0};; waited += kSlice) {
        {
          std::lock_guard<std::mutex> lock(core->mu);
          if (core->stopping) break;
        }
        try {
          core->store->wait({kClockReadyKey}, kSlice);
          core->clockReady.store(true);
          break;
        } catch (const TimeoutError&) {
          if (waited + kSlice >= kClockWait) throw;
        }
      }
    }
    if (estimateClock(*core, kClockWait)) core->clockEstimated.store(true);
  } catch (const std::exception& e) {
    LOOM_LOG_INFO("rank ", core->id.rank, ": clock estimate: ", e.what());
  }
  {
    std::lock_guard<std::mutex> lock(core->mu);  // leaveGroup waits for this under mu
    core->clockRoundRunning.store(false);
  }
  core->finished.notify_all();
}

}  // namespace loom::diag
