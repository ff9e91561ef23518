// Peer authentication of the tcp transport (loom/store/peer_auth.h; comm/src/tcp/tcp_setup.cc
// and tcp_heal.cc), with process ranks over a FileStore on loopback and a stranger process that
// knows a rank's port (it reads the store) but not the group's key:
// - strangers that reach rank 0 before its real peers (silent ones, 80 of them; one with a forged
// hello:
//   right magic, rank and size, a wrong MAC; one with a hello and no MAC; one with garbage)
//   neither take a peer's place nor stall or fail the setup: 2 and 4 ranks complete their
//   all-reduces, the forged connections are closed, and the setup does not wait for the silent
//   stranger's handshake deadline;
// - with healing on, a forged resume (a stranger claiming to re-establish rank 1's connection)
//   is dropped and no connection is lost, and a real reset still heals beside a silent stranger;
// - the handshake itself: a dialer or an acceptor without the key is refused by the other side.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <poll.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "loom/common/socket.h"
#include "loom/store/file_store.h"
#include "loom/store/hash_store.h"
#include "loom/store/peer_auth.h"
#include "loom/testing/ranks.h"
#include "tcp/peer.h"
#include "tcp/tcp_transport.h"

namespace loom::comm::testing {
namespace {

using namespace std::chrono_literals;

ContextOptions tcpOptions(int reconnectMs = 0) {
  ContextOptions o;
  o.host = "127.0.0.1";
  o.sharedMemory = false;
  o.timeout = 60s;
  o.tcpReconnectMs = reconnectMs;
  o.tcpHealLocal = reconnectMs > 0;
  return o;
}

tcp::TcpTransport& tcpOf(Context& ctx) {
  auto* t = dynamic_cast<tcp::TcpTransport*>(&ctx.transport());
  LOOM_CHECK(t != nullptr, "the Context's transport is not tcp");
  return *t;
}

// `iters` all-reduces of 1000 int32 (sum), checked.
void allreduceChecked(Context& ctx, int iters, uint64_t firstSeq, size_t count = 1000) {
  std::vector<int32_t> buf(count);
  for (int iter = 0; iter < iters; ++iter) {
    for (size_t i = 0; i < count; ++i) buf[i] = ctx.rank() + static_cast<int32_t>(i % 101) + iter;
    CollectiveOptions opts;
    opts.seq = firstSeq + static_cast<uint64_t>(iter);
    opts.timeout = 60s;
    allreduce(ctx, buf.data(), buf.data(), count, DType::kInt32, ReduceOp::kSum, opts);
    const int n = ctx.size();
    for (size_t i = 0; i < count; ++i) {
      const int32_t want = n * (n - 1) / 2 + n * (static_cast<int32_t>(i % 101) + iter);
      LOOM_CHECK_EQ(buf[i], want, "rank ", ctx.rank(), ": element ", i);
    }
  }
}

net::Socket connectToKey(Store& store, const std::string& key) {
  store.wait({key}, 30s);
  const std::string addr = store.getString(key);
  const auto colon = addr.rfind(':');
  return net::connectTo(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)), 10s);
}

// True when the peer closes the connection (EOF or reset) within `bound`.
bool closedByPeer(int fd, std::chrono::milliseconds bound) {
  char c;
  try {
    net::readFull(fd, &c, 1, Deadline(bound), "the rank");
  } catch (const TimeoutError&) {
    return false;
  } catch (const IoError&) {
    return true;
  }
  return false;
}

// A stranger's forged opening (right magic, rank, size): it reads the challenge and answers
// with a MAC made with the wrong key; the rank must close the connection.
void forgeHello(Store& store, const std::string& addrKey, uint32_t magic, int rank, int to,
                int size, bool heals) {
  net::Socket s = connectToKey(store, addrKey);
  const tcp::Hello hello = tcp::makeHello(magic, rank, to, size, 0, 1, heals, 0);
  net::writeFull(s.fd(), &hello, sizeof(hello), Deadline(5s), "the rank");
  auth::Challenge challenge{};
  net::readFull(s.fd(), &challenge, sizeof(challenge), Deadline(15s), "the rank");
  auth::Key wrong{};
  wrong[0] = 1;
  const auth::Proof proof{
      auth::handshakeMac(wrong, tcp::kAuthLabel, false, tcp::bytesOf(hello), challenge.nonce)};
  net::writeFull(s.fd(), &proof, sizeof(proof), Deadline(5s), "the rank");
  LOOM_CHECK(closedByPeer(s.fd(), 15s), "the rank kept a connection whose MAC was wrong");
}

