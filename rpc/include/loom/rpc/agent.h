// RpcAgent: one named worker of an RPC job (torch.distributed.rpc's agent).
//
// Contract
// - RpcAgent(name, rank, worldSize, store, functions, options) starts this worker's server
//   (a listening socket and options.numThreads request threads), publishes "name -> address"
//   in the store and waits (bounded by options.timeout) until all worldSize workers have
//   published; names must be unique. Functions are the Registry given here (copied; fixed
//   for the agent's life).
// - rpcSync / rpcAsync / remote call a function by name on a worker by name (itself included).
//   Arguments are a Value array (rpc::args(...)). Each call has a deadline: `timeout`, or
//   options.timeout when 0 (LOOM_RPC_TIMEOUT, default 60 s). The callee runs requests
//   concurrently on its threads, so calls may execute in any order, even from one caller.
// - Errors: a callee's exception comes back as RemoteError naming the function, the callee and
//   the exception's type and message; an unknown function is a RemoteError listing the ones
//   registered; an unknown worker name an InvalidArgumentError listing the workers. When the
//   connection to a callee breaks (its process died: the kernel closes its sockets) every call
//   pending on it fails with IoError at once and later calls to it fail fast with the same
//   cause; a deadline that passes is a TimeoutError naming the call, the callee and the time.
// - shutdown(graceful = true) is torch's rpc.shutdown: wait (up to options.timeout) until this
//   worker's own calls are answered, then meet every worker in a store barrier (up to
//   options.timeout; so no one stops serving while another still calls it), then stop (running
//   requests get up to min(timeout, 5 s)). The barrier's TimeoutError names the workers that
//   never arrived; calls still pending make it a TimeoutError too, after the stop. shutdown(false)
//   stops at once: pending calls fail with IoError. The destructor calls shutdown(false) if
//   shutdown was not called. After shutdown every call throws IoError. A handler still running
//   after the bound is left to finish on its own thread (logged), never joined forever.
// - Thread-safe: any number of threads may call at once.
//
// Transport: a small socket layer on common/'s sockets (docs/rpc.md says why not the comm
// transports): one connection from each caller to each callee it talks to, opened on first
// use; frames are a fixed header plus a MessagePack payload.
//
// Authentication: the first worker to start puts a random key under "<prefix>/auth-key" in the
// store; every connection opens with a challenge-response in both directions over that key
// (loom/store/peer_auth.h), so a process that can reach a worker's port but not read the store
// cannot call its functions (docs/rpc.md: what that protects, with and without
// LOOM_STORE_TOKEN).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/common/error.h"
#include "loom/rpc/future.h"
#include "loom/rpc/registry.h"
#include "loom/rpc/rref.h"
#include "loom/rpc/value.h"
#include "loom/store/store.h"

namespace loom::rpc {

struct RpcOptions {
  // Default deadline of a call, of the rendezvous and of the shutdown barrier; 0 takes
  // LOOM_RPC_TIMEOUT (60000 ms).
  std::chrono::milliseconds timeout{0};
  // Threads running incoming requests; 0 takes LOOM_RPC_THREADS (8). A handler that blocks
  // (waiting for other calls to arrive) holds one of them.
  int numThreads = 0;
  // Address published to peers, and the one the server listens on (only there); "" takes
  // LOOM_RPC_HOST, else the local address on the route to the store's host (TCPStore), else
  // the host name.
  std::string host;
  // Inbound connections served at once (each holds a reader thread; one per calling worker is
  // what a job uses); more are refused and logged. 0 takes LOOM_RPC_MAX_CONNECTIONS (1024).
  int maxConnections = 0;
  // Frames larger than this are refused (sender: InvalidArgumentError; receiver: connection
  // closed).
  size_t maxMessageBytes = size_t{1} << 30;
  // Store keys live under "<prefix>/" (several jobs may share a store).
  std::string prefix = "rpc";
};

struct WorkerInfo {
  std::string name;
  int rank = -1;
  std::string host;
  int port = 0;
};

// The callee raised. what(): "rpc: 'get_rows' on worker 'ps' (rank 0) raised
// loom::InvalidArgumentError: row 99 is out of range [0, 64)".
class RemoteError : public Error {
 public:
  RemoteError(const std::string& what, std::string callee, std::string function, std::string type,
              std::string message)
      : Error(what),
        callee_(std::move(callee)),
        function_(std::move(function)),
        type_(std::move(type)),
        message_(std::move(message)) {}
  const std::string& callee() const { return callee_; }
  const std::string& function() const { return function_; }
  // The C++ type of the exception on the callee, "loom::InvalidArgumentError".
  const std::string& remoteType() const { return type_; }
  const std::string& remoteMessage() const { return message_; }

 private:
  std::string callee_, function_, type_, message_;
};

class RpcAgent {
 public:
  RpcAgent(const std::string& name, int rank, int worldSize, std::shared_ptr<Store> store,
           const Registry& functions, const RpcOptions& options = {});
  ~RpcAgent();
  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;

  Value rpcSync(const std::string& to, const std::string& function, Value args = Value::array(),
                std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  Future rpcAsync(const std::string& to, const std::string& function, Value args = Value::array(),
                  std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  RRef remote(const std::string& to, const std::string& function, Value args = Value::array(),
              std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  void shutdown(bool graceful = true);

  const WorkerInfo& self() const;
  const WorkerInfo& worker(const std::string& name) const;
  const WorkerInfo& worker(int rank) const;
  const std::vector<WorkerInfo>& workers() const;
  std::chrono::milliseconds timeout() const;
  // How many values made by remote() this worker holds as their owner (torch's
  // num_owner_rrefs): it drops one when its creator's last RRef copy is gone.
  size_t ownedValues() const;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace loom::rpc
