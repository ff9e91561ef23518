#include "loom/process_group/work.h"

#include <thread>
#include <utility>

#include "loom/common/error.h"

namespace loom {

Work::Work(std::string opName, uint64_t seq, int rank)
    : opName_(std::move(opName)), seq_(seq), rank_(rank) {}

std::string Work::describe() const {
  return opName_ + "#" + std::to_string(seq_);
}

bool Work::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completed_) return true;
  }
  return pollIntervalUs() > 0 && poll();
}

bool Work::isSuccess() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Work::markCompleted() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completed_) return;
    completed_ = true;
  }
  done_.notify_all();
}

void Work::markFailed(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completed_) return;
    completed_ = true;
    error_ = std::move(error);
  }
  done_.notify_all();
}

void Work::setOnWaitTimeout(std::function<void(const std::string&)> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  onWaitTimeout_ = std::move(hook);
}

bool Work::wait() {
  if (!isCompleted()) runInline();
  return waitUntil(std::chrono::steady_clock::time_point::max(), false);
}

bool Work::wait(std::chrono::milliseconds timeout) {
  return waitUntil(std::chrono::steady_clock::now() + timeout, true);
}

bool Work::waitUntil(std::chrono::steady_clock::time_point deadline, bool bounded) {
  const auto start = std::chrono::steady_clock::now();
  const int pollUs = pollIntervalUs();
  std::unique_lock<std::mutex> lock(mu_);
  while (!completed_) {
    if (bounded && std::chrono::steady_clock::now() >= deadline) break;
    if (pollUs > 0) {
      lock.unlock();
      const bool done = poll();
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(pollUs));
      lock.lock();
    } else if (bounded) {
      done_.wait_until(lock, deadline);
    } else {
      done_.wait(lock);
    }
  }
  if (completed_) {
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  const std::string reason =
      detail::str("rank ", rank_, ": ", describe(), " did not complete within ", waited.count(),
                  " ms of wait(); the group was aborted");
  auto hook = onWaitTimeout_;
  lock.unlock();
  if (hook) hook(reason);
  throw TimeoutError(reason);
}

}  // namespace loom
