#include "loom/store/hash_store.h"

#include <charconv>

#include "loom/common/error.h"

namespace loom {
namespace {

int64_t parseCounter(const std::string& key, const Bytes& value) {
  int64_t out = 0;
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  auto [ptr, ec] = std::from_chars(begin, end, out);
  LOOM_CHECK(ec == std::errc() && ptr == end, "add(\"", key,
             "\"): the key holds a value that is not a decimal integer");
  return out;
}

void checkKeys(const std::vector<std::string>& keys) {
  for (const auto& key : keys) LOOM_CHECK(!key.empty(), "store keys must be non-empty");
}

std::string joinMissing(const std::map<std::string, Bytes>& data,
                        const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) {
    if (data.count(key) == 0) out += (out.empty() ? "\"" : ", \"") + key + "\"";
  }
  return out;
}

}  // namespace

void HashStore::set(const std::string& key, const Bytes& value) {
  LOOM_CHECK(!key.empty(), "store keys must be non-empty");
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  LOOM_CHECK(!key.empty(), "store keys must be non-empty");
  std::unique_lock<std::mutex> lock(mu_);
  waitLocked(lock, {key}, timeout(), "get");
  return data_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  LOOM_CHECK(!key.empty(), "store keys must be non-empty");
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    const int64_t current = it == data_.end() ? 0 : parseCounter(key, it->second);
    LOOM_CHECK(!__builtin_add_overflow(current, delta, &result), "add(\"", key, "\", ", delta,
               "): overflows int64 (current ", current, ")");
    data_[key] = toBytes(std::to_string(result));
  }
  changed_.notify_all();
  return result;
}

Bytes HashStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  LOOM_CHECK(!key.empty(), "store keys must be non-empty");
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      data_[key] = desired;
      result = desired;
    } else {
      if (it->second == expected) it->second = desired;
      result = it->second;
    }
  }
  changed_.notify_all();
  return result;
}

bool HashStore::deleteKey(const std::string& key) {
  LOOM_CHECK(!key.empty(), "store keys must be non-empty");
  std::lock_guard<std::mutex> lock(mu_);
  return data_.erase(key) > 0;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  checkKeys(keys);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& key : keys) {
    if (data_.count(key) == 0) return false;
  }
  return true;
}

void HashStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  checkKeys(keys);
  std::unique_lock<std::mutex> lock(mu_);
  waitLocked(lock, keys, timeout, "wait");
}

int64_t HashStore::numKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

void HashStore::waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                           milliseconds timeout, const char* op) {
  Deadline deadline(timeout);
  auto present = [&] {
    for (const auto& key : keys) {
      if (data_.count(key) == 0) return false;
    }
    return true;
  };
  if (!changed_.wait_until(lock, deadline.end(), present)) {
    LOOM_THROW(TimeoutError, "HashStore ", op, " timed out after ", deadline.elapsed().count(),
               " ms waiting for key(s) ", joinMissing(data_, keys));
  }
}

}  // namespace loom
