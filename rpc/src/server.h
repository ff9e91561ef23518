// Server: the callee side of a worker. It listens on the address the worker publishes (not on
// every interface). An acceptor thread takes connections and runs their authentication
// handshakes side by side (a connection without the job's key is logged and closed before it
// can send a frame); each authenticated connection, up to Core::maxConnections at once (more
// are refused and logged), gets a reader thread that reads requests in order and hands them to the
// request pool (options.numThreads threads), which runs the function and writes the answer on that
// connection (one writer at a time per connection). Values made by remote() are kept in the
// RRef table until their creator deletes them; a fetch of a value not made yet is parked on it
// and answered by the thread that makes it, so a fetch never holds a pool thread.
//
// stop(bound) closes the listening socket and every connection, joins the reader threads, and
// waits up to `bound` for running requests; a request thread still busy after that (a handler
// that does not return) is detached and logged: everything it touches is shared-owned.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core.h"
#include "loom/common/socket.h"
#include "wire.h"

namespace loom::rpc::detail {

class Pool;
struct Connection;
struct RRefTable;

class Server {
 public:
  // Listens on core->self.host at a free port.
  explicit Server(std::shared_ptr<Core> core);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  size_t ownedValues() const;
  // Authenticated connections being served.
  size_t connections() const;
  void start();
  void stop(milliseconds bound);

 private:
  void acceptLoop();
  void serve(net::Socket s);  // an authenticated connection: its reader thread, or refused
  void reap();                // joins the reader threads of connections that ended
  void connectionLoop(std::shared_ptr<Connection> conn);
  void handle(const std::shared_ptr<Connection>& conn, wire::Frame frame);

  std::shared_ptr<Core> core_;
  net::Socket listen_;
  int port_ = 0;
  std::shared_ptr<Pool> pool_;
  std::shared_ptr<RRefTable> rrefs_;
  std::thread acceptor_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;  // guards connections_ and threads_ (same index: one connection)
  std::vector<std::shared_ptr<Connection>> connections_;
  std::vector<std::thread> threads_;
};

}  // namespace loom::rpc::detail
