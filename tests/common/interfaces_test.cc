// LOOM_SOCKET_IFNAME: which interface a rank listens on (loom/common/interfaces.h), in
// NCCL_SOCKET_IFNAME's syntax.
#include "loom/common/interfaces.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/common/error.h"

namespace loom::net {
namespace {

TEST(Interfaces, TheSpecSelectsByPrefixExactNameOrExclusion) {
  EXPECT_TRUE(interfaceMatches("eth", "eth0"));
  EXPECT_TRUE(interfaceMatches("eth,ib", "ib1"));
  EXPECT_FALSE(interfaceMatches("eth,ib", "docker0"));
  EXPECT_TRUE(interfaceMatches("=eth0", "eth0"));
  EXPECT_FALSE(interfaceMatches("=eth0", "eth0.100"));  // exact: not a prefix
  EXPECT_FALSE(interfaceMatches("^docker,lo", "docker0"));
  EXPECT_FALSE(interfaceMatches("^docker,lo", "lo"));
  EXPECT_TRUE(interfaceMatches("^docker,lo", "eth0"));
  EXPECT_FALSE(interfaceMatches("^=eth0,lo", "eth0"));
  EXPECT_TRUE(interfaceMatches("^=eth0,lo", "eth01"));
  EXPECT_TRUE(interfaceMatches("eth,,", "eth2"));  // empty items are ignored
  EXPECT_FALSE(interfaceMatches(",", "eth2"));
}

TEST(Interfaces, TheFirstMatchingInterfaceThatIsUpGivesItsIpv4AddressElseIpv6) {
  const std::vector<InterfaceAddress> here = {
      {"lo", "127.0.0.1", false, false, true},  {"docker0", "172.17.0.1", false, false, true},
      {"eth0", "fe80::1", true, true, true},    {"eth0", "fd00::5", true, false, true},
      {"eth0", "10.0.0.5", false, false, true}, {"eth1", "10.1.0.5", false, false, false},  // down
      {"ib0", "fd01::9", true, false, true},
  };
  EXPECT_EQ(chooseInterfaceAddress("eth", "LOOM_SOCKET_IFNAME", here), "10.0.0.5");
  EXPECT_EQ(chooseInterfaceAddress("^lo,docker", "LOOM_SOCKET_IFNAME", here), "10.0.0.5");
  EXPECT_EQ(chooseInterfaceAddress("ib", "LOOM_SOCKET_IFNAME", here), "fd01::9");
  EXPECT_EQ(chooseInterfaceAddress("lo", "LOOM_SOCKET_IFNAME", here), "127.0.0.1");
  // Down, or link-local only: nothing to listen on that peers reach. The error names the spec,
  // where it came from, and what the machine has.
  for (const std::string spec : {"eth1", "=eth", "wlan"}) {
    try {
      chooseInterfaceAddress(spec, "LOOM_SOCKET_IFNAME", here);
      ADD_FAILURE() << spec << " selected an interface";
    } catch (const InvalidArgumentError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("LOOM_SOCKET_IFNAME='" + spec + "' selects no interface"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("eth1 10.1.0.5 (down)"), std::string::npos) << what;
      EXPECT_NE(what.find("eth0 fe80::1 (link-local)"), std::string::npos) << what;
    }
  }
  const std::vector<InterfaceAddress> linkLocalOnly = {{"eth0", "fe80::1", true, true, true}};
  EXPECT_THROW(chooseInterfaceAddress("eth", "LOOM_SOCKET_IFNAME", linkLocalOnly),
               InvalidArgumentError);
}

TEST(Interfaces, ThisMachinesInterfacesAreListedWithLoopbackAmongThem) {
  const std::vector<InterfaceAddress> here = interfaceAddresses();
  bool loopback = false;
  for (const InterfaceAddress& a : here) loopback = loopback || a.address == "127.0.0.1";
  EXPECT_TRUE(loopback) << "no 127.0.0.1 among " << here.size() << " addresses";
  EXPECT_EQ(addressOfInterface("=lo", "LOOM_SOCKET_IFNAME"), "127.0.0.1");
}

}  // namespace
}  // namespace loom::net
