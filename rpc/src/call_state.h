// CallState: one outstanding call's completion, shared by the caller's Future and the channel
// that will deliver its answer. The first completion wins (answer, connection failure or
// deadline); later ones are ignored.
//
// A failure is kept as its kind and text (CallError), not as the exception object: every wait()
// throws a fresh exception on the waiting thread, so no exception object is shared between the
// thread that failed the call and the threads that wait on it.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "loom/common/deadline.h"
#include "loom/rpc/value.h"

namespace loom::rpc::detail {

class CallState {
 public:
  // `description`: "call #17 'get_rows' to worker 'ps' (rank 0)", for errors.
  // `function`: the name called, for the RemoteError of a failed answer.
  CallState(std::string description, std::string function, milliseconds timeout)
      : description_(std::move(description)),
        function_(std::move(function)),
        timeout_(timeout),
        deadline_(timeout) {}

  bool succeed(Value value);
  // Records the error `error` holds (then drops it, on this thread).
  bool fail(std::exception_ptr error);
  // Fails with TimeoutError when the deadline has passed; true when it did.
  bool expireIfDue();

  bool done() const;
  bool failed() const;
  // Waits for completion, at most until the deadline plus `margin`; then expires the call.
  Value wait(milliseconds margin);

  const std::string& description() const { return description_; }
  const std::string& function() const { return function_; }
  const Deadline& deadline() const { return deadline_; }
  milliseconds timeout() const { return timeout_; }

 private:
  struct CallError {
    enum class Kind { kIo, kTimeout, kRemote, kInvalidArgument } kind = Kind::kIo;
    std::string what;
    std::string callee, function, type, message;  // kRemote
    [[noreturn]] void raise() const;
  };

  bool finish(Value value, std::optional<CallError> error);

  const std::string description_;
  const std::string function_;
  const milliseconds timeout_;
  const Deadline deadline_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Value value_;
  std::optional<CallError> error_;
};

}  // namespace loom::rpc::detail
