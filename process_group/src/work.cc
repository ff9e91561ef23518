#include "loom/process_group/work.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#include <utility>

#include "loom/common/error.h"

namespace loom {

namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the futex word is a plain 32-bit word");

// Sleeps while *word == expected, for at most `timeout` (null: no bound). Returns on a wake,
// a changed word, a signal or the timeout; the caller re-checks.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, const timespec* timeout) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, timeout,
            nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
}

}  // namespace

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
  uint32_t expected = kPending;
  if (!error) {
    // Success writes no error_: one compare-and-swap claims and publishes it (sequentially
    // consistent, to pair with a sleeper's count and load below).
    if (!state_.compare_exchange_strong(expected, kDone, std::memory_order_seq_cst)) {
      return false;  // completion is final: the first call won
    }
  } else {
    if (!state_.compare_exchange_strong(expected, kSetting, std::memory_order_acq_rel)) {
      return false;
    }
    error_ = std::move(error);
    state_.store(kDone, std::memory_order_seq_cst);
  }
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futexWakeAll(&state_);
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
  if (timeout <= std::chrono::milliseconds::zero()) return wait();  // c10d's kNoTimeout
  return waitUntil(std::chrono::steady_clock::now() + timeout, true);
}

bool Work::waitUntil(std::chrono::steady_clock::time_point deadline, bool bounded) {
  if (done()) return finished();  // no clock read: a waiter that ran it inline lands here
  const auto start = std::chrono::steady_clock::now();
  sleepUntilDone(deadline, bounded);
  if (!done()) timedOut(start);
  return finished();
}

bool Work::awaitCompletion(std::chrono::steady_clock::time_point deadline) {
  if (!done()) sleepUntilDone(deadline, true);
  return done();
}

void Work::sleepUntilDone(std::chrono::steady_clock::time_point deadline, bool bounded) {
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  for (;;) {
    // Sequentially consistent, to pair with complete()'s store of kDone and load of sleepers_.
    const uint32_t state = state_.load(std::memory_order_seq_cst);
    if (state == kDone) break;
    if (!bounded) {
      futexWait(&state_, state, nullptr);
      continue;
    }
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec timeout{static_cast<time_t>(ns / 1'000'000'000),
                           static_cast<long>(ns % 1'000'000'000)};
    futexWait(&state_, state, &timeout);
  }
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
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
