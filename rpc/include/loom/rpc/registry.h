// Registry: the functions a worker serves, by name.
//
// A handler takes the call's arguments (a Value array, see value.h) and the CallContext (who
// called, which function) and returns the result Value. Whatever it throws travels back to the
// caller as a RemoteError carrying the exception's type, message and the callee's name.
//
// add(name, fn) with a plain callable R(A...) converts the argument array to A... (each with
// Value::get<A>()) and R to a Value (void gives null); a call with the wrong number of
// arguments is an InvalidArgumentError on the callee, which the caller sees as a RemoteError.
// addRaw(name, handler) registers a handler that sees the Value array and the context as is.
//
// A Registry is filled before the agent starts and copied into it; the agent only reads it, so
// handlers are looked up without a lock. Handlers run concurrently on the agent's threads: they
// must be thread-safe.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/common/error.h"
#include "loom/rpc/value.h"

namespace loom::rpc {

struct CallContext {
  std::string caller;    // the calling worker's name
  int callerRank = -1;   //
  std::string function;  // the name it called
  uint64_t callId = 0;   // the caller's sequence number for this call
};

using Handler = std::function<Value(const Value& args, const CallContext& context)>;

namespace detail {

template <class F>
struct Signature : Signature<decltype(&std::decay_t<F>::operator())> {};
template <class R, class... A>
struct Signature<R (*)(A...)> {
  using Result = R;
  using Args = std::tuple<std::decay_t<A>...>;
};
template <class R, class... A>
struct Signature<R(A...)> : Signature<R (*)(A...)> {};
template <class C, class R, class... A>
struct Signature<R (C::*)(A...) const> : Signature<R (*)(A...)> {};
template <class C, class R, class... A>
struct Signature<R (C::*)(A...)> : Signature<R (*)(A...)> {};

template <class F, class Tuple, size_t... I>
Value invokeWith(F& f, const Value& args, std::index_sequence<I...>) {
  using R = typename Signature<F>::Result;
  if constexpr (std::is_void_v<R>) {
    f(args.at(I).template get<std::tuple_element_t<I, Tuple>>()...);
    return Value();
  } else {
    return Value(f(args.at(I).template get<std::tuple_element_t<I, Tuple>>()...));
  }
}

}  // namespace detail

class Registry {
 public:
  void addRaw(const std::string& name, Handler handler);

  template <class F>
  void add(const std::string& name, F fn) {
    addRaw(name, [name, fn = std::move(fn)](const Value& a, const CallContext&) mutable {
      using Args = typename detail::Signature<F>::Args;
      constexpr size_t kArity = std::tuple_size_v<Args>;
      LOOM_CHECK(a.is_array() && a.size() == kArity, "function '", name, "' takes ", kArity,
                 " argument(s), got ", a.is_array() ? a.size() : 1, ": ", a.dump().substr(0, 200));
      return detail::invokeWith<F, Args>(fn, a, std::make_index_sequence<kArity>{});
    });
  }

  // nullptr when no function has that name.
  const Handler* find(const std::string& name) const;
  // "add, echo, get_rows" for messages.
  std::string names() const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }

 private:
  std::map<std::string, Handler> handlers_;
};

}  // namespace loom::rpc
