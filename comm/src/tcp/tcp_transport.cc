#include "tcp/tcp_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"
#include "tag.h"

namespace loom::comm::tcp {

namespace {

constexpr uint32_t kMagic = 0x4d4f4f4c;  // "LOOM" little-endian
constexpr uint32_t kHelloVersion = 1;
enum Kind : uint32_t { kData = 1, kGoodbye = 2, kAbort = 3 };

struct Header {
  uint32_t magic;
  uint32_t kind;
  uint64_t tag;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 24);

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
};

constexpr size_t kStageBytes = 64 << 10;
constexpr size_t kDirectBytes = 16 << 10;
constexpr size_t kMaxBytesPerPoll = 8 << 20;
constexpr size_t kMaxAbortText = 4096;
// An unexpected message larger than this is left in the socket (flow control holds the
// sender back) until a receive is posted, so that it lands in place instead of in a
// freshly allocated buffer; smaller ones are buffered at once.
constexpr size_t kEagerBytes = 64 << 10;

enum State : uint32_t { kPending = 0, kDone = 1, kFailed = 2 };

Clock::duration spinTime() {
  static const Clock::duration spin = [] {
    const char* env = std::getenv("LOOM_SPIN_US");
    long us = 50;
    if (env != nullptr && *env != '\0') us = std::max(0L, std::strtol(env, nullptr, 10));
    return std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(us));
  }();
  return spin;
}

constexpr size_t kSpinBytes = 64 << 10;  // larger transfers go straight to drive()

thread_local bool tlsDriving = false;  // this thread is inside TcpTransport::drive

}  // namespace

class TcpRequest : public Request {
 public:
  TcpRequest(TcpTransport* transport, int peer, bool send, uint8_t* data, size_t bytes,
             uint64_t tag)
      : transport_(transport), peer_(peer), send_(send), data_(data), bytes_(bytes), tag_(tag) {
    header_ = Header{kMagic, kData, tag, bytes};
  }

  bool test() override {
    const uint32_t s = state_.load(std::memory_order_acquire);
    if (s == kFailed) throw IoError(error_);
    return s == kDone;
  }

  bool wait(const Deadline& deadline) override {
    if (state_.load(std::memory_order_acquire) == kPending && bytes_ <= kSpinBytes) {
      const auto spinEnd = Clock::now() + spinTime();
      do {
        transport_->pollPeer(peer_, send_);
        if (state_.load(std::memory_order_acquire) != kPending) break;
        sched_yield();
      } while (Clock::now() < spinEnd);
    }
    if (state_.load(std::memory_order_acquire) == kPending) {
      sleeping_.store(1);
      const bool done = transport_->drive(
          [this] { return state_.load(std::memory_order_acquire) != kPending; }, deadline.end());
      if (!done) return false;
    }
    return test();
  }

  int peer() const override { return peer_; }
  bool isSend() const override { return send_; }
  size_t bytes() const override { return bytes_; }
  uint64_t tag() const override { return tag_; }
  size_t bytesOutstanding() const override {
    return bytes_ - std::min(bytes_, done_.load(std::memory_order_relaxed));
  }

  void complete() {
    done_.store(bytes_, std::memory_order_relaxed);
    state_.store(kDone);
    if (sleeping_.load() && !tlsDriving) transport_->notifyDriver();
  }
  void failWith(const std::string& message) {
    if (state_.load() != kPending) return;
    error_ = message;
    state_.store(kFailed);
    if (sleeping_.load() && !tlsDriving) transport_->notifyDriver();
  }
  void setDone(size_t n) { done_.store(n, std::memory_order_relaxed); }

  TcpTransport* const transport_;
  const int peer_;
  const bool send_;
  uint8_t* const data_;
  const size_t bytes_;
  const uint64_t tag_;
  Header header_;

 private:
  std::atomic<uint32_t> state_{kPending};
  std::atomic<uint32_t> sleeping_{0};
  std::atomic<size_t> done_{0};
  std::string error_;  // written before state_ becomes kFailed
};

struct Unexpected {
  uint64_t tag = 0;
  size_t bytes = 0;
  std::unique_ptr<uint8_t[]> data;
  bool complete = false;
  std::shared_ptr<TcpRequest> claimedBy;  // a receive posted while the payload streamed in
};

struct Peer {
  int rank = -1;
  net::Socket sock;
  std::string addr;
  std::atomic<bool> inEpoll{false};

