// ProcessGroupComm's hand-off: how an operation gets from the thread that issues it to the
// thread that runs it (the worker, or the waiter itself; comm_backend.h and docs/handoff.md).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "comm_backend.h"
#include "comm_backend_impl.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/schedule_noise.h"
#include "record_hooks.h"

namespace loom {

namespace comm_pg {

namespace {

struct Registry {
  std::mutex mu;
  std::unordered_map<uint64_t, std::weak_ptr<ProcessGroup>> groups;
};

Registry& registry() {
  // Never destroyed: a group (or a Work) may outlive static destruction's order.
  static auto* r = new Registry;
  return *r;
}

std::atomic<uint64_t> nextRegistryKey{1};

}  // namespace

uint64_t newRegistryKey() {
  return nextRegistryKey.fetch_add(1, std::memory_order_relaxed);
}

void registerGroup(uint64_t key, std::weak_ptr<ProcessGroup> group) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.groups[key] = std::move(group);
}

void unregisterGroup(uint64_t key) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.groups.erase(key);
}

std::shared_ptr<ProcessGroup> registeredGroup(uint64_t key) {
  if (key == 0) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto it = r.groups.find(key);
  return it == r.groups.end() ? nullptr : it->second.lock();
}

}  // namespace comm_pg

using namespace comm_pg;

std::shared_ptr<ProcessGroupComm> ProcessGroupComm::CommWork::lockGroup() const {
  auto group = group_.lock();
  if (!group) group = registeredGroup(registryKey_);
  return std::static_pointer_cast<ProcessGroupComm>(group);
}

bool ProcessGroupComm::CommWork::wait() {
  if (!isCompleted()) {
    if (direct != nullptr) {
      // When the claim fails, another thread claimed the operation (the worker after the
      // grace, or the waiter of a later operation running the queue up to its own): it runs
      // and completes it, and there is nothing to hurry. So this path never needs the group.
      runDirect();
    } else if (auto group = lockGroup(); group && !group->runInline(this) && !isCompleted()) {
      group->wakeForWaiter(this);
    }
  }
  return Work::wait();
}

bool ProcessGroupComm::CommWork::runDirect() {
  // Until the claim succeeds the group may be gone (then the worker claimed this operation
  // while it drained the queue, and the claim fails).
  LOOM_NOISE();  // the worker's grace may end meanwhile: it claims the operation too
  if (!claim()) return false;
  ProcessGroupComm& group = *direct;
  // One direct run at a time (see directRuns_): a plain increment.
  group.directRuns_.store(group.directRuns_.load(std::memory_order_relaxed) + 1,
                          std::memory_order_relaxed);
  group.execute(*this, nullptr);
  return true;
}

ProcessGroupComm::CommWork* ProcessGroupComm::directHeadLocked() {
  while (!queue_.empty() && queue_.front()->isClaimed()) {
    // Only a direct operation is claimed while still queued (the others leave the queue as
    // they are claimed).
    if (!queue_.front()->isCompleted()) return queue_.front().get();
    queue_.pop_front();
  }
  return nullptr;
}

bool ProcessGroupComm::CommWork::wait(std::chrono::milliseconds timeout) {
  if (timeout <= std::chrono::milliseconds::zero()) return wait();  // c10d's kNoTimeout
  if (!isCompleted()) {
    if (auto group = lockGroup()) group->wakeForWaiter(this);
  }
  return Work::wait(timeout);
}

void ProcessGroupComm::CommWork::onWaitTimeout(const std::string& reason) {
  if (auto group = lockGroup()) group->abort(reason);
}

