// TorchStore: torch's c10d::Store (the one init_process_group made: TCPStore, FileStore or the
// PrefixStore new_group adds) seen as a loom::Store.
//
// Contract
// - Every call goes straight to the torch store: one rendezvous, one namespace per group (torch
//   prefixes each group's store), torch's own server. Nothing is cached.
// - wait() (and get()'s wait for its key) never holds the store's client for long: torch's
//   TCPStore client holds one lock for the whole of a wait, which would block every other call
//   on the store (the rendezvous included) behind Loom's diagnostics listener, which waits for
//   dump requests as long as the group lives. So:
//   - a wait of kBlockingWaitFrom or more on a store that is (or prefixes) a torch TCPStore runs
//     on a client connection of its own (a pool: one per concurrent waiter, opened on first use,
//     dropped after a wait that fails or times out): one request, answered by the server when
//     the keys are set. An idle listener costs nothing between its waits (one per minute), and
//     a request it waits for (another rank's failure report asking for its record) wakes it as
//     soon as the server has it (a round trip, well under a millisecond on one host).
//   - any other wait polls check() with a pause that doubles from 1 ms to 50 ms during its
//     first second, then up to kMaxPollPause: a long wait on a FileStore or a Python store
//     costs about one request per second, and sees its keys at most that late.
// - Errors: a torch error whose message says it timed out becomes loom::TimeoutError, any other
//   failure loom::IoError; both name the key and the operation. Loom's failure reports and
//   barriers rely on wait() throwing TimeoutError.
// - Thread-safe as far as the torch store is (TCPStore and FileStore serialize their calls).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "loom/store/store.h"

namespace loom::torch_backend {

class TorchStore : public Store {
 public:
  // Waits at least this long run on a client connection of their own (TCPStore only).
  static constexpr milliseconds kBlockingWaitFrom{5000};
  // The longest pause between two checks of a polled wait.
  static constexpr milliseconds kMaxPollPause{1000};

  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  int64_t numKeys() override;

  // Requests sent to torch's store so far (a blocking wait counts one); for tests and the
  // figures in docs/torch.md.
  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }

 private:
  template <typename Fn>
  auto call(const char* what, const std::string& key, Fn&& fn) -> decltype(fn());
  void poll(const std::vector<std::string>& keys, milliseconds timeout);
  // A blocking wait on a client of its own; false when no client could be opened (the caller
  // polls instead).
  bool waitOnOwnClient(const std::vector<std::string>& keys, milliseconds timeout);
  [[noreturn]] void throwMissing(const std::vector<std::string>& keys, milliseconds timeout);

  c10::intrusive_ptr<c10d::Store> store_;
  // The torch TCPStore under store_'s prefixes (null for any other store), and the prefix its
  // keys take there ("default_pg/" ...).
  c10d::TCPStore* tcp_ = nullptr;
  std::string keyPrefix_;
  std::mutex waitersMu_;
  std::vector<c10::intrusive_ptr<c10d::TCPStore>> idleWaiters_;  // waitersMu_
  bool waitersFailed_ = false;                                   // waitersMu_: poll from now on
  std::atomic<uint64_t> requests_{0};
};

}  // namespace loom::torch_backend
