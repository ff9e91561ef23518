// TcpTransport setup and teardown: listen, publish the address in the Store, connect the
// full mesh (lower ranks accept, higher ranks connect, and each pair runs the authentication
// handshake of peer_auth.h), start the progress thread; the destructor stops it and says goodbye to
// every peer.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/schedule_noise.h"
#include "loom/store/rank_claim.h"
#include "loom/store/setup_failure.h"
#include "loom/store/store.h"
#include "tag.h"
#include "tcp/peer.h"
#include "tcp/tcp_transport.h"

namespace loom::comm::tcp {

TcpTransport::TcpTransport(int rank, int size)
    : rank_(rank), size_(size), resuming_(sizeof(Hello), kMaxHandshakes) {}

namespace {

// The third number of /proc/sys/net/ipv4/tcp_wmem or tcp_rmem: the most the kernel's
// autotuning gives one socket's buffer; `fallback` when it cannot be read.
size_t autotuneMax(const char* file, size_t fallback) {
  std::ifstream in(file);
  size_t lo = 0, def = 0, hi = 0;
  if (in >> lo >> def >> hi && hi > 0) return hi;
  return fallback;
}

int bufferOption(int fd, int option) {
  int v = 0;
  socklen_t len = sizeof(v);
  if (::getsockopt(fd, SOL_SOCKET, option, &v, &len) != 0) return 0;
  return v;
}

// The replay ring of a healing connection (tcp_heal.cc) must hold every byte this rank wrote
// that the peer may not have read: at most what this socket's send buffer and the peer's
// receive buffer hold (the peer's is taken to be as large as this rank's: ranks run with the
// same settings), plus a margin for the kernel's accounting (a buffer may overshoot by a
// segment, and its size counts overhead too, so the payload it holds is less).
size_t replayBytes(int fd, int bufferBytes) {
  size_t snd = static_cast<size_t>(std::max(0, bufferOption(fd, SO_SNDBUF)));
  size_t rcv = static_cast<size_t>(std::max(0, bufferOption(fd, SO_RCVBUF)));
  if (bufferBytes <= 0) {
    snd = std::max(snd, autotuneMax("/proc/sys/net/ipv4/tcp_wmem", size_t{4} << 20));
    rcv = std::max(rcv, autotuneMax("/proc/sys/net/ipv4/tcp_rmem", size_t{6} << 20));
  }
  return snd + rcv + (size_t{1} << 20);
}

// Both ends of the connection on one host (loopback, or the same address at both ends).
bool sameHost(int fd) {
  sockaddr_storage local{}, remote{};
  socklen_t ll = sizeof(local), rl = sizeof(remote);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rl) != 0) {
    return false;
  }
  if (local.ss_family != remote.ss_family) return false;
  if (local.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(local).sin_addr;
    const auto& b = reinterpret_cast<const sockaddr_in&>(remote).sin_addr;
    return a.s_addr == b.s_addr || (ntohl(b.s_addr) >> 24) == 127;
  }
  if (local.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(local).sin6_addr;
    const auto& b = reinterpret_cast<const sockaddr_in6&>(remote).sin6_addr;
    return std::memcmp(&a, &b, sizeof(a)) == 0 || IN6_IS_ADDR_LOOPBACK(&b);
  }
  return false;
}

}  // namespace

