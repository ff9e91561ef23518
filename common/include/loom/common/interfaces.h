// Choosing the network interface a rank listens on (LOOM_SOCKET_IFNAME), as NCCL_SOCKET_IFNAME
// and GLOO_SOCKET_IFNAME choose theirs.
//
// A machine with several interfaces (a management Ethernet, the fast fabric, docker0, virbr0)
// may route to the rendezvous store over one and want the collectives on another. The spec is
// NCCL's syntax:
//   "eth,ib"     interfaces whose names start with eth or ib
//   "^docker,lo" every interface except those whose names start with docker or lo
//   "=eth0"      exactly eth0 ("^=eth0,lo": every interface but exactly eth0 and lo)
// Among the interfaces that are up and match, in the kernel's order, the first IPv4 address is
// chosen, else the first IPv6 one (not link-local, which needs a scope to be reached).
#pragma once

#include <string>
#include <vector>

namespace loom::net {

struct InterfaceAddress {
  std::string name;     // "eth0"
  std::string address;  // "10.0.0.5" or "fd00::5"
  bool ipv6 = false;
  bool linkLocal = false;  // fe80::/10
  bool up = true;
};

// This machine's interface addresses (getifaddrs), in the kernel's order.
std::vector<InterfaceAddress> interfaceAddresses();

// Whether `spec` (the syntax above) selects the interface `name`.
bool interfaceMatches(const std::string& spec, const std::string& name);

// The address `spec` selects among `interfaces`. Throws InvalidArgumentError naming the spec,
// where it came from (`from`, e.g. "LOOM_SOCKET_IFNAME") and the interfaces there are (with
// their addresses) when none that is up matches with a usable address.
std::string chooseInterfaceAddress(const std::string& spec, const std::string& from,
                                   const std::vector<InterfaceAddress>& interfaces);

// chooseInterfaceAddress over this machine's interfaces.
std::string addressOfInterface(const std::string& spec, const std::string& from);

// Where a rank listens when nothing names an address (no ContextOptions::host, no LOOM_HOST):
// the interface LOOM_SOCKET_IFNAME selects (its errors as above), else the local address on the
// route to `towards` (the store's host: Debian maps the hostname to 127.0.1.1, useless to
// other hosts), else "" (the caller's default, the hostname).
std::string defaultListenAddress(const std::string& towards);

}  // namespace loom::net
