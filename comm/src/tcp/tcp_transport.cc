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

namespace loom::comm::tcp {

void TcpTransport::checkPeer(int peer) const {
  LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, "rank ", rank_, ": peer ", peer,
             " is not another rank of this world of size ", size_);
}

std::shared_ptr<TcpRequest> TcpTransport::failedRequest(int peer, bool send, const void* data,
                                                        size_t bytes, uint64_t tag) {
  auto req = std::make_shared<TcpRequest>(
      this, peer, send, static_cast<uint8_t*>(const_cast<void*>(data)), bytes, tag);
  std::lock_guard<std::mutex> lock(failMu_);
  req->failWith(failure_);
  return req;
}

RequestPtr TcpTransport::isend(int peer, const void* data, size_t bytes, uint64_t tag) {
  checkPeer(peer);
  if (failed()) return failedRequest(peer, true, data, bytes, tag);
  auto req = std::make_shared<TcpRequest>(
      this, peer, true, static_cast<uint8_t*>(const_cast<void*>(data)), bytes, tag);
  Peer& p = *peers_[peer];
  std::string error;
  {
    std::lock_guard<std::mutex> lock(p.sendMu);
    if (p.sendClosed) {
      std::lock_guard<std::mutex> flock(failMu_);
      req->failWith(failure_.empty()
                        ? detail::str("connection to rank ", peer, " (", p.addr, ") is closed")
                        : failure_);
      return req;
    }
    p.sendQueue.push_back(req);
    p.sendPending.store(true);
    if (p.sendQueue.size() == 1) error = progressSendLocked(p);
    if (error.empty() && !p.sendQueue.empty() && !p.epollOut) updateEpollLocked(p, true);
  }
  if (!error.empty()) fail(error, true);
  return req;
}

RequestPtr TcpTransport::irecv(int peer, void* data, size_t bytes, uint64_t tag) {
  checkPeer(peer);
  if (failed()) return failedRequest(peer, false, data, bytes, tag);
  auto req =
      std::make_shared<TcpRequest>(this, peer, false, static_cast<uint8_t*>(data), bytes, tag);
  Peer& p = *peers_[peer];
  std::string error;
  {
    std::lock_guard<std::mutex> lock(p.recvMu);
    for (auto it = p.unexpected.begin(); it != p.unexpected.end(); ++it) {
      Unexpected& u = **it;
      if (u.tag != tag || u.claimedBy) continue;
      if (u.bytes != bytes) {
        error = detail::str("rank ", peer, " sent ", u.bytes, " bytes for ", describeTag(tag),
                            " but this rank receives ", bytes,
                            " bytes (ranks called the collective with different counts or "
                            "dtypes)");
        break;
      }
      if (u.complete) {
        if (bytes > 0) std::memcpy(data, u.data.get(), bytes);
        p.unexpected.erase(it);
        req->complete();
      } else {
        u.claimedBy = req;
      }
      return req;
    }
    if (error.empty() && p.stalled && p.header.tag == tag && p.header.bytes != bytes) {
      error = detail::str("rank ", peer, " sent ", p.header.bytes, " bytes for ", describeTag(tag),
                          " but this rank receives ", bytes,
                          " bytes (ranks called the collective with different counts or dtypes)");
    }
    if (error.empty() && p.stalled) {
      if (p.header.tag == tag) {
        p.targetRequest = req;
        p.target = req->data_;
        resumeLocked(p);
        error = progressRecvLocked(p);
        if (error.empty()) return req;
      } else {
        // Another message is wanted first: buffer the stalled one after all.
        bufferUnexpectedLocked(p);
        resumeLocked(p);
      }
    }
    if (error.empty()) {
      // A message of the same sequence number but another collective already arrived: the
      // ranks disagree about what they are running.
      for (const auto& u : p.unexpected) {
        if (tagKind(u->tag) != tagKind(tag) && tagSeq(u->tag) == tagSeq(tag) && tagSeq(tag) != 0 &&
            !isPointToPointTag(u->tag) && !isPointToPointTag(tag)) {
          error = detail::str("mismatched collectives: rank ", peer, " sent ", describeTag(u->tag),
                              " while this rank runs ", describeTag(tag));
          break;
        }
      }
    }
    if (error.empty()) {
      if (p.closed) {
        error = detail::str("rank ", peer, " (", p.addr, ") closed its connection before sending ",
                            describeTag(tag));
      } else {
        p.posted.push_back(req);
        return req;
      }
    }
  }
  fail(error, true);
  req->failWith(error);
  return req;
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
  ev.data.u64 = static_cast<uint64_t>(p.rank);
  ::epoll_ctl(epollFd_, EPOLL_CTL_MOD, p.sock.fd(), &ev);
}

