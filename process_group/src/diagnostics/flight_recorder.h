// FlightRecorder: a ring of a process group's last N operations (PyTorch's Flight Recorder,
// written for Loom), read when something goes wrong: dumps, the analysis of a failure.
//
// Contract
// - The ring is preallocated at construction (capacity entries, > 0); recording never
//   allocates, takes no lock and makes no system call beyond reading the clock.
// - Writers: recordIssue is called by the issuing thread (ProcessGroup::issue, under the
//   group's issue lock, so ids follow the issue order); recordStart / recordEnd by the thread
//   that runs the operation. The two never write one entry at the same time in practice (an
//   entry is issued before it can start), and when they would (the ring wrapped while an old
//   operation still ran) the per-entry version makes one wait for the other for a few stores;
//   a start or end whose entry was overwritten is dropped.
// - Readers (snapshot) run on any thread at any time and never block writers: each entry
//   carries a version that is odd while it is written (a seqlock); a reader that sees it
//   change retries that entry a few times and skips it if it keeps changing.
// - Times are steady-clock nanoseconds; snapshot() converts them to microseconds since the
//   Unix epoch so that dumps of different hosts line up (as well as their clocks do).
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
  // Makes the slot's version odd (waiting while another writer holds it); returns it.
  static uint64_t lock(Slot& slot);
  static void unlock(Slot& slot, uint64_t version);
  void setState(uint64_t id, OpState state, uint64_t timeWord, int peer);

  const size_t capacity_;
  const comm::Algorithm algorithm_;
  const std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> lastSeq_{0};
  // The steady clock and the system clock read together, to convert times in snapshot().
  const int64_t steadyOriginNs_;
  const int64_t systemOriginUs_;
};

}  // namespace loom::diag