  std::mutex sendMu;
  std::deque<std::shared_ptr<TcpRequest>> sendQueue;  // front may be partly written
  size_t sendOffset = 0;                              // of header + payload of the front
  bool epollOut = false;
  bool sendClosed = false;
  std::atomic<bool> sendPending{false};  // sendQueue non-empty (read by drive() unlocked)

  std::mutex recvMu;
  std::deque<std::shared_ptr<TcpRequest>> posted;
  std::deque<std::unique_ptr<Unexpected>> unexpected;
  bool readingHeader = true;
  Header header{};
  size_t headerGot = 0;
  uint8_t* target = nullptr;
  size_t remaining = 0;
  std::shared_ptr<TcpRequest> targetRequest;
  Unexpected* targetUnexpected = nullptr;
  bool targetAbort = false;
  bool stalled = false;  // header read, no receive posted yet, payload left in the socket
  std::atomic<bool> readPaused{false};  // EPOLLIN off while stalled
  std::mutex epollMu;                   // serialises epoll_ctl(MOD) on this socket
  std::string abortText;
  std::unique_ptr<uint8_t[]> stage{new uint8_t[kStageBytes]};
  size_t stageBegin = 0;
  size_t stageEnd = 0;
  bool goodbye = false;  // the peer said goodbye; a later EOF is a clean close
  bool closed = false;   // nothing more will be read
};

TcpTransport::TcpTransport(int rank, int size) : rank_(rank), size_(size) {}

