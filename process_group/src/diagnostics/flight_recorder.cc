#include "diagnostics/flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

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
      marks_(std::make_unique<Mark[]>(slotsFor(capacity))),
      steadyOriginNs_(static_cast<int64_t>(steadyNs())),
      ticksOrigin_(ticks()) {}

void FlightRecorder::setPreciseEvery(uint64_t every) {
  preciseMask_ = slotsFor(every == 0 ? 1 : every) - 1;
}

void FlightRecorder::markProgress(uint64_t steadyNs) {
  const uint64_t ended = progress_.ended.load(std::memory_order_acquire);
  // Withdrawing the tick (0): the thread is about to sleep or run an operation itself, and the
  // last ends still need a time: read the clock (rare: a transition, not an operation).
  const uint64_t ns = steadyNs != 0 ? steadyNs : FlightRecorder::steadyNs();
  const uint64_t index = marked_.load(std::memory_order_relaxed);
  Mark& mark = marks_[index & mask_];
  // Readers drop the marks a write in progress may have reached (snapshot()): announce this
  // one first, as the seqlock's busy stamp does.
  marked_.store(index + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  mark.ended.store(ended, std::memory_order_relaxed);
  mark.ns.store(ns, std::memory_order_relaxed);
  // The mark is whole for readers that see this.
  lastMarked_ = ended;
  markedWhole_.store(index + 1, std::memory_order_release);
}

void FlightRecorder::failInOrder(uint64_t id, int peer) {
  Slot& slot = slotOf(id);
  constexpr auto r = std::memory_order_relaxed;
  const uint64_t stamp = slot.words[kStamp].load(r);
  if ((stamp >> kIdShift) != id) return;  // the ring wrapped onto it
  slot.words[kStart].store(progress_.startTick.load(r), r);
  endWrite(slot, stamp | kStartSet | kStartTick);
  recordEnd(id, true, peer);
}

bool FlightRecorder::readEntry(uint64_t id, uint64_t (&w)[kWords]) const {
  const Slot& slot = slotOf(id);
  constexpr auto r = std::memory_order_relaxed;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint64_t v1 = slot.words[kStamp].load(std::memory_order_acquire);
    if (v1 & kBusy) {
      std::this_thread::yield();
      continue;
    }
    w[kStamp] = v1;
    for (size_t i = 1; i < kWords; ++i) w[i] = slot.words[i].load(r);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.words[kStamp].load(r) == v1) return (v1 >> kIdShift) == id;  // else overwritten
  }
  return false;  // kept changing
}

