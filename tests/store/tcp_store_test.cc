// TCPStore and TCPStoreServer beyond the conformance suite: hostile clients, tokens, ports,
// worker joins, and the server going away under a waiting client.
#include "loom/store/tcp_store.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <random>
#include <thread>

#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/store/store_protocol.h"
#include "loom/store/tcp_store_server.h"

namespace loom {
namespace {

using std::chrono::milliseconds;
namespace proto = store_protocol;

TCPStoreOptions quick(int rank = -1, const std::string& token = "") {
  TCPStoreOptions o;
  o.timeout = milliseconds(5000);
  o.rank = rank;
  o.token = token;
  return o;
}

// Reads until the server closes the connection; true when it did within the deadline.
bool serverCloses(int fd, milliseconds timeout) {
  Deadline d(timeout);
  uint8_t buf[256];
  while (!d.expired()) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, d.pollTimeoutMs()) <= 0) continue;
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

// Polls a condition until it holds or 10 s pass (for state only the server thread changes).
template <typename F>
bool waitUntil(F condition) {
  Deadline d(milliseconds(10000));
  while (!condition()) {
    if (d.expired()) return false;
    std::this_thread::sleep_for(milliseconds(1));  // poll interval, bounded by the deadline
  }
  return true;
}

std::vector<uint8_t> helloFrame(const std::string& token = "") {
  return proto::encode(proto::Message{proto::Op::kHello, 1, -1, {"raw-client"}, {toBytes(token)}});
}

// A server with one well-behaved client parked in a get: every hostile case must leave both
// working.
class HostileClients : public ::testing::Test {
 protected:
  void SetUp() override {
    good_ = std::make_unique<TCPStore>("127.0.0.1", server_.port(), quick(0));
    waiter_ = std::thread([this] { parked_ = waitingClient_->getString("parked"); });
  }
  void TearDown() override {
    if (waiter_.joinable()) {
      good_->set("parked", std::string_view("released"));
      waiter_.join();
    }
  }

  net::Socket raw() { return net::connectTo("127.0.0.1", server_.port(), milliseconds(5000)); }

  void send(int fd, const std::vector<uint8_t>& bytes) {
    net::writeFull(fd, bytes.data(), bytes.size(), Deadline(milliseconds(5000)), "test server");
  }

  // After a hostile client was dropped: the log named it, the parked get is still answered,
  // and the good client still works.
  void expectServerStillServes(const std::string& log, const std::string& reason) {
    EXPECT_NE(log.find("closing connection from 127.0.0.1:"), std::string::npos) << log;
    EXPECT_NE(log.find(reason), std::string::npos) << log;
    expectServerStillServes();
  }
  void expectServerStillServes() {
    good_->set("parked", std::string_view("released"));
    waiter_.join();
    EXPECT_EQ(parked_, "released");
    EXPECT_EQ(good_->add("after", 1), 1);
    TCPStore fresh("127.0.0.1", server_.port(), quick(1));
    EXPECT_EQ(fresh.getString("after"), "1");
  }

