// Connections that heal: a tcp connection to a live peer that is reset or closed (a middlebox
// drop, a link down for a while, a killed socket) is replaced by a new one, and what the peer
// had not yet read is sent again, instead of failing the transport.
//
// How it works
// - Numbering: each direction of a connection is a stream of bytes numbered from 0. The sender
//   counts what it wrote (Peer::sent), the receiver what it read out of the socket
//   (Peer::received; bytes in the staging buffer count as read: the reader state machine keeps
//   them across the reconnect).
// - Keeping: a finished send is appended to the connection's replay ring (replay_ring.h) before
//   its request completes (after that the caller may reuse the buffer); the message being
//   written is still in its caller's buffer. The ring holds the last sndbuf + rcvbuf bytes of
//   the stream (the most the kernels of both ends can hold unread, tcp_setup.cc), so whatever
//   the peer had not read when the connection broke is in the ring or in the front message.
// - Detect: a read or write error that a new connection may cure (ECONNRESET, EPIPE, EOF without
//   a goodbye, ETIMEDOUT, unreachable) makes the connection *reconnecting* (lose()): it leaves
//   the poll sets, its socket is closed with a reset (so the other end learns at once when the
//   network lets it), sends to it queue up, receives stay posted. Any other error (a corrupt
//   stream, an abort, a mismatch) still fails the transport.
// - Reconnect: the healer thread (one per transport, started when some connection heals) owns
//   the listening socket, which stays open. The side that dialled the connection at setup (the
//   higher rank) dials the peer's listener again with backoff and opens with a resume (a Hello
//   with kResumeMagic: rank, lane, how much of the peer's stream it read); the two run the
//   authentication handshake over it (peer_auth.h, the group's key), then the peer answers with
//   a ResumeReply {how much of the dialler's stream it read}. The healer handshakes accepted
//   connections side by side in its poll loop, each within kAttemptTimeout, and drops (and
//   logs) one that fails: a stranger can neither replace a connection, nor make a rank drop
//   one, nor hold up the healer. The accepting side meanwhile dials the dialler's listener too,
//   but only to ask (a Resume from the lower rank): a refused connection means the process is
//   gone, and a live dialler that had not noticed the loss (it sent nothing since) redials.
// - Resume: each side rewinds its sending to the peer's count (installLocked): the bytes from
//   there to the front message come out of the ring, then the front message is written from
//   the peer's position in it (or from its start). Bytes arrive exactly once and in order, so a
//   message is never delivered twice or torn, and the reader simply continues.
// - Give up: a refused redial or probe (no listener: the process exited or destroyed its
//   transport) fails the transport at once, naming the peer; otherwise it retries until
//   TcpOptions::reconnectMs after the loss, then fails with an IoError saying where the stream
//   stood, how long it tried and why the last attempt failed. An operation's own deadline
//   still ends the operation first when it is shorter.
//
// Thread-safety: lose() and installLocked() take (or hold) Peer::recvMu then Peer::sendMu; the
// healer's per-connection bookkeeping (Peer::lostAt ...) is touched by the healer thread only,
// after lose() published `reconnecting`.
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/schedule_noise.h"
#include "tcp/peer.h"
#include "tcp/tcp_transport.h"

