#include "call_state.h"

#include "loom/common/error.h"
#include "loom/rpc/future.h"

namespace loom::rpc {
namespace detail {

bool CallState::finish(Value value, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return false;
    done_ = true;
    value_ = std::move(value);
    error_ = std::move(error);
  }
  cv_.notify_all();
  return true;
}

bool CallState::succeed(Value value) {
  return finish(std::move(value), nullptr);
}

bool CallState::fail(std::exception_ptr error) {
  return finish(Value(), std::move(error));
}

bool CallState::expireIfDue() {
  if (!deadline_.expired() || done()) return false;
  return fail(std::make_exception_ptr(TimeoutError(
      "rpc: " + description_ + " timed out after " + std::to_string(deadline_.elapsed().count()) +
      " ms (timeout " + std::to_string(timeout_.count()) + " ms)")));
}

bool CallState::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool CallState::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && error_ != nullptr;
}

Value CallState::wait(milliseconds margin) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline_.end() + margin, [&] { return done_; });
  }
  // The channel's sweep normally expires the call; do it here if it has not yet.
  expireIfDue();
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
  return value_;
}

}  // namespace detail

Value Future::wait() const {
  LOOM_CHECK(state_ != nullptr, "wait() on an empty rpc::Future");
  return state_->wait(milliseconds(200));
}

bool Future::done() const {
  return state_ != nullptr && state_->done();
}

bool Future::failed() const {
  return state_ != nullptr && state_->failed();
}

}  // namespace loom::rpc
