#include "loom/store/prefix_store.h"

#include "loom/common/error.h"

namespace loom {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  LOOM_CHECK(store_ != nullptr, "PrefixStore(\"", prefix_, "\") needs an underlying store");
  Store::setTimeout(store_->timeout());
}

std::string PrefixStore::join(const std::string& key) const {
  LOOM_CHECK(!key.empty(), "store keys must be non-empty (PrefixStore \"", prefix_, "\")");
  return prefix_ + "/" + key;
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(join(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  store_->set(join(key), value);
}

Bytes PrefixStore::get(const std::string& key) {
  return store_->get(join(key));
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return store_->add(join(key), delta);
}

Bytes PrefixStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return store_->compareSet(join(key), expected, desired);
}

bool PrefixStore::deleteKey(const std::string& key) {
  return store_->deleteKey(join(key));
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return store_->check(join(keys));
}

void PrefixStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  store_->wait(join(keys), timeout);
}

int64_t PrefixStore::numKeys() {
  return store_->numKeys();
}

std::vector<Bytes> PrefixStore::multiGet(const std::vector<std::string>& keys) {
  return store_->multiGet(join(keys));
}

void PrefixStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  store_->multiSet(join(keys), values);
}

void PrefixStore::setTimeout(milliseconds timeout) {
  Store::setTimeout(timeout);
  store_->setTimeout(timeout);
}

}  // namespace loom
