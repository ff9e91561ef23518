// FlightRecorder: a ring of a process group's last N operations (PyTorch's Flight Recorder,
// written for Loom), read when something goes wrong: dumps, the analysis of a failure.
//
// Contract
// - The ring is preallocated at construction (capacity entries, > 0); recording never
//   allocates, takes no lock and makes no system call beyond reading the clock.
// - Writers: recordIssue is called by the issuing thread (ProcessGroup::issue, under the
//   group's issue lock, so ids follow the issue order); recordStart / recordEnd by the thread
//   that runs the operation, which got it through the backend's queue (a lock), so the writes
//   of one entry are ordered. Writers use plain stores (no read-modify-write, no lock): the
//   one case where two could write one entry at once is the ring wrapping onto an operation
//   still running (more than `capacity` operations outstanding); then its start or end is
//   dropped (its id no longer matches), or at worst an entry mixes two operations' fields.
// - Readers (snapshot) run on any thread at any time and never block writers: each entry's
//   first word (its stamp: the id and a write count) is odd while the entry is written (a
//   seqlock); a reader that sees it change retries that entry a few times and skips it if it
//   keeps changing.
// - Cost (docs/diagnostics.md has the measurement): one clock read and one cache line of
//   stores per call, inlined into the caller. An entry is one 64-byte line; the ring has a
//   power-of-two number of slots (capacity rounded up; only the newest `capacity` are
//   reported) so that finding an entry is a mask, not a division. Times are raw clock values:
//   the issue time the coarse monotonic clock (one kernel tick of resolution, a few ms: enough
//   for the age of a queued or hung operation), start and end the CPU's time-stamp counter
//   when it is invariant (CPUID: constant rate, runs in every C-state; the steady clock
//   otherwise). snapshot() converts them to microseconds since the Unix epoch, anchored at
//   the snapshot (the system clock now, minus the time's distance from now on the monotonic
//   clock), so dumps of different hosts line up as well as their clocks do, and ranks of one
//   host that read their rings together agree to well under a microsecond.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "loom/process_group/diagnostics.h"
#include "loom/process_group/process_group.h"

namespace loom::diag {

class FlightRecorder {
 public:
  // `algorithm` is the group's forced comm algorithm (kAuto: chosen per call, not known here).
  FlightRecorder(size_t capacity, comm::Algorithm algorithm);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  size_t capacity() const { return capacity_; }

  // Returns the entry's id (1, 2, ...), which OpDesc::recordId carries to the running thread.
  // Forced inline: GCC at -O2 kept recordIssue out of line (a call per operation in the
  // profile).
  [[gnu::always_inline]] inline uint64_t recordIssue(const OpDesc& op);
  [[gnu::always_inline]] inline void recordStart(uint64_t id);
  // `peer`: the rank the operation waited on when it failed (-1: none named).
  [[gnu::always_inline]] inline void recordEnd(uint64_t id, bool failed, int peer = -1);

  // The entries still in the ring, oldest first.
  std::vector<OpRecord> snapshot() const;
  // Entries recorded since construction (those before the last `capacity` were overwritten).
  uint64_t recorded() const { return next_.load(std::memory_order_relaxed); }
  // Sequence number of the last collective issued (0 before the first).
  uint64_t lastSeq() const { return lastSeq_.load(std::memory_order_relaxed); }
  // Whether start and end are read from the time-stamp counter (else the steady clock).
  bool usesTsc() const { return useTsc_; }
  // Whether this CPU's time-stamp counter is invariant (x86-64 CPUID 0x80000007 EDX bit 8).
  static bool tscIsInvariant();

 private:
  // One entry: eight words, each a relaxed atomic so that a torn read is a retry, never
  // undefined behaviour. kStamp = id << 8 | writes << 1 | busy. kKind packs type | dtype << 8 |
  // reduce op << 16 | state << 24 | algorithm << 32; kRoot packs root (low 32 bits) and peer
  // (high 32 bits). Bytes are count * dtype size, computed when read.
  enum Word : size_t { kStamp, kSeq, kKind, kRoot, kCount, kIssue, kStart, kEnd, kWords };
  static constexpr uint64_t kBusy = 1;
  static constexpr uint64_t kWriteMask = 0xfe;  // the write count, bits 1-7 (wraps)
  struct alignas(64) Slot {
    std::atomic<uint64_t> words[kWords] = {};
  };
  static_assert(sizeof(Slot) == 64, "one entry is one cache line");

