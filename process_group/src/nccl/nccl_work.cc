// NcclWork (nccl_state.h): an nccl operation's Work. wait() orders the caller's stream after
// the operation and returns; wait(timeout) and a blockingWait group's wait() block the host
// (hostWait); isCompleted() polls the event. A Work in the open point-to-point batch issues the
// batch first (nccl_p2p_batch.cc). A failed group's Works take the watchdog's diagnosis as their
// error when theirs is the failing operation (nccl_backend.cc, diagnose).
#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "loom/common/error.h"
#include "nccl/nccl_state.h"
#include "pg_failure.h"

namespace loom::nccl_detail {

bool NcclWork::isCompleted() {
  if (Work::isCompleted()) return true;
  if (!ensureIssued()) return Work::isCompleted();
  poll(false);
  return Work::isCompleted();
}

bool NcclWork::wait() {
  if (state_->options.blockingWait) return hostWait(std::nullopt);
  if (!ensureIssued() || Work::isCompleted()) return finished();
  poll(false);
  if (Work::isCompleted()) return finished();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->broken) {
      DeviceGuard guard(*state_->api, state_->device);
      state_->api->streamWaitEvent(callerStream(state_->options), done_.get());
      return true;
    }
  }
  poll(true);  // broken: the Work's error (after the diagnosis)
  return finished();
}

bool NcclWork::wait(std::chrono::milliseconds timeout) {
  if (timeout <= std::chrono::milliseconds::zero()) return wait();  // c10d's kNoTimeout
  return hostWait(Clock::now() + timeout, timeout);
}

bool NcclWork::ensureIssued() {
  if (issued_.load(std::memory_order_acquire)) return true;
  state_->flush();
  return issued_.load(std::memory_order_acquire);
}

bool NcclWork::hostWait(std::optional<Clock::time_point> deadline,
                        std::chrono::milliseconds timeout) {
  if (!ensureIssued() || Work::isCompleted()) return finished();
  std::string error;
  const auto spinUntil = Clock::now() + state_->options.hostSpin;
  NcclApi::EventState s = state_->api->queryEvent(done_.get(), error);
  while (s == NcclApi::EventState::kPending && Clock::now() < spinUntil) {
    s = state_->api->queryEvent(done_.get(), error);
  }
  if (s != NcclApi::EventState::kPending) {
    poll(true);
    if (Work::isCompleted()) return finished();
  }
  if (deadline) {
    if (auto dog = state_->watchdog.lock()) dog->tighten(done_, *deadline, timeout);
  }
  try {
    state_->api->synchronizeEvent(done_.get());
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->failLocked(state_->who + ": " + description_ + ": " + e.what());
  }
  poll(true);
  if (!Work::isCompleted()) {
    // The event completed but the group has not said why it failed: bounded by the same
    // window as a failure's diagnosis.
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->failLocked(state_->who + ": " + description_ +
                       ": cudaEventSynchronize returned before the operation completed");
  }
  poll(true);
  return finished();
}

void NcclWork::poll(bool mayWait) {
  std::string error;
  const NcclApi::EventState s = state_->api->queryEvent(done_.get(), error);
  std::unique_lock<std::mutex> lock(state_->mu);
  if (s == NcclApi::EventState::kDone) {
    // After an abort, an event also completes because the kernels were ended: the operation
    // succeeded only when the watchdog saw it done before its failure.
    bool ok = !state_->aborted;
    if (!ok) {
      auto dog = state_->watchdog.lock();
      ok = dog && !dog->failure().empty() && !dog->failedPending(done_);
    }
    if (ok) {
      lock.unlock();
      markCompleted();
      return;
    }
  }
  if (s == NcclApi::EventState::kFailed) {
    state_->failLocked(state_->who + ": " + description_ + " failed on the device: " + error);
  }
  if (!state_->broken) return;
  if (state_->diagnosing) {
    if (!mayWait) return;
    const auto window =
        std::min(std::chrono::milliseconds(2000) + timeout_ / 2, std::chrono::milliseconds(60000));
    state_->settled.wait_for(lock, window + pg_failure::kStoreSlack,
                             [&] { return !state_->diagnosing; });
  }
  std::exception_ptr error_ptr;
  if (state_->failedError && state_->failedOp == description_) {
    error_ptr = state_->failedError;
  } else {
    error_ptr = std::make_exception_ptr(
        IoError(state_->who + ": " + description_ + " failed: the group failed: " + state_->cause));
  }
  lock.unlock();
  markFailed(error_ptr);
}

}  // namespace loom::nccl_detail
