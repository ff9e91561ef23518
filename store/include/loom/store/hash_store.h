// HashStore: an in-process Store for ranks that are threads of one process (tests).
// Thread-safe; waits are answered by a condition variable, never by polling.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "loom/store/store.h"

namespace loom {

class HashStore : public Store {
 public:
  HashStore() = default;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  using Store::wait;
  int64_t numKeys() override;

 private:
  // Requires mu_ held. Blocks until every key exists; throws TimeoutError naming the missing.
  void waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  milliseconds timeout, const char* op);

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
};

}  // namespace loom
