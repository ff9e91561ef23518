// TcpTransport's data path: isend/irecv, the per-peer send queue and reader state machine
// (headers, payloads into posted receives, unexpected and stalled messages), and failure.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "tag.h"
#include "tcp/peer.h"
#include "tcp/tcp_transport.h"
#include "tcp/tsan_wire.h"

namespace loom::comm::tcp {

void TcpTransport::checkPeer(int peer) const {
  LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, "rank ", rank_, ": peer ", peer,
             " is not another rank of this world of size ", size_);
}

std::shared_ptr<TcpRequest> TcpTransport::failedRequest(int peer, bool send, const void* data,
                                                        size_t bytes, uint64_t tag) {
  auto req = std::make_shared<TcpRequest>(this, peer, send, data, bytes, tag);
  std::lock_guard<std::mutex> lock(failMu_);
  req->fail(failure_,
            failureInvalid_ ? RequestCore::Failure::kInvalidArgument : RequestCore::Failure::kIo);
  return req;
}

std::pair<size_t, size_t> TcpTransport::stripePart(size_t bytes, int lane) const {
  const size_t part = (bytes / lanes_ + 63) & ~size_t{63};
  const size_t begin = std::min(bytes, part * lane);
  const size_t end = lane + 1 == lanes_ ? bytes : std::min(bytes, begin + part);
  return {begin, end - begin};
}

RequestPtr TcpTransport::isend(int peer, const void* data, size_t bytes, uint64_t tag) {
  checkPeer(peer);
  if (failed()) return failedRequest(peer, true, data, bytes, tag);
  if (lanes_ == 1 || bytes < stripeBytes_) return sendOn(conn(peer, 0), data, bytes, tag);
  std::vector<std::shared_ptr<TcpRequest>> parts;
  for (int lane = 0; lane < lanes_; ++lane) {
    const auto [begin, n] = stripePart(bytes, lane);
    parts.push_back(
        sendOn(conn(peer, lane), static_cast<const uint8_t*>(data) + begin, n, tag | kStripedTag));
  }
  return std::make_shared<StripedRequest>(peer, true, bytes, tag, std::move(parts));
}

RequestPtr TcpTransport::irecv(int peer, void* data, size_t bytes, uint64_t tag) {
  checkPeer(peer);
  if (failed()) return failedRequest(peer, false, data, bytes, tag);
  if (lanes_ == 1 || bytes < stripeBytes_) return recvOn(conn(peer, 0), data, bytes, tag);
  std::vector<std::shared_ptr<TcpRequest>> parts;
  for (int lane = 0; lane < lanes_; ++lane) {
    const auto [begin, n] = stripePart(bytes, lane);
    parts.push_back(
        recvOn(conn(peer, lane), static_cast<uint8_t*>(data) + begin, n, tag | kStripedTag));
  }
  return std::make_shared<StripedRequest>(peer, false, bytes, tag, std::move(parts));
}

std::shared_ptr<TcpRequest> TcpTransport::sendOn(Peer& p, const void* data, size_t bytes,
                                                 uint64_t tag) {
  const int peer = p.rank;
  auto req = std::make_shared<TcpRequest>(this, peer, true, data, bytes, tag);
  Fault fault;
  {
    std::lock_guard<std::mutex> lock(p.sendMu);
    if (p.sendClosed) {
      std::lock_guard<std::mutex> flock(failMu_);
      req->fail(
          failure_.empty() ? detail::str("connection to rank ", peer, " (", p.addr, ") is closed")
                           : failure_,
          failureInvalid_ ? RequestCore::Failure::kInvalidArgument : RequestCore::Failure::kIo);
      return req;
    }
    p.sendQueue.push_back(req);
    p.sendPending.store(true);
    if (p.sendQueue.size() == 1) fault = progressSendLocked(p);
    if (!fault && !p.sendQueue.empty() && !p.epollOut) updateEpollLocked(p, true);
  }
  if (fault) onFault(p, fault);
  return req;
}

