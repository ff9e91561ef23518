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
                     std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) {
    if (recorder_ != nullptr) recorder_->recordEnd(recordId, true);
    return;
  }
  entries_.push_back(
      Entry{std::move(handle), recordId, std::move(description), timeout, Deadline(timeout)});
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

void Watchdog::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Nothing to watch: sleep until an operation is tracked.
      wake_.wait(lock, [&] { return stopping_ || (!entries_.empty() && failure_.empty()); });
      if (stopping_) return;
    }
    try {
      pass();
    } catch (const std::exception& e) {
      fail(who_ + ": NCCL watchdog: " + e.what(), false);
    }
    std::unique_lock<std::mutex> lock(mu_);
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
      fail(who_ + ": " + description + " failed on the device: " + error, false);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (recorder_ != nullptr) recorder_->recordEnd(recordId, false);
    entries_.pop_front();
  }
  const std::string async = device_->asyncError();
  if (!async.empty()) {
    fail(who_ + ": the NCCL communicator failed: " + async, false);
    return;
  }
  std::string expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_) {
      if (e.deadline.expired()) {
        expired = who_ + ": " + e.description + " timed out after " +
                  std::to_string(e.timeout.count()) +
                  " ms (NCCL watchdog; the communicator was aborted)";
        break;
      }
    }
  }
  if (!expired.empty()) fail(expired, true);
}

void Watchdog::fail(const std::string& reason, bool timedOut) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.empty()) return;
    failure_ = reason;
    for (const Entry& e : entries_) {
      if (recorder_ != nullptr) recorder_->recordEnd(e.recordId, true);
    }
    entries_.clear();
  }
  LOOM_LOG_WARNING(reason);
  device_->abort(reason);
  if (onFailure_) onFailure_(reason, timedOut);
}

}  // namespace loom::nccl_detail