class Strangers : public ::testing::TestWithParam<int> {};

// Strangers reach rank 0 first; then the real ranks set up and all-reduce.
TEST_P(Strangers, CannotJoinStallOrFailSetup) {
  const int size = GetParam();
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  const std::string addrKey = "comm/tcp/addr/0";
  children.spawn(
      [&] {
        FileStore store(dir.file("store"));
        net::Socket silent = connectToKey(store, addrKey);  // says nothing
        // A flood of silent connections, more than rank 0 handshakes at once (64): the oldest
        // are displaced, and the real peers, who come later, are not.
        std::vector<net::Socket> flood;
        for (int i = 0; i < 80; ++i) flood.push_back(connectToKey(store, addrKey));
        forgeHello(store, addrKey, tcp::kMagic, size - 1, 0, size, false);
        {
          // A hello and no MAC: the rank drops it when it closes.
          net::Socket s = connectToKey(store, addrKey);
          const tcp::Hello hello = tcp::makeHello(tcp::kMagic, 1, 0, size, 0, 1, false, 0);
          net::writeFull(s.fd(), &hello, sizeof(hello), Deadline(5s), "rank 0");
        }
        {
          net::Socket s = connectToKey(store, addrKey);
          const std::string garbage(sizeof(tcp::Hello), 'x');
          net::writeFull(s.fd(), garbage.data(), garbage.size(), Deadline(5s), "rank 0");
          LOOM_CHECK(closedByPeer(s.fd(), 15s), "rank 0 kept a connection that sent garbage");
        }
        store.set("strangers/ready", "1");
        store.wait({"job/done"}, 60s);  // the silent connection stays open until then
      },
      "stranger");
  children.spawnRanks(size, [&](int rank) {
    FileStore store(dir.file("store"));
    if (rank > 0) store.wait({"strangers/ready"}, 30s);
    const auto start = std::chrono::steady_clock::now();
    auto ctx = Context::create(store, rank, size, tcpOptions());
    const auto took = std::chrono::steady_clock::now() - start;
    // Not held up until the silent stranger's handshake deadline (10 s).
    LOOM_CHECK(took < 8s, "rank ", rank, ": setup took ",
               std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), " ms");
    allreduceChecked(*ctx, 3, 1);
    store.add("job/finished", 1);
    if (store.add("job/finished", 0) == size) store.set("job/done", "1");
    store.wait({"job/done"}, 30s);
  });
  EXPECT_EQ(children.waitAllOk(90s), "");
}

