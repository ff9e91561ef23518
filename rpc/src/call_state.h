// CallState: one outstanding call's completion, shared by the caller's Future and the channel
// that will deliver its answer. The first completion wins (answer, connection failure or
// deadline); later ones are ignored.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
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
  bool finish(Value value, std::exception_ptr error);

  const std::string description_;
  const std::string function_;
  const milliseconds timeout_;
  const Deadline deadline_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Value value_;
  std::exception_ptr error_;
};

}  // namespace loom::rpc::detail
