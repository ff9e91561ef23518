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
//   acquire-release compare-and-swap), so the writes of one entry are ordered. Writers use plain
//   stores (no read-modify-write, no lock): the one case where two could write one entry at once is
//   the ring wrapping onto an operation still running (more than `capacity` operations
//   outstanding); then its start or end is dropped (its id no longer matches), or at worst an entry
//   mixes two operations' fields.
// - Readers (snapshot) run on any thread at any time and never block writers: each entry's
//   first word (its stamp: the id and a write count) is odd while the entry is written (a
//   seqlock); a reader that sees it change retries that entry a few times and skips it if it
//   keeps changing.
// - In-order collectives (setCollectivesInOrder: the comm backend, which runs its collectives
//   one at a time in issue order). Their start and end, when the tick is published and the
//   operation is not sampled, do not touch the entry: start stores the entry's id and the
//   tick in two per-group words (last started), end stores its id in a third (last ended), all
//   on one cache line the running thread keeps. snapshot() derives such an entry's state from
//   them (id <= last ended: done; id == last started: running; else queued). Its end time is
//   bracketed by the tick thread's progress marks: each publishTick notes the last ended id
//   with the time, when it changed, in a ring of marks as long as the entry ring; the entry's
//   end is the first mark at or past its id (late by at most about one nap, as a tick is), its
//   start the later of its issue and the previous in-order entry's end. A failure, a sampled
//   operation, or one run while no tick is published writes the entry as below.
// - Cost (docs/diagnostics.md has the measurement): a few stores into one 64-byte line at
//   issue, inlined into the caller, two stores at start and one at end for in-order
//   collectives, and on most operations no clock read: an 8-byte all-reduce over shared memory
//   takes well under a microsecond, and reading a clock three times per operation (issue,
//   start, end) was 4% of it. The ring has a power-of-two number of slots (capacity rounded
//   up; only the newest `capacity` are reported) so that finding an entry is a mask, not a
//   division. Each issue prefetches the next entry's line: the ring does not stay in the L1
//   cache, and a store that misses it stalls the issue lock's release (~4 ns in place).
// - Times. Every entry has an issue, start and end time (0 until it happens), each either
//   precise or a tick:
//   - precise: start and end read from the CPU's time-stamp counter when it is invariant
//     (CPUID: constant rate, runs in every C-state; the steady clock otherwise). Every
//     collective and point-to-point operation whose sequence number is a multiple of
//     preciseEvery() (LOOM_FLIGHT_RECORDER_PRECISE_EVERY, a power of two, 256 by default; 1:
//     every operation) or that moves kAlwaysPreciseBytes or more is timed so on every rank,
//     so that stragglers() compares the same operations on every rank; and every operation
//     is whenever no tick is published. (Reading the counter takes 16-20 ns under the Intel
//     VM's hypervisor: two reads in every 16th operation were ~2 ns of an 8-byte all-reduce.)
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
#include <cstddef>
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
  // Operations of at least this many bytes are always timed precisely (two time-stamp counter
  // reads are nothing next to moving 64 KiB), whatever their sequence number.
  static constexpr size_t kAlwaysPreciseBytes = 64 * 1024;
  // The group runs its collectives one at a time, in issue order (see In-order collectives
  // above). Set before the first recordIssue.
  void setCollectivesInOrder(bool inOrder) { inOrder_.store(inOrder, std::memory_order_relaxed); }
  // The tick (see Times above): `steadyNs`, the steady clock's nanoseconds, read by a thread
  // that reads it again within about a nap; 0 withdraws it. One thread publishes (it also
  // writes the progress marks of in-order collectives).
  void publishTick(uint64_t steadyNs) {
    tick_.word.store(steadyNs, std::memory_order_relaxed);
    if (inOrder_.load(std::memory_order_relaxed) &&
        progress_.ended.load(std::memory_order_relaxed) != lastMarked_) {
      markProgress(steadyNs);
    }
  }

  // Returns the entry's id (1, 2, ...), which OpDesc::recordId carries to the running thread.
  // `inOrder` (may be null) is set to whether the running thread must use the InOrder calls
  // below (OpDesc::recordInOrder). Forced inline: GCC at -O2 kept recordIssue out of line (a
  // call per operation in the profile).
  [[gnu::always_inline]] inline uint64_t recordIssue(const OpDesc& op, bool* inOrder = nullptr);
  [[gnu::always_inline]] inline void recordStart(uint64_t id);
  // `peer`: the rank the operation waited on when it failed (-1: none named).
  [[gnu::always_inline]] inline void recordEnd(uint64_t id, bool failed, int peer = -1);
  // For the entries recordIssue said are in order: the progress words while the tick is
  // published, else recordStart / recordEnd.
  [[gnu::always_inline]] inline void recordStartInOrder(uint64_t id);
  [[gnu::always_inline]] inline void recordEndInOrder(uint64_t id, bool failed, int peer = -1);
  // The running thread's calls for an issued operation (op.recordId from recordIssue, and
  // op.recordInOrder as it set it): the in-order ones or the entry's.
  [[gnu::always_inline]] inline void recordStart(const OpDesc& op) {
    if (op.recordInOrder) {
      recordStartInOrder(op.recordId);
    } else {
      recordStart(op.recordId);
    }
  }
  [[gnu::always_inline]] inline void recordEnd(const OpDesc& op, bool failed, int peer = -1) {
    if (op.recordInOrder) {
      recordEndInOrder(op.recordId, failed, peer);
    } else {
      recordEnd(op.recordId, failed, peer);
    }
  }

  // The entries still in the ring, oldest first; the newest `newest` of them only when fewer
  // (then the first one read, when a derived in-order collective, starts at its issue).
  std::vector<OpRecord> snapshot(size_t newest = SIZE_MAX) const;
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
  // An in-order collective: while its state is still kQueued, the progress words say whether
  // it started or ended.
  static constexpr uint64_t kInOrder = 1u << 15;
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
  // One entry's words, read under its seqlock; false when it kept changing or holds another
  // id now.
  bool readEntry(uint64_t id, uint64_t (&w)[kWords]) const;
  // publishTick's half for in-order collectives (out of line: once per nap at most).
  void markProgress(uint64_t steadyNs);
  // recordEndInOrder's rare path: an in-order entry that started on the progress words fails;
  // its start (the tick then) is copied into the entry with the failure.
  void failInOrder(uint64_t id, int peer);

  const size_t capacity_;
  uint64_t preciseMask_ = 255;  // preciseEvery() - 1
  const uint64_t mask_;         // slots - 1 (slots: capacity rounded up to a power of two)
  const comm::Algorithm algorithm_;
  const bool useTsc_;
  const std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> lastSeq_{0};
  // Written by another thread than next_ (once per nap): a line of its own.
  struct alignas(64) Tick {
    std::atomic<uint64_t> word{0};
  } tick_;
  // In-order collectives' progress, written by the thread that runs them: the last started
  // (its id, then the tick it started at) and the last ended. A line of its own. inOrder_ is
  // set by the backend's constructor, which may run after the group's diagnostics thread (a
  // reader) started: an atomic, loaded relaxed (a plain load).
  std::atomic<bool> inOrder_{false};
  struct alignas(64) Progress {
    std::atomic<uint64_t> started{0};
    std::atomic<uint64_t> startTick{0};
    std::atomic<uint64_t> ended{0};
  } progress_;
  // The progress marks: (last ended id, steady ns) pairs, a ring as long as the entries',
  // written by the tick's thread only, each when the last ended id changed. `marked_` counts
  // the marks begun, `markedWhole_` those written: a reader keeps the whole ones it read that
  // no mark begun since could have overwritten (snapshot()).
  struct Mark {
    std::atomic<uint64_t> ended{0};
    std::atomic<uint64_t> ns{0};
  };
  const std::unique_ptr<Mark[]> marks_;
  std::atomic<uint64_t> marked_{0};
  std::atomic<uint64_t> markedWhole_{0};
  uint64_t lastMarked_ = 0;  // the tick's thread's: the id of the last mark
  // The steady clock and the ticks read together at construction: snapshot() measures the
  // ticks' rate from them.
  const int64_t steadyOriginNs_;
  const uint64_t ticksOrigin_;
};