INSTANTIATE_TEST_SUITE_P(Auth, Strangers, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// Healing on: a stranger's forged resume is dropped (no connection is lost), and a real reset
// still heals while a silent stranger holds a connection to each rank's listener.
TEST(Auth, ForgedResumeIsDroppedAndRealResetStillHeals) {
  loom::testing::TempDir dir;
  loom::testing::ChildProcesses children;
  children.spawn(
      [&] {
        FileStore store(dir.file("store"));
        store.wait({"heal/ready"}, 60s);
        net::Socket silent0 = connectToKey(store, "comm/tcp/addr/0");
        net::Socket silent1 = connectToKey(store, "comm/tcp/addr/1");
        // "Rank 1 lost connection 0 and re-establishes it", and "rank 0 asks rank 1 to redial".
        forgeHello(store, "comm/tcp/addr/0", tcp::kResumeMagic, 1, 0, 2, true);
        forgeHello(store, "comm/tcp/addr/1", tcp::kResumeMagic, 0, 1, 2, true);
        store.set("strangers/ready", "1");
        store.wait({"job/done"}, 60s);
      },
      "stranger");
  children.spawnRanks(2, [&](int rank) {
    FileStore store(dir.file("store"));
    auto ctx = Context::create(store, rank, 2, tcpOptions(10000));
    tcp::TcpTransport& t = tcpOf(*ctx);
    LOOM_CHECK(t.heals(1 - rank, 0), "the connection does not heal");
    allreduceChecked(*ctx, 1, 1);
    store.add("heal/ranks", 1);
    if (store.add("heal/ranks", 0) == 2) store.set("heal/ready", "1");
    store.wait({"strangers/ready"}, 60s);
    allreduceChecked(*ctx, 2, 2);
    LOOM_CHECK_EQ(t.reconnects(), 0, "rank ", rank, ": a forged resume replaced a connection");
    if (rank == 1) t.testResetAfter(0, 0, 1 << 20);
    allreduceChecked(*ctx, 2, 4, size_t{1} << 20);
    if (rank == 1) {
      LOOM_CHECK(t.reconnects() >= 1, "the reset connection was not re-established");
    }
    LOOM_CHECK(!t.failed(), "the transport failed");
    store.add("job/finished", 1);
    if (store.add("job/finished", 0) == 2) store.set("job/done", "1");
    store.wait({"job/done"}, 30s);
  });
  EXPECT_EQ(children.waitAllOk(90s), "");
}

// The handshake on a socket pair: both sides with the key succeed; an acceptor without it is
// refused by the dialer, and a dialer without it by the acceptor.
TEST(Auth, HandshakeNeedsTheKeyOnBothSides) {
  HashStore store;
  const auth::Key key = auth::sharedKey(store, "k");
  EXPECT_EQ(auth::sharedKey(store, "k"), key);  // the first caller's key for everyone
  auth::Key other = key;
  other[5] ^= 1;
  struct Outcome {
    bool dialed;
    auth::Inbound::State accepted;
  };
  auto run = [](const auth::Key& dialerKey, const auth::Key& acceptorKey) {
    int fds[2];
    LOOM_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0, "socketpair");
    net::Socket a(fds[0]);
    const std::vector<uint8_t> opening(24, 7);
    bool dialed = false;
    std::thread dialer([&, fd = fds[1]] {
      net::Socket b(fd);
      try {
        auth::dial(b.fd(), dialerKey, "test", opening, Deadline(5s), "acceptor");
        dialed = true;
        char c;
        net::readFull(b.fd(), &c, 1, Deadline(5s), "acceptor");  // until the acceptor closes
      } catch (const IoError&) {
      }
    });
    auth::Inbound in(std::move(a), opening.size(), Clock::now() + 5s);
    auth::Inbound::State state = auth::Inbound::State::kPending;
    while (state == auth::Inbound::State::kPending) {
      state = in.advance(acceptorKey, "test", [](std::span<const uint8_t>) { return ""; });
      std::this_thread::sleep_for(1ms);  // a poll loop in the real users; bounded by the deadline
    }
    if (state == auth::Inbound::State::kFailed)
      std::fprintf(stderr, "refused: %s\n", in.why().c_str());
    in.release();  // closes: the dialer's read ends
    dialer.join();
    return Outcome{dialed, state};
  };
  const Outcome good = run(key, key);
  EXPECT_TRUE(good.dialed);
  EXPECT_EQ(good.accepted, auth::Inbound::State::kDone);
  const Outcome strangerAcceptor = run(key, other);
  EXPECT_FALSE(strangerAcceptor.dialed);
  EXPECT_EQ(strangerAcceptor.accepted, auth::Inbound::State::kFailed);
  const Outcome strangerDialer = run(other, key);
  EXPECT_FALSE(strangerDialer.dialed);  // it refused the acceptor's MAC first
  EXPECT_EQ(strangerDialer.accepted, auth::Inbound::State::kFailed);
}