namespace loom::comm::tcp {

namespace {

// How long one redial, probe or handshake may take, and the pause between a connection's
// attempts (doubling from kFirstBackoff).
constexpr milliseconds kAttemptTimeout{2000};
constexpr milliseconds kProbeTimeout{1000};
// How long a probe's handshake may take. The probed dialler's healer answers it from its poll
// loop, so it may be busy in its own redial to this rank, which this rank's healer answers only
// once the probe gave up: the probe must give up well before a redial does (kAttemptTimeout),
// or the two could wait on each other until both time out, again and again.
constexpr milliseconds kProbeHandshake{500};
constexpr milliseconds kFirstBackoff{50};
constexpr milliseconds kMaxBackoff{1000};
// How long the accepting side of a lost connection waits for the dialler's redial before it
// checks the dialler (and asks it to redial).
constexpr milliseconds kFirstProbe{200};

// One connection attempt to "host:port" within `timeout`. An invalid socket when it failed:
// `why` says why, `refused` is true when the host answered that nothing listens there.
net::Socket dialOnce(const std::string& addr, milliseconds timeout, std::string& why,
                     bool& refused) {
  refused = false;
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos) {
    why = detail::str("bad address '", addr, "'");
    return {};
  }
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const std::string port = addr.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &list);
  if (rc != 0) {
    why = detail::str("cannot resolve ", host, ": ", ::gai_strerror(rc));
    return {};
  }
  net::Socket result;
  for (addrinfo* ai = list; ai != nullptr && !result.valid(); ai = ai->ai_next) {
    net::Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      why = detail::errnoText(errno);
      continue;
    }
    net::setNonBlocking(s.fd(), true);
    int err = 0;
    if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd pfd{s.fd(), POLLOUT, 0};
        const int ready = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
        if (ready == 1) {
          socklen_t len = sizeof(err);
          ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    if (err == 0) {
      net::setNonBlocking(s.fd(), false);
      result = std::move(s);
    } else {
      refused = refused || err == ECONNREFUSED;
      why = err == ETIMEDOUT ? detail::str("connect timed out after ", timeout.count(), " ms")
                             : detail::errnoText(err);
    }
  }
  ::freeaddrinfo(list);
  return result;
}

milliseconds backoffFor(int attempts) {
  milliseconds b = kFirstBackoff;
  for (int i = 1; i < attempts && b < kMaxBackoff; ++i) b *= 2;
  return std::min(b, kMaxBackoff);
}

}  // namespace

// After a goodbye the peer meant to close: a reset then is no reason to reconnect.
Fault TcpTransport::lostFault(Peer& p, std::string text) const {
  return Fault{std::move(text), !p.goodbye, p.gen};
}

bool TcpTransport::heals(int peer, int lane) const {
  checkPeer(peer);
  LOOM_CHECK(lane >= 0 && lane < lanes_, "lane ", lane, " is out of range [0, ", lanes_, ")");
  return conn(peer, lane).heals;
}

void TcpTransport::testResetAfter(int peer, int lane, uint64_t bytes, int times) {
  checkPeer(peer);
  LOOM_CHECK(lane >= 0 && lane < lanes_, "lane ", lane, " is out of range [0, ", lanes_, ")");
  LOOM_CHECK(times >= 1, "times is ", times, "; expected at least 1");
  Peer& p = conn(peer, lane);
  std::lock_guard<std::mutex> lock(p.sendMu);
  p.testResetEvery = std::max<uint64_t>(bytes, 1);
  p.testResetAt = p.sent + p.testResetEvery;
  p.testResets = times;
}

