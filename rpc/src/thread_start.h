// startThread: how the RPC layer starts a connection's reader thread (the server's per-connection
// reader, the channel's answer reader), with a test seam. A thread start can fail
// (std::system_error, EAGAIN: out of threads or memory); the callers refuse that one connection
// instead of letting it escape.
//
// Test seam (rpc_auth_test), zero otherwise: while failConnectionThreadStarts (server),
// failReaderThreadStarts (channel) or failPoolThreadStarts (the request pool) is positive, a
// start of that kind decrements it and throws std::system_error(EAGAIN) as std::thread would;
// while poolThreadStartsBeforeFailure is positive, a pool start decrements it and succeeds
// first (so that a pool can fail half-started).
#pragma once

#include <atomic>
#include <cerrno>
#include <system_error>
#include <thread>
#include <utility>

namespace loom::rpc::detail {

inline std::atomic<int> failConnectionThreadStarts{0};
inline std::atomic<int> failReaderThreadStarts{0};
inline std::atomic<int> failPoolThreadStarts{0};
inline std::atomic<int> poolThreadStartsBeforeFailure{0};

template <class F>
std::thread startThread(std::atomic<int>& failures, F&& f,
                        std::atomic<int>* successesFirst = nullptr) {
  if (successesFirst != nullptr) {
    int first = successesFirst->load();
    while (first > 0 && !successesFirst->compare_exchange_weak(first, first - 1)) {
    }
    if (first > 0) return std::thread(std::forward<F>(f));
  }
  int left = failures.load();
  while (left > 0 && !failures.compare_exchange_weak(left, left - 1)) {
  }
  if (left > 0) {
    throw std::system_error(EAGAIN, std::generic_category(),
                            "cannot start a thread (injected by a test)");
  }
  return std::thread(std::forward<F>(f));
}

}  // namespace loom::rpc::detail