// InboundSet, the acceptor loop the tcp setup, its healing and the RPC server share, on a real
// listener with a limit of 2: of three silent connections the oldest is dropped for the limit
// (its address reported); silent ones expire at their deadline; a dialer with the key is
// accepted with its opening; one whose opening fails the check and one with another key (which
// refuses the acceptor's MAC and hangs up) are refused with their reasons; the set ends empty.
TEST(Auth, InboundSetAcceptsRefusesAndBoundsHandshakes) {
  HashStore store;
  const auth::Key key = auth::sharedKey(store, "k");
  auth::Key other = key;
  other[0] ^= 1;
  net::Socket listener = net::listenOn("127.0.0.1", 0);
  net::setNonBlocking(listener.fd(), true);
  const int port = net::localPort(listener.fd());
  auth::InboundSet set(8, 2);
  const auto check = [](std::span<const uint8_t> opening) -> std::string {
    return opening[0] == 1 ? "" : "its opening does not start with 1";
  };
  std::vector<auth::InboundSet::Accepted> done;
  std::vector<auth::InboundSet::Refused> refused;
  std::vector<std::string> dropped;
  // Runs the poll loop until `until` returns true (or 10 s pass).
  auto loop = [&](Clock::time_point handshakeDeadline, const std::function<bool()>& until) {
    const Clock::time_point end = Clock::now() + 10s;
    while (!until() && Clock::now() < end) {
      std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
      Clock::time_point wake = Clock::now() + 50ms;
      set.addPollFds(fds, wake);
      ::poll(fds.data(), fds.size(), 50);
      set.advance(fds, 1, key, "test", check, done, refused);
      if (fds[0].revents & POLLIN) {
        EXPECT_EQ(set.acceptAll(listener.fd(), handshakeDeadline, dropped), 0);
      }
    }
  };
  std::vector<net::Socket> silent;
  for (int i = 0; i < 3; ++i) silent.push_back(net::connectTo("127.0.0.1", port, 5s));
  loop(Clock::now() + 1s, [&] { return dropped.size() == 1 && set.size() == 2; });
  EXPECT_EQ(dropped.size(), 1u);
  EXPECT_EQ(set.size(), 2u);
  // The two silent ones left expire; then three dialers, one at a time.
  loop(Clock::now() + 1s, [&] { return refused.size() == 2; });
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_NE(refused[0].why.find("before its deadline"), std::string::npos) << refused[0].why;
  EXPECT_EQ(set.size(), 0u);
  refused.clear();
  auto dialWith = [&](const auth::Key& k, uint8_t first) {
    return std::thread([&, k, first] {
      try {
        net::Socket s = net::connectTo("127.0.0.1", port, 5s);
        std::vector<uint8_t> opening(8, 9);
        opening[0] = first;
        auth::dial(s.fd(), k, "test", opening, Deadline(5s), "acceptor");
        char c;
        net::readFull(s.fd(), &c, 1, Deadline(5s), "acceptor");  // until the test closes it
      } catch (const IoError&) {
      }
    });
  };
  std::thread good = dialWith(key, 1);
  loop(Clock::now() + 5s, [&] { return done.size() == 1; });
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].opening, (std::vector<uint8_t>{1, 9, 9, 9, 9, 9, 9, 9}));
  EXPECT_TRUE(done[0].socket.valid());
  done[0].socket.reset();
  good.join();
  std::thread badOpening = dialWith(key, 2);
  loop(Clock::now() + 5s, [&] { return refused.size() == 1; });
  badOpening.join();
  std::thread stranger = dialWith(other, 1);
  loop(Clock::now() + 5s, [&] { return refused.size() == 2; });
  stranger.join();
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_EQ(refused[0].why, "its opening does not start with 1");
  // The stranger finds the acceptor's MAC wrong first and hangs up.
  EXPECT_NE(refused[1].why.find("closed the connection during the authentication handshake"),
            std::string::npos)
      << refused[1].why;
  EXPECT_EQ(done.size(), 1u);
  EXPECT_EQ(set.size(), 0u);
}

