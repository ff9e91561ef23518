// PrefixStore: a namespace inside another Store (one per ProcessGroup or subgroup).
//
// Every key is stored as "<prefix>/<key>" in the underlying store, which is shared (not
// owned exclusively): several PrefixStores over one store never see each other's keys. Errors
// come from the underlying store and name the full key. numKeys() counts every key of the
// underlying store, as c10d's PrefixStore does. The timeout is the underlying store's.
// Thread-safe when the underlying store is.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loom/store/store.h"

namespace loom {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  void set(const std::string& key, const Bytes& value) override;
  using Store::set;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  using Store::wait;
  int64_t numKeys() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void setTimeout(milliseconds timeout) override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying() const { return store_; }

 private:
  std::string join(const std::string& key) const;
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace loom
