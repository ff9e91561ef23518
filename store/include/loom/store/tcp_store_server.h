// TCPStoreServer: the server side of TCPStore, one epoll event-loop thread for all clients.
//
// Contract
// - The constructor binds and listens (port 0 picks a free port; read it back with port()),
//   then starts the loop thread. "Address in use" is an IoError naming host:port, thrown from
//   the constructor.
// - The loop owns all state (the key-value map and the waiters). Sockets are non-blocking;
//   each connection has an input buffer parsed incrementally (store_protocol.h) and an output
//   buffer flushed when the socket is writable. No thread per client, no polling: get, wait
//   and multiGet on missing keys are parked per key and answered when a set, add, compareSet
//   or multiSet creates the key.
// - A client whose bytes are malformed, truncated at close, oversized, of the wrong version, or
//   whose token (LOOM_STORE_TOKEN) is wrong gets its own connection closed and one warning log
//   line naming its address and the reason; everything else keeps working. So does one that
//   connects and stays silent past options.helloTimeout, or parks more than 1024 requests.
// - Clients identify themselves in the hello (a client id per TCPStore object and, optionally,
//   a rank). waitForWorkers(n) blocks until n distinct clients have joined and, on timeout,
//   says "x/n joined" and which ranks never did.
// - With options.dataDir the keys persist (docs/store.md): loaded at construction (a torn last
//   record is dropped with a warning naming the file and offset), every change logged before
//   it is answered, a change that cannot be logged (a full disk) refused with an I/O error.
// - stop() (and the destructor) wakes the loop through an eventfd, closes every connection and
//   joins the thread. Thread-safe: every public method may be called from any thread.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "loom/common/deadline.h"
#include "loom/store/store.h"

namespace loom {

// The token from LOOM_STORE_TOKEN, or "" (no authentication) when unset.
std::string defaultStoreToken();

// When a persisting server makes a change durable (store_log.h, docs/store.md): kAlways
// fdatasyncs before answering, kNever only writes (survives the process, not the machine).
enum class StoreFsync : uint8_t { kAlways, kNever };
// LOOM_STORE_FSYNC, kAlways when unset.
StoreFsync defaultStoreFsync();

struct TCPStoreServerOptions {
  std::string host;  // "" or "*" = all interfaces
  int port = 0;      // 0 = pick a free port
  std::string token = defaultStoreToken();
  int numWorkers = -1;  // expected clients, for messages; -1 = unknown
  // A connection that has not said hello (with the right token) by then is closed.
  milliseconds helloTimeout{10000};
  // Persistence (docs/store.md): a directory only this server uses; its keys are loaded from
  // it at construction and every change is logged there before it is answered. "" = memory
  // only.
  std::string dataDir{};
  StoreFsync fsync = defaultStoreFsync();
  // The log is compacted into a snapshot once it passes this size.
  uint64_t compactBytes = uint64_t{64} << 20;
};

class TCPStoreServer {
 public:
  explicit TCPStoreServer(const TCPStoreServerOptions& options = {});
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  int port() const;
  // "host:port" as bound, for messages.
  const std::string& address() const;

  // Blocks until `numWorkers` distinct clients have said hello. TimeoutError:
  // "2/4 workers joined TCPStore server H:P after 1000 ms; missing ranks: 1, 3".
  void waitForWorkers(int numWorkers, milliseconds timeout);
  // Distinct clients that have joined so far, and the ranks they gave.
  int numJoined() const;
  std::set<int> joinedRanks() const;
  // Connections open right now (tests use it to see a hostile client was dropped).
  int numConnections() const;
  // Requests (get, wait, multiGet) parked until their keys exist.
  int numWaiting() const;
  // With dataDir: keys loaded at construction, and log bytes dropped as a torn tail.
  int64_t numKeysLoaded() const;
  int64_t bytesDropped() const;

  void stop();

 private:
  class Loop;
  std::unique_ptr<Loop> loop_;
};

}  // namespace loom