std::unique_ptr<TcpTransport> TcpTransport::create(Store& store, int rank, int size,
                                                   const TcpOptions& options) {
  LOOM_CHECK(size >= 1, "world size must be at least 1, got ", size);
  LOOM_CHECK(rank >= 0 && rank < size, "rank ", rank, " is out of range [0, ", size, ")");
  LOOM_CHECK(options.busyPollUs <= 10'000'000, "busyPollUs ", options.busyPollUs,
             " is out of range; expected at most 10000000 µs (or < 0 for the default)");
  LOOM_CHECK(options.sockets >= 0 && options.sockets <= 16, "sockets per peer is ", options.sockets,
             "; expected 1 to 16 (or 0 for the default)");
  const long long busyUs = options.busyPollUs >= 0 ? options.busyPollUs : kDefaultBusyPollUs;
  const size_t sendStep = options.sendBytes != 0 ? options.sendBytes : kMaxSendBytes;
  const long long spinUs = options.spinUs >= 0 ? options.spinUs : kDefaultSpinUs;
  const int bufferBytes =
      options.bufferBytes == 0 ? static_cast<int>(kDefaultBufferBytes) : options.bufferBytes;
  std::unique_ptr<TcpTransport> t(new TcpTransport(rank, size));
  t->busy_ = std::chrono::microseconds(busyUs);
  t->sendStep_ = sendStep;
  t->spin_ = std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(spinUs));
  t->lanes_ = options.sockets > 0 ? options.sockets : kDefaultSockets;
  t->stripeBytes_ = options.stripeBytes > 0 ? options.stripeBytes : kDefaultStripeBytes;
  LOOM_CHECK(options.reconnectMs >= 0, "reconnectMs is ", options.reconnectMs,
             "; expected a duration in ms (0: lost connections fail at once)");
  t->reconnect_ = milliseconds(options.reconnectMs);
  t->bufferBytes_ = bufferBytes;
  const int lanes = t->lanes_;
  t->conns_.resize(static_cast<size_t>(size) * lanes);
  if (size == 1) {
    t->start();
    return t;
  }
  const Deadline deadline(options.timeout);
  // A rank whose setup fails says why under this key (first failure wins), and the ranks that
  // wait on it, or on ranks that wait on it, stop at once naming it, with an error of the same
  // kind, instead of each timing out later with a misleading cause of its own.
  const std::string failedKey = options.keyPrefix + "/setup-failed";
  const std::string stopped = detail::str("rank ", rank, ": tcp transport setup stopped");
  auto checkPeerSetup = [&] { checkSetupFailure(store, failedKey, stopped); };
  auto waitWatching = [&](const std::vector<std::string>& keys) {
    waitWatchingSetup(store, keys, deadline, failedKey, stopped);
  };
  try {
    // Before the address is published: a second process with this rank is refused here, and
    // the failure published below stops the one that holds it and the ranks waiting on it.
    claimRank(store, detail::str(options.keyPrefix, "/claim/", rank), rank, size);
    std::string host = options.host;
    const char* hostFrom = "ContextOptions::host, LOOM_HOST or LOOM_SOCKET_IFNAME";
    if (host.empty()) {
      host = net::hostname();
      hostFrom = nullptr;
    }
    net::Socket listener;
    try {
      listener = net::listenOn(host, 0);
    } catch (const IoError& e) {
      // An address the user chose must work: publishing loopback instead would send the peers
      // of other hosts to themselves. Only the address derived from the hostname falls back.
      if (hostFrom != nullptr) {
        LOOM_THROW(IoError, "rank ", rank, ": cannot listen on ", host, " (from ", hostFrom,
                   "): ", e.what(), "; expected an address of this host");
      }
      LOOM_LOG_WARNING(
          "rank ", rank, ": cannot listen on ", host, " (the hostname; ", e.what(),
          "); using 127.0.0.1, which only peers on this host can reach (set LOOM_HOST)");
      host = "127.0.0.1";
      listener = net::listenOn(host, 0);
    }
    const int port = net::localPort(listener.fd());
    // The group's key, before the address is published: whoever connects must prove it holds it.
    t->key_ = auth::sharedKey(store, options.keyPrefix + "/auth-key");
    store.set(detail::str(options.keyPrefix, "/addr/", rank), net::formatHostPort(host, port));

    // Whether a connection heals (tcp_heal.cc): a bound is set, and the peer is on another host
    // or same-host connections heal too. Both ends decide alike (the hello checks it).
    auto heals = [&](int fd) {
      return options.reconnectMs > 0 && (options.healLocal || !sameHost(fd));
    };
    bool anyHeals = false;
    auto setupSocket = [&](net::Socket sock, int peer, int lane) {
      const int index = peer * lanes + lane;
      auto p = std::make_unique<Peer>(rank, peer, lane, index);
      net::setNoDelay(sock.fd());
      if (bufferBytes > 0) net::setBufferSizes(sock.fd(), bufferBytes);
      net::setNonBlocking(sock.fd(), true);
      p->addr = net::peerAddressOf(sock.fd());
      p->heals = heals(sock.fd());
      p->dialer = peer < rank;
      if (p->heals) p->ring = ReplayRing(replayBytes(sock.fd(), bufferBytes));
      anyHeals = anyHeals || p->heals;
      p->pollFd.store(sock.fd());
      p->sock = std::move(sock);
      t->conns_[index] = std::move(p);
    };

    // Connect to every lower rank (their listen backlog takes us before they accept) and prove
    // this rank holds the group's key (peer_auth.h); each answers once it is accepting.
    for (int peer = 0; peer < rank; ++peer) {
      const std::string key = detail::str(options.keyPrefix, "/addr/", peer);
      waitWatching({key});
      const std::string addr = store.getString(key);
      const auto colon = addr.rfind(':');
      LOOM_CHECK(colon != std::string::npos, "bad address '", addr, "' under store key ", key);
      std::string peerHost = addr.substr(0, colon);
      if (peerHost.size() >= 2 && peerHost.front() == '[') {
        peerHost = peerHost.substr(1, peerHost.size() - 2);
      }
      const int peerPort = std::stoi(addr.substr(colon + 1));
      for (int lane = 0; lane < lanes; ++lane) {
        // A connection the peer dropped before its handshake ended (a flood of strangers
        // displaced it) is dialled again, within the setup deadline; a wrong MAC is no peer.
        for (milliseconds pause{10};; pause = std::min(pause * 2, milliseconds(500))) {
          net::Socket sock;
          while (!sock.valid()) {  // in slices, watching for another rank's failure
            checkPeerSetup();
            try {
              sock = net::connectTo(peerHost, peerPort,
                                    std::min(deadline.remaining(), milliseconds(1000)));
            } catch (const TimeoutError& e) {
              if (!deadline.expired()) continue;
              LOOM_THROW(TimeoutError, "rank ", rank, ": cannot reach rank ", peer, " at ", addr,
                         " within the setup timeout of ", options.timeout.count(),
                         " ms: ", e.what());
            }
          }
          const Hello hello = makeHello(kMagic, rank, peer, size, lane, lanes, heals(sock.fd()), 0);
          try {
            auth::dial(sock.fd(), t->key_, kAuthLabel, bytesOf(hello), deadline,
                       detail::str("rank ", rank, ": rank ", peer, " at ", addr));
          } catch (const auth::AuthenticationError&) {
            throw;
          } catch (const IoError& e) {
            if (deadline.expired() || dynamic_cast<const TimeoutError*>(&e) != nullptr) throw;
            LOOM_LOG_WARNING("rank ", rank, ": the handshake with rank ", peer, " at ", addr,
                             " failed (", e.what(), "); dialling again");
            std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
            continue;
          }
          setupSocket(std::move(sock), peer, lane);
          break;
        }
      }
    }
    // Accept from every higher rank: each connection's handshake runs beside the others' in one
    // poll loop (a connection that says nothing, or a stranger's, holds up no other), and one
    // that fails it (no Loom hello for this rank, or a wrong MAC: a process without the group's
    // key) is logged and dropped while the loop goes on waiting for the real peers.
    const int expected = (size - 1 - rank) * lanes;
    int accepted = 0;
    auth::InboundSet pending(sizeof(Hello), kMaxHandshakes);
    net::setNonBlocking(listener.fd(), true);
    auto missingRanks = [&] {
      std::string missing;
      for (int peer = rank + 1; peer < size; ++peer) {
        bool all = true;
        for (int lane = 0; lane < lanes; ++lane) all = all && t->conns_[peer * lanes + lane];
        if (!all) missing += detail::str(missing.empty() ? "" : ", ", peer);
      }
      return missing;
    };
    auto checkOpening = [&](std::span<const uint8_t> bytes) -> std::string {
      Hello h;
      std::memcpy(&h, bytes.data(), sizeof(h));
      if (h.magic != kMagic || h.version != kHelloVersion) {
        return "not the hello of a Loom tcp transport of this version";
      }
      if (h.to != rank) return detail::str("its hello is addressed to rank ", h.to);
      return {};
    };
    Clock::time_point nextWatch = Clock::now();
    while (accepted < expected) {
      if (Clock::now() >= nextWatch) {
        checkPeerSetup();
        nextWatch = Clock::now() + milliseconds(250);
      }
      if (deadline.expired()) {
        const std::string acceptFailure = pending.acceptFailure();
        LOOM_THROW(TimeoutError, "rank ", rank, ": tcp transport setup timed out after ",
                   deadline.elapsed().count(), " ms waiting for rank(s) ", missingRanks(),
                   " to connect to ", net::formatHostPort(host, port),
                   acceptFailure.empty() ? "" : " (", acceptFailure,
                   acceptFailure.empty() ? "" : ")");
      }
      // Out of descriptors past the grace: nothing here will free one, and waiting out the whole
      // setup timeout only hides the cause from the ranks that wait for this one.
      if (pending.outOfDescriptorsFor() >= kOutOfDescriptorsGrace) {
        LOOM_THROW(IoError, "rank ", rank, ": tcp transport setup cannot take the connections of ",
                   "rank(s) ", missingRanks(), ": ", pending.acceptFailure(),
                   "; raise the limit (ulimit -n) or use fewer descriptors in this process");
      }
      Clock::time_point wake = deadline.end();
      std::vector<pollfd> fds{pending.listenerPollFd(listener.fd(), wake)};
      pending.addPollFds(fds, wake);
      // At most one watch interval, so that another rank's failure stops this wait within it.
      const auto waitMs = std::chrono::ceil<milliseconds>(wake - Clock::now()).count();
      const int ready =
          ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(waitMs, 0, 250)));
      LOOM_CHECK_T(IoError, ready >= 0 || errno == EINTR, "rank ", rank,
                   ": poll during tcp setup: ", detail::errnoText(errno));
      std::vector<auth::InboundSet::Accepted> done;
      std::vector<auth::InboundSet::Refused> refused;
      pending.advance(fds, 1, t->key_, kAuthLabel, checkOpening, done, refused);
      for (const auto& r : refused) {
        LOOM_LOG_WARNING("rank ", rank, ": tcp setup dropped a connection from ", r.address, ": ",
                         r.why, "; still waiting for rank(s) ", missingRanks());
      }
      for (auto& a : done) {
        Hello hello;
        std::memcpy(&hello, a.opening.data(), sizeof(hello));
        net::Socket sock = std::move(a.socket);
        // An authenticated peer: what it says now is a configuration to agree on.
        LOOM_CHECK_T(IoError, hello.size == size, "rank ", rank, ": peer rank ", hello.rank,
                     " has world size ", hello.size, " but this rank has ", size);
        LOOM_CHECK_T(IoError, hello.lanes == lanes, "rank ", rank, ": rank ", hello.rank, " opens ",
                     hello.lanes, " connections per peer but this rank ", lanes,
                     " (LOOM_TCP_SOCKETS / ContextOptions::tcpSockets must be equal on all ranks)");
        LOOM_CHECK_T(IoError, hello.heals == (heals(sock.fd()) ? 1 : 0), "rank ", rank, ": rank ",
                     hello.rank, (hello.heals ? " heals" : " does not heal"),
                     " its connections to this rank but this rank",
                     (hello.heals ? " does not" : " does"),
                     " (LOOM_TCP_RECONNECT_MS, zero or not, and LOOM_TCP_HEAL_LOCAL must agree on "
                     "all ranks)");
        LOOM_CHECK_T(IoError,
                     hello.rank > rank && hello.rank < size && hello.lane >= 0 &&
                         hello.lane < lanes && !t->conns_[hello.rank * lanes + hello.lane],
                     "rank ", rank, ": unexpected or duplicate connection from rank ", hello.rank,
                     " (lane ", hello.lane, ")");
        setupSocket(std::move(sock), hello.rank, hello.lane);
        ++accepted;
      }
      if (fds[0].revents & POLLIN) {
        std::vector<std::string> dropped;
        // A failed accept (out of descriptors): the connection stays queued, the listener backs
        // off, and the failure is logged once and named if the setup times out.
        if (pending.acceptAll(listener.fd(),
                              std::min(Clock::now() + kHandshakeTimeout, deadline.end()),
                              dropped) != 0) {
          LOOM_LOG_WARNING("rank ", rank, ": tcp setup: ", pending.acceptFailure(),
                           "; still waiting for rank(s) ", missingRanks());
        }
        for (const std::string& address : dropped) {
          LOOM_LOG_WARNING("rank ", rank, ": tcp setup dropped a connection from ", address, ": ",
                           kMaxHandshakes,
                           " handshakes were in progress (a flood of connections?)");
        }
      }
    }
    if (anyHeals) {
      // The listener stays open for replacement connections, and every rank's address is known
      // (the accepting side of a lost connection checks that the dialler still listens).
      net::setNonBlocking(listener.fd(), true);
      t->listener_ = std::move(listener);
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r) keys.push_back(detail::str(options.keyPrefix, "/addr/", r));
      waitWatching(keys);
      for (const Bytes& addr : store.multiGet(keys)) {
        t->peerAddrs_.emplace_back(addr.begin(), addr.end());
      }
    }
    t->start();
    return t;
  } catch (const std::exception& e) {
    // First failure wins: a rank stopped by another's failure republishes nothing.
    publishSetupFailure(store, failedKey, e);
    throw;
  }
}

