#include "loom/process_group/work.h"

#include <utility>

#include "loom/common/error.h"

namespace loom {

Work::Work(std::string opName, uint64_t seq, int rank)
    : opName_(std::move(opName)), seq_(seq), rank_(rank) {}

std::string Work::describe() const {
  return opName_ + "#" + std::to_string(seq_);
}

bool Work::isCompleted() {
  return done();
}

bool Work::isSuccess() const {
  return done() && !error_;
}

std::exception_ptr Work::exception() const {
  return done() ? error_ : nullptr;
}

bool Work::complete(std::exception_ptr error) {
  uint8_t expected = kPending;
  if (!state_.compare_exchange_strong(expected, kSetting, std::memory_order_acq_rel)) {
    return false;  // completion is final: the first call won
  }
  error_ = std::move(error);
  state_.store(kDone, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    // Taking mu_ orders this notify after the sleeper's check of state_ (it holds mu_ from
    // that check until the condition variable releases it).
    { std::lock_guard<std::mutex> lock(mu_); }
    done_.notify_all();
  }
  return true;
}

void Work::markCompleted() {
  complete(nullptr);
}

void Work::markFailed(std::exception_ptr error) {
  complete(std::move(error));
}

bool Work::wait() {
  return waitUntil(std::chrono::steady_clock::time_point::max(), false);
}

bool Work::wait(std::chrono::milliseconds timeout) {
  return waitUntil(std::chrono::steady_clock::now() + timeout, true);
}

bool Work::waitUntil(std::chrono::steady_clock::time_point deadline, bool bounded) {
  if (done()) return finished();  // no clock read: a waiter that ran it inline lands here
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    // Sequentially consistent, to pair with complete()'s store of kDone and load of sleepers_.
    const auto finished = [&] { return state_.load(std::memory_order_seq_cst) == kDone; };
    while (!finished()) {
      if (!bounded) {
        done_.wait(lock);
      } else if (done_.wait_until(lock, deadline) == std::cv_status::timeout) {
        break;
      }
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (!done()) timedOut(start);
  return finished();
}

bool Work::finished() const {
  if (error_) std::rethrow_exception(error_);
  return true;
}

void Work::timedOut(std::chrono::steady_clock::time_point start) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  const std::string reason =
      detail::str("rank ", rank_, ": ", describe(), " did not complete within ", waited.count(),
                  " ms of wait(); the group was aborted");
  onWaitTimeout(reason);
  throw TimeoutError(reason);
}

void Work::onWaitTimeout(const std::string&) {}

}  // namespace loom
