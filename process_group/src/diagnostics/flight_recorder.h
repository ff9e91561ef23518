// FlightRecorder: a ring of a process group's last N operations (PyTorch's Flight Recorder,
// written for Loom), read when something goes wrong: dumps, the analysis of a failure.
//
// Contract
// - The ring is preallocated at construction (capacity entries, > 0); recording never
//   allocates, takes no lock and makes no system call beyond reading the clock.
// - Writers: recordIssue is called by the issuing thread (ProcessGroup::issue, under the
//   group's issue lock, so ids follow the issue order); recordStart / recordEnd by the thread
//   that runs the operation, which got it through the backend's queue (a lock) or, for the
//   comm backend's direct operations, as the Work that issue returned (claimed with an
//   acquire-release compare-and-swap), so the writes of one entry are ordered. Writers use plain stores (no read-modify-write, no lock): the
//   one case where two could write one entry at once is the ring wrapping onto an operation
//   still running (more than `capacity` operations outstanding); then its start or end is
//   dropped (its id no longer matches), or at worst an entry mixes two operations' fields.
// - Readers (snapshot) run on any thread at any time and never block writers: each entry's
//   first word (its stamp: the id and a write count) is odd while the entry is written (a
//   seqlock); a reader that sees it change retries that entry a few times and skips it if it
//   keeps changing.
// - Cost (docs/diagnostics.md has the measurement): a few stores into one 64-byte line per
//   call, inlined into the caller, and on most operations no clock read: an 8-byte all-reduce
//   over shared memory takes well under a microsecond, and reading a clock three times per
//   operation (issue, start, end) was 4% of it. The ring has a power-of-two number of slots
//   (capacity rounded up; only the newest `capacity` are reported) so that finding an entry
//   is a mask, not a division.
// - Times. Every entry has an issue, start and end time (0 until it happens), each either
//   precise or a tick:
//   - precise: start and end read from the CPU's time-stamp counter when it is invariant
//     (CPUID: constant rate, runs in every C-state; the steady clock otherwise). Every
//     collective and point-to-point operation whose sequence number is a multiple of
//     preciseEvery() (LOOM_FLIGHT_RECORDER_PRECISE_EVERY, a power of two; 1: every
//     operation) is timed so on every rank, so that stragglers() compares the same operations
//     on every rank; and every operation is whenever no tick is published.
//   - tick: the backend's thread that naps while waiters run operations (the comm backend's
//     worker, docs/handoff.md) publishes the monotonic time it read on each wake-up
//     (publishTick), and withdraws it (0) before it sleeps or runs an operation itself. An
//     operation stamped from the tick is late by at most about one nap (1 ms by default, more
//     when the machine does not run the worker in time): the age of a queued or hung
//     operation, what the failure analysis reports, to the millisecond; not the duration of a
//     microsecond operation. OpRecord::precise tells them apart.
//   - issue times are the tick when one is published, else the coarse monotonic clock (one
//     kernel tick of resolution, a few ms).
//   snapshot() converts them to microseconds since the Unix epoch, anchored at the snapshot
//   (the system clock now, minus the time's distance from now on the monotonic clock), so
//   dumps of different hosts line up as well as their clocks do, and ranks of one host that
//   read their rings together agree to well under a microsecond.
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
  // Operations whose sequence number is a multiple of `every` (rounded up to a power of two,
  // >= 1) get precise start and end times. Set before the first recordIssue.
  void setPreciseEvery(uint64_t every);
  uint64_t preciseEvery() const { return preciseMask_ + 1; }
  // The tick (see Times above): `steadyNs`, the steady clock's nanoseconds, read by a thread
  // that reads it again within about a nap; 0 withdraws it.
  void publishTick(uint64_t steadyNs) { tick_.word.store(steadyNs, std::memory_order_relaxed); }

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
  // undefined behaviour. kStamp = id << 16 | the flag bits (kSampled, kStartSet, kStartTick,
  // kEndTick, kPeerSet) | state << 8 | writes << 1 | busy: what start and end change lives in
  // the word they load and store anyway, and which of the other words hold this operation's
  // values (a reused slot's kStart, kEnd and kPeer are not cleared at issue). kKind packs type
  // | dtype << 8 | reduce op << 16 | algorithm << 24 | root << 32. Bytes are count * dtype
  // size, computed when read.
  //
  // recordIssue rewrites the entry under the busy bit. recordStart and recordEnd change one
  // time word (and the peer) and then the stamp, without the busy bit: a reader that read the
  // old stamp around a new time word still sees the old state, under which that word is not
  // this operation's and is ignored.
  enum Word : size_t { kStamp, kSeq, kKind, kPeer, kCount, kIssue, kStart, kEnd, kWords };
  static constexpr uint64_t kBusy = 1;
  static constexpr uint64_t kWriteMask = 0xfe;  // the write count, bits 1-7 (wraps)
  static constexpr int kStateShift = 8;         // bits 8-9: the OpState
  static constexpr uint64_t kStateMask = uint64_t{3} << kStateShift;
  static constexpr uint64_t kSampled = 1u << 10;    // start and end are read precisely
  static constexpr uint64_t kStartTick = 1u << 11;  // kStart holds the tick
  static constexpr uint64_t kEndTick = 1u << 12;    // kEnd holds the tick
  static constexpr uint64_t kStartSet = 1u << 13;   // kStart is this operation's
  static constexpr uint64_t kPeerSet = 1u << 14;    // kPeer is this operation's
  static constexpr int kIdShift = 16;
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
  [[gnu::always_inline]] inline void setState(uint64_t id, OpState state, Word timeWord,
                                              uint64_t tickBit, int peer);

  const size_t capacity_;
  uint64_t preciseMask_ = 15;  // preciseEvery() - 1
  const uint64_t mask_;        // slots - 1 (slots: capacity rounded up to a power of two)
  const comm::Algorithm algorithm_;
  const bool useTsc_;
  const std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> lastSeq_{0};
  // Written by another thread than next_ (once per nap): a line of its own.
  struct alignas(64) Tick {
    std::atomic<uint64_t> word{0};
  } tick_;
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
  const uint64_t next =
      beginWrite(slot, id << kIdShift | ((op.seq & preciseMask_) == 0 ? kSampled : 0) |
                           static_cast<uint64_t>(OpState::kQueued) << kStateShift);
  constexpr auto r = std::memory_order_relaxed;
  slot.words[kSeq].store(op.seq, r);
  const uint64_t tick = tick_.word.load(r);
  slot.words[kKind].store(static_cast<uint64_t>(op.type) | static_cast<uint64_t>(op.dtype) << 8 |
                              static_cast<uint64_t>(op.reduceOp) << 16 |
                              static_cast<uint64_t>(algorithm_) << 24 |
                              static_cast<uint64_t>(static_cast<uint32_t>(op.root)) << 32,
                          r);
  slot.words[kCount].store(op.count, r);
  slot.words[kIssue].store(tick != 0 ? tick : coarseNs(), r);
  endWrite(slot, next);
  // isCollective (comm/src/types.cc, another library: a call) spelled out.
  if (op.type != OpType::kSend && op.type != OpType::kRecv) {
    lastSeq_.store(op.seq, std::memory_order_relaxed);
  }
  return id;
}