void TcpTransport::start() {
  epollFd_ = LOOM_SYSCHECK(::epoll_create1(EPOLL_CLOEXEC), "epoll_create1");
  wakeFd_ = LOOM_SYSCHECK(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), "eventfd");
  notifyFd_ = LOOM_SYSCHECK(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  LOOM_SYSCHECK(::epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev), "epoll_ctl(eventfd)");
  for (auto& p : conns_) {
    if (!p) continue;
    epoll_event pev{};
    pev.events = EPOLLIN;
    pev.data.u64 = static_cast<uint64_t>(p->index);
    LOOM_SYSCHECK(::epoll_ctl(epollFd_, EPOLL_CTL_ADD, p->sock.fd(), &pev), "epoll_ctl(add)");
    p->inEpoll = true;
  }
  progress_ = std::thread([this] { progressLoop(); });
  if (listener_.valid()) {
    healWakeFd_ = LOOM_SYSCHECK(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), "eventfd");
    healer_ = std::thread([this] { healLoop(); });
  }
}

TcpTransport::~TcpTransport() {
  if (healer_.joinable()) {
    // A connection still healing may owe a peer the end of its last operation (this rank's
    // sends finished into a socket that broke): let it heal and flush, within the bound.
    const Deadline deadline(reconnect_);
    auto settled = [&] {
      for (auto& p : conns_) {
        if (!p) continue;
        if (p->reconnecting.load()) return false;
        std::lock_guard<std::mutex> lock(p->sendMu);
        if (!p->replay.empty()) return false;
      }
      return true;
    };
    while (!failed() && !deadline.expired() && !settled()) {
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
  LOOM_NOISE();  // a connection may be lost after it looked settled
  // Stop the progress thread first: from now on nothing reads, so a peer closing at the same
  // time (its goodbye unread here, or a reset) cannot turn into a failure broadcast to peers
  // that are still running their last collective.
  stop_.store(true);
  if (wakeFd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wakeFd_, &one, sizeof(one));
  }
  if (progress_.joinable()) progress_.join();
  stopHealer();
  LOOM_NOISE();  // peers may finish, say goodbye and close first
  if (!failed()) {
    // Say goodbye so that peers take our EOF as a clean close, not a crash.
    for (auto& p : conns_) {
      if (!p) continue;
      std::lock_guard<std::mutex> lock(p->sendMu);
      if (!p->sendQueue.empty() || p->sendClosed || p->reconnecting.load() || !p->replay.empty()) {
        continue;
      }
      const Header bye{kMagic, kGoodbye, 0, 0, 0, 0};
      try {
        net::writeFull(p->sock.fd(), &bye, sizeof(bye), Deadline(milliseconds(1000)), p->addr);
      } catch (const std::exception&) {
        // The peer is gone already; nothing to tell it.
      }
    }
  }
  if (epollFd_ >= 0) ::close(epollFd_);
  if (wakeFd_ >= 0) ::close(wakeFd_);
  if (notifyFd_ >= 0) ::close(notifyFd_);
  if (healWakeFd_ >= 0) ::close(healWakeFd_);
}

}  // namespace loom::comm::tcp
