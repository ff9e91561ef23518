#include "call_state.h"

#include "loom/common/error.h"
#include "loom/rpc/agent.h"
#include "loom/rpc/future.h"

namespace loom::rpc {
namespace detail {

void CallState::CallError::raise() const {
  switch (kind) {
    case Kind::kTimeout:
      throw TimeoutError(what);
    case Kind::kRemote:
      throw RemoteError(what, callee, function, type, message);
    case Kind::kInvalidArgument:
      throw InvalidArgumentError(what);
    case Kind::kIo:
      break;
  }
  throw IoError(what);
}

bool CallState::finish(Value value, std::optional<CallError> error) {
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
  return finish(std::move(value), std::nullopt);
}

bool CallState::fail(std::exception_ptr error) {
  CallError e;
  try {
    std::rethrow_exception(std::move(error));
  } catch (const RemoteError& r) {
    e = CallError{CallError::Kind::kRemote, r.what(),         r.callee(), r.function(),
                  r.remoteType(),           r.remoteMessage()};
  } catch (const TimeoutError& t) {
    e = CallError{CallError::Kind::kTimeout, t.what(), {}, {}, {}, {}};
  } catch (const InvalidArgumentError& i) {
    e = CallError{CallError::Kind::kInvalidArgument, i.what(), {}, {}, {}, {}};
  } catch (const std::exception& x) {
    e = CallError{CallError::Kind::kIo, x.what(), {}, {}, {}, {}};
  } catch (...) {
    e = CallError{
        CallError::Kind::kIo, "rpc: " + description_ + " failed (unknown error)", {}, {}, {}, {}};
  }
  return finish(Value(), std::move(e));
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
  return done_ && error_.has_value();
}

Value CallState::wait(milliseconds margin) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline_.end() + margin, [&] { return done_; });
  }
  // The channel's sweep normally expires the call; do it here if it has not yet.
  expireIfDue();
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) error_->raise();
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
