#include "diagnostics/flight_recorder.h"

#include <chrono>
#include <thread>

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
      systemOriginUs_(systemUs()) {}

uint64_t FlightRecorder::lock(Slot& slot) {
  uint64_t v = slot.version.load(std::memory_order_relaxed);
  for (;;) {
    if ((v & 1) == 0 && slot.version.compare_exchange_weak(v, v + 1, std::memory_order_acquire,
                                                           std::memory_order_relaxed)) {
      // Readers that see a field written below also see the odd version (seqlock).
      std::atomic_thread_fence(std::memory_order_release);
      return v + 1;
    }
    // Another writer holds the slot for a few stores (the ring wrapped onto a running op).
    std::this_thread::yield();
    v = slot.version.load(std::memory_order_relaxed);
  }
}

void FlightRecorder::unlock(Slot& slot, uint64_t version) {
  slot.version.store(version + 1, std::memory_order_release);
}

uint64_t FlightRecorder::recordIssue(const OpDesc& op) {
  const uint64_t id = next_.fetch_add(1, std::memory_order_relaxed) + 1;
  Slot& slot = slotOf(id);
  const uint64_t v = lock(slot);
  constexpr auto r = std::memory_order_relaxed;
  slot.words[kId].store(id, r);
  slot.words[kSeq].store(op.seq, r);
  slot.words[kKind].store(packKind(op, algorithm_), r);
  slot.words[kRoot].store(packRoot(op.root, -1), r);
  slot.words[kCount].store(op.count, r);
  slot.words[kBytes].store(op.count * dtypeSize(op.dtype), r);
  slot.words[kIssue].store(static_cast<uint64_t>(steadyNs()), r);
  slot.words[kStart].store(0, r);
  slot.words[kEnd].store(0, r);
  unlock(slot, v);
  if (isCollective(op.type)) lastSeq_.store(op.seq, std::memory_order_relaxed);
  return id;
}

void FlightRecorder::setState(uint64_t id, OpState state, uint64_t timeWord, int peer) {
  if (id == 0) return;  // issued before the recorder saw it (or recorder off at issue)
  const uint64_t now = static_cast<uint64_t>(steadyNs());
  Slot& slot = slotOf(id);
  const uint64_t v = lock(slot);
  constexpr auto r = std::memory_order_relaxed;
  if (slot.words[kId].load(r) == id) {
    slot.words[kKind].store(withState(slot.words[kKind].load(r), state), r);
    slot.words[timeWord].store(now, r);
    if (peer >= 0) {
      const uint64_t root = slot.words[kRoot].load(r) & 0xffffffffu;
      slot.words[kRoot].store(root | static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 32, r);
    }
  }
  unlock(slot, v);
}

void FlightRecorder::recordStart(uint64_t id) {
  setState(id, OpState::kRunning, kStart, -1);
}

void FlightRecorder::recordEnd(uint64_t id, bool failed, int peer) {
  setState(id, failed ? OpState::kFailed : OpState::kDone, kEnd, peer);
}

std::vector<OpRecord> FlightRecorder::snapshot() const {
  // Steady nanoseconds -> Unix microseconds, through the pair read at construction.
  const auto toUs = [&](uint64_t ns) -> int64_t {
    if (ns == 0) return 0;
    return systemOriginUs_ + (static_cast<int64_t>(ns) - steadyOriginNs_) / 1000;
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
    rec.issueUs = toUs(w[kIssue]);
    rec.startUs = toUs(w[kStart]);
    rec.endUs = toUs(w[kEnd]);
    out.push_back(rec);
  }
  return out;
}

}  // namespace loom::diag
