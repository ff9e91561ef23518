#include "diagnostics/flight_recorder.h"

#include <time.h>

#include <chrono>
#include <thread>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace loom::diag {

namespace {

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t systemUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The issue time: the coarse monotonic clock (a few ns; it advances once per kernel tick, a
// few milliseconds, which is all the age of a queued or hung operation needs).
uint64_t coarseNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// Start and end: the time-stamp counter where there is one (a third of a clock_gettime's
// cost), converted in snapshot() through two (ticks, steady ns) pairs.
uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(steadyNs());
#endif
}

// kKind packs the small fields: type | dtype << 8 | reduce op << 16 | state << 24 |
// algorithm << 32. kRoot packs root (low 32 bits) and peer (high 32 bits).
uint64_t packKind(const OpDesc& op, comm::Algorithm algorithm) {
  return static_cast<uint64_t>(op.type) | static_cast<uint64_t>(op.dtype) << 8 |
         static_cast<uint64_t>(op.reduceOp) << 16 | static_cast<uint64_t>(OpState::kQueued) << 24 |
         static_cast<uint64_t>(algorithm) << 32;
}

uint64_t withState(uint64_t kind, OpState state) {
  return (kind & ~(uint64_t{0xff} << 24)) | static_cast<uint64_t>(state) << 24;
}

uint64_t packRoot(int root, int peer) {
  return static_cast<uint32_t>(root) | static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 32;
}

}  // namespace

FlightRecorder::FlightRecorder(size_t capacity, comm::Algorithm algorithm)
    : capacity_(capacity),
      algorithm_(algorithm),
      slots_(std::make_unique<Slot[]>(capacity)),
      steadyOriginNs_(steadyNs()),
      coarseOriginNs_(static_cast<int64_t>(coarseNs())),
      ticksOrigin_(ticks()),
      systemOriginUs_(systemUs()) {}

inline uint64_t FlightRecorder::beginWrite(Slot& slot) {
  // Odd while written. Plain stores, no read-modify-write: the writers of one entry are
  // ordered by the queue (see the header), so no two write it at once in practice.
  const uint64_t v = slot.version.load(std::memory_order_relaxed) | 1;
  slot.version.store(v, std::memory_order_relaxed);
  // Readers that see a field written after this also see the odd version.
  std::atomic_thread_fence(std::memory_order_release);
  return v;
}

inline void FlightRecorder::endWrite(Slot& slot, uint64_t version) {
  slot.version.store(version + 1, std::memory_order_release);
}

uint64_t FlightRecorder::recordIssue(const OpDesc& op) {
  // One writer (the issuing thread, under the group's issue lock): a plain store, not a locked
  // read-modify-write; readers only load it.
  const uint64_t id = next_.load(std::memory_order_relaxed) + 1;
  next_.store(id, std::memory_order_relaxed);
  Slot& slot = slotOf(id);
  const uint64_t v = beginWrite(slot);
  constexpr auto r = std::memory_order_relaxed;
  slot.words[kId].store(id, r);
  slot.words[kSeq].store(op.seq, r);
  slot.words[kKind].store(packKind(op, algorithm_), r);
  slot.words[kRoot].store(packRoot(op.root, -1), r);
  slot.words[kCount].store(op.count, r);
  slot.words[kBytes].store(op.count * dtypeSize(op.dtype), r);
  slot.words[kIssue].store(coarseNs(), r);
  slot.words[kStart].store(0, r);
  slot.words[kEnd].store(0, r);
  endWrite(slot, v);
  if (isCollective(op.type)) lastSeq_.store(op.seq, std::memory_order_relaxed);
  return id;
}

