// ProcessGroupComm: the comm backend, Gloo-like: comm/ algorithms over any comm::Context (the
// "tcp" backend: TCP connections, shared memory between same-host ranks; the "verbs"
// backend: RDMA) plus one worker thread that runs the collectives of a FIFO queue, in issue
// order. Private to loom_process_group: users get it through createProcessGroup.
//
// Contract (on top of ProcessGroup's)
// - CPU buffers only (InvalidArgumentError otherwise).
// - Hand-off ("the waiter runs it"): operations run one at a time in issue order, each on
//   exactly one thread: the worker, or a thread blocked in Work::wait() on it. An unbounded
//   wait() on an operation that is still queued, with no operation running, claims the
//   operations from the head of the queue up to its own (under the queue lock, so exactly
//   one thread takes each) and runs them inline: issue-then-wait costs no thread hand-off
//   and no wake-up. To leave a waiter that chance, the worker does not take a fresh
//   operation issued with nothing queued or running ahead of it until the grace
//   (options.comm.graceUs, 50 us) after it first found it, unless a waiter sleeps on the
//   queue, more operations queue up behind it (the async pattern) or the group is being
//   destroyed: then it starts at once. While waiters run operations (the last inline run less
//   than kHotWindow, 5 ms, ago) the worker naps in slices of options.comm.napUs (1 ms) instead
//   of sleeping, and issuing a lone operation does not wake it: an operation nobody waits on
//   then starts within a nap at the latest. 0 turns the grace, or the napping, off: every
//   issue then wakes the worker.
// - Direct operations: a collective issued with nothing queued or running ahead of it (the
//   issue-then-wait pattern) is claimed by its waiter with one compare-and-swap on the Work,
//   without the queue lock, and runs while it stays at the head of the queue; nobody else runs
//   anything meanwhile (a claimed head counts as running), and whoever holds the lock next
//   (the next issue, the worker) pops it once it completed. The worker, and a waiter of a later
//   operation, sleep on its completion. If the worker claims it first (after the grace), the
//   waiter sleeps as for any other operation.
// - send / recv at the head of the queue are posted on the transport as they reach it (with
//   the tag layout of comm::send / comm::recv) and waited for as one batch that keeps taking
//   the send / recv operations queued behind it, so a ring exchange cannot deadlock.
// - The constructor is collective (comm::Context::create through the store) and blocks until
//   this rank is connected, or options.timeout passes.
// - Failure handling, on the thread running the operation (the worker, or a waiter running
//   it inline), when an operation raises:
//   1. the group is marked broken: every queued and future operation fails at once with an
//      IoError naming the original cause;
//   2. this rank publishes a failure report ("failure/<rank>": its message) in the store,
//      then closes its connections, so that the peers blocked on it fail within moments
//      instead of waiting for their own deadline (the failure cascades);
//   3. it waits up to failureReportWindow (capped at timeout / 2) for the other ranks'
//      reports and raises one error that carries its own message, the others' reports and
//      the ranks that sent none (dead, stopped, or not at this operation: the suspects). The
//      error is a TimeoutError when any rank's failure was a timeout, else an IoError.
//   The store work runs on a short-lived detached thread and the worker waits for it with
//   deadlines (window + at most window / 2), so a store that does not answer (its host was
//   stopped) costs the reports, never the bound: a failed operation raises within 1.75x its
//   timeout.
// - abort(reason) never waits for the network: it fails the running operation through
//   comm::Context::abort. The destructor drains the queue (each operation bounded by its
//   deadline, or failing at once when the group is broken) and joins the worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "loom/process_group/process_group.h"

namespace loom {

class ProcessGroupComm final : public ProcessGroup {
 public:
  // `backend` names it in messages ("tcp", "verbs"); makeContext creates its Context
  // (comm::Context::create, comm::createVerbsContext, or a test's).
  using ContextFactory = std::function<std::shared_ptr<comm::Context>(Store&, int rank, int size,
                                                                      const comm::ContextOptions&)>;
  ProcessGroupComm(std::string backend, std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupOptions& options, const ContextFactory& makeContext);
  ~ProcessGroupComm() override;

  void abort(const std::string& reason) override;
  bool isBroken() const override;
  std::string transportSummary() const override;
  std::string tuningSummary() const override;
  bool reproducible() const override { return reproducible_; }

  // Runs the queued operations up to and including `work`'s on the calling thread, in issue
  // order, when `work` is still queued and no operation is running (Work::wait() calls it
  // before blocking). Returns true once `work`'s operation ran, false when it could not
  // (running elsewhere, behind a running operation, already done, group broken).
  bool runInline(const Work* work);
  // A thread is about to sleep on `work`: when it is still queued, the worker starts the
  // queue now instead of leaving it to a waiter.
  void wakeForWaiter(const Work* work);

