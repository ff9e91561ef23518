// TCPStore: a Store client of a TCPStoreServer (in this process or a standalone loom-store).
//
// Contract
// - TCPStore(host, port, options) connects (retrying refused connects with backoff and
//   jitter until options.timeout), says hello with options.token (LOOM_STORE_TOKEN by
//   default) and options.rank, and is then ready. With options.isServer it first starts a
//   TCPStoreServer inside this process on `port` (0 = pick a free one; port() tells which),
//   like c10d's TCPStore(is_master=True); with numWorkers > 0 and waitForWorkers it then
//   blocks until that many clients (itself included) have joined, or throws TimeoutError
//   "x/y workers joined ...; missing ranks: ...".
// - Thread-safe, and a blocking call in one thread never holds up another: the store keeps a
//   small pool of connections, each carrying one request at a time. A thread takes an idle
//   connection (or opens a new one) for the length of one call. A single-threaded user has
//   exactly one connection.
// - get, wait and multiGet wait on the server (which answers when the keys appear, no
//   polling). When the deadline passes first the client throws TimeoutError naming the keys,
//   the server address and the milliseconds waited, cancels the wait on the server and keeps
//   the connection usable.
// - The server closing the connection (it stopped or died) turns the call in flight into an
//   IoError naming the server address, at once; the store is then unusable and every later
//   call fails fast with the same cause (destroy it and create a new one). Unless
//   options.reconnectTimeout (LOOM_STORE_RECONNECT_MS) is above 0: then the client reconnects
//   within that time (a restarted server, docs/store.md) and sends the call again, except an
//   add or deleteKey that may have reached the old server: that call throws IoError (its
//   outcome is unknown) and the store stays usable. Waits go on with their remaining time.
// - Keys are 1..4096 bytes, values at most 64 MiB (store_protocol.h); larger ones are an
//   InvalidArgumentError before anything is sent.
// - A client-only TCPStore may be used in a child after fork(): the child opens its own
//   connections (the server still counts it as the same client). A store with isServer must
//   not cross a fork.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loom/store/store.h"
#include "loom/store/tcp_store_server.h"

namespace loom {

namespace store_protocol {
struct Message;
}

struct TCPStoreOptions {
  milliseconds timeout = Store::kDefaultTimeout;  // per-operation and connect timeout
  std::string token = defaultStoreToken();
  int rank = -1;  // identifies this client to the server (join messages); -1 = anonymous
  bool isServer = false;
  int numWorkers = -1;  // with isServer: clients expected, this one included
  bool waitForWorkers = true;
  // After losing its server, how long the client keeps reconnecting (a restarted loom-store
  // with --data-dir; docs/store.md) before the store becomes unusable. Unset:
  // LOOM_STORE_RECONNECT_MS (0 when that is unset too: fail at once).
  std::optional<milliseconds> reconnectTimeout = std::nullopt;
  // With isServer: the in-process server's persistence directory (TCPStoreServerOptions).
  std::string dataDir{};
  // How long a connection waits for the server's answer to its hello (at most `timeout`). A
  // Loom store answers at once; something else listening on the port may never answer, and
  // waiting out the whole timeout for it only hides the cause.
  milliseconds helloTimeout{30000};
};

class TCPStore : public Store {
 public:
  TCPStore(std::string host, int port, const TCPStoreOptions& options = {});
  ~TCPStore() override;

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

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // "host:port" of the server, as used in messages.
  const std::string& address() const { return address_; }
  // The in-process server when isServer, else nullptr.
  TCPStoreServer* server() const { return server_.get(); }

 private:
  struct Connection;

  // Connects and says hello within `limit` (0: the store timeout).
  std::unique_ptr<Connection> connect(milliseconds limit = milliseconds(0));
  // An idle connection (fresh = false) or a new one (fresh = true).
  std::unique_ptr<Connection> acquire(bool& fresh, milliseconds connectLimit);
  // acquire(), skipping idle connections whose server has gone (when reconnecting is on).
  std::unique_ptr<Connection> acquireLive(bool& fresh, milliseconds connectLimit);
  void release(std::unique_ptr<Connection> conn);
  // One request, one reply, on a pooled connection. `waitTimeout` >= 0 marks a request that
  // waits on the server (get/wait/multiGet): its reply may take that long, then it is
  // cancelled and a TimeoutError thrown.
  // A connection lost under the call is reconnected and the call repeated (when it is safe to
  // repeat) within options.reconnectTimeout.
  store_protocol::Message call(store_protocol::Message request,
                               milliseconds waitTimeout = milliseconds(-1));
  store_protocol::Message callOnce(store_protocol::Message request,
                                   const std::optional<Deadline>& waitDeadline,
                                   milliseconds connectLimit);
  [[noreturn]] void fail(const std::string& why);
  void checkKey(const std::string& key, const char* op) const;

  std::string host_;
  int port_;
  std::string address_;
  TCPStoreOptions options_;
  std::string clientId_;
  std::unique_ptr<TCPStoreServer> server_;

  std::mutex mu_;  // guards idle_, broken_ and pid_
  std::vector<std::unique_ptr<Connection>> idle_;
  std::string broken_;  // non-empty once a connection failed: the store is unusable
  pid_t pid_;           // the process the pooled connections belong to
};

}  // namespace loom