std::string TcpTransport::progressSendLocked(Peer& p) {
  while (!p.sendQueue.empty()) {
    TcpRequest& req = *p.sendQueue.front();
    const size_t total = sizeof(Header) + req.bytes_;
    iovec iov[2];
    int n = 0;
    if (p.sendOffset < sizeof(Header)) {
      iov[n++] = {reinterpret_cast<uint8_t*>(&req.header_) + p.sendOffset,
                  sizeof(Header) - p.sendOffset};
      if (req.bytes_ > 0) iov[n++] = {req.data_, std::min(req.bytes_, sendStep_)};
    } else {
      const size_t off = p.sendOffset - sizeof(Header);
      iov[n++] = {req.data_ + off, std::min(req.bytes_ - off, sendStep_)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = ::sendmsg(p.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      const int err = errno;
      return detail::str(
          "sending to rank ", p.rank, " (", p.addr, ") failed: ", detail::errnoText(err),
          err == EPIPE || err == ECONNRESET ? " (the peer process exited, crashed or aborted)"
                                            : "");
    }
    moved_.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
    p.sendOffset += static_cast<size_t>(w);
    if (p.sendOffset < total) {
      req.setDone(p.sendOffset > sizeof(Header) ? p.sendOffset - sizeof(Header) : 0);
      continue;
    }
    auto done = std::move(p.sendQueue.front());
    p.sendQueue.pop_front();
    p.sendOffset = 0;
    done->complete();
  }
  p.sendPending.store(!p.sendQueue.empty());
  if (p.sendQueue.empty() && p.epollOut) updateEpollLocked(p, false);
  return {};
}

void TcpTransport::onHeaderLocked(Peer& p, std::string& error) {
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
      break;
    case kData: {
      auto it = std::find_if(p.posted.begin(), p.posted.end(),
                             [&](const auto& r) { return r->tag_ == h.tag; });
      if (it != p.posted.end()) {
        if ((*it)->bytes_ != h.bytes) {
          error = detail::str("rank ", p.rank, " sent ", h.bytes, " bytes for ", describeTag(h.tag),
                              " but this rank receives ", (*it)->bytes_,
                              " bytes (ranks called the collective with different counts or "
                              "dtypes)");
          return;
        }
        p.targetRequest = std::move(*it);
        p.posted.erase(it);
        p.target = p.targetRequest->data_;
        break;
      }
      // Same sequence number and step but another collective: the ranks disagree.
      for (const auto& r : p.posted) {
        if (tagKind(r->tag_) != tagKind(h.tag) && tagSeq(r->tag_) == tagSeq(h.tag) &&
            tagSeq(h.tag) != 0 && !isPointToPointTag(h.tag) && !isPointToPointTag(r->tag_)) {
          error = detail::str("mismatched collectives: rank ", p.rank, " sent ", describeTag(h.tag),
                              " while this rank runs ", describeTag(r->tag_));
          return;
        }
      }
      if (h.bytes > kEagerBytes && p.posted.empty()) {
        // Nothing is waiting on this peer: leave the payload in the socket until the
        // matching receive is posted (irecv resumes reading).
        p.stalled = true;
        p.readingHeader = false;
        p.readPaused.store(true);
        setEpollMask(p);
        return;
      }
      bufferUnexpectedLocked(p);
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

void TcpTransport::bufferUnexpectedLocked(Peer& p) {
  auto u = std::make_unique<Unexpected>();
  u->tag = p.header.tag;
  u->bytes = p.header.bytes;
  u->data.reset(new uint8_t[std::max<size_t>(u->bytes, 1)]);
  p.target = u->data.get();
  p.targetUnexpected = u.get();
  p.unexpected.push_back(std::move(u));
}

void TcpTransport::resumeLocked(Peer& p) {
  p.stalled = false;
  p.readPaused.store(false);
  setEpollMask(p);
}

void TcpTransport::onPayloadDoneLocked(Peer& p) {
  p.readingHeader = true;
  p.target = nullptr;
  if (p.targetRequest) {
    p.targetRequest->complete();
    p.targetRequest.reset();
  } else if (p.targetUnexpected != nullptr) {
    Unexpected* u = std::exchange(p.targetUnexpected, nullptr);
    u->complete = true;
    if (u->claimedBy) {
      if (u->bytes > 0) std::memcpy(u->claimedBy->data_, u->data.get(), u->bytes);
      auto req = std::move(u->claimedBy);
      auto it = std::find_if(p.unexpected.begin(), p.unexpected.end(),
                             [&](const auto& e) { return e.get() == u; });
      p.unexpected.erase(it);
      req->complete();
    }
  }
}

std::string TcpTransport::progressRecvLocked(Peer& p) {
  if (p.closed || p.stalled) return {};
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
          onHeaderLocked(p, error);
          if (!error.empty()) return error;
          if (p.stalled) return {};  // staged payload bytes stay in the stage
        }
      } else {
        const size_t take = std::min(p.remaining, avail);
        std::memcpy(p.target, src, take);
        p.target += take;
        p.remaining -= take;
        p.stageBegin += take;
        if (p.targetRequest) p.targetRequest->setDone(p.targetRequest->bytes_ - p.remaining);
        if (p.remaining == 0) {
          if (p.targetAbort) {
            return detail::str("rank ", p.rank, " aborted: ", p.abortText);
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
      r = ::recv(p.sock.fd(), p.target, p.remaining, MSG_DONTWAIT);
    } else {
      r = ::recv(p.sock.fd(), p.stage.get(), kStageBytes, MSG_DONTWAIT);
    }
    if (r > 0) {
      moved_.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
      budget -= std::min(budget, static_cast<size_t>(r));
      if (direct) {
        p.target += r;
        p.remaining -= static_cast<size_t>(r);
        if (p.targetRequest) p.targetRequest->setDone(p.targetRequest->bytes_ - p.remaining);
        if (p.remaining == 0) onPayloadDoneLocked(p);
      } else {
        p.stageEnd = static_cast<size_t>(r);
      }
      continue;
    }
    if (r == 0) {
      if (p.goodbye && p.readingHeader && p.headerGot == 0) {
        p.closed = true;
        if (p.inEpoll.exchange(false)) {
          ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, p.sock.fd(), nullptr);
        }
        if (!p.posted.empty()) {
          return detail::str("rank ", p.rank, " (", p.addr,
                             ") closed its connection while this rank still waits for ",
                             describeTag(p.posted.front()->tag_));
        }
        return {};
      }
      return detail::str("connection to rank ", p.rank, " (", p.addr,
                         ") closed by the peer (the process exited, crashed or aborted)");
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    if (errno == EINTR) continue;
    return detail::str("connection to rank ", p.rank, " (", p.addr,
                       ") failed: ", detail::errnoText(errno));
  }
}

void TcpTransport::fail(const std::string& reason, bool notifyPeers) {
  {
    std::lock_guard<std::mutex> lock(failMu_);
    if (failed_.load()) return;
    failure_ = reason;
    failed_.store(true);
  }
  LOOM_LOG_INFO("tcp transport of rank ", rank_, " failed: ", reason);
  for (auto& pp : peers_) {
    if (!pp) continue;
    Peer& p = *pp;
    std::lock_guard<std::mutex> rlock(p.recvMu);
    std::lock_guard<std::mutex> slock(p.sendMu);
    for (auto& r : p.posted) r->failWith(reason);
    p.posted.clear();
    if (p.targetRequest) p.targetRequest->failWith(reason);
    p.targetRequest.reset();
    for (auto& u : p.unexpected) {
      if (u->claimedBy) u->claimedBy->failWith(reason);
      u->claimedBy.reset();
    }
    p.closed = true;
    // Tell the peer why, when its stream is at a message boundary (best effort).
    if (notifyPeers && p.sendOffset == 0 && !p.sendClosed) {
      const std::string text = reason.substr(0, kMaxAbortText);
      Header h{kMagic, kAbort, 0, text.size()};
      iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(text.data()), text.size()}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      [[maybe_unused]] ssize_t w = ::sendmsg(p.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    for (auto& r : p.sendQueue) r->failWith(reason);
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
  if (peer < 0 || peer >= size_ || !peers_[peer]) return "?";
  return peers_[peer]->addr;
}

std::string TcpTransport::describeUnexpected(int peer) const {
  if (peer < 0 || peer >= size_ || !peers_[peer]) return {};
  Peer& p = *peers_[peer];
  std::lock_guard<std::mutex> lock(p.recvMu);
  std::string out;
  if (p.stalled) out = detail::str(describeTag(p.header.tag), " (", p.header.bytes, " bytes)");
  size_t shown = 0;
  for (const auto& u : p.unexpected) {
    if (u->claimedBy) continue;
    if (shown++ == 4) {
      out += ", ...";
      break;
    }
    out += detail::str(out.empty() ? "" : ", ", describeTag(u->tag), " (", u->bytes, " bytes)");
  }
  return out;
}

}  // namespace loom::comm::tcp
