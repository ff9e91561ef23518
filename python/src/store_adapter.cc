#include "store_adapter.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>

#include "loom/common/error.h"

namespace loom::torch_backend {

namespace {

// Runs one torch store call, turning its errors into Loom's kinds.
template <typename Fn>
auto call(const char* what, const std::string& key, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string message = std::string("torch store ") + what + "('" + key + "'): " + e.what();
    const std::string text = e.what();
    if (text.find("imeout") != std::string::npos || text.find("timed out") != std::string::npos) {
      throw TimeoutError(message);
    }
    throw IoError(message);
  }
}

std::string firstKey(const std::vector<std::string>& keys) {
  if (keys.empty()) return "";
  return keys.size() == 1 ? keys.front() : keys.front() + ", ...";
}

}  // namespace

TorchStore::TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  LOOM_CHECK(store_, "TorchStore: null store");
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
  // Polls check() instead of calling torch's wait: torch's TCPStore client holds one lock for
  // the whole of a wait, so a thread that waits long (Loom's diagnostics listener waits for
  // dump requests) would block every other call on the store, the rendezvous included. The
  // interval grows from 1 ms to 50 ms.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  milliseconds pause{1};
  for (;;) {
    if (check(keys)) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string names;
      for (const auto& key : keys) {
        if (!check({key})) names += (names.empty() ? "'" : ", '") + key + "'";
      }
      if (names.empty()) return;  // they arrived just now
      throw TimeoutError("torch store wait: keys " + names + " missing after " +
                         std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, milliseconds(50));
  }
}

int64_t TorchStore::numKeys() {
  return call("numKeys", "", [&] { return store_->getNumKeys(); });
}

}  // namespace loom::torch_backend
