// RRef: a reference to a value that lives on its owner, made by RpcAgent::remote().
//
// Contract
// - remote(to, fn, args) asks worker `to` to run fn(args) and keep the result; it returns at
//   once with an RRef naming the owner and the value's id. The owner keeps the value until the
//   last copy of the RRef on the creator is destroyed (then the creator tells the owner to drop
//   it; a one-way message, best effort once the agent has shut down).
// - toHere(timeout) fetches a copy of the value from the owner, waiting on the owner until the
//   value is made. If making it raised, toHere() throws the same RemoteError. The call has a
//   deadline like any other (0: the agent's default).
// - created() is the future of the creation itself (its result is null once the value exists).
// - An RRef is meant for its creator: passing one to a third worker is not supported (torch's
//   fork protocol for shared RRefs is not implemented).
// - Copies share one state; thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "loom/rpc/future.h"
#include "loom/rpc/value.h"

namespace loom::rpc {

namespace detail {
struct RRefState;
}

class RRef {
 public:
  RRef() = default;
  explicit RRef(std::shared_ptr<detail::RRefState> state) : state_(std::move(state)) {}

  const std::string& owner() const;
  int ownerRank() const;
  uint64_t id() const;
  const Future& created() const;

  Value toHere(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const;
  template <class T>
  T toHereAs(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const {
    return toHere(timeout).template get<T>();
  }
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<detail::RRefState> state_;
};

}  // namespace loom::rpc
