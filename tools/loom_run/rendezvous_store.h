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

// This machine's address on the route towards `host` (resolved, then a UDP socket connected to
// it: no packet is sent), as text; "" when it cannot be found. Multi-node loom-run hands it to
// the workers as LOOM_HOST, the address their transports listen on and publish, so that a host
// name resolving to 127.0.1.1 (Debian's /etc/hosts) or to another namespace cannot mislead them.
std::string localAddressTowards(const std::string& host);

}  // namespace loom::run
