// Channel: this worker's connection to one callee, and the calls pending on it.
//
// How it works. The first call opens the connection (connectTo within the call's deadline), runs
// the authentication handshake (wire.h) and sends kHello; a reader thread then waits for answers
// (poll with a 100 ms tick) and completes the pending call with the id each answer echoes. Every
// tick it also expires the calls whose deadline passed, so a future nobody waits on still
// completes. Callers write their request frames themselves, one at a time (writeMu_). Any read or
// write failure breaks the channel: every pending call fails with an IoError naming the callee and
// the cause, and later calls fail fast with the same cause (a dead callee does not come back).
//
// Lock order: writeMu_, then mu_ (never writeMu_ while holding mu_). mu_ guards the socket,
// pending_ and broken_; the socket is reset (its fd closed) only under both, so a writer that
// read the fd under writeMu_ never writes to a closed or reused descriptor.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "call_state.h"
#include "core.h"
#include "loom/common/socket.h"
#include "wire.h"

namespace loom::rpc::detail {

class Channel {
 public:
  Channel(Core& core, int peerRank);
  ~Channel();  // close()
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Sends a request and returns its state; the answer completes it. Never throws for a
  // transport failure: the returned state has failed instead.
  std::shared_ptr<CallState> call(wire::Kind kind, uint64_t id, const std::string& function,
                                  uint64_t aux, const std::vector<uint8_t>& payload,
                                  milliseconds timeout, const std::string& description);
  // A one-way frame (kDelete); best effort, bounded by `timeout`.
  void post(wire::Kind kind, uint64_t aux, milliseconds timeout);
  // Stops the reader and fails what is pending with `why`.
  void close(const std::string& why);

 private:
  // mu_ held. Connects and starts the reader; IoError naming the call (`description`) and the
  // peer when either fails, with no connection kept.
  void ensureConnected(const Deadline& deadline, const std::string& description);
  void readerLoop();
  void breakWith(const std::string& why);
  void deliver(wire::Frame& frame);
  void sweep();

  Core& core_;
  const int peer_;
  const std::string what_;  // "worker 'ps' (rank 0) at 10.0.0.1:4242"

  std::mutex writeMu_;
  std::mutex mu_;
  net::Socket sock_;
  std::thread reader_;
  std::map<uint64_t, std::shared_ptr<CallState>> pending_;
  std::string broken_;
  std::atomic<bool> stop_{false};
};

}  // namespace loom::rpc::detail
