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
// - Readers (snapshot) run on any thread at any time and never block writers: each entry
//   carries a version that is odd while it is written (a seqlock); a reader that sees it
//   change retries that entry a few times and skips it if it keeps changing.
// - Cost (docs/diagnostics.md has the measurement): three time stamps and a dozen stores per
//   operation. The issue time is CLOCK_MONOTONIC_COARSE (one kernel tick of resolution,
//   ~4 ms: enough for the age of a queued or hung operation), start and end the CPU's
//   time-stamp counter on x86-64 (the steady clock elsewhere). snapshot() converts them all to
//   microseconds since the Unix epoch, so dumps of different hosts line up as well as their
//   clocks do.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

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
  uint64_t recordIssue(const OpDesc& op);
  void recordStart(uint64_t id);
  // `peer`: the rank the operation waited on when it failed (-1: none named).
  void recordEnd(uint64_t id, bool failed, int peer = -1);

  // The entries still in the ring, oldest first.
  std::vector<OpRecord> snapshot() const;
  // Entries recorded since construction (those before the last `capacity` were overwritten).
  uint64_t recorded() const { return next_.load(std::memory_order_relaxed); }
  // Sequence number of the last collective issued (0 before the first).
  uint64_t lastSeq() const { return lastSeq_.load(std::memory_order_relaxed); }

 private:
  // One entry: the version, then the fields packed into words, each a relaxed atomic so that a
  // torn read is a retry, never undefined behaviour.
  enum Word : size_t { kId, kSeq, kKind, kRoot, kCount, kBytes, kIssue, kStart, kEnd, kWords };
  struct alignas(64) Slot {
    std::atomic<uint64_t> version{0};
    std::atomic<uint64_t> words[kWords] = {};
  };

  Slot& slotOf(uint64_t id) const { return slots_[(id - 1) % capacity_]; }
  // The seqlock's writer side: the version is odd between the two.
  // Forced inline: out of line (GCC's choice at -O2) they were two calls per record in the
  // profile of an 8-byte shm all-reduce.
  [[gnu::always_inline]] static inline uint64_t beginWrite(Slot& slot);
  [[gnu::always_inline]] static inline void endWrite(Slot& slot, uint64_t version);
  void setState(uint64_t id, OpState state, Word timeWord, int peer);

  const size_t capacity_;
  const comm::Algorithm algorithm_;
  const std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> lastSeq_{0};
  // The clocks read together at construction, to convert times in snapshot().
  const int64_t steadyOriginNs_;
  const int64_t coarseOriginNs_;
  const uint64_t ticksOrigin_;
  const int64_t systemOriginUs_;
};

}  // namespace loom::diag