void FlightRecorder::setState(uint64_t id, OpState state, Word timeWord, int peer) {
  if (id == 0) return;  // not recorded
  const uint64_t now = ticks();
  Slot& slot = slotOf(id);
  constexpr auto r = std::memory_order_relaxed;
  // The ring wrapped onto this operation (more than `capacity` operations issued while it
  // waited): its entry belongs to a newer one now, and the update is dropped.
  if (slot.words[kId].load(r) != id) return;
  const uint64_t v = beginWrite(slot);
  slot.words[kKind].store(withState(slot.words[kKind].load(r), state), r);
  slot.words[timeWord].store(now, r);
  if (peer >= 0) {
    const uint64_t root = slot.words[kRoot].load(r) & 0xffffffffu;
    slot.words[kRoot].store(root | static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 32, r);
  }
  endWrite(slot, v);
}

void FlightRecorder::recordStart(uint64_t id) {
  setState(id, OpState::kRunning, kStart, -1);
}

void FlightRecorder::recordEnd(uint64_t id, bool failed, int peer) {
  setState(id, failed ? OpState::kFailed : OpState::kDone, kEnd, peer);
}

std::vector<OpRecord> FlightRecorder::snapshot() const {
  // Coarse nanoseconds and ticks -> Unix microseconds, through the pairs read at construction
  // and now (the ticks' rate is measured over that span: a 40 ns read over even a millisecond
  // is a 4e-5 error).
  const int64_t steadyNow = steadyNs();
  const uint64_t ticksNow = ticks();
  const double nsPerTick = ticksNow > ticksOrigin_ && steadyNow > steadyOriginNs_
                               ? static_cast<double>(steadyNow - steadyOriginNs_) /
                                     static_cast<double>(ticksNow - ticksOrigin_)
                               : 1.0;
  const auto coarseToUs = [&](uint64_t ns) -> int64_t {
    if (ns == 0) return 0;
    return systemOriginUs_ + (static_cast<int64_t>(ns) - coarseOriginNs_) / 1000;
  };
  const auto ticksToUs = [&](uint64_t t) -> int64_t {
    if (t == 0) return 0;
    const double sinceOrigin =
        (static_cast<double>(t) - static_cast<double>(ticksOrigin_)) * nsPerTick;
    return systemOriginUs_ + static_cast<int64_t>(sinceOrigin / 1000);
  };
  const uint64_t last = next_.load(std::memory_order_acquire);
  const uint64_t first = last > capacity_ ? last - capacity_ + 1 : 1;
  std::vector<OpRecord> out;
  out.reserve(last - first + 1);
  constexpr auto r = std::memory_order_relaxed;
  for (uint64_t id = first; id <= last; ++id) {
    const Slot& slot = slotOf(id);
    uint64_t w[kWords];
    bool ok = false;
    for (int attempt = 0; attempt < 16 && !ok; ++attempt) {
      const uint64_t v1 = slot.version.load(std::memory_order_acquire);
      if (v1 & 1) {
        std::this_thread::yield();
        continue;
      }
      for (size_t i = 0; i < kWords; ++i) w[i] = slot.words[i].load(r);
      std::atomic_thread_fence(std::memory_order_acquire);
      ok = slot.version.load(r) == v1;
    }
    if (!ok || w[kId] != id) continue;  // kept changing, or already overwritten
    OpRecord rec;
    rec.id = id;
    rec.seq = w[kSeq];
    rec.type = static_cast<OpType>(w[kKind] & 0xff);
    rec.dtype = static_cast<DType>((w[kKind] >> 8) & 0xff);
    rec.reduceOp = static_cast<ReduceOp>((w[kKind] >> 16) & 0xff);
    rec.state = static_cast<OpState>((w[kKind] >> 24) & 0xff);
    rec.algorithm = static_cast<comm::Algorithm>((w[kKind] >> 32) & 0xff);
    rec.root = static_cast<int32_t>(w[kRoot] & 0xffffffffu);
    rec.peer = static_cast<int32_t>(w[kRoot] >> 32);
    rec.count = w[kCount];
    rec.bytes = w[kBytes];
    rec.issueUs = coarseToUs(w[kIssue]);
    rec.startUs = ticksToUs(w[kStart]);
    rec.endUs = ticksToUs(w[kEnd]);
    out.push_back(rec);
  }
  return out;
}

}  // namespace loom::diag