// Out of descriptors, accept fails while the connection stays queued and the listener stays
// readable: a loop that polled it would spin (the tcp setup until its deadline, the heal thread
// for as long as the limit lasts). The set leaves the listener out of the poll for
// kAcceptBackoff after each failure, says what failed, how often and the open-file limit, and
// takes the connection once a descriptor is free again.
TEST(Auth, InboundSetBacksOffWhileAcceptFailsAndNamesTheLimit) {
  net::Socket listener = net::listenOn("127.0.0.1", 0);
  net::setNonBlocking(listener.fd(), true);
  net::Socket client = net::connectTo("127.0.0.1", net::localPort(listener.fd()), 5s);
  auth::InboundSet set(8, 2);
  std::vector<std::string> dropped;
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const rlim_t low = 256;
  ASSERT_GE(saved.rlim_cur, low);
  rlimit lowered = saved;
  lowered.rlim_cur = low;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  std::vector<int> fillers;  // every descriptor below the limit taken
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
  const auto release = [&] {
    for (int fd : fillers) ::close(fd);
    fillers.clear();
    ::setrlimit(RLIMIT_NOFILE, &saved);
  };
  EXPECT_EQ(set.acceptAll(listener.fd(), Clock::now() + 5s, dropped), EMFILE);
  const std::string failure = set.acceptFailure();
  // The loop the tcp setup, its healing and the RPC server run, for half a second: with the
  // back-off it polls about ten times; polling the readable listener it would spin.
  int passes = 0;
  const Clock::time_point end = Clock::now() + 500ms;
  while (Clock::now() < end) {
    Clock::time_point wake = end;
    std::vector<pollfd> fds{set.listenerPollFd(listener.fd(), wake)};
    set.addPollFds(fds, wake);
    const auto waitMs = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(waitMs, 0)));
    if (fds[0].revents & POLLIN) (void)set.acceptAll(listener.fd(), Clock::now() + 5s, dropped);
    ++passes;
  }
  const std::string later = set.acceptFailure();
  // How long the shortage has lasted, which the tcp setup gives up after (kOutOfDescriptorsGrace).
  const Clock::duration shortage = set.outOfDescriptorsFor();
  // Right after a failed accept the listener is out of the poll (the loop may have ended after
  // its back-off expired, so fail one more here; a later failure of the run returns 0).
  EXPECT_EQ(set.acceptAll(listener.fd(), Clock::now() + 5s, dropped), 0);
  Clock::time_point wake = Clock::time_point::max();
  const pollfd backingOff = set.listenerPollFd(listener.fd(), wake);
  release();
  EXPECT_NE(failure.find("accept failed 1 time over "), std::string::npos) << failure;
  EXPECT_NE(failure.find("Too many open files (errno 24)"), std::string::npos) << failure;
  EXPECT_NE(failure.find("the connections wait in the listen queue"), std::string::npos) << failure;
  EXPECT_NE(failure.find("this process may open 256 descriptors (ulimit -n"), std::string::npos)
      << failure;
  EXPECT_LE(passes, 40) << "the loop spun on the readable listener";
  EXPECT_GE(passes, 2);
  EXPECT_NE(later.find(" times over "), std::string::npos) << later;
  EXPECT_GE(shortage, 400ms);
  EXPECT_EQ(backingOff.events, 0);
  EXPECT_LE(wake, Clock::now() + Clock::duration(auth::InboundSet::kAcceptBackoff));
  // A descriptor is free again: the queued connection is taken and the failure forgotten.
  std::this_thread::sleep_for(auth::InboundSet::kAcceptBackoff);
  wake = Clock::time_point::max();
  EXPECT_EQ(set.listenerPollFd(listener.fd(), wake).events, POLLIN);
  EXPECT_EQ(set.acceptAll(listener.fd(), Clock::now() + 5s, dropped), 0);
  EXPECT_EQ(set.size(), 1u);
  EXPECT_EQ(set.acceptFailure(), "");
  EXPECT_EQ(set.outOfDescriptorsFor(), Clock::duration::zero());
}

}  // namespace
}  // namespace loom::comm::testing
