// StoreState: what a TCPStoreServer stores and who waits for what, without any sockets.
//
// The event loop hands it each authenticated request with the id of the connection it came
// from (the socket's fd: unique while the connection is open, and dropClient() is called
// before an fd can be reused); StoreState applies it and emits replies through the sink, in
// the order the protocol promises: a request's own reply first, then the replies of the parked
// requests it woke.
//
// Parked requests (get, wait, multiGet on missing keys) are listed under one key they still
// miss. When that key is created the request is checked again and answered, or listed under
// its next missing key, so each key event costs O(waiters on that key), never a scan of all.
//
// With a StoreLog (persistTo), every change is appended to the log before it is applied and
// answered; a change the log refuses (a full disk) is answered with an I/O error
// (store_protocol::kErrorIo) and not applied.
//
// Not thread-safe: the loop thread owns it. numWaiting() may be read from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/store/store_protocol.h"
#include "store_log.h"

namespace loom {

class StoreState {
 public:
  using ClientId = int;
  using Sink = std::function<void(ClientId, store_protocol::Message)>;

  explicit StoreState(Sink sink) : sink_(std::move(sink)) {}

  // Applies one request. Returns "" or, when the client broke the protocol (wrong shape for
  // the op, too many parked requests), the reason to close its connection.
  std::string handle(ClientId client, store_protocol::Message& request);
  // Forgets the client's parked requests (its connection closed).
  void dropClient(ClientId client);
  // Loads the keys from `options.dir` (before any request) and logs every change from now on.
  const StoreLog::Loaded& persistTo(const StoreLogOptions& options);
  size_t numKeys() const { return data_.size(); }

  int numWaiting() const { return waiting_.load(std::memory_order_relaxed); }

 private:
  struct Waiter {
    ClientId client;
    uint64_t id;
    store_protocol::Op op;
    std::vector<std::string> keys;
    std::string parkedOn;
  };
  using WaiterPtr = std::shared_ptr<Waiter>;

  std::string checkShape(const store_protocol::Message& m) const;
  void replyError(ClientId client, uint64_t id, const std::string& what, int64_t code = 0);
  // Logs `changes` when persisting; false (the client told why) when the log refused them.
  bool persist(ClientId client, uint64_t id, const std::vector<StoreLog::Change>& changes);
  bool present(const std::vector<std::string>& keys) const;
  void answer(const Waiter& waiter);
  void park(const WaiterPtr& waiter);
  void unpark(const WaiterPtr& waiter);
  void forget(const WaiterPtr& waiter);  // drop from its client's list
  void setKey(const std::string& key, Bytes value);
  void keyCreated(const std::string& key);

  Sink sink_;
  std::unique_ptr<StoreLog> log_;  // null: keys live in memory only
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::list<WaiterPtr>> parked_;  // by missing key
  std::unordered_map<ClientId, std::list<WaiterPtr>> byClient_;   // by connection
  std::vector<std::string> created_;  // keys created by the request being handled
  std::atomic<int> waiting_{0};
};

}  // namespace loom
