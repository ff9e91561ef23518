// Store: the key-value rendezvous interface (c10d's vocabulary).
//
// Contract
// - Keys are strings, values are byte strings. A Store is shared by all ranks of a job (or a
//   group); every rank sees every other rank's writes.
// - get() and wait() block until the keys exist or the store's timeout (or the one given)
//   passes; then they throw TimeoutError naming the keys that were missing and how long they
//   waited. Nothing blocks without a deadline.
// - add(key, delta) treats the value as a decimal integer (absent = 0) and returns the new
//   value atomically.
// - compareSet(key, expected, desired): if the key holds `expected`, store `desired`; if the
//   key is absent and `expected` is empty, create it with `desired`; returns the value the
//   key holds afterwards, or `expected` when the key is absent and `expected` is non-empty
//   (nothing is stored then). This matches torch.distributed.
// - All methods are thread-safe. Implementations: HashStore (in-process), FileStore,
//   TCPStore (client of a TCPStoreServer), PrefixStore (namespaces another store).
// - Errors: InvalidArgumentError for bad keys/values (empty key, over the size limits),
//   TimeoutError on deadlines, IoError when the backing file or server fails.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/common/deadline.h"

namespace loom {

using Bytes = std::vector<uint8_t>;

inline Bytes toBytes(std::string_view s) {
  return Bytes(s.begin(), s.end());
}
inline std::string toString(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

class Store {
 public:
  static constexpr milliseconds kDefaultTimeout{300000};  // 5 minutes, as c10d.

  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` exists or timeout() passes.
  virtual Bytes get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Returns true when the key existed and was removed.
  virtual bool deleteKey(const std::string& key) = 0;
  // True when every key exists now; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists or `timeout` passes (TimeoutError names the missing keys).
  virtual void wait(const std::vector<std::string>& keys, milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual int64_t numKeys() = 0;

  // Batched forms; the defaults loop, implementations may do one round trip.
  virtual std::vector<Bytes> multiGet(const std::vector<std::string>& keys);
  virtual void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values);

  // String conveniences.
  void set(const std::string& key, std::string_view value) { set(key, toBytes(value)); }
  std::string getString(const std::string& key) { return toString(get(key)); }

  milliseconds timeout() const { return timeout_.load(std::memory_order_relaxed); }
  virtual void setTimeout(milliseconds timeout) {
    timeout_.store(timeout, std::memory_order_relaxed);
  }

 private:
  std::atomic<milliseconds> timeout_{kDefaultTimeout};
};

}  // namespace loom