std::unique_ptr<TcpTransport> TcpTransport::create(Store& store, int rank, int size,
                                                   const TcpOptions& options) {
  LOOM_CHECK(size >= 1, "world size must be at least 1, got ", size);
  LOOM_CHECK(rank >= 0 && rank < size, "rank ", rank, " is out of range [0, ", size, ")");
  std::unique_ptr<TcpTransport> t(new TcpTransport(rank, size));
  t->peers_.resize(size);
  if (size == 1) {
    t->start();
    return t;
  }
  const Deadline deadline(options.timeout);
  std::string host = options.host;
  if (host.empty()) {
    const char* env = std::getenv("LOOM_HOST");
    host = env != nullptr && *env != '\0' ? env : net::hostname();
  }
  net::Socket listener;
  try {
    listener = net::listenOn(host, 0);
  } catch (const IoError& e) {
    LOOM_LOG_WARNING("rank ", rank, ": cannot listen on ", host, " (", e.what(),
                     "); using 127.0.0.1");
    host = "127.0.0.1";
    listener = net::listenOn(host, 0);
  }
  const int port = net::localPort(listener.fd());
  store.set(detail::str(options.keyPrefix, "/addr/", rank), net::formatHostPort(host, port));

  auto setupSocket = [&](net::Socket sock, int peer) {
    auto p = std::make_unique<Peer>();
    p->rank = peer;
    net::setNoDelay(sock.fd());
    if (options.bufferBytes > 0) net::setBufferSizes(sock.fd(), options.bufferBytes);
    net::setNonBlocking(sock.fd(), true);
    p->addr = net::peerAddressOf(sock.fd());
    p->sock = std::move(sock);
    t->peers_[peer] = std::move(p);
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
    net::Socket sock = net::connectTo(peerHost, peerPort, deadline.remaining());
    const Hello hello{kMagic, kHelloVersion, rank, size};
    net::writeFull(sock.fd(), &hello, sizeof(hello), deadline,
                   detail::str("rank ", peer, " at ", addr));
    setupSocket(std::move(sock), peer);
  }
  // Accept from every higher rank; the hello says who it is.
  for (int accepted = 0; accepted < size - 1 - rank; ++accepted) {
    net::Socket sock = net::acceptWithDeadline(listener.fd(), deadline);
    if (!sock.valid()) {
      std::string missing;
      for (int peer = rank + 1; peer < size; ++peer) {
        if (!t->peers_[peer]) missing += detail::str(missing.empty() ? "" : ", ", peer);
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
    LOOM_CHECK_T(IoError, hello.rank > rank && hello.rank < size && !t->peers_[hello.rank], "rank ",
                 rank, ": unexpected or duplicate connection from rank ", hello.rank);
    setupSocket(std::move(sock), hello.rank);
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
  ev.data.u64 = static_cast<uint64_t>(size_);  // size_ marks the wake fd
  LOOM_SYSCHECK(::epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev), "epoll_ctl(eventfd)");
  for (auto& p : peers_) {
    if (!p) continue;
    epoll_event pev{};
    pev.events = EPOLLIN;
    pev.data.u64 = static_cast<uint64_t>(p->rank);
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
    for (auto& p : peers_) {
      if (!p) continue;
      std::lock_guard<std::mutex> lock(p->sendMu);
      if (!p->sendQueue.empty() || p->sendClosed) continue;
      const Header bye{kMagic, kGoodbye, 0, 0};
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
    if (error.empty() && p.stalled) {
      if (p.header.tag == tag && p.header.bytes == bytes) {
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
      if (req.bytes_ > 0) iov[n++] = {req.data_, req.bytes_};
    } else {
      const size_t off = p.sendOffset - sizeof(Header);
      iov[n++] = {req.data_ + off, req.bytes_ - off};
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
            tagKind(h.tag) != OpKind::kP2P && tagKind(r->tag_) != OpKind::kP2P) {
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
    ssize_t r;
    const bool direct = !p.readingHeader && p.remaining >= kDirectBytes;
    if (direct) {
      r = ::recv(p.sock.fd(), p.target, p.remaining, MSG_DONTWAIT);
    } else {
      r = ::recv(p.sock.fd(), p.stage.get(), kStageBytes, MSG_DONTWAIT);
    }
    if (r > 0) {
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

void TcpTransport::pollPeer(int peer, bool send) {
  Peer& p = *peers_[peer];
  std::string error;
  if (send) {
    std::unique_lock<std::mutex> lock(p.sendMu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    error = progressSendLocked(p);
  } else {
    std::unique_lock<std::mutex> lock(p.recvMu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    error = progressRecvLocked(p);
  }
  if (!error.empty()) fail(error, true);
}

void TcpTransport::notifyDriver() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(notifyFd_, &one, sizeof(one));
}

template <typename Done>
bool TcpTransport::drive(Done done, Clock::time_point end) {
  driving_.fetch_add(1);
  tlsDriving = true;
  std::vector<pollfd> fds;
  std::vector<int> ranks;
  fds.reserve(peers_.size() + 1);
  ranks.reserve(peers_.size() + 1);
  bool finished = done();
  while (!finished) {
    fds.clear();
    ranks.clear();
    for (auto& p : peers_) {
      if (!p || !p->inEpoll.load()) continue;
      const short events = static_cast<short>((p->readPaused.load() ? 0 : POLLIN) |
                                              (p->sendPending.load() ? POLLOUT : 0));
      if (events == 0) continue;
      fds.push_back({p->sock.fd(), events, 0});
      ranks.push_back(p->rank);
    }
    fds.push_back({notifyFd_, POLLIN, 0});
    ranks.push_back(-1);
    const auto now = Clock::now();
    if (now >= end) break;
    const auto left = std::chrono::duration_cast<milliseconds>(end - now).count() + 1;
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, 1)));
    if (ready > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (ranks[i] < 0) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(notifyFd_, &v, sizeof(v));
          continue;
        }
        Peer& p = *peers_[ranks[i]];
        std::string error;
        if (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) {
          std::lock_guard<std::mutex> lock(p.recvMu);
          error = progressRecvLocked(p);
        }
        if (error.empty() && (fds[i].revents & POLLOUT)) {
          std::lock_guard<std::mutex> lock(p.sendMu);
          error = progressSendLocked(p);
        }
        if (!error.empty()) fail(error, true);
      }
    }
    finished = done();
  }
  tlsDriving = false;
  if (driving_.fetch_sub(1) == 1) {
    const uint64_t one = 1;  // send the progress thread back to epoll
    [[maybe_unused]] ssize_t w = ::write(wakeFd_, &one, sizeof(one));
  }
  return finished || done();
}

void TcpTransport::progressLoop() {
  epoll_event events[64];
  while (!stop_.load()) {
    if (driving_.load() > 0) {
      // A waiting thread drives the sockets; stay out of its way until it is done.
      pollfd pfd{wakeFd_, POLLIN, 0};
      ::poll(&pfd, 1, 100);
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wakeFd_, &v, sizeof(v));
      continue;
    }
    const int n = ::epoll_wait(epollFd_, events, 64, 1000);
    if (driving_.load() > 0) continue;
    for (int i = 0; i < n; ++i) {
      const auto id = static_cast<int>(events[i].data.u64);
      if (id == size_) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wakeFd_, &v, sizeof(v));
        continue;
      }
      Peer& p = *peers_[id];
      std::string error;
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        std::lock_guard<std::mutex> lock(p.recvMu);
        error = progressRecvLocked(p);
      }
      if (error.empty() && (events[i].events & EPOLLOUT)) {
        std::lock_guard<std::mutex> lock(p.sendMu);
        error = progressSendLocked(p);
      }
      if (!error.empty()) fail(error, true);
    }
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
