// TcpTransport setup and teardown: listen, publish the address in the Store, connect the
// full mesh (lower ranks accept, higher ranks connect and say hello), start the progress
// thread; the destructor stops it and says goodbye to every peer.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"
#include "tag.h"
#include "tcp/peer.h"
#include "tcp/tcp_transport.h"

namespace loom::comm::tcp {

TcpTransport::TcpTransport(int rank, int size) : rank_(rank), size_(size) {}

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
  const int lanes = t->lanes_;
  t->conns_.resize(static_cast<size_t>(size) * lanes);
  if (size == 1) {
    t->start();
    return t;
  }
  const Deadline deadline(options.timeout);
  std::string host = options.host;
  const char* hostFrom = "ContextOptions::host or LOOM_HOST";
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
    LOOM_LOG_WARNING("rank ", rank, ": cannot listen on ", host, " (the hostname; ", e.what(),
                     "); using 127.0.0.1, which only peers on this host can reach (set LOOM_HOST)");
    host = "127.0.0.1";
    listener = net::listenOn(host, 0);
  }
  const int port = net::localPort(listener.fd());
  store.set(detail::str(options.keyPrefix, "/addr/", rank), net::formatHostPort(host, port));

  auto setupSocket = [&](net::Socket sock, int peer, int lane) {
    const int index = peer * lanes + lane;
    auto p = std::make_unique<Peer>(rank, peer, lane, index);
    net::setNoDelay(sock.fd());
    if (bufferBytes > 0) net::setBufferSizes(sock.fd(), bufferBytes);
    net::setNonBlocking(sock.fd(), true);
    p->addr = net::peerAddressOf(sock.fd());
    p->sock = std::move(sock);
    t->conns_[index] = std::move(p);
  };

  // Connect to every lower rank (their listen backlog takes us before they accept).
  for (int peer = 0; peer < rank; ++peer) {
    const std::string key = detail::str(options.keyPrefix, "/addr/", peer);
    store.wait({key}, deadline.remaining());
    const std::string addr = store.getString(key);
    const auto colon = addr.rfind(':');
    LOOM_CHECK(colon != std::string::npos, "bad address '", addr, "' under store key ", key);
    std::string peerHost = addr.substr(0, colon);
    if (peerHost.size() >= 2 && peerHost.front() == '[') {
      peerHost = peerHost.substr(1, peerHost.size() - 2);
    }
    const int peerPort = std::stoi(addr.substr(colon + 1));
    for (int lane = 0; lane < lanes; ++lane) {
      net::Socket sock = net::connectTo(peerHost, peerPort, deadline.remaining());
      const Hello hello{kMagic, kHelloVersion, rank, size, lane, lanes};
      net::writeFull(sock.fd(), &hello, sizeof(hello), deadline,
                     detail::str("rank ", peer, " at ", addr));
      setupSocket(std::move(sock), peer, lane);
    }
  }
  // Accept from every higher rank; the hello says who it is.
  for (int accepted = 0; accepted < (size - 1 - rank) * lanes; ++accepted) {
    net::Socket sock = net::acceptWithDeadline(listener.fd(), deadline);
    if (!sock.valid()) {
      std::string missing;
      for (int peer = rank + 1; peer < size; ++peer) {
        bool all = true;
        for (int lane = 0; lane < lanes; ++lane) all = all && t->conns_[peer * lanes + lane];
        if (!all) missing += detail::str(missing.empty() ? "" : ", ", peer);
      }
      LOOM_THROW(TimeoutError, "rank ", rank, ": tcp transport setup timed out after ",
                 deadline.elapsed().count(), " ms waiting for rank(s) ", missing, " to connect to ",
                 net::formatHostPort(host, port));
    }
    Hello hello{};
    net::readFull(sock.fd(), &hello, sizeof(hello), deadline,
                  detail::str("connecting peer ", net::peerAddressOf(sock.fd())));
    LOOM_CHECK_T(IoError, hello.magic == kMagic && hello.version == kHelloVersion, "rank ", rank,
                 ": unexpected hello from ", net::peerAddressOf(sock.fd()),
                 " (not a Loom tcp transport of the same version)");
    LOOM_CHECK_T(IoError, hello.size == size, "rank ", rank, ": peer rank ", hello.rank,
                 " has world size ", hello.size, " but this rank has ", size);
    LOOM_CHECK_T(IoError, hello.lanes == lanes, "rank ", rank, ": rank ", hello.rank, " opens ",
                 hello.lanes, " connections per peer but this rank ", lanes,
                 " (LOOM_TCP_SOCKETS / ContextOptions::tcpSockets must be equal on all ranks)");
    LOOM_CHECK_T(IoError,
                 hello.rank > rank && hello.rank < size && hello.lane >= 0 && hello.lane < lanes &&
                     !t->conns_[hello.rank * lanes + hello.lane],
                 "rank ", rank, ": unexpected or duplicate connection from rank ", hello.rank,
                 " (lane ", hello.lane, ")");
    setupSocket(std::move(sock), hello.rank, hello.lane);
  }
  t->start();
  return t;
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
}

TcpTransport::~TcpTransport() {
  // Stop the progress thread first: from now on nothing reads, so a peer closing at the same
  // time (its goodbye unread here, or a reset) cannot turn into a failure broadcast to peers
  // that are still running their last collective.
  stop_.store(true);
  if (wakeFd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wakeFd_, &one, sizeof(one));
  }
  if (progress_.joinable()) progress_.join();
  if (!failed()) {
    // Say goodbye so that peers take our EOF as a clean close, not a crash.
    for (auto& p : conns_) {
      if (!p) continue;
      std::lock_guard<std::mutex> lock(p->sendMu);
      if (!p->sendQueue.empty() || p->sendClosed) continue;
      const Header bye{kMagic, kGoodbye, 0, 0, 0};
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
}

}  // namespace loom::comm::tcp
