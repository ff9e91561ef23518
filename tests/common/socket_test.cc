#include "loom/common/socket.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "loom/common/error.h"

namespace loom::net {
namespace {

TEST(Socket, ListenOnPortZeroThenConnectAndExchange) {
  Socket server = listenOn("127.0.0.1", 0);
  const int port = localPort(server.fd());
  ASSERT_GT(port, 0);
  std::thread client([port] {
    Socket c = connectTo("127.0.0.1", port, milliseconds(5000));
    const std::string msg = "hello loom";
    writeFull(c.fd(), msg.data(), msg.size(), Deadline(milliseconds(5000)), "test server");
  });
  Socket conn = acceptWithDeadline(server.fd(), Deadline(milliseconds(5000)));
  ASSERT_TRUE(conn.valid());
  std::string got(10, '\0');
  readFull(conn.fd(), got.data(), got.size(), Deadline(milliseconds(5000)), "test client");
  EXPECT_EQ(got, "hello loom");
  client.join();
}

TEST(Socket, ClosedPeerIsAnIoErrorWithByteCounts) {
  Socket server = listenOn("127.0.0.1", 0);
  const int port = localPort(server.fd());
  Socket c = connectTo("127.0.0.1", port, milliseconds(5000));
  Socket conn = acceptWithDeadline(server.fd(), Deadline(milliseconds(5000)));
  c.reset();
  char buf[16];
  try {
    readFull(conn.fd(), buf, sizeof(buf), Deadline(milliseconds(5000)), "peer rank 1");
    FAIL() << "expected IoError";
  } catch (const TimeoutError&) {
    FAIL() << "a closed peer must not look like a timeout";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("connection closed by peer rank 1 after 0 of 16 bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST(Socket, ReadTimesOutWithinBound) {
  Socket server = listenOn("127.0.0.1", 0);
  Socket c = connectTo("127.0.0.1", localPort(server.fd()), milliseconds(5000));
  Socket conn = acceptWithDeadline(server.fd(), Deadline(milliseconds(5000)));
  char buf[4];
  Deadline d(milliseconds(100));
  EXPECT_THROW(readFull(conn.fd(), buf, sizeof(buf), d, "silent peer"), TimeoutError);
  EXPECT_GE(d.elapsed().count(), 100);
  EXPECT_LT(d.elapsed().count(), 5000);
}

TEST(Socket, ConnectToNothingTimesOutNamingTheAddress) {
  // Find a port that is free by binding and closing it.
  int port = 0;
  {
    Socket s = listenOn("127.0.0.1", 0);
    port = localPort(s.fd());
  }
  try {
    connectTo("127.0.0.1", port, milliseconds(300));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
    EXPECT_NE(what.find("Connection refused"), std::string::npos) << what;
  }
}

TEST(Socket, AddressInUseNamesHostAndPort) {
  Socket a = listenOn("127.0.0.1", 0);
  const int port = localPort(a.fd());
  try {
    Socket b = listenOn("127.0.0.1", port);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

TEST(Socket, LocalAddressTowardsLoopbackIsLoopback) {
  EXPECT_EQ(localAddressTowards("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(localAddressTowards("no-such-host.invalid"), "");
}

}  // namespace
}  // namespace loom::net
