// DirStore: a minimal Store over a directory for process-rank tests (one file per key,
// written to a temporary name and renamed, so readers never see half a value). Only what
// Context::create needs (set, get, wait, check); the rest throws NotAvailableError. The real
// FileStore/TCPStore live in store/.
#pragma once

#include <unistd.h>
#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include "loom/common/error.h"
#include "loom/store/store.h"

namespace loom::comm::testing {

class DirStore : public Store {
 public:
  explicit DirStore(std::string dir) : dir_(std::move(dir)) {}

  void set(const std::string& key, const Bytes& value) override {
    const std::string tmp = path(key) + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(reinterpret_cast<const char*>(value.data()),
                static_cast<std::streamsize>(value.size()));
    }
    LOOM_SYSCHECK(::rename(tmp.c_str(), path(key).c_str()), "rename ", tmp);
  }
  Bytes get(const std::string& key) override {
    wait({key}, timeout());
    std::ifstream in(path(key), std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) {
      if (::access(path(k).c_str(), F_OK) != 0) return false;
    }
    return true;
  }
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const Deadline deadline(timeout);
    while (!check(keys)) {
      if (deadline.expired()) {
        LOOM_THROW(TimeoutError, "DirStore: keys missing after ", timeout.count(), " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a test helper: polls
    }
  }
  using Store::wait;
  int64_t add(const std::string&, int64_t) override { unsupported("add"); }
  Bytes compareSet(const std::string&, const Bytes&, const Bytes&) override {
    unsupported("compareSet");
  }
  bool deleteKey(const std::string&) override { unsupported("deleteKey"); }
  int64_t numKeys() override { unsupported("numKeys"); }

 private:
  [[noreturn]] static void unsupported(const char* what) {
    LOOM_THROW(NotAvailableError, "DirStore (test helper) does not implement ", what);
  }
  std::string path(const std::string& key) const {
    std::string name;
    for (char c : key) name += (c == '/') ? '_' : c;
    return dir_ + "/" + name;
  }
  std::string dir_;
};

}  // namespace loom::comm::testing