  TCPStoreServer server_{TCPStoreServerOptions{"127.0.0.1", 0, "", -1}};
  std::unique_ptr<TCPStore> good_;
  std::unique_ptr<TCPStore> waitingClient_ =
      std::make_unique<TCPStore>("127.0.0.1", server_.port(), quick(2));
  std::thread waiter_;
  std::string parked_;
};

TEST_F(HostileClients, GarbageBytes) {
  net::Socket s = raw();
  std::mt19937 rng(1);
  std::vector<uint8_t> garbage(100);
  for (auto& b : garbage) b = static_cast<uint8_t>(rng());
  garbage[0] = 'X';
  ::testing::internal::CaptureStderr();
  send(s.fd(), garbage);
  EXPECT_TRUE(serverCloses(s.fd(), milliseconds(5000)));
  expectServerStillServes(::testing::internal::GetCapturedStderr(), "bad magic");
}

TEST_F(HostileClients, WrongMagicInAnOtherwiseValidFrame) {
  net::Socket s = raw();
  auto frame = helloFrame();
  frame[3] ^= 0xFF;
  ::testing::internal::CaptureStderr();
  send(s.fd(), frame);
  EXPECT_TRUE(serverCloses(s.fd(), milliseconds(5000)));
  expectServerStillServes(::testing::internal::GetCapturedStderr(), "bad magic");
}

TEST_F(HostileClients, TruncatedFrameThenClose) {
  net::Socket s = raw();
  auto frame = helloFrame();
  frame.resize(frame.size() / 2);
  ::testing::internal::CaptureStderr();
  send(s.fd(), frame);
  ::shutdown(s.fd(), SHUT_WR);
  EXPECT_TRUE(serverCloses(s.fd(), milliseconds(5000)));
  expectServerStillServes(::testing::internal::GetCapturedStderr(), "in the middle of a frame");
}

TEST_F(HostileClients, LengthOfTwoToTheFortieth) {
  net::Socket s = raw();
  auto frame = helloFrame();
  frame.resize(proto::kHeaderBytes);
  uint64_t length = uint64_t{1} << 40;
  for (int i = 23; i >= 16; --i, length >>= 8) frame[i] = static_cast<uint8_t>(length);
  ::testing::internal::CaptureStderr();
  send(s.fd(), frame);
  EXPECT_TRUE(serverCloses(s.fd(), milliseconds(5000)));
  expectServerStillServes(::testing::internal::GetCapturedStderr(), "exceeds the limit");
}

TEST_F(HostileClients, HugeFrameBeforeHello) {
  net::Socket s = raw();
  // A well-formed 100 MiB set frame (under the frame limit) from a client that never said
  // hello: refused once 64 KiB are buffered, not after 100 MiB.
  auto frame = proto::encode(proto::Message{proto::Op::kSet, 1, 0, {"k"}, {Bytes(1 << 20)}});
  uint64_t length = (uint64_t{100} << 20);
  for (int i = 23; i >= 16; --i, length >>= 8) frame[i] = static_cast<uint8_t>(length);
  ::testing::internal::CaptureStderr();
  try {
    send(s.fd(), frame);  // the server may close before all of it is sent
  } catch (const IoError&) {
  }
  EXPECT_TRUE(serverCloses(s.fd(), milliseconds(5000)));
  expectServerStillServes(::testing::internal::GetCapturedStderr(), "before the hello completed");
}

TEST_F(HostileClients, RequestBeforeHello) {
  net::Socket s = raw();
  ::testing::internal::CaptureStderr();
  send(s.fd(), proto::encode(proto::Message{proto::Op::kSet, 1, 0, {"k"}, {toBytes("v")}}));
  EXPECT_TRUE(serverCloses(s.fd(), milliseconds(5000)));
  expectServerStillServes(::testing::internal::GetCapturedStderr(), "before the hello");
}

TEST_F(HostileClients, WrongShapeAfterHello) {
  net::Socket s = raw();
  ::testing::internal::CaptureStderr();
  send(s.fd(), helloFrame());
  send(s.fd(), proto::encode(proto::Message{proto::Op::kCompareSet, 2, 0, {"k"}, {}}));
  EXPECT_TRUE(serverCloses(s.fd(), milliseconds(5000)));
  expectServerStillServes(::testing::internal::GetCapturedStderr(), "compareSet needs 1 key(s)");
}

TEST_F(HostileClients, ClientVanishesWhileParked) {
  net::Socket s = raw();
  send(s.fd(), helloFrame());
  send(s.fd(), proto::encode(proto::Message{proto::Op::kGet, 2, 0, {"parked"}, {}}));
  ASSERT_TRUE(waitUntil([&] { return server_.numWaiting() == 2; }));
  s.reset();
  // The waiter of the vanished client is dropped; setting the key answers only live ones.
  ASSERT_TRUE(waitUntil([&] { return server_.numWaiting() == 1; }));
  expectServerStillServes();
}

TEST(TCPStoreToken, WrongTokenIsRefusedAtConnectAndOthersKeepWorking) {
  TCPStoreServer server(TCPStoreServerOptions{"127.0.0.1", 0, "s3cret", -1});
  TCPStore good("127.0.0.1", server.port(), quick(0, "s3cret"));
  good.set("k", std::string_view("v"));
  ::testing::internal::CaptureStderr();
  try {
    TCPStore bad("127.0.0.1", server.port(), quick(1, "wrong"));
    FAIL() << "expected the wrong token to be refused";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("authentication failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(server.port())), std::string::npos);
  }
  EXPECT_THROW(TCPStore("127.0.0.1", server.port(), quick(1, "")), IoError);
  // The refusal reaches the client before the server has logged and closed: wait for that.
  EXPECT_TRUE(waitUntil([&] { return server.numConnections() == 1; }));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("wrong token"), std::string::npos) << log;
  EXPECT_NE(log.find("no token given"), std::string::npos) << log;
  EXPECT_EQ(good.getString("k"), "v");
}

TEST(TCPStoreServerTest, PortZeroPicksAPortAndAddressInUseNamesIt) {
  TCPStoreServer first(TCPStoreServerOptions{"127.0.0.1", 0, "", -1});
  ASSERT_GT(first.port(), 0);
  EXPECT_EQ(first.address(), "127.0.0.1:" + std::to_string(first.port()));
  try {
    TCPStoreServer second(TCPStoreServerOptions{"127.0.0.1", first.port(), "", -1});
    FAIL() << "expected address in use";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << what;
    EXPECT_NE(what.find("in use"), std::string::npos) << what;
  }
}

TEST(TCPStoreServerTest, IsServerStoreWaitsForWorkersWhoIdentifyThemselves) {
  // The hosting store picks the port; workers learn it from a port the test reserves first.
  int port = 0;
  {
    net::Socket probe = net::listenOn("127.0.0.1", 0);
    port = net::localPort(probe.fd());
  }
  std::vector<std::thread> workers;
  for (int rank = 1; rank < 3; ++rank) {
    workers.emplace_back([port, rank] {
      TCPStore worker("127.0.0.1", port, quick(rank));
      worker.set("hello/" + std::to_string(rank), std::string_view("up"));
    });
  }
  TCPStoreOptions options = quick(0);
  options.isServer = true;
  options.numWorkers = 3;
  TCPStore host("127.0.0.1", port, options);
  for (auto& w : workers) w.join();
  ASSERT_NE(host.server(), nullptr);
  EXPECT_EQ(host.server()->numJoined(), 3);
  EXPECT_EQ(host.server()->joinedRanks(), (std::set<int>{0, 1, 2}));
  host.wait({"hello/1", "hello/2"});
}

TEST(TCPStoreServerTest, WaitForWorkersTimeoutSaysWhoIsMissing) {
  TCPStoreServer server(TCPStoreServerOptions{"127.0.0.1", 0, "", 4});
  TCPStore r0("127.0.0.1", server.port(), quick(0));
  TCPStore r2("127.0.0.1", server.port(), quick(2));
  TCPStore r2again("127.0.0.1", server.port(), quick(2));  // a second store of rank 2
  try {
    server.waitForWorkers(5, milliseconds(200));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("3/5 workers joined"), std::string::npos) << what;
    EXPECT_NE(what.find("missing ranks: 1, 3, 4"), std::string::npos) << what;
  }
  server.waitForWorkers(3, milliseconds(1000));
}