  Slot& slotOf(uint64_t id) const { return slots_[(id - 1) & mask_]; }
  // Start and end times: the TSC or the steady clock's nanoseconds.
  uint64_t ticks() const {
#if defined(__x86_64__)
    if (useTsc_) return __rdtsc();
#endif
    return steadyNs();
  }
  static uint64_t steadyNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
  }
  static uint64_t coarseNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
  }
  // The seqlock's writer side around an update of the entry whose stamp is `stamp`.
  static uint64_t beginWrite(Slot& slot, uint64_t stamp) {
    slot.words[kStamp].store(stamp | kBusy, std::memory_order_relaxed);
    // Readers that see a field written after this also see the busy stamp.
    std::atomic_thread_fence(std::memory_order_release);
    return (stamp & ~kWriteMask & ~kBusy) | ((stamp + 2) & kWriteMask);
  }
  static void endWrite(Slot& slot, uint64_t next) {
    slot.words[kStamp].store(next, std::memory_order_release);
  }
  [[gnu::always_inline]] inline void setState(uint64_t id, OpState state, Word timeWord, int peer);

  const size_t capacity_;
  const uint64_t mask_;  // slots - 1 (slots: capacity rounded up to a power of two)
  const comm::Algorithm algorithm_;
  const bool useTsc_;
  const std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> lastSeq_{0};
  // The steady clock and the ticks read together at construction: snapshot() measures the
  // ticks' rate from them.
  const int64_t steadyOriginNs_;
  const uint64_t ticksOrigin_;
};

inline uint64_t FlightRecorder::recordIssue(const OpDesc& op) {
  // One writer (the issuing thread, under the group's issue lock): a plain store, not a locked
  // read-modify-write; readers only load it.
  const uint64_t id = next_.load(std::memory_order_relaxed) + 1;
  next_.store(id, std::memory_order_relaxed);
  Slot& slot = slotOf(id);
  const uint64_t next = beginWrite(slot, id << 8);
  constexpr auto r = std::memory_order_relaxed;
  slot.words[kSeq].store(op.seq, r);
  slot.words[kKind].store(static_cast<uint64_t>(op.type) | static_cast<uint64_t>(op.dtype) << 8 |
                              static_cast<uint64_t>(op.reduceOp) << 16 |
                              static_cast<uint64_t>(OpState::kQueued) << 24 |
                              static_cast<uint64_t>(algorithm_) << 32,
                          r);
  slot.words[kRoot].store(static_cast<uint32_t>(op.root) | uint64_t{0xffffffffu} << 32, r);
  slot.words[kCount].store(op.count, r);
  slot.words[kIssue].store(coarseNs(), r);
  slot.words[kStart].store(0, r);
  slot.words[kEnd].store(0, r);
  endWrite(slot, next);
  // isCollective (comm/src/types.cc, another library: a call) spelled out.
  if (op.type != OpType::kSend && op.type != OpType::kRecv) {
    lastSeq_.store(op.seq, std::memory_order_relaxed);
  }
  return id;
}

inline void FlightRecorder::setState(uint64_t id, OpState state, Word timeWord, int peer) {
  if (id == 0) return;  // not recorded
  const uint64_t now = ticks();
  Slot& slot = slotOf(id);
  constexpr auto r = std::memory_order_relaxed;
  const uint64_t stamp = slot.words[kStamp].load(r);
  // The ring wrapped onto this operation (more than the ring's slots issued while it waited):
  // its entry belongs to a newer one now, and the update is dropped.
  if ((stamp >> 8) != id) return;
  const uint64_t next = beginWrite(slot, stamp);
  const uint64_t kind = slot.words[kKind].load(r);
  slot.words[kKind].store((kind & ~(uint64_t{0xff} << 24)) | static_cast<uint64_t>(state) << 24, r);
  slot.words[timeWord].store(now, r);
  if (peer >= 0) {
    const uint64_t root = slot.words[kRoot].load(r) & 0xffffffffu;
    slot.words[kRoot].store(root | static_cast<uint64_t>(static_cast<uint32_t>(peer)) << 32, r);
  }
  endWrite(slot, next);
}

inline void FlightRecorder::recordStart(uint64_t id) {
  setState(id, OpState::kRunning, kStart, -1);
}

inline void FlightRecorder::recordEnd(uint64_t id, bool failed, int peer) {
  setState(id, failed ? OpState::kFailed : OpState::kDone, kEnd, peer);
}

}  // namespace loom::diag