std::shared_ptr<Work> ProcessGroupComm::post(OpDesc&& op) {
  // Called with mu_ held: it is the group's issue lock.
  if (!registered_) {
    // Until the group is owned by a shared_ptr its weak pointer is null: then no inline or
    // direct runs (and a bounded wait that expires cannot abort the group).
    if (auto self = weak_from_this(); !self.expired()) {
      registerGroup(registryKey_, std::move(self));
      registered_ = true;
    }
  }
  directHeadLocked();  // drops the last direct operation once it completed
  // A collective (send / recv run as batches taken from the queue, comm_backend.cc) issued
  // with nothing queued or running ahead of it.
  const bool lone = queue_.empty() && !running_;
  const bool direct =
      lone && registered_ && !broken_ && op.type != OpType::kSend && op.type != OpType::kRecv;
  auto work = std::make_shared<CommWork>(
      std::move(op), rank(),
      direct || !registered_ ? std::weak_ptr<ProcessGroup>() : weak_from_this(),
      registered_ ? registryKey_ : 0);
  if (broken_) {
    // A broken group fails it at once, without touching the queue.
    recordEnd(work->op, true);
    work->markFailed(std::make_exception_ptr(
        IoError(who() + ": " + work->op.describe() +
                " was not run: the group failed earlier: " + brokenCause_)));
    return work;
  }
  work->lone = lone;
  if (direct) work->direct = this;
  queue_.push_back(work);
  const bool wake = workerNeedsWakeLocked();
  stats_.issueWakes += wake;
  // Under the lock (the caller's): the worker sleeps only once it released it, so the notify
  // cannot be lost, and it costs nothing unless the worker must be woken.
  if (wake) wake_.notify_all();
  return work;
}

bool ProcessGroupComm::workerNeedsWakeLocked() const {
  if (running_ || workerState_ == WorkerState::kBusy) {
    // The worker looks at the queue before it waits again; the thread running an operation
    // inline wakes it when it is done (runInline).
    return false;
  }
  if (workerState_ == WorkerState::kSleeping || stopping_ || broken_ || urgent_) return true;
  // Napping: it comes back on its own within the nap; a lone fresh operation is left to its
  // waiter. More than one queued means nobody waited: start now.
  return queue_.size() > 1;
}

void ProcessGroupComm::workerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  // Nothing to take: nap while waiters run operations (`hot`), else sleep until notified.
  const auto idle = [&](bool hot) {
    ++stats_.workerWaits;
    if (hot) {
      workerState_ = WorkerState::kNapping;
      wake_.wait_for(lock, nap_);
    } else {
      workerState_ = WorkerState::kSleeping;
      wake_.wait(lock);
    }
  };
  for (;;) {
    workerState_ = WorkerState::kBusy;
    const TimePoint now = Clock::now();
    const uint64_t inlineRuns = stats_.inlineRuns + directRuns_.load(std::memory_order_relaxed);
    if (inlineRuns != inlineSeen_) {
      inlineSeen_ = inlineRuns;
      inlineSeenAt_ = now;
    }
    const bool hot = nap_.count() > 0 && now - inlineSeenAt_ < kHotWindow;
    // While it naps, the worker's wake-ups are the flight recorder's tick (an operation run
    // inline then reads no clock for its record); it is withdrawn before the worker sleeps
    // or runs an operation itself.
    publishRecorderTick(hot ? now : TimePoint{});
    if (running_) {
      // A waiter runs an operation inline; it wakes the worker when it is done and work is
      // left. Napping (not sleeping) while waiters run operations keeps the next issue from
      // having to wake the worker.
      idle(hot);
      continue;
    }
    if (directHeadLocked() != nullptr) {
      // Its waiter runs the operation at the head (CommWork::runDirect). Alone, it is the
      // issue-then-wait pattern: nap as while running_ (waking on each completion would
      // cost a futex wake per operation and a context switch). With operations queued
      // behind it, or the group stopping or broken, sleep on its completion instead (bounded
      // slices: the nap's wake-ups are the recorder's tick), then pop it and go on.
      if (queue_.size() == 1 && !urgent_ && !stopping_ && !broken_) {
        idle(hot);
        continue;
      }
      Item head = queue_.front();
      ++stats_.workerWaits;
      workerState_ = WorkerState::kNapping;
      lock.unlock();
      head->awaitCompletion(now + (nap_.count() > 0 ? nap_ : kDirectWaitSlice));
      head.reset();
      lock.lock();
      continue;
    }
    // ctx_ is still set while broken only after abort() with no failed operation.
    if (broken_ && ctx_) {
      publishRecorderTick(TimePoint{});
      const std::string cause = brokenCause_;
      running_ = true;
      lock.unlock();
      const milliseconds window = std::min(options().failureReportWindow, options().timeout / 2);
      auto exchange = FailureExchange::start(
          store(), rank(), size(), "io\n" + cause,
          diagnostics() ? diagnostics()->dumpLocal("abort", diag::GroupDiagnostics::kFailureEntries)
                        : "",
          window, false);
      if (exchange) exchange->waitFor(exchange->published, Clock::now() + window);
      std::shared_ptr<comm::Context> closing;
      {
        std::lock_guard<std::mutex> relock(mu_);
        closing = std::move(ctx_);
      }
      closing.reset();  // outside the lock: the connections close
      lock.lock();
      running_ = false;
      continue;
    }
    if (queue_.empty()) {
      urgent_ = false;
      if (stopping_) break;  // the queue is drained
      idle(hot);
      continue;
    }
    if (grace_.count() > 0 && queue_.size() == 1 && queue_.front()->lone && !urgent_ &&
        !stopping_ && !broken_) {
      TimePoint& seen = queue_.front()->seen;
      if (seen == TimePoint{}) seen = now;
      const TimePoint due = seen + grace_;
      if (now < due) {
        // A fresh lone operation: its waiter may be about to run it (see comm_backend.h).
        workerState_ = WorkerState::kNapping;
        ++stats_.workerWaits;
        ++stats_.graceWaits;
        wake_.wait_until(lock, due);
        continue;
      }
    }
    // Fails only when the head's waiter claimed it directly just now: then wait for it.
    if (!queue_.front()->claim()) continue;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    ++stats_.workerRuns;
    lock.unlock();
    LOOM_NOISE();  // waiters may look at the queue, and issues come, while the worker runs
    publishRecorderTick(TimePoint{});
    execute(*item, &item);
    item.reset();  // drop the buffers' Work outside the lock
    lock.lock();
    running_ = false;
  }
  workerState_ = WorkerState::kBusy;
  publishRecorderTick(TimePoint{});
}

