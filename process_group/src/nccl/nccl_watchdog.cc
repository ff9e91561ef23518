#include "nccl/nccl_watchdog.h"

#include <vector>

#include "diagnostics/flight_recorder.h"
#include "loom/common/logging.h"

namespace loom::nccl_detail {

Watchdog::Watchdog(std::shared_ptr<WatchdogDevice> device, diag::FlightRecorder* recorder,
                   std::string who, FailureHandler onFailure, std::chrono::microseconds interval)
    : device_(std::move(device)),
      recorder_(recorder),
      who_(std::move(who)),
      onFailure_(std::move(onFailure)),
      interval_(interval) {
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::track(std::shared_ptr<void> handle, uint64_t recordId, std::string description,
                     std::chrono::milliseconds timeout, std::shared_ptr<const OpDesc> op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) {
    if (recorder_ != nullptr) recorder_->recordEnd(recordId, true);
    failedHandles_.push_back(std::move(handle));
    return;
  }
  // Only an idle watchdog sleeps until woken; a busy one comes back within its interval, and
  // waking it per operation would cost a thread switch per operation.
  const bool idle = entries_.empty();
  entries_.push_back(Entry{std::move(handle), recordId, std::move(description), timeout,
                           Deadline(timeout), std::move(op), false, std::nullopt,
                           std::chrono::milliseconds(0)});
  if (idle) wake_.notify_all();
}

void Watchdog::tighten(const std::shared_ptr<void>& handle,
                       std::chrono::steady_clock::time_point deadline,
                       std::chrono::milliseconds waited) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : entries_) {
    if (e.handle != handle) continue;
    if (!e.waitDeadline || deadline < *e.waitDeadline) {
      e.waitDeadline = deadline;
      e.waited = waited;
    }
  }
  wake_.notify_all();
}

void Watchdog::setTimer(std::chrono::steady_clock::time_point when, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  timerAt_ = when;
  timer_ = std::move(fn);
  wake_.notify_all();
}

size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::string Watchdog::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

bool Watchdog::failedPending(const std::shared_ptr<void>& handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& h : failedHandles_) {
    if (h == handle) return true;
  }
  return false;
}

void Watchdog::loop() {
  for (;;) {
    std::function<void()> timer;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Nothing to watch: sleep until an operation is tracked or the timer is due.
      const auto ready = [&] {
        return stopping_ || (!entries_.empty() && failure_.empty()) ||
               (timerAt_ && std::chrono::steady_clock::now() >= *timerAt_);
      };
      while (!ready()) {
        if (timerAt_) {
          wake_.wait_until(lock, *timerAt_);
        } else {
          wake_.wait(lock);
        }
      }
      if (stopping_) return;
      if (timerAt_ && std::chrono::steady_clock::now() >= *timerAt_) {
        timer = std::move(timer_);
        timer_ = nullptr;
        timerAt_.reset();
      }
    }
    try {
      if (timer) timer();
      pass();
    } catch (const std::exception& e) {
      fail(who_ + ": NCCL watchdog: " + e.what(), false, nullptr);
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (entries_.empty() || !failure_.empty()) continue;  // back to the sleep above
    if (wake_.wait_for(lock, interval_, [&] { return stopping_; })) return;
  }
}

void Watchdog::pass() {
  // The head, while it completes (one stream: in order).
  for (;;) {
    std::shared_ptr<void> handle;
    uint64_t recordId = 0;
    std::string description;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (entries_.empty() || !failure_.empty()) return;
      Entry& h = entries_.front();
      if (!h.started) {
        h.started = true;
        if (recorder_ != nullptr) recorder_->recordStart(h.recordId);
      }
      handle = h.handle;
      recordId = h.recordId;
      description = h.description;
    }
    std::string error;
    const WatchdogDevice::Status s = device_->query(handle, error);
    if (s == WatchdogDevice::Status::kPending) break;
    if (s == WatchdogDevice::Status::kFailed) {
      std::shared_ptr<const OpDesc> op;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!entries_.empty()) op = entries_.front().op;
      }
      fail(who_ + ": " + description + " failed on the device: " + error, false, op);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (recorder_ != nullptr) recorder_->recordEnd(recordId, false);
    entries_.pop_front();
  }
  const std::string async = device_->asyncError();
  if (!async.empty()) {
    std::shared_ptr<const OpDesc> op;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!entries_.empty()) op = entries_.front().op;
    }
    fail(who_ + ": the NCCL communicator failed: " + async, false, op);
    return;
  }
  std::string expired;
  std::shared_ptr<const OpDesc> op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (const Entry& e : entries_) {
      if (e.deadline.expired()) {
        expired = who_ + ": " + e.description + " timed out after " +
                  std::to_string(e.timeout.count()) +
                  " ms (NCCL watchdog; the communicator was aborted)";
      } else if (e.waitDeadline && now >= *e.waitDeadline) {
        expired = who_ + ": " + e.description + " timed out after " +
                  std::to_string(e.waited.count()) +
                  " ms in a bounded wait (NCCL watchdog; the communicator was aborted)";
      } else {
        continue;
      }
      op = e.op;
      break;
    }
  }
  if (!expired.empty()) fail(expired, true, op);
}

void Watchdog::fail(const std::string& reason, bool timedOut, std::shared_ptr<const OpDesc> op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) return;
    failure_ = reason;
    for (const Entry& e : entries_) {
      if (recorder_ != nullptr) recorder_->recordEnd(e.recordId, true);
      failedHandles_.push_back(e.handle);
    }
    entries_.clear();
  }
  LOOM_LOG_WARNING(reason);
  device_->abort(reason);
  if (onFailure_) onFailure_(reason, timedOut, op.get());
}

}  // namespace loom::nccl_detail
