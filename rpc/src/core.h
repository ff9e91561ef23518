// Core: what the agent's parts share (its identity, resolved options, the peers, the functions),
// fixed once the rendezvous is done, plus the signal that outstanding calls changed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/rpc/agent.h"
#include "loom/rpc/registry.h"
#include "loom/store/peer_auth.h"

namespace loom::rpc::detail {

struct Core {
  WorkerInfo self;
  int worldSize = 0;
  milliseconds timeout{60000};
  size_t maxMessageBytes = 0;
  int numThreads = 1;
  // Inbound connections served at once (RpcOptions::maxConnections).
  int maxConnections = 1024;
  // The job's key: every connection proves it holds it (peer_auth.h).
  auth::Key key{};
  std::shared_ptr<const Registry> functions;
  std::vector<WorkerInfo> workers;  // by rank

  // Outstanding outgoing calls, for shutdown's wait.
  std::mutex pendingMu;
  std::condition_variable pendingCv;
  size_t pendingCalls = 0;  // guarded by pendingMu

  void addPending(size_t n) {
    std::lock_guard<std::mutex> lock(pendingMu);
    pendingCalls += n;
  }
  void removePending(size_t n) {
    {
      std::lock_guard<std::mutex> lock(pendingMu);
      pendingCalls -= n;
    }
    pendingCv.notify_all();
  }

  // "worker 'ps' (rank 0)"
  std::string describe(int rank) const {
    return "worker '" + workers[static_cast<size_t>(rank)].name + "' (rank " +
           std::to_string(rank) + ")";
  }
};

// The payload of a kError frame, and the exception it becomes on the caller.
std::vector<uint8_t> encodeError(const std::string& type, const std::string& message);
std::exception_ptr decodeError(const std::vector<uint8_t>& payload, const std::string& callee,
                               const std::string& function);
// "<type>: <message>" parts of the exception in flight (inside a catch block).
void describeCurrentException(std::string& type, std::string& message);

}  // namespace loom::rpc::detail