std::shared_ptr<TcpRequest> TcpTransport::recvOn(Peer& p, void* data, size_t bytes, uint64_t tag) {
  const int peer = p.rank;
  auto tcpReq = std::make_shared<TcpRequest>(this, peer, false, data, bytes, tag);
  // As the matcher's pointer type: passing it on costs no reference-count round trip.
  std::shared_ptr<RequestCore> req = tcpReq;
  std::string error;
  bool invalid = false;
  Fault fault;
  {
    std::lock_guard<std::mutex> lock(p.recvMu);
    switch (p.matcher.receive(req, error)) {
      case TagMatcher::Match::kDone:
        return tcpReq;
      case TagMatcher::Match::kArriving: {
        const TagMatcher::Incoming& in = p.matcher.incoming();
        p.target = in.target + in.got;
        if (!p.stalled) return tcpReq;
        // It was stalled in the socket: read it straight into the receive now.
        resumeLocked(p);
        fault = progressRecvLocked(p);
        if (!fault) return tcpReq;
        break;
      }
      case TagMatcher::Match::kError:
        invalid = true;  // a mismatch: the callers' mistake
        break;
      case TagMatcher::Match::kNone:
        if (p.stalled) {
          // Another message is wanted first: buffer the stalled one after all.
          if (!p.matcher.bufferIncoming(error)) break;  // fails the transport below
          p.target = p.matcher.incoming().target;
          resumeLocked(p);
        }
        if (!p.closed) {
          p.matcher.post(req);
          return tcpReq;
        }
        error = detail::str("rank ", peer, " (", p.addr, ") closed its connection before sending ",
                            describeTag(tag));
        break;
    }
  }
  if (fault) {
    // A lost connection heals (the receive stays posted) or fails the transport (and it).
    onFault(p, fault);
    return tcpReq;
  }
  fail(error, true, invalid);
  req->fail(error);
  return tcpReq;
}

void TcpTransport::onFault(Peer& p, const Fault& fault) {
  if (fault.lost && p.heals) {
    lose(p, fault.gen, fault.text);
  } else {
    fail(fault.text, true, fault.invalid);
  }
}

void TcpTransport::keepForReplayLocked(Peer& p, const TcpRequest& req) {
  // Bytes a reply overwrote are never replayed (tsan_wire.h).
  [[maybe_unused]] const UnrecordedReplayCopy unrecorded;
  p.ring.append(&req.header_, sizeof(Header));
  p.ring.append(req.data(), req.bytes());
}

// Errors of a connection's socket that a new connection may cure (the peer may live).
static bool connectionLost(int err) {
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ETIMEDOUT:
    case ECONNABORTED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
      return true;
    default:
      return false;
  }
}

void TcpTransport::updateEpollLocked(Peer& p, bool wantOut) {
  p.epollOut = wantOut;
  setEpollMask(p);
}

