// The Store implementations the conformance suite runs over. Each kind owns the backing
// state (a server, a file) and hands out clients of one shared store with open().
#pragma once

#include <memory>
#include <string>

#include "loom/store/file_store.h"
#include "loom/store/hash_store.h"
#include "loom/store/prefix_store.h"
#include "loom/store/tcp_store.h"
#include "loom/store/tcp_store_server.h"
#include "loom/testing/ranks.h"

namespace loom::testing {

struct HashStoreKind {
  static constexpr const char* kName = "HashStore";
  std::shared_ptr<HashStore> store = std::make_shared<HashStore>();
  std::shared_ptr<Store> open() { return store; }
};

struct FileStoreKind {
  static constexpr const char* kName = "FileStore";
  TempDir dir;
  std::shared_ptr<Store> open() { return std::make_shared<FileStore>(dir.file("store")); }
};

struct TCPStoreKind {
  static constexpr const char* kName = "TCPStore";
  TCPStoreServer server{TCPStoreServerOptions{"127.0.0.1", 0, "", -1}};
  std::shared_ptr<Store> open() {
    TCPStoreOptions options;
    options.timeout = std::chrono::milliseconds(10000);
    return std::make_shared<TCPStore>("127.0.0.1", server.port(), options);
  }
};

// A PrefixStore over a TCPStore, with a second namespace written next to it to show that
// namespaces do not leak.
struct PrefixStoreKind {
  static constexpr const char* kName = "PrefixStore";
  TCPStoreKind base;
  std::shared_ptr<Store> open() { return std::make_shared<PrefixStore>("group0", base.open()); }
};

}  // namespace loom::testing
