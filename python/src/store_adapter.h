// TorchStore: torch's c10d::Store (the one init_process_group made: TCPStore, FileStore or the
// PrefixStore new_group adds) seen as a loom::Store.
//
// Contract
// - Every call goes straight to the torch store: one rendezvous, one namespace per group (torch
//   prefixes each group's store), torch's own server. Nothing is cached. wait() (and get()'s
//   wait for its key) polls check() with a growing pause (1 to 50 ms) rather than blocking in
//   torch's wait, which holds the TCPStore client's lock for its whole duration.
// - Errors: a torch error whose message says it timed out becomes loom::TimeoutError, any other
//   failure loom::IoError; both name the key and the operation. Loom's failure reports and
//   barriers rely on wait() throwing TimeoutError.
// - Thread-safe as far as the torch store is (TCPStore and FileStore serialize their calls).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

#include "loom/store/store.h"

namespace loom::torch_backend {

class TorchStore : public Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  int64_t numKeys() override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace loom::torch_backend