TEST(TCPStoreClient, ConnectRetriesUntilTheServerStarts) {
  int port = 0;
  {
    net::Socket probe = net::listenOn("127.0.0.1", 0);
    port = net::localPort(probe.fd());
  }
  std::unique_ptr<TCPStoreServer> server;
  std::thread late([&] {
    // The behaviour under test: a server that comes up 300 ms late, while the client below is
    // already retrying (nothing observable tells that it has failed a first connect).
    std::this_thread::sleep_for(milliseconds(300));
    server = std::make_unique<TCPStoreServer>(TCPStoreServerOptions{"127.0.0.1", port, "", -1});
  });
  Deadline d(milliseconds(0));
  TCPStore client("127.0.0.1", port, quick(0));
  late.join();
  EXPECT_GE(d.elapsed().count(), 250);
  client.set("k", std::string_view("v"));
  EXPECT_EQ(client.getString("k"), "v");
}

TEST(TCPStoreClient, ConnectTimeoutNamesTheAddress) {
  int port = 0;
  {
    net::Socket probe = net::listenOn("127.0.0.1", 0);
    port = net::localPort(probe.fd());
  }
  TCPStoreOptions o = quick();
  o.timeout = milliseconds(300);
  try {
    TCPStore client("127.0.0.1", port, o);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

// Something else listens on the store's port and never answers (another program; a store of
// another job that is stuck): the hello has its own bound, not the whole timeout, and the
// error says what the silence may mean.
TEST(TCPStoreClient, AListenerThatNeverAnswersTheHelloIsNamedAfterTheHelloTimeout) {
  net::Socket silent = net::listenOn("127.0.0.1", 0);  // the kernel accepts; nobody answers
  const int port = net::localPort(silent.fd());
  TCPStoreOptions o = quick();
  o.timeout = milliseconds(60000);
  o.helloTimeout = milliseconds(300);
  const Deadline d(milliseconds(60000));
  try {
    TCPStore client("127.0.0.1", port, o);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("did not answer the hello within 300 ms (is it a Loom store?"),
              std::string::npos)
        << what;
  }
  EXPECT_LT(d.elapsed().count(), 30000) << "waited out the operation timeout";
}

TEST(TCPStoreClient, ServerStoppingDuringGetIsAPromptIoErrorNamingTheServer) {
  auto server = std::make_unique<TCPStoreServer>(TCPStoreServerOptions{"127.0.0.1", 0, "", -1});
  const int port = server->port();
  TCPStoreOptions o = quick();
  o.timeout = milliseconds(60000);
  TCPStore client("127.0.0.1", port, o);
  client.set("ready", std::string_view("1"));
  std::string error;
  bool wasTimeout = false;
  Deadline d(milliseconds(0));
  std::thread getter([&] {
    try {
      client.get("never");
    } catch (const TimeoutError& e) {
      wasTimeout = true;
      error = e.what();
    } catch (const IoError& e) {
      error = e.what();
    }
  });
  // Stop once the get is parked on the server.
  ASSERT_TRUE(waitUntil([&] { return server->numWaiting() == 1; }));
  server->stop();
  getter.join();
  EXPECT_FALSE(wasTimeout) << error;
  EXPECT_LT(d.elapsed().count(), 10000);
  EXPECT_NE(error.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << error;
  // The store is now unusable and says so at once.
  Deadline again(milliseconds(0));
  EXPECT_THROW(client.set("x", std::string_view("y")), IoError);
  EXPECT_LT(again.elapsed().count(), 1000);
}

TEST(TCPStoreClient, OversizedValueIsRefusedBeforeSending) {
  TCPStoreServer server(TCPStoreServerOptions{"127.0.0.1", 0, "", -1});
  TCPStore client("127.0.0.1", server.port(), quick());
  EXPECT_THROW(client.set("big", Bytes(proto::kMaxValueBytes + 1)), InvalidArgumentError);
  EXPECT_THROW(client.get(std::string(proto::kMaxKeyBytes + 1, 'k')), InvalidArgumentError);
  client.set("small", std::string_view("fine"));
  EXPECT_EQ(client.getString("small"), "fine");
}

TEST(TCPStoreClient, LargeValuesRoundTrip) {
  TCPStoreServer server(TCPStoreServerOptions{"127.0.0.1", 0, "", -1});
  TCPStore a("127.0.0.1", server.port(), quick());
  TCPStore b("127.0.0.1", server.port(), quick());
  Bytes big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131);
  std::thread t([&] { EXPECT_EQ(b.get("big"), big); });
  a.set("big", big);
  t.join();
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST(TCPStoreServerTest, SilentClientIsDroppedAfterTheHelloTimeout) {
  TCPStoreServerOptions options{"127.0.0.1", 0, "", -1};
  options.helloTimeout = milliseconds(200);
  TCPStoreServer server(options);
  TCPStore good("127.0.0.1", server.port(), quick());
  net::Socket silent = net::connectTo("127.0.0.1", server.port(), milliseconds(5000));
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(serverCloses(silent.fd(), milliseconds(5000)));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("no hello within 200 ms"), std::string::npos) << log;
  // The good client said hello long ago and is not affected.
  good.set("k", std::string_view("v"));
  EXPECT_EQ(good.getString("k"), "v");
}

TEST(TCPStoreServerTest, ClientParkingTooManyRequestsIsDropped) {
  TCPStoreServer server(TCPStoreServerOptions{"127.0.0.1", 0, "", -1});
  TCPStore good("127.0.0.1", server.port(), quick());
  net::Socket s = net::connectTo("127.0.0.1", server.port(), milliseconds(5000));
  std::vector<uint8_t> flood = helloFrame();
  for (uint64_t id = 2; id < 2000; ++id) {
    proto::encode(proto::Message{proto::Op::kGet, id, 0, {"never"}, {}}, flood);
  }
  ::testing::internal::CaptureStderr();
  net::writeFull(s.fd(), flood.data(), flood.size(), Deadline(milliseconds(5000)), "server");
  EXPECT_TRUE(serverCloses(s.fd(), milliseconds(5000)));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("requests waiting on one connection"), std::string::npos) << log;
  EXPECT_TRUE(waitUntil([&] { return server.numWaiting() == 0; }));
  EXPECT_EQ(good.add("still", 1), 1);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

proto::Message readReply(int fd) {
  std::vector<uint8_t> buf(proto::kHeaderBytes);
  const Deadline d(milliseconds(5000));
  net::readFull(fd, buf.data(), buf.size(), d, "server");
  uint64_t length = 0;
  for (int i = 16; i < 24; ++i) length = (length << 8) | buf[i];
  buf.resize(buf.size() + length);
  net::readFull(fd, buf.data() + proto::kHeaderBytes, length, d, "server");
  proto::Message m;
  EXPECT_EQ(proto::decode(buf.data(), buf.size(), m).status, proto::DecodeStatus::kOk);
  return m;
}

TEST(TCPStoreServerTest, PipelinedRequestsInOneWriteAreAnsweredInOrder) {
  TCPStoreServer server(TCPStoreServerOptions{"127.0.0.1", 0, "", -1});
  net::Socket s = net::connectTo("127.0.0.1", server.port(), milliseconds(5000));
  std::vector<uint8_t> batch = helloFrame();
  using proto::Op;
  proto::encode(proto::Message{Op::kGet, 2, 0, {"k"}, {}}, batch);  // parks until 3 sets k
  proto::encode(proto::Message{Op::kSet, 3, 0, {"k"}, {toBytes("v")}}, batch);
  proto::encode(proto::Message{Op::kAdd, 4, 5, {"n"}, {}}, batch);
  proto::encode(proto::Message{Op::kCompareSet, 5, 0, {"k"}, {toBytes("v"), toBytes("w")}}, batch);
  proto::encode(proto::Message{Op::kNumKeys, 6, 0, {}, {}}, batch);
  // Split the batch at an awkward place so frames straddle reads.
  const size_t half = batch.size() / 2 + 3;
  const Deadline d(milliseconds(5000));
  net::writeFull(s.fd(), batch.data(), half, d, "server");
  net::writeFull(s.fd(), batch.data() + half, batch.size() - half, d, "server");
  EXPECT_EQ(readReply(s.fd()).id, 1u);  // hello
  // The set is answered before the get it wakes.
  auto set = readReply(s.fd());
  EXPECT_EQ(set.id, 3u);
  auto get = readReply(s.fd());
  EXPECT_EQ(get.id, 2u);
  ASSERT_EQ(get.values.size(), 1u);
  EXPECT_EQ(toString(get.values[0]), "v");
  EXPECT_EQ(readReply(s.fd()).number, 5);
  auto cas = readReply(s.fd());
  ASSERT_EQ(cas.values.size(), 1u);
  EXPECT_EQ(toString(cas.values[0]), "w");
  EXPECT_EQ(readReply(s.fd()).number, 2);
}

}  // namespace
}  // namespace loom
