#include "store_adapter.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>

#include "loom/common/error.h"
#include "loom/common/logging.h"

namespace loom::torch_backend {

namespace {

using Clock = std::chrono::steady_clock;

std::string firstKey(const std::vector<std::string>& keys) {
  if (keys.empty()) return "";
  return keys.size() == 1 ? keys.front() : keys.front() + ", ...";
}

// A torch error as Loom's kind.
[[noreturn]] void rethrow(const std::string& message, const std::exception& e) {
  const std::string text = e.what();
  if (text.find("imeout") != std::string::npos || text.find("timed out") != std::string::npos) {
    throw TimeoutError(message);
  }
  throw IoError(message);
}

// PrefixStore's prefix is protected; a pointer to the member, named through a derived class,
// reads it from any PrefixStore.
struct PrefixOf : c10d::PrefixStore {
  static const std::string& of(const c10d::PrefixStore& store) {
    return store.*(&PrefixOf::prefix_);
  }
};

}  // namespace

template <typename Fn>
auto TorchStore::call(const char* what, const std::string& key, Fn&& fn) -> decltype(fn()) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow(std::string("torch store ") + what + "('" + key + "'): " + e.what(), e);
  }
}

TorchStore::TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  LOOM_CHECK(store_, "TorchStore: null store");
  // new_group's store is PrefixStore(group, PrefixStore("default_pg", TCPStore)): a key k
  // reaches the TCPStore as "default_pg/group/k".
  c10d::Store* s = store_.get();
  std::vector<std::string> prefixes;
  while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s)) {
    prefixes.push_back(PrefixOf::of(*prefixed));
    s = prefixed->getUnderlyingStore().get();
  }
  tcp_ = dynamic_cast<c10d::TCPStore*>(s);
  for (auto it = prefixes.rbegin(); it != prefixes.rend(); ++it) keyPrefix_ += *it + "/";
}

void TorchStore::set(const std::string& key, const Bytes& value) {
  call("set", key, [&] { store_->set(key, value); });
}

Bytes TorchStore::get(const std::string& key) {
  // torch's get waits for the key with the torch store's own timeout; Loom's is ours.
  wait({key}, timeout());
  return call("get", key, [&] { return store_->get(key); });
}

int64_t TorchStore::add(const std::string& key, int64_t delta) {
  return call("add", key, [&] { return store_->add(key, delta); });
}

Bytes TorchStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return call("compareSet", key, [&] { return store_->compareSet(key, expected, desired); });
}

bool TorchStore::deleteKey(const std::string& key) {
  return call("deleteKey", key, [&] { return store_->deleteKey(key); });
}

bool TorchStore::check(const std::vector<std::string>& keys) {
  return call("check", firstKey(keys), [&] { return store_->check(keys); });
}

void TorchStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (check(keys)) return;
  if (tcp_ != nullptr && timeout >= kBlockingWaitFrom && waitOnOwnClient(keys, timeout)) return;
  poll(keys, timeout);
}

void TorchStore::throwMissing(const std::vector<std::string>& keys, milliseconds timeout) {
  std::string names;
  for (const auto& key : keys) {
    if (!check({key})) names += (names.empty() ? "'" : ", '") + key + "'";
  }
  throw TimeoutError("torch store wait: keys " + names + " missing after " +
                     std::to_string(timeout.count()) + " ms");
}

void TorchStore::poll(const std::vector<std::string>& keys, milliseconds timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  milliseconds pause{1};
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline) {
      bool all = true;
      for (const auto& key : keys) all = all && check({key});
      if (all) return;  // they arrived just now
      throwMissing(keys, timeout);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    if (check(keys)) return;
    const milliseconds cap =
        Clock::now() - start < std::chrono::seconds(1) ? milliseconds(50) : kMaxPollPause;
    pause = std::min(pause * 2, cap);
  }
}

bool TorchStore::waitOnOwnClient(const std::vector<std::string>& keys, milliseconds timeout) {
  c10::intrusive_ptr<c10d::TCPStore> client;
  {
    std::lock_guard<std::mutex> lock(waitersMu_);
    if (waitersFailed_) return false;
    if (!idleWaiters_.empty()) {
      client = std::move(idleWaiters_.back());
      idleWaiters_.pop_back();
    }
  }
  if (!client) {
    try {
      c10d::TCPStoreOptions options;
      options.port = tcp_->getPort();
      options.isServer = false;
      options.waitWorkers = false;
      options.timeout = std::min(timeout, this->timeout());
      requests_.fetch_add(1, std::memory_order_relaxed);
      client = c10::make_intrusive<c10d::TCPStore>(tcp_->getHost(), options);
    } catch (const std::exception& e) {
      LOOM_LOG_WARNING("torch store: no client of its own for long waits (", e.what(),
                       "); waits poll instead");
      std::lock_guard<std::mutex> lock(waitersMu_);
      waitersFailed_ = true;
      return false;
    }
  }
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(keyPrefix_ + key);
  requests_.fetch_add(1, std::memory_order_relaxed);
  try {
    client->wait(full, timeout);
  } catch (const std::exception& e) {
    // The server may still answer this wait later: the connection goes with the client.
    client.reset();
    if (check(keys)) return true;
    const std::string text = e.what();
    if (text.find("imeout") != std::string::npos || text.find("timed out") != std::string::npos) {
      throwMissing(keys, timeout);
    }
    rethrow("torch store wait('" + firstKey(keys) + "'): " + text, e);
  }
  std::lock_guard<std::mutex> lock(waitersMu_);
  idleWaiters_.push_back(std::move(client));
  return true;
}

int64_t TorchStore::numKeys() {
  return call("numKeys", "", [&] { return store_->getNumKeys(); });
}

}  // namespace loom::torch_backend