inline void FlightRecorder::setState(uint64_t id, OpState state, Word timeWord, uint64_t tickBit,
                                     int peer) {
  if (id == 0) return;  // not recorded
  Slot& slot = slotOf(id);
  constexpr auto r = std::memory_order_relaxed;
  const uint64_t stamp = slot.words[kStamp].load(r);
  // The ring wrapped onto this operation (more than the ring's slots issued while it waited):
  // its entry belongs to a newer one now, and the update is dropped.
  if ((stamp >> kIdShift) != id) return;
  const uint64_t tick = (stamp & kSampled) != 0 ? 0 : tick_.word.load(r);
  slot.words[timeWord].store(tick != 0 ? tick : ticks(), r);
  uint64_t flags = tick != 0 ? tickBit : 0;
  if (timeWord == kStart) flags |= kStartSet;
  if (peer >= 0) {
    slot.words[kPeer].store(static_cast<uint32_t>(peer), r);
    flags |= kPeerSet;
  }
  // Release: a reader that sees the new stamp sees the words written before it.
  endWrite(slot, (stamp & ~kWriteMask & ~kStateMask & ~tickBit) | ((stamp + 2) & kWriteMask) |
                     static_cast<uint64_t>(state) << kStateShift | flags);
}

inline void FlightRecorder::recordStart(uint64_t id) {
  setState(id, OpState::kRunning, kStart, kStartTick, -1);
}

inline void FlightRecorder::recordEnd(uint64_t id, bool failed, int peer) {
  setState(id, failed ? OpState::kFailed : OpState::kDone, kEnd, kEndTick, peer);
}

}  // namespace loom::diag
