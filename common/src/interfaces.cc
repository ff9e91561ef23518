#include "loom/common/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>

#include "loom/common/error.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"

namespace loom::net {

std::vector<InterfaceAddress> interfaceAddresses() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    LOOM_THROW(IoError,
               "getifaddrs (the list of network interfaces) failed: ", detail::errnoText(errno));
  }
  std::vector<InterfaceAddress> out;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    InterfaceAddress a;
    a.name = i->ifa_name;
    a.ipv6 = family == AF_INET6;
    a.up = (i->ifa_flags & IFF_UP) != 0;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = a.ipv6 ? static_cast<const void*>(
                                   &reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr)
                             : static_cast<const void*>(
                                   &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr);
    if (::inet_ntop(family, raw, text, sizeof(text)) == nullptr) continue;
    a.address = text;
    if (a.ipv6) {
      const auto* six = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      a.linkLocal = IN6_IS_ADDR_LINKLOCAL(&six->sin6_addr);
    }
    out.push_back(std::move(a));
  }
  ::freeifaddrs(list);
  return out;
}

bool interfaceMatches(const std::string& spec, const std::string& name) {
  size_t pos = 0;
  const bool exclude = spec.compare(0, 1, "^") == 0;
  if (exclude) ++pos;
  const bool exact = spec.compare(pos, 1, "=") == 0;
  if (exact) ++pos;
  bool listed = false;
  while (pos <= spec.size() && !listed) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(pos, comma - pos);
    if (!item.empty()) {
      listed = exact ? name == item : name.compare(0, item.size(), item) == 0;
    }
    pos = comma + 1;
  }
  return exclude ? !listed : listed;
}

std::string chooseInterfaceAddress(const std::string& spec, const std::string& from,
                                   const std::vector<InterfaceAddress>& interfaces) {
  const InterfaceAddress* six = nullptr;
  for (const InterfaceAddress& a : interfaces) {
    if (!a.up || !interfaceMatches(spec, a.name)) continue;
    if (!a.ipv6) return a.address;
    if (!a.linkLocal && six == nullptr) six = &a;
  }
  if (six != nullptr) return six->address;
  std::string present;
  for (const InterfaceAddress& a : interfaces) {
    present += detail::str(present.empty() ? "" : ", ", a.name, " ", a.address,
                           a.up ? "" : " (down)", a.linkLocal ? " (link-local)" : "");
  }
  LOOM_THROW(InvalidArgumentError, from, "='", spec,
             "' selects no interface that is up with an address other peers can reach; this "
             "machine has: ",
             present.empty() ? std::string("none") : present,
             " (expected comma-separated name prefixes such as eth,ib; ^ before the list "
             "excludes them, = makes the names exact)");
}

std::string addressOfInterface(const std::string& spec, const std::string& from) {
  return chooseInterfaceAddress(spec, from, interfaceAddresses());
}

std::string defaultListenAddress(const std::string& towards) {
  if (const auto spec = settings::text("LOOM_SOCKET_IFNAME"); spec && !spec->empty()) {
    return addressOfInterface(*spec, "LOOM_SOCKET_IFNAME");
  }
  return towards.empty() ? std::string() : localAddressTowards(towards);
}

}  // namespace loom::net
