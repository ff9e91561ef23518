#include "store_adapter.h"

#include <exception>
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
  call("get", key, [&] { store_->wait({key}, timeout()); });
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
  call("wait", firstKey(keys), [&] { store_->wait(keys, timeout); });
}

int64_t TorchStore::numKeys() {
  return call("numKeys", "", [&] { return store_->getNumKeys(); });
}

}  // namespace loom::torch_backend
