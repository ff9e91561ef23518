#include "diagnostics/flight_recorder.h"

#include <chrono>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace loom::diag {

namespace {

int64_t systemUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t slotsFor(size_t capacity) {
  uint64_t slots = 1;
  while (slots < capacity) slots <<= 1;
  return slots;
}

}  // namespace

bool FlightRecorder::tscIsInvariant() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, eax, ebx, ecx, edx);
  return (edx & (1u << 8)) != 0;
#else
  return false;
#endif
}

FlightRecorder::FlightRecorder(size_t capacity, comm::Algorithm algorithm)
    : capacity_(capacity),
      mask_(slotsFor(capacity) - 1),
      algorithm_(algorithm),
      useTsc_(tscIsInvariant()),
      slots_(std::make_unique<Slot[]>(slotsFor(capacity))),
      steadyOriginNs_(static_cast<int64_t>(steadyNs())),
      ticksOrigin_(ticks()) {}

void FlightRecorder::setPreciseEvery(uint64_t every) {
  preciseMask_ = slotsFor(every == 0 ? 1 : every) - 1;
}

std::vector<OpRecord> FlightRecorder::snapshot() const {
  // Raw times -> Unix microseconds, anchored now: a time's distance from now on the monotonic
  // clock, subtracted from the system clock now. The TSC's rate is measured over the group's
  // lifetime (its readings against the steady clock's at construction and now: a 40 ns read
  // over even a millisecond is a 4e-5 error). Anchoring at the read, not at construction,
  // keeps ranks of one host consistent with each other when they read their rings together
  // (stragglers(), the failure analysis): the system clock's offset from the monotonic one
  // (NTP's slewing) is then the same for all of them.
  const int64_t steadyNow = static_cast<int64_t>(steadyNs());
  const uint64_t ticksNow = ticks();
  const int64_t systemNowUs = systemUs();
  const double nsPerTick = useTsc_ && ticksNow > ticksOrigin_ && steadyNow > steadyOriginNs_
                               ? static_cast<double>(steadyNow - steadyOriginNs_) /
                                     static_cast<double>(ticksNow - ticksOrigin_)
                               : 1.0;
  // Monotonic nanoseconds (the coarse clock's too: it is the same clock at tick resolution).
  const auto monotonicToUs = [&](double ns) -> int64_t {
    return systemNowUs - static_cast<int64_t>((static_cast<double>(steadyNow) - ns) / 1000);
  };
  const auto coarseToUs = [&](uint64_t ns) -> int64_t {
    return ns == 0 ? 0 : monotonicToUs(static_cast<double>(ns));
  };
  const auto ticksToUs = [&](uint64_t t, bool tick) -> int64_t {
    if (t == 0) return 0;
    if (tick || !useTsc_) return monotonicToUs(static_cast<double>(t));
    // Signed: another thread may have stamped after ticksNow was read.
    const double ago = (static_cast<double>(ticksNow) - static_cast<double>(t)) * nsPerTick;
    return monotonicToUs(static_cast<double>(steadyNow) - ago);
  };
  const uint64_t last = next_.load(std::memory_order_acquire);
  const uint64_t first = last > capacity_ ? last - capacity_ + 1 : 1;
  std::vector<OpRecord> out;
  out.reserve(last - first + 1);
  constexpr auto r = std::memory_order_relaxed;
  for (uint64_t id = first; id <= last; ++id) {
    const Slot& slot = slotOf(id);
    uint64_t w[kWords] = {};
    bool ok = false;
    for (int attempt = 0; attempt < 16 && !ok; ++attempt) {
      const uint64_t v1 = slot.words[kStamp].load(std::memory_order_acquire);
      if (v1 & kBusy) {
        std::this_thread::yield();
        continue;
      }
      w[kStamp] = v1;
      for (size_t i = 1; i < kWords; ++i) w[i] = slot.words[i].load(r);
      std::atomic_thread_fence(std::memory_order_acquire);
      ok = slot.words[kStamp].load(r) == v1;
    }
    if (!ok || (w[kStamp] >> kIdShift) != id) continue;  // kept changing, or already overwritten
    OpRecord rec;
    rec.id = id;
    rec.seq = w[kSeq];
    rec.type = static_cast<OpType>(w[kKind] & 0xff);
    rec.dtype = static_cast<DType>((w[kKind] >> 8) & 0xff);
    rec.reduceOp = static_cast<ReduceOp>((w[kKind] >> 16) & 0xff);
    rec.state = static_cast<OpState>((w[kStamp] & kStateMask) >> kStateShift);
    rec.algorithm = static_cast<comm::Algorithm>((w[kKind] >> 24) & 0xff);
    rec.root = static_cast<int32_t>(static_cast<uint32_t>(w[kKind] >> 32));
    rec.peer = (w[kStamp] & kPeerSet) != 0 ? static_cast<int32_t>(w[kPeer] & 0xffffffffu) : -1;
    rec.count = w[kCount];
    rec.bytes = w[kCount] * dtypeSize(rec.dtype);
    rec.issueUs = coarseToUs(w[kIssue]);
    const bool ended = rec.state == OpState::kDone || rec.state == OpState::kFailed;
    rec.startUs =
        (w[kStamp] & kStartSet) != 0 ? ticksToUs(w[kStart], (w[kStamp] & kStartTick) != 0) : 0;
    rec.endUs = ended ? ticksToUs(w[kEnd], (w[kStamp] & kEndTick) != 0) : 0;
    rec.precise = (w[kStamp] & (kStartTick | kEndTick)) == 0;
    // A tick is late by up to a nap: it cannot put the end before the start, nor the start
    // before the issue (clamped below).
    if (rec.endUs != 0 && rec.endUs < rec.startUs) rec.endUs = rec.startUs;
    // The coarse clock lags by up to one tick: an issue time after the start is that lag.
    if (rec.startUs != 0 && rec.issueUs > rec.startUs) rec.issueUs = rec.startUs;
    out.push_back(rec);
  }
  return out;
}

}  // namespace loom::diag