void TcpTransport::lose(Peer& p, uint64_t gen, const std::string& why) {
  LOOM_NOISE();  // the healer may install a new connection, or the transport fail, meanwhile
  {
    std::lock_guard<std::mutex> rlock(p.recvMu);
    std::lock_guard<std::mutex> slock(p.sendMu);
    if (failed() || p.gen != gen || p.reconnecting.load() || p.sendClosed || p.closed) return;
    if (p.inEpoll.exchange(false)) ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, p.sock.fd(), nullptr);
    // A reset, not a close: the peer learns at once (when the network lets it) that this
    // connection is gone, and cannot take the end of the stream for a goodbye.
    const linger reset{1, 0};
    ::setsockopt(p.sock.fd(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    p.pollFd.store(-1);
    p.sock.reset();
    p.epollOut = false;
    p.replay = {};
    p.replayOffset = 0;
    p.lostAt = Clock::now();
    // The dialler redials at once; the accepting side first gives it kFirstProbe to do so (it
    // normally has, and a probe racing the redial only costs a second reconnect).
    p.nextTry = p.lostAt + (p.dialer ? milliseconds(0) : kFirstProbe);
    p.lostWhy = why;
    p.lastAttempt = "none yet";
    p.lostSent = p.sent;
    p.lostReceived = p.received;
    p.attempts = 0;
    p.reconnecting.store(true);
  }
  LOOM_LOG_WARNING("rank ", rank_, ": connection ", p.lane, " to rank ", p.rank, " lost (", why,
                   "); re-establishing it for up to ", reconnect_.count(),
                   " ms (LOOM_TCP_RECONNECT_MS)");
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(healWakeFd_, &one, sizeof(one));
}

std::string TcpTransport::installLocked(Peer& p, net::Socket sock, uint64_t peerConsumed) {
  // Where the stream stands: the ring ends where the front message begins.
  const uint64_t frontStart = p.ring.end();
  const uint64_t written = frontStart + p.sendOffset;
  if (peerConsumed > written) {
    return detail::str("rank ", p.rank, " says it read ", peerConsumed, " bytes of connection ",
                       p.lane, " from rank ", rank_, ", but only ", written,
                       " were written (the two ends no longer agree)");
  }
  std::vector<uint8_t> replay;
  size_t sendOffset = 0;
  if (planResend(p.ring, p.sendOffset, peerConsumed, replay, sendOffset) ==
      ResendPlan::kOlderThanRing) {
    return detail::str("rank ", p.rank, " read ", peerConsumed, " bytes of connection ", p.lane,
                       " from rank ", rank_, ", but this rank kept only bytes ", p.ring.begin(),
                       " to ", frontStart, " for a resend (a replay ring of ", p.ring.capacity(),
                       " bytes, sized from the socket buffers); the connection cannot resume");
  }
  const int fd = sock.fd();
  net::setNoDelay(fd);
  if (bufferBytes_ > 0) net::setBufferSizes(fd, bufferBytes_);
  net::setNonBlocking(fd, true);
  // A connection reset at once has no peer address any more: keep the old one for messages.
  if (std::string addr = net::peerAddressOf(fd); addr != "<unknown>") p.addr = std::move(addr);
  p.sock = std::move(sock);
  p.pollFd.store(fd);
  ++p.gen;
  p.replay = std::move(replay);
  p.replayOffset = 0;
  p.sendOffset = sendOffset;
  p.sent = peerConsumed;
  if (!p.sendQueue.empty()) {
    p.sendQueue.front()->setBytesDone(sendOffset > sizeof(Header) ? sendOffset - sizeof(Header)
                                                                  : 0);
  }
  const bool wantOut = !p.sendQueue.empty() || !p.replay.empty();
  p.sendPending.store(wantOut);
  p.epollOut = wantOut;
  epoll_event ev{};
  ev.events = (p.readPaused.load() ? 0u : static_cast<uint32_t>(EPOLLIN)) |
              (wantOut ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.u64 = static_cast<uint64_t>(p.index);
  {
    std::lock_guard<std::mutex> lock(p.epollMu);
    if (::epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return detail::str("epoll_ctl(add) of the new connection to rank ", p.rank,
                         " failed: ", detail::errnoText(errno));
    }
    p.inEpoll.store(true);
  }
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - p.lostAt).count();
  LOOM_LOG_WARNING("rank ", rank_, ": connection ", p.lane, " to rank ", p.rank,
                   " re-established after ", took, " ms (", p.attempts,
                   " attempts); resending from byte ", peerConsumed, " (", written - peerConsumed,
                   " bytes again), receiving from byte ", p.received);
  p.installedAt.store(Clock::now());
  p.reconnecting.store(false);
  reconnects_.fetch_add(1);
  return {};
}

void TcpTransport::healLoop() {
  try {
    while (!stop_.load() && !failed()) {
      auto now = Clock::now();
      int timeout = 1000;
      for (auto& p : conns_) {
        if (!p || !p->reconnecting.load()) continue;
        const auto wait = std::chrono::duration_cast<milliseconds>(p->nextTry - now).count();
        timeout = std::clamp(static_cast<int>(wait), 0, timeout);
      }
      Clock::time_point wake = now + milliseconds(timeout);
      std::vector<pollfd> fds{resuming_.listenerPollFd(listener_.fd(), wake),
                              {healWakeFd_, POLLIN, 0}};
      resuming_.addPollFds(fds, wake);
      timeout = static_cast<int>(
          std::clamp<long long>(std::chrono::ceil<milliseconds>(wake - now).count(), 0, timeout));
      ::poll(fds.data(), fds.size(), timeout);
      if (fds[1].revents & POLLIN) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(healWakeFd_, &v, sizeof(v));
      }
      if (stop_.load() || failed()) break;
      advanceResumes(fds, 2);
      if (failed()) break;
      if (fds[0].revents & POLLIN) acceptResume();
      now = Clock::now();
      for (auto& p : conns_) {
        if (failed()) break;
        if (p && p->reconnecting.load() && now >= p->nextTry) healStep(*p, now);
      }
    }
  } catch (const std::exception& e) {
    fail(detail::str("rank ", rank_, ": healing a lost tcp connection failed: ", e.what()), true);
  }
  // Peers still healing towards this rank are refused from now on: they fail at once.
  listener_.reset();
  resuming_.clear();
}

