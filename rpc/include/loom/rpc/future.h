// Future: the result of an rpcAsync call (or of creating a remote value), ready later.
//
// Contract
// - Every call has a deadline fixed when it is issued (its timeout). The future completes with
//   the callee's result, with a RemoteError (the callee raised), an IoError (the connection to
//   the callee broke: it died or shut down; pending calls fail as soon as the socket reports
//   it), or a TimeoutError once the deadline passes, whether or not anyone waits on it.
// - wait() blocks until completion and returns the result or rethrows the error; it never
//   blocks past the call's deadline (plus a small margin for the completion to arrive).
// - Copies share one state; all methods are thread-safe.
#pragma once

#include <exception>
#include <memory>

#include "loom/rpc/value.h"

namespace loom::rpc {

namespace detail {
class CallState;
}

class Future {
 public:
  Future() = default;
  explicit Future(std::shared_ptr<detail::CallState> state) : state_(std::move(state)) {}

  // The result, or the call's error rethrown.
  Value wait() const;
  template <class T>
  T waitAs() const {
    return wait().template get<T>();
  }
  bool done() const;
  // True once done with an error (what wait() would throw).
  bool failed() const;
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<detail::CallState> state_;
};

}  // namespace loom::rpc