 protected:
  std::shared_ptr<Work> post(OpDesc&& op) override;
  void checkDevice(const BufferView& buf, const char* opName) const override;
  // In reproducible mode (comm::ContextOptions::reproducible) a reduction the mode refuses
  // (PROD over a floating dtype) is refused at issue, so that the group stays usable.
  void checkOp(const OpDesc& op) const override;

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  // A queued operation is its Work, which carries the OpDesc (moved in once at issue): the
  // queue, the worker and the waiters pass pointers, never copies of the OpDesc.
  class CommWork;
  using Item = std::shared_ptr<CommWork>;
  // What the worker is doing, so that post() knows whether it must be woken.
  enum class WorkerState : uint8_t {
    kBusy,      // running, or about to look at the queue (it will see what is there)
    kNapping,   // a timed wait: it looks at the queue again on its own soon
    kSleeping,  // waits until notified
  };

  void workerLoop();
  // Whether the worker must be notified for the queue as it is now (mu_ held).
  bool workerNeedsWakeLocked() const;
  // Runs one claimed operation (fails it at once when the group is broken). The caller set
  // running_, or claimed a direct operation. `owner` is the queue's pointer to it (the
  // send / recv batch keeps it; null only for a direct collective). Completing the Work is
  // its last access to the group.
  void execute(CommWork& work, Item* owner);
  // mu_ held: pops the completed operations that waiters ran directly from the head of the
  // queue and returns the head when a waiter still runs it (else null).
  CommWork* directHeadLocked();
  void run(const OpDesc& op);
  // allreduceCoalesced: packs the buffers, one comm::allreduce, unpacks.
  void runAllreduceCoalesced(comm::Context& ctx, const OpDesc& op,
                             const comm::CollectiveOptions& copts);
  // The comm/ collective of `op`, on the running thread.
  // send / recv: `first` and the send / recv operations that reach the head of the queue
  // while it waits run as one batch on the transport.
  void runPointToPoint(Item& first);
  // Debug level DETAIL: compares op's signature with every rank's through the store.
  void checkSignature(const OpDesc& op);
  // Steps 1-3 above; returns the error the failing operation's Work gets.
  std::exception_ptr handleFailure(const OpDesc& op, std::exception_ptr error);
  // Marks the group broken with `cause` (first call wins); returns true on the first call.
  bool markBroken(const std::string& cause);

  std::shared_ptr<comm::Context> ctx_;     // used by the running thread; abort() may call abort
  bool reproducible_ = false;              // ctx_->reproducible(), kept for checkOp after abort
  const std::chrono::microseconds grace_;  // options.comm.graceUs
  const std::chrono::microseconds nap_;    // options.comm.napUs

  // The group's issue lock (ProcessGroup::issueMutex), which post() is called with: issuing
  // an operation takes one lock. Guards everything below.
  std::mutex& mu_;
  std::condition_variable wake_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  // An operation taken from the queue runs (on the worker or inline in a waiter). A direct
  // operation (CommWork::runDirect) running at the head of the queue counts as running too.
  bool running_ = false;
  WorkerState workerState_ = WorkerState::kBusy;
  bool urgent_ = false;  // a waiter sleeps on a queued operation: no grace until it drains
  // The worker's view of inline runs: the count it last saw and when it saw it change (so
  // that running inline reads no clock).
  uint64_t inlineSeen_ = 0;
  TimePoint inlineSeenAt_{};
  // Hand-off counters, logged by the destructor when the debug level is INFO or DETAIL
  // (inlineRuns also tells the worker that waiters run operations).
  struct HandoffStats {
    uint64_t inlineRuns = 0;   // operations run by a waiter
    uint64_t workerRuns = 0;   // operations run by the worker
    uint64_t issueWakes = 0;   // issues that notified the worker
    uint64_t waiterWakes = 0;  // waiters about to sleep that notified the worker
    uint64_t workerWaits = 0;  // times the worker waited (slept, napped or held back)
    uint64_t graceWaits = 0;   // of which it held a fresh lone operation back for its waiter
  } stats_;
  bool broken_ = false;
  std::atomic<bool> brokenFlag_{false};  // broken_, for a lock-free look before each operation
  std::string brokenCause_;
  uint64_t lastSignatureSeq_ = 0;  // worker only
  // Direct operations run by their waiters (no lock: one runs at a time, and each run
  // happens after the previous one completed); the worker's view of inline runs adds it.
  std::atomic<uint64_t> directRuns_{0};
  // This group's key in the registry of groups owned by a shared_ptr (comm_handoff.cc),
  // through which a direct operation's Work finds its group on its rare paths (a bounded
  // wait, its timeout) without holding a weak pointer to it. Registered by the first post()
  // that finds the group owned (registered_, under mu_); removed by the destructor.
  const uint64_t registryKey_;
  bool registered_ = false;

  std::thread worker_;
};

}  // namespace loom