void TcpTransport::healStep(Peer& p, Clock::time_point now) {
  const auto since = std::chrono::duration_cast<milliseconds>(now - p.lostAt);
  const std::string what =
      detail::str("rank ", rank_, ": the connection to rank ", p.rank, " (connection ", p.lane,
                  ", ", peerAddrs_[p.rank], ") was lost at byte ", p.lostSent, " sent and ",
                  p.lostReceived, " received (", p.lostWhy, ")");
  if (since >= reconnect_) {
    fail(detail::str(what, " and could not be re-established within ", reconnect_.count(),
                     " ms (LOOM_TCP_RECONNECT_MS; ", p.attempts,
                     " attempts, the last: ", p.lastAttempt, ")"),
         true);
    return;
  }
  ++p.attempts;
  const milliseconds left = reconnect_ - since;
  std::string why;
  bool refused = false;
  net::Socket s = dialOnce(
      peerAddrs_[p.rank], std::min(left, p.dialer ? kAttemptTimeout : kProbeTimeout), why, refused);
  if (refused) {
    fail(detail::str(what, " and rank ", p.rank, " is gone: its listener at ", peerAddrs_[p.rank],
                     " refused a new connection (the process exited, or destroyed its transport)"),
         true);
    return;
  }
  p.nextTry = Clock::now() + (p.dialer ? backoffFor(p.attempts) : kProbeTimeout / 2);
  if (!s.valid()) {
    p.lastAttempt = why;
    return;
  }
  uint64_t consumed;
  {
    std::lock_guard<std::mutex> lock(p.recvMu);
    consumed = p.received;
  }
  const Hello hello = makeHello(kResumeMagic, rank_, p.rank, size_, p.lane, lanes_, true, consumed);
  try {
    const Deadline deadline(std::min(left, p.dialer ? kAttemptTimeout : kProbeHandshake));
    auth::dial(s.fd(), key_, kAuthLabel, bytesOf(hello), deadline,
               detail::str("rank ", rank_, ": rank ", p.rank, " at ", peerAddrs_[p.rank]));
    // The accepting side only asked whether the dialler lives (and tells it to redial).
    if (!p.dialer) return;
    LOOM_NOISE();  // the peer may lose, fail or close its end meanwhile
    ResumeReply reply{};
    net::readFull(s.fd(), &reply, sizeof(reply), deadline, peerAddrs_[p.rank]);
    if (reply.magic != kResumeMagic || reply.status != 0) {
      fail(detail::str(what, " and rank ", p.rank, " refused to resume it (status ", reply.status,
                       ")"),
           true);
      return;
    }
    std::string error;
    LOOM_NOISE();  // a send may queue, or the transport fail, before the new connection is in
    {
      std::lock_guard<std::mutex> rlock(p.recvMu);
      std::lock_guard<std::mutex> slock(p.sendMu);
      if (failed()) return;
      error = installLocked(p, std::move(s), reply.consumed);
    }
    if (!error.empty()) {
      fail(detail::str(what, ": ", error), true);
      return;
    }
    afterInstall(p);
  } catch (const IoError& e) {
    p.lastAttempt = e.what();
  }
}

void TcpTransport::acceptResume() {
  std::vector<std::string> dropped;
  // A failed accept (out of descriptors): the connection stays queued, the listener backs off
  // (healLoop's poll would spin on it), and the failure is logged once per run of failures.
  if (resuming_.acceptAll(listener_.fd(), Clock::now() + kAttemptTimeout, dropped) != 0) {
    LOOM_LOG_WARNING("rank ", rank_,
                     ": a peer's reconnection cannot be taken: ", resuming_.acceptFailure());
  }
  for (const std::string& address : dropped) {
    LOOM_LOG_WARNING("rank ", rank_, ": dropped a connection from ", address, ": ", kMaxHandshakes,
                     " handshakes were in progress (a flood?)");
  }
}