void TcpTransport::setEpollMask(Peer& p) {
  std::lock_guard<std::mutex> lock(p.epollMu);
  if (!p.inEpoll.load()) return;
  epoll_event ev{};
  ev.events = (p.readPaused.load() ? 0u : static_cast<uint32_t>(EPOLLIN)) |
              (p.sendPending.load() ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.u64 = static_cast<uint64_t>(p.index);
  ::epoll_ctl(epollFd_, EPOLL_CTL_MOD, p.sock.fd(), &ev);
}

Fault TcpTransport::progressSendLocked(Peer& p) {
  if (p.reconnecting.load(std::memory_order_relaxed)) return {};
  // The check after every write for TcpTransport::testResetAfter (one compare when unarmed).
  auto testReset = [&]() -> Fault {
    if (p.testResetAt == 0 || p.sent < p.testResetAt) return {};
    p.testResetAt = --p.testResets > 0 ? p.sent + p.testResetEvery : 0;
    return lostFault(p, detail::str("connection to rank ", p.rank, " (", p.addr,
                                    ") reset by the test hook at byte ", p.sent));
  };
  auto writeError = [&](int err) {
    std::string text = detail::str(
        "sending to rank ", p.rank, " (", p.addr, ") failed: ", detail::errnoText(err),
        err == EPIPE || err == ECONNRESET ? " (the peer process exited, crashed or aborted)" : "");
    return connectionLost(err) ? lostFault(p, std::move(text))
                               : Fault{std::move(text), false, p.gen};
  };
  // After a reconnect: what the peer had not consumed of the messages already finished.
  while (p.replayOffset < p.replay.size()) {
    const size_t n = std::min(p.replay.size() - p.replayOffset, sendStep_);
    iovec iov{p.replay.data() + p.replayOffset, n};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    const ssize_t w = wireSendmsg(p.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
      if (errno == EINTR) continue;
      return writeError(errno);
    }
    p.replayOffset += static_cast<size_t>(w);
    p.sent += static_cast<uint64_t>(w);
    if (p.replayOffset == p.replay.size()) {
      p.replay = {};
      p.replayOffset = 0;
    }
    if (Fault f = testReset()) return f;
  }
  while (!p.sendQueue.empty()) {
    TcpRequest& req = *p.sendQueue.front();
    const size_t bytes = req.bytes();
    uint8_t* const data = req.data();
    const size_t total = sizeof(Header) + bytes;
    iovec iov[2];
    int n = 0;
    if (p.sendOffset < sizeof(Header)) {
      iov[n++] = {reinterpret_cast<uint8_t*>(&req.header_) + p.sendOffset,
                  sizeof(Header) - p.sendOffset};
      if (bytes > 0) iov[n++] = {data, std::min(bytes, sendStep_)};
    } else {
      const size_t off = p.sendOffset - sizeof(Header);
      iov[n++] = {data + off, std::min(bytes - off, sendStep_)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = wireSendmsg(p.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return writeError(errno);
    }
    moved_.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
    p.sendOffset += static_cast<size_t>(w);
    p.sent += static_cast<uint64_t>(w);
    if (p.sendOffset < total) {
      req.setBytesDone(p.sendOffset > sizeof(Header) ? p.sendOffset - sizeof(Header) : 0);
      if (Fault f = testReset()) return f;
      continue;
    }
    auto done = std::move(p.sendQueue.front());
    p.sendQueue.pop_front();
    p.sendOffset = 0;
    // Kept before it completes: the caller may reuse its buffer from then on.
    if (p.heals) keepForReplayLocked(p, *done);
    done->complete();
    if (Fault f = testReset()) return f;
  }
  p.sendPending.store(!p.sendQueue.empty());
  if (p.sendQueue.empty() && p.epollOut) updateEpollLocked(p, false);
  return {};
}

void TcpTransport::onHeaderLocked(Peer& p, std::string& error, bool& invalid) {
  const Header& h = p.header;
  if (h.magic != kMagic) {
    error = detail::str("corrupt stream from rank ", p.rank, " (", p.addr, "): bad magic 0x",
                        std::hex, h.magic);
    return;
  }
  p.target = nullptr;
  p.remaining = h.bytes;
  switch (h.kind) {
    case kGoodbye:
      p.goodbye = true;
      return;
    case kAbort:
      if (h.bytes == 0) {
        error = detail::str("rank ", p.rank, " aborted");
        return;
      }
      if (h.bytes > kMaxAbortText) {
        error = detail::str("corrupt abort message from rank ", p.rank);
        return;
      }
      p.abortText.assign(h.bytes, '\0');
      p.target = reinterpret_cast<uint8_t*>(p.abortText.data());
      p.targetAbort = true;
      p.abortInvalid = h.tag == kAbortInvalid;
      break;
    case kData: {
      if (!p.matcher.arrive(h.tag, h.bytes, Signature{h.signature, h.signatureExtra}, error)) {
        if (!error.empty()) {
          invalid = true;
          return;
        }
        if (h.bytes > kEagerBytes && !p.matcher.waiting()) {
          // Nothing is waiting on this peer: leave the payload in the socket (the matcher
          // holds the message) until the matching receive is posted (irecv resumes reading).
          p.stalled = true;
          p.readingHeader = false;
          p.readPaused.store(true);
          setEpollMask(p);
          return;
        }
        if (!p.matcher.bufferIncoming(error)) return;
      }
      p.target = p.matcher.incoming().target;
      break;
    }
    default:
      error = detail::str("corrupt stream from rank ", p.rank, " (", p.addr,
                          "): unknown message kind ", h.kind);
      return;
  }
  p.readingHeader = false;
  if (p.remaining == 0) onPayloadDoneLocked(p);
}

void TcpTransport::resumeLocked(Peer& p) {
  p.stalled = false;
  p.readPaused.store(false);
  setEpollMask(p);
}

void TcpTransport::onPayloadDoneLocked(Peer& p) {
  p.readingHeader = true;
  p.target = nullptr;
  p.matcher.finishIncoming();
}

Fault TcpTransport::progressRecvLocked(Peer& p) {
  if (p.closed || p.stalled || p.reconnecting.load(std::memory_order_relaxed)) return {};
  size_t budget = kMaxBytesPerPoll;
  std::string error;
  for (;;) {
    while (p.stageBegin < p.stageEnd) {
      const size_t avail = p.stageEnd - p.stageBegin;
      const uint8_t* src = p.stage.get() + p.stageBegin;
      if (p.readingHeader) {
        const size_t take = std::min(sizeof(Header) - p.headerGot, avail);
        std::memcpy(reinterpret_cast<uint8_t*>(&p.header) + p.headerGot, src, take);
        p.stageBegin += take;
        p.headerGot += take;
        if (p.headerGot == sizeof(Header)) {
          p.headerGot = 0;
          bool invalid = false;
          onHeaderLocked(p, error, invalid);
          if (!error.empty()) return Fault{error, false, p.gen, invalid};
          if (p.stalled) return {};  // staged payload bytes stay in the stage
        }
      } else {
        const size_t take = std::min(p.remaining, avail);
        wireReceiving();
        std::memcpy(p.target, src, take);
        p.target += take;
        p.remaining -= take;
        p.stageBegin += take;
        if (!p.targetAbort) p.matcher.arrived(take);
        if (p.remaining == 0) {
          if (p.targetAbort) {
            return Fault{detail::str("rank ", p.rank, " aborted: ", p.abortText), false, p.gen,
                         p.abortInvalid};
          }
          onPayloadDoneLocked(p);
        }
      }
    }
    p.stageBegin = p.stageEnd = 0;
    if (budget == 0) return {};
    // The progress thread leaves the socket to a thread that started driving meanwhile.
    if (!tlsDriving && driving_.load(std::memory_order_relaxed) > 0) return {};
    ssize_t r;
    const bool direct = !p.readingHeader && p.remaining >= kDirectBytes;
    if (direct) {
      wireReceiving();
      r = ::recv(p.sock.fd(), p.target, p.remaining, MSG_DONTWAIT);
    } else {
      r = ::recv(p.sock.fd(), p.stage.get(), kStageBytes, MSG_DONTWAIT);
    }
    if (r > 0) {
      moved_.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
      p.received += static_cast<uint64_t>(r);
      budget -= std::min(budget, static_cast<size_t>(r));
      if (direct) {
        p.target += r;
        p.remaining -= static_cast<size_t>(r);
        if (!p.targetAbort) p.matcher.arrived(static_cast<size_t>(r));
        if (p.remaining == 0) onPayloadDoneLocked(p);
      } else {
        p.stageEnd = static_cast<size_t>(r);
      }
      continue;
    }
    const int err = r < 0 ? errno : 0;
    if (r < 0 && (err == EAGAIN || err == EWOULDBLOCK)) return {};
    if (r < 0 && err == EINTR) continue;
    // A peer that said goodbye left cleanly, whether its close reaches us as an EOF or as a
    // reset: its kernel resets a connection closed with our last bytes unread, or answers bytes
    // that arrive after the close with a reset (a rank that finished its part of a collective
    // this rank disagrees with, and exited). Everything it sent before the goodbye was read
    // above, and may be what names the failure (a mismatch found when the receive is posted):
    // the reset must not fail the transport first.
    if ((r == 0 || connectionLost(err)) && p.goodbye && p.readingHeader && p.headerGot == 0) {
      p.closed = true;
      if (p.inEpoll.exchange(false)) {
        ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, p.sock.fd(), nullptr);
      }
      if (p.matcher.waiting()) {
        return Fault{detail::str("rank ", p.rank, " (", p.addr,
                                 ") closed its connection while this rank still waits for ",
                                 describeTag(p.matcher.waitingTag())),
                     false, p.gen};
      }
      return {};
    }
    if (r == 0) {
      return lostFault(p, detail::str("connection to rank ", p.rank, " (", p.addr,
                                      ") closed by the peer (the process exited, crashed or "
                                      "aborted, or the connection was dropped)"));
    }
    std::string text = detail::str("connection to rank ", p.rank, " (", p.addr,
                                   ") failed: ", detail::errnoText(err));
    if (connectionLost(err)) return lostFault(p, std::move(text));
    return Fault{std::move(text), false, p.gen};
  }
}

void TcpTransport::fail(const std::string& reason, bool notifyPeers, bool invalid) {
  const auto kind = invalid ? RequestCore::Failure::kInvalidArgument : RequestCore::Failure::kIo;
  {
    std::lock_guard<std::mutex> lock(failMu_);
    if (failed_.load()) return;
    failure_ = reason;
    failureInvalid_ = invalid;
    failed_.store(true);
  }
  if (healWakeFd_ >= 0) {
    // The healer stops and closes the listener: peers healing towards this rank fail at once.
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(healWakeFd_, &one, sizeof(one));
  }
  LOOM_LOG_INFO("tcp transport of rank ", rank_, " failed: ", reason);
  for (auto& pp : conns_) {
    if (!pp) continue;
    Peer& p = *pp;
    std::lock_guard<std::mutex> rlock(p.recvMu);
    std::lock_guard<std::mutex> slock(p.sendMu);
    p.matcher.failAll(reason, false, kind);
    p.closed = true;
    // Tell the peer why, when its stream is at a message boundary (best effort).
    if (notifyPeers && p.sendOffset == 0 && p.replay.empty() && !p.sendClosed &&
        !p.reconnecting.load()) {
      const std::string text = reason.substr(0, kMaxAbortText);
      Header h{kMagic, kAbort, invalid ? kAbortInvalid : 0, text.size(), 0, 0};
      iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(text.data()), text.size()}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      [[maybe_unused]] ssize_t w = ::sendmsg(p.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    for (auto& r : p.sendQueue) r->fail(reason, kind);
    p.sendQueue.clear();
    p.sendOffset = 0;
    p.sendClosed = true;
    if (p.inEpoll.exchange(false)) ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, p.sock.fd(), nullptr);
    ::shutdown(p.sock.fd(), SHUT_RDWR);
  }
}

void TcpTransport::abort(const std::string& reason) {
  fail(reason, true);
}

std::string TcpTransport::peerAddress(int peer) const {
  if (peer < 0 || peer >= size_ || !conns_[peer * lanes_]) return "?";
  return conn(peer, 0).addr;
}

std::string TcpTransport::describeUnexpected(int peer) const {
  if (peer < 0 || peer >= size_ || !conns_[peer * lanes_]) return {};
  std::string text;
  for (int lane = 0; lane < lanes_; ++lane) {
    Peer& p = conn(peer, lane);
    std::lock_guard<std::mutex> lock(p.recvMu);
    const std::string more = p.matcher.describeUnexpected();
    if (!more.empty()) text += (text.empty() ? "" : "; ") + more;
  }
  return text;
}

uint64_t TcpTransport::unexpectedBytes() const {
  uint64_t bytes = 0;
  for (const auto& p : conns_) {
    if (p) bytes += p->matcher.bufferedBytes();
  }
  return bytes;
}

// A striped message's first part travels on lane 0, as every unstriped message does.
bool TcpTransport::probe(int peer, uint64_t tag) const {
  if (peer < 0 || peer >= size_ || !conns_[peer * lanes_]) return false;
  Peer& p = conn(peer, 0);
  std::lock_guard<std::mutex> lock(p.recvMu);
  return p.matcher.hasUnexpected(tag);
}

}  // namespace loom::comm::tcp
