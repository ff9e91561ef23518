// ProcessGroupComm's private pieces shared by comm_backend.cc (running operations, failures) and
// comm_handoff.cc (how an operation reaches the thread that runs it): the hand-off's timing
// constants, and the failure-report exchange and the signature check of pg_failure.h, which
// the mpi backend shares.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm_backend.h"
#include "diagnostics/group_diagnostics.h"
#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"
#include "pg_failure.h"

namespace loom::comm_pg {

using namespace ::loom::pg_failure;  // FailureExchange, storeSlack, the store keys

// How often a waiting send / recv batch looks for more send / recv operations to start:
// every kP2PSliceMin at first, backing off to kP2PSliceMax while nothing changes.
constexpr milliseconds kP2PSliceMin{1};
constexpr milliseconds kP2PSliceMax{10};

// The hand-off (see comm_backend.h): for how long after the last inline run the worker keeps
// napping (options.comm.graceUs and napUs hold the grace and the nap).
inline constexpr milliseconds kHotWindow{5};
// How long a thread sleeps on a direct operation's completion before it looks again (the
// worker uses its nap when napping is on).
inline constexpr milliseconds kDirectWaitSlice{1};

// The groups owned by a shared_ptr, by a key unique in the process (never reused): what a
// direct operation's Work holds instead of a weak pointer (ProcessGroupComm::CommWork). Only
// the rare paths look a group up, under one process-wide lock.
uint64_t newRegistryKey();
void registerGroup(uint64_t key, std::weak_ptr<ProcessGroup> group);
void unregisterGroup(uint64_t key);
// The group while it lives (null once its destructor started, or when never registered).
std::shared_ptr<ProcessGroup> registeredGroup(uint64_t key);

}  // namespace loom::comm_pg

namespace loom {

// A queued operation of ProcessGroupComm (comm_backend.h): its Work, carrying its OpDesc. The
// waiter's part of the hand-off: the unbounded wait() runs the queue up to this operation
// inline when nothing runs, and a wait that is about to sleep tells the worker to start the
// queue at once.
class ProcessGroupComm::CommWork final : public Work {
 public:
  // `group` is null for a direct operation (and for any operation of a group not owned by a
  // shared_ptr); `registryKey` finds its group in the registry then (0: none).
  CommWork(OpDesc&& desc, int rank, std::weak_ptr<ProcessGroup> group, uint64_t registryKey)
      : Work(opTypeName(desc.type), desc.seq, rank),
        op(std::move(desc)),
        group_(std::move(group)),
        registryKey_(registryKey) {}

  bool wait() override;
  // A bounded wait never runs the operation itself, so that its deadline holds.
  bool wait(std::chrono::milliseconds timeout) override;

  OpDesc op;
  // Guarded by the group's mu_: set when it was queued with nothing queued or running ahead
  // of it; only such an operation is left to its waiter for the grace, counted from `seen`,
  // when the worker first found it at the head (issuing reads no clock).
  bool lone = false;
  TimePoint seen{};
  // Set by post() (before the Work is returned) for a lone collective of a group owned by a
  // shared_ptr: its waiter may claim and run it without the queue lock (runDirect). Such a
  // Work holds no weak pointer to its group (one atomic increment at issue and one decrement
  // when the Work dies, ~10% of a world-size-1 all-reduce through the group): the unbounded
  // wait never needs the group unless it wins the claim, which keeps the group alive; the
  // rare paths (a bounded wait, its timeout) find it in the registry by registryKey_.
  ProcessGroupComm* direct = nullptr;

  // Exactly one thread runs the operation: the first to claim it. The worker and the waiters
  // of the lock path claim it under mu_ as they take it from the queue; the waiter of a
  // direct operation claims it without the lock, and the operation then stays at the head of
  // the queue while it runs, as running_ does for the others (comm_backend.h).
  bool claim() {
    bool expected = false;
    return claimed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel);
  }
  bool isClaimed() const { return claimed_.load(std::memory_order_acquire); }
  // The waiter's part of a direct operation: claims it and runs it on the calling thread;
  // false when another thread claimed it first (the worker, after the grace). Static in
  // spirit: it touches the group only once the claim succeeded, which keeps the group alive
  // (the worker drains a claimed head before the group can be destroyed), and not after the
  // operation completed.
  bool runDirect();

 protected:
  // wait(timeout) expired: abort the group (a TimeoutError always means it is unusable).
  void onWaitTimeout(const std::string& reason) override;

 private:
  // The group, while it lives: through the weak pointer, or for a direct operation through
  // the registry. Null once it is being destroyed, and for a group not owned by a shared_ptr.
  std::shared_ptr<ProcessGroupComm> lockGroup() const;

  std::weak_ptr<ProcessGroup> group_;
  const uint64_t registryKey_;
  std::atomic<bool> claimed_{false};
};

}  // namespace loom