std::vector<OpRecord> FlightRecorder::snapshot(size_t newest) const {
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

  // 1. The entries' words, oldest first.
  struct Raw {
    uint64_t id;
    uint64_t w[kWords];
  };
  const uint64_t last = next_.load(std::memory_order_acquire);
  const uint64_t kept = std::min<uint64_t>(capacity_, newest);
  const uint64_t first = last > kept ? last - kept + 1 : 1;
  std::vector<Raw> raws;
  raws.reserve(last - first + 1);
  for (uint64_t id = first; id <= last; ++id) {
    Raw raw{id, {}};
    if (readEntry(id, raw.w)) raws.push_back(raw);  // else kept changing, or overwritten
  }
  const auto stateOf = [](const Raw& raw) {
    return static_cast<OpState>((raw.w[kStamp] & kStateMask) >> kStateShift);
  };
  const auto collective = [](const Raw& raw) {
    const auto type = static_cast<OpType>(raw.w[kKind] & 0xff);
    return type != OpType::kSend && type != OpType::kRecv;
  };

  // 2. In-order collectives' progress (see the header), read after the entries, so that an
  // entry still queued on its own words is reported as it is now; and the marks, oldest
  // first: those whole when read and not overwritten while being read.
  const uint64_t lastStarted = progress_.started.load(std::memory_order_acquire);
  const uint64_t startTick = progress_.startTick.load(std::memory_order_relaxed);
  const uint64_t lastEnded = progress_.ended.load(std::memory_order_acquire);
  std::vector<std::pair<uint64_t, uint64_t>> marks;  // (last ended id, steady ns)
  if (inOrder_.load(std::memory_order_relaxed)) {
    const uint64_t slots = mask_ + 1;
    const uint64_t whole = markedWhole_.load(std::memory_order_acquire);
    const uint64_t from = whole > slots ? whole - slots : 0;
    marks.reserve(whole - from);
    for (uint64_t i = from; i < whole; ++i) {
      const Mark& m = marks_[i & mask_];
      marks.emplace_back(m.ended.load(std::memory_order_relaxed),
                         m.ns.load(std::memory_order_relaxed));
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t begun = marked_.load(std::memory_order_relaxed);
    // A mark begun after the copy may have overwritten the oldest ones copied.
    const uint64_t keepFrom = begun > slots ? begun - slots : 0;
    if (keepFrom > from) {
      marks.erase(marks.begin(),
                  marks.begin() + static_cast<std::ptrdiff_t>(std::min(keepFrom, whole) - from));
    }
    // The group's collectives end in issue order: one that ended, by its entry or by the
    // progress words, means every collective before it ended too. An entry written on its
    // own words that was read unfinished before such a one was read before it ended: read
    // it again.
    const auto finished = [&](const Raw& raw) {
      const OpState st = stateOf(raw);
      if (st == OpState::kDone || st == OpState::kFailed) return true;
      return (raw.w[kStamp] & kInOrder) != 0 && st == OpState::kQueued && raw.id <= lastEnded;
    };
    bool finishedAfter = false;
    for (size_t i = raws.size(); i-- > 0;) {
      Raw& raw = raws[i];
      if (!collective(raw)) continue;
      if (finished(raw)) {
        finishedAfter = true;
      } else if (finishedAfter && (raw.w[kStamp] & kInOrder) == 0) {
        Raw again{raw.id, {}};
        if (readEntry(raw.id, again.w)) raw = again;
      }
    }
  }

  // 3. The records.
  size_t nextMark = 0;            // the first mark not before the entry at hand
  int64_t prevCollectiveEnd = 0;  // the previous collective's end, Unix microseconds
  std::vector<OpRecord> out;
  out.reserve(raws.size());
  for (const Raw& raw : raws) {
    const uint64_t id = raw.id;
    const uint64_t(&w)[kWords] = raw.w;
    OpRecord rec;
    rec.id = id;
    rec.seq = w[kSeq];
    rec.type = static_cast<OpType>(w[kKind] & 0xff);
    rec.dtype = static_cast<DType>((w[kKind] >> 8) & 0xff);
    rec.reduceOp = static_cast<ReduceOp>((w[kKind] >> 16) & 0xff);
    rec.state = stateOf(raw);
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
    if ((w[kStamp] & kInOrder) != 0 && rec.state == OpState::kQueued) {
      // Nothing written since the issue: the progress words tell.
      if (id <= lastEnded) {
        rec.state = OpState::kDone;
        rec.precise = false;
        while (nextMark < marks.size() && marks[nextMark].first < id) ++nextMark;
        // Ended before the first mark that saw it ended; after the last mark: before now.
        rec.endUs = nextMark < marks.size()
                        ? monotonicToUs(static_cast<double>(marks[nextMark].second))
                        : systemNowUs;
        // It started once issued and once the collective before it ended (one at a time).
        rec.startUs = std::min(std::max(rec.issueUs, prevCollectiveEnd), rec.endUs);
      } else if (id == lastStarted) {
        rec.state = OpState::kRunning;
        rec.precise = false;
        // The tick it started at, or the previous collective's end (a mark, later than the
        // tick by up to a nap) when that is later: never before the one before it ended.
        rec.startUs = std::max(ticksToUs(startTick, true), prevCollectiveEnd);
      }
    }
    // A tick is late by up to a nap: it cannot put the end before the start, nor the start
    // before the issue (clamped below).
    if (rec.endUs != 0 && rec.endUs < rec.startUs) rec.endUs = rec.startUs;
    // The coarse clock lags by up to one tick: an issue time after the start is that lag.
    if (rec.startUs != 0 && rec.issueUs > rec.startUs) rec.issueUs = rec.startUs;
    if (rec.type != OpType::kSend && rec.type != OpType::kRecv && rec.endUs != 0) {
      prevCollectiveEnd = rec.endUs;
    }
    out.push_back(rec);
  }
  return out;
}

}  // namespace loom::diag
