// The Store the loom-run processes of a multi-node job rendezvous through: node 0 hosts a
// TCPStore server at --master-addr:--master-port (listening on every interface) and every
// node, node 0 included, talks to it as a client.
#pragma once

#include <memory>
#include <string>

#include "launch_options.h"
#include "loom/store/store.h"

namespace loom::run {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual Store& store() = 0;
  // "addr:port", for messages.
  virtual std::string endpoint() const = 0;
};

// Hosts (node 0) and/or connects. Throws IoError/TimeoutError naming the address when the
// server cannot be reached within the rendezvous timeout.
std::unique_ptr<RendezvousStore> openRendezvousStore(const LaunchOptions& options);

// A TCP port that was free on every interface a moment ago (bind to port 0, read, close).
int pickFreePort();

}  // namespace loom::run