inline uint64_t FlightRecorder::recordIssue(const OpDesc& op, bool* inOrder) {
  // One writer (the issuing thread, under the group's issue lock): a plain store, not a locked
  // read-modify-write; readers only load it.
  const uint64_t id = next_.load(std::memory_order_relaxed) + 1;
  next_.store(id, std::memory_order_relaxed);
  Slot& slot = slotOf(id);
  // The next operation's entry, fetched now (see Cost): an operation ahead, the line is
  // there, exclusive, when it is written.
  __builtin_prefetch(&slotOf(id + 1), 1, 3);
  // isCollective (comm/src/types.cc, another library: a call) spelled out.
  const bool collective = op.type != OpType::kSend && op.type != OpType::kRecv;
  const bool sampled =
      (op.seq & preciseMask_) == 0 || op.count * dtypeSize(op.dtype) >= kAlwaysPreciseBytes;
  const bool fast = inOrder_.load(std::memory_order_relaxed) && collective && !sampled;
  if (inOrder != nullptr) *inOrder = fast;
  const uint64_t next =
      beginWrite(slot, id << kIdShift | (sampled ? kSampled : 0) | (fast ? kInOrder : 0) |
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
  if (collective) lastSeq_.store(op.seq, std::memory_order_relaxed);
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

inline void FlightRecorder::recordStartInOrder(uint64_t id) {
  const uint64_t tick = tick_.word.load(std::memory_order_relaxed);
  if (tick == 0) {
    recordStart(id);
    return;
  }
  progress_.startTick.store(tick, std::memory_order_relaxed);
  // Release: a reader that sees the id sees its start tick (or a later one's).
  progress_.started.store(id, std::memory_order_release);
}

inline void FlightRecorder::recordEndInOrder(uint64_t id, bool failed, int peer) {
  if (progress_.started.load(std::memory_order_relaxed) != id) {
    recordEnd(id, failed, peer);  // started on the entry (no tick then), or never started
  } else if (!failed) {
    progress_.ended.store(id, std::memory_order_release);
  } else {
    failInOrder(id, peer);
  }
}

}  // namespace loom::diag