bool ProcessGroupComm::runInline(const Work* work) {
  for (;;) {
    LOOM_NOISE();  // the worker, or another waiter, may take the head meanwhile
    Item item;
    Item ahead;  // a direct operation running at the head, ahead of `work`
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_ || broken_) return false;
      const CommWork* head = directHeadLocked();
      if (queue_.empty() || head == work) return false;
      mine = queue_.front().get() == work;
      if (!mine && std::none_of(queue_.begin(), queue_.end(),
                                [&](const Item& i) { return i.get() == work; })) {
        return false;  // not queued: running on the worker, or done
      }
      if (head != nullptr) {
        ahead = queue_.front();
      } else if (queue_.front()->claim()) {
        item = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
        ++stats_.inlineRuns;
      } else {
        continue;  // its own waiter claimed the head directly just now: look again
      }
    }
    if (ahead != nullptr) {
      // Another thread runs the operation ahead of ours: wait for it, then look again
      // (bounded slices: the operation is bounded by its own timeout).
      ahead->awaitCompletion(Clock::now() + kDirectWaitSlice);
      continue;
    }
    execute(*item, &item);
    item.reset();
    LOOM_NOISE();  // operations may be issued behind it, and waiters sleep on them, meanwhile
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      if (queue_.empty()) urgent_ = false;
      wake = workerState_ != WorkerState::kBusy &&
             (!queue_.empty() || broken_ || stopping_ || urgent_);
    }
    if (wake) wake_.notify_all();
    if (mine) return true;
  }
}

void ProcessGroupComm::wakeForWaiter(const Work* work) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::any_of(queue_.begin(), queue_.end(), [&](const Item& i) { return i.get() == work; })) {
      urgent_ = true;
      wake = !running_ && workerState_ != WorkerState::kBusy;
      stats_.waiterWakes += wake;
    }
  }
  if (wake) wake_.notify_all();
}

}  // namespace loom
