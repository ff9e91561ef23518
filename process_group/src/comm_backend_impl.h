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

}  // namespace loom::comm_pg

namespace loom {

// A queued operation of ProcessGroupComm (comm_backend.h): its Work, carrying its OpDesc. The
// waiter's part of the hand-off: the unbounded wait() runs the queue up to this operation
// inline when nothing runs, and a wait that is about to sleep tells the worker to start the
// queue at once.
class ProcessGroupComm::CommWork final : public Work {
 public:
  CommWork(OpDesc&& desc, int rank, std::weak_ptr<ProcessGroup> group)
      : Work(opTypeName(desc.type), desc.seq, rank),
        op(std::move(desc)),
        group_(std::move(group)) {}

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
  // shared_ptr: its waiter may claim and run it without the queue lock (runDirect).
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
  // Whether the group is owned by a shared_ptr (no inline runs otherwise).
  bool ownedGroup() const { return !group_.expired(); }

 protected:
  // wait(timeout) expired: abort the group (a TimeoutError always means it is unusable).
  void onWaitTimeout(const std::string& reason) override;

 private:
  std::shared_ptr<ProcessGroupComm> lockGroup() const {
    return std::static_pointer_cast<ProcessGroupComm>(group_.lock());
  }

  std::weak_ptr<ProcessGroup> group_;
  std::atomic<bool> claimed_{false};
};

}  // namespace loom