void TcpTransport::advanceResumes(const std::vector<pollfd>& fds, size_t first) {
  auto check = [&](std::span<const uint8_t> bytes) -> std::string {
    Hello h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    if (h.magic != kResumeMagic || h.version != kHelloVersion || h.to != rank_) {
      return "not a Loom tcp transport of this version re-establishing a connection to this rank";
    }
    return {};
  };
  std::vector<auth::InboundSet::Accepted> accepted;
  std::vector<auth::InboundSet::Refused> refused;
  resuming_.advance(fds, first, key_, kAuthLabel, check, accepted, refused);
  for (const auto& r : refused) {
    // A stranger, or a peer whose network failed again (it retries).
    LOOM_LOG_WARNING("rank ", rank_, ": dropped a connection from ", r.address, ": ", r.why);
  }
  std::vector<std::pair<Hello, net::Socket>> done;
  for (auto& a : accepted) {
    Hello h;
    std::memcpy(&h, a.opening.data(), sizeof(h));
    done.emplace_back(h, std::move(a.socket));
  }
  for (auto& [hello, sock] : done) {
    if (failed()) return;
    resumeAccepted(hello, std::move(sock));
  }
}

void TcpTransport::resumeAccepted(const Hello& hello, net::Socket s) {
  // Authenticated: a peer of this group. What it says must still fit this transport.
  if (!isResumeFor(hello, rank_, size_, lanes_)) {
    LOOM_LOG_WARNING("rank ", rank_, ": ignored a connection from ", net::peerAddressOf(s.fd()),
                     " re-establishing a connection this transport does not have (rank ",
                     hello.rank, ", lane ", hello.lane, ", world size ", hello.size, ")");
    return;
  }
  Peer& p = conn(hello.rank, hello.lane);
  if (!p.heals) return;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(p.sendMu);
    gen = p.gen;
  }
  LOOM_NOISE();  // this rank's own reader may find the old connection lost meanwhile
  if (hello.rank < rank_) {
    // The accepting side lost this connection and asks this rank, its dialler, to redial;
    // unless this rank re-established it just now (the probe was sent before that: the
    // accepting side probes again later if it still lacks the connection).
    const bool fresh = Clock::now() - p.installedAt.load() < kProbeTimeout;
    if (!p.reconnecting.load() && !fresh) {
      lose(p, gen, detail::str("rank ", hello.rank, " lost it and asked for a new one"));
    }
    return;
  }
  // The dialler replaces the connection: this end of the old one is dead too.
  if (!p.reconnecting.load()) {
    lose(p, gen, detail::str("rank ", hello.rank, " lost it and re-established it"));
  }
  if (!p.reconnecting.load()) return;  // failed meanwhile
  ResumeReply reply{kResumeMagic, 0, 0};
  {
    std::lock_guard<std::mutex> lock(p.recvMu);
    reply.consumed = p.received;
  }
  try {
    net::writeFull(s.fd(), &reply, sizeof(reply), Deadline(kAttemptTimeout),
                   detail::str("rank ", hello.rank));
  } catch (const IoError&) {
    return;  // the dialler tries again
  }
  ++p.attempts;
  std::string error;
  LOOM_NOISE();  // the dialler may give up on this attempt and redial meanwhile
  {
    std::lock_guard<std::mutex> rlock(p.recvMu);
    std::lock_guard<std::mutex> slock(p.sendMu);
    if (failed()) return;
    error = installLocked(p, std::move(s), hello.consumed);
  }
  if (!error.empty()) {
    fail(detail::str("rank ", rank_, ": resuming the connection to rank ", p.rank, ": ", error),
         true);
    return;
  }
  afterInstall(p);
}

void TcpTransport::afterInstall(Peer& p) {
  // What the reader kept across the reconnect (staged bytes) and what arrived already are read
  // now: no wake-up may come for them. Then waiters rebuild their poll sets.
  Fault fault;
  {
    std::lock_guard<std::mutex> lock(p.recvMu);
    fault = progressRecvLocked(p);
  }
  if (fault) onFault(p, fault);
  notifyDriver();
}

void TcpTransport::stopHealer() {
  if (!healer_.joinable()) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(healWakeFd_, &one, sizeof(one));
  healer_.join();
}

}  // namespace loom::comm::tcp
