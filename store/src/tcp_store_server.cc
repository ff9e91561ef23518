#include "loom/store/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/socket.h"
#include "loom/store/store_protocol.h"

namespace loom {

using store_protocol::DecodeStatus;
using store_protocol::Message;
using store_protocol::Op;

std::string defaultStoreToken() {
  const char* env = std::getenv("LOOM_STORE_TOKEN");
  return env == nullptr ? std::string() : std::string(env);
}

namespace {

// Bytes of replies a client may leave unread before it is considered stuck and dropped.
constexpr size_t kMaxPendingOutput = size_t{512} << 20;
// Bytes read from one connection per wake-up, so one fast sender cannot starve the others.
constexpr size_t kReadBudget = size_t{1} << 20;

bool constantTimeEqual(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<uint8_t>(a[i]) ^ (i < b.size() ? static_cast<uint8_t>(b[i]) : 0);
  return diff == 0;
}

}  // namespace

class TCPStoreServer::Loop {
 public:
  explicit Loop(const TCPStoreServerOptions& options);
  ~Loop();

  void stop();
  void waitForWorkers(int numWorkers, milliseconds timeout);

  int port_ = 0;
  std::string address_;
  mutable std::mutex joinMu_;
  std::condition_variable joined_;
  std::set<std::string> clientIds_;  // guarded by joinMu_
  std::set<int> ranks_;              // guarded by joinMu_
  bool stopped_ = false;             // guarded by joinMu_
  std::atomic<int> connections_{0};
  std::atomic<int> waiting_{0};

 private:
  struct Conn;
  // A parked get/wait/multiGet. It is listed under one key it still misses (`parkedOn`);
  // when that key appears it is checked again and answered or re-parked on the next missing
  // key, so a waiter costs O(1) per key event.
  struct Waiter {
    Conn* conn;
    uint64_t id;
    Op op;
    std::vector<std::string> keys;
    std::string parkedOn;
  };
  struct Conn {
    net::Socket sock;
    std::string peer;
    std::vector<uint8_t> in;
    std::vector<uint8_t> out;
    size_t outStart = 0;
    bool authed = false;
    bool wantWrite = false;
    // Set instead of closing in the middle of a handler; the loop closes it afterwards.
    bool dead = false;
    bool deadWarn = false;
    std::string deadWhy;
    std::list<std::shared_ptr<Waiter>> waiters;
  };

  void run();
  void accept();
  void onReadable(Conn& conn);
  void onWritable(Conn& conn);
  void close(Conn& conn, const std::string& why, bool warn);
  void markDead(Conn& conn, const std::string& why, bool warn);
  void closeDead();
  void handle(Conn& conn, Message& request);
  void handleHello(Conn& conn, const Message& request);
  void reply(Conn& conn, Message message);
  void replyError(Conn& conn, uint64_t id, const std::string& what);
  void flush(Conn& conn);
  void updateInterest(Conn& conn);
  bool present(const std::vector<std::string>& keys) const;
  void answerWaiter(Waiter& waiter);
  void park(const std::shared_ptr<Waiter>& waiter);
  void unpark(const std::shared_ptr<Waiter>& waiter);
  void keyCreated(const std::string& key);
  void setKey(const std::string& key, Bytes value);
  // The request's shape is wrong for its op: a broken client, not a caller's mistake.
  std::string checkShape(const Message& m) const;

  std::string token_;
  int numWorkers_;
  net::Socket listen_;
  int epoll_ = -1;
  int stopFd_ = -1;
  std::thread thread_;
  std::once_flag stopOnce_;

  // Loop-thread state.
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::list<std::shared_ptr<Waiter>>> parked_;
  std::vector<int> dead_;
  std::vector<std::string> created_;  // keys created by the request being handled
};

TCPStoreServer::Loop::Loop(const TCPStoreServerOptions& options)
    : token_(options.token), numWorkers_(options.numWorkers) {
  LOOM_CHECK_LE(token_.size(), store_protocol::kMaxTokenBytes, "LOOM_STORE_TOKEN is too long");
  listen_ = net::listenOn(options.host, options.port);
  port_ = net::localPort(listen_.fd());
  address_ = net::formatHostPort(options.host, port_);
  net::setNonBlocking(listen_.fd());
  epoll_ = LOOM_SYSCHECK(epoll_create1(EPOLL_CLOEXEC), "epoll_create1 for TCPStore server");
  stopFd_ = LOOM_SYSCHECK(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_.fd();
  LOOM_SYSCHECK(epoll_ctl(epoll_, EPOLL_CTL_ADD, listen_.fd(), &ev), "epoll_ctl");
  ev.data.fd = stopFd_;
  LOOM_SYSCHECK(epoll_ctl(epoll_, EPOLL_CTL_ADD, stopFd_, &ev), "epoll_ctl");
  thread_ = std::thread([this] { run(); });
  LOOM_LOG_INFO("TCPStore server listening on ", address_);
}

TCPStoreServer::Loop::~Loop() {
  stop();
  if (stopFd_ >= 0) ::close(stopFd_);
  if (epoll_ >= 0) ::close(epoll_);
}

void TCPStoreServer::Loop::stop() {
  std::call_once(stopOnce_, [this] {
    {
      std::lock_guard<std::mutex> lock(joinMu_);
      stopped_ = true;
    }
    joined_.notify_all();
    const uint64_t one = 1;
    if (::write(stopFd_, &one, sizeof(one)) < 0) {
      LOOM_LOG_ERROR("TCPStore server ", address_, ": cannot wake the loop to stop");
    }
    if (thread_.joinable()) thread_.join();
  });
}

void TCPStoreServer::Loop::run() {
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      LOOM_LOG_ERROR("TCPStore server ", address_,
                     ": epoll_wait failed: ", detail::errnoText(errno));
      break;
    }
    bool stopping = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stopFd_) {
        stopping = true;
        continue;
      }
      if (fd == listen_.fd()) {
        accept();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;  // closed earlier in this batch
      Conn& conn = *it->second;
      try {
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) onReadable(conn);
        if (conns_.count(fd) != 0 && (events[i].events & EPOLLOUT)) onWritable(conn);
      } catch (const std::exception& e) {
        // Only this client's connection is affected (e.g. its buffer could not be grown).
        markDead(conn, e.what(), true);
      }
      closeDead();
    }
    if (stopping) break;
  }
  while (!conns_.empty()) close(*conns_.begin()->second, "server stopping", false);
}

void TCPStoreServer::Loop::accept() {
  for (;;) {
    const int fd = ::accept4(listen_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // EMFILE and friends: log and keep serving the clients we have.
        LOOM_LOG_WARNING("TCPStore server ", address_,
                         ": accept failed: ", detail::errnoText(errno));
      }
      return;
    }
    auto conn = std::make_unique<Conn>();
    conn->sock = net::Socket(fd);
    conn->peer = net::peerAddressOf(fd);
    try {
      net::setNoDelay(fd);
    } catch (const std::exception&) {
      // Not fatal: replies are still delivered, only later.
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      LOOM_LOG_WARNING("TCPStore server ", address_, ": cannot watch client ", conn->peer, ": ",
                       detail::errnoText(errno));
      continue;
    }
    LOOM_LOG_DEBUG("TCPStore server ", address_, ": client ", conn->peer, " connected");
    conns_.emplace(fd, std::move(conn));
    connections_.fetch_add(1, std::memory_order_relaxed);
  }
}

void TCPStoreServer::Loop::onReadable(Conn& conn) {
  const int fd = conn.sock.fd();
  if (conn.dead) return;
  size_t budget = kReadBudget;
  bool peerClosed = false;
  uint8_t chunk[65536];
  while (budget > 0) {
    const ssize_t r = ::recv(fd, chunk, std::min(sizeof(chunk), budget), 0);
    if (r > 0) {
      conn.in.insert(conn.in.end(), chunk, chunk + r);
      budget -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      peerClosed = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    markDead(conn, "read failed: " + detail::errnoText(errno), false);
    return;
  }
  size_t used = 0;
  while (!conn.dead && used < conn.in.size()) {
    Message request;
    const auto result =
        store_protocol::decode(conn.in.data() + used, conn.in.size() - used, request);
    if (result.status == DecodeStatus::kNeedMore) break;
    if (result.status == DecodeStatus::kError) {
      markDead(conn, result.error, true);
      return;
    }
    used += result.consumed;
    handle(conn, request);
  }
  if (conn.dead) return;
  conn.in.erase(conn.in.begin(), conn.in.begin() + static_cast<std::ptrdiff_t>(used));
  if (peerClosed) {
    if (!conn.in.empty()) {
      markDead(conn,
               detail::str("connection closed in the middle of a frame (", conn.in.size(),
                           " bytes of it received)"),
               true);
    } else {
      markDead(conn, "client disconnected", false);
    }
  }
}

void TCPStoreServer::Loop::onWritable(Conn& conn) {
  flush(conn);
}

void TCPStoreServer::Loop::markDead(Conn& conn, const std::string& why, bool warn) {
  if (conn.dead) return;
  conn.dead = true;
  conn.deadWhy = why;
  conn.deadWarn = warn;
  dead_.push_back(conn.sock.fd());
}

void TCPStoreServer::Loop::closeDead() {
  while (!dead_.empty()) {
    const int fd = dead_.back();
    dead_.pop_back();
    auto it = conns_.find(fd);
    if (it != conns_.end()) close(*it->second, it->second->deadWhy, it->second->deadWarn);
  }
}

void TCPStoreServer::Loop::close(Conn& conn, const std::string& why, bool warn) {
  if (warn) {
    LOOM_LOG_WARNING("TCPStore server ", address_, ": closing connection from ", conn.peer, ": ",
                     why);
  } else {
    LOOM_LOG_DEBUG("TCPStore server ", address_, ": closing connection from ", conn.peer, ": ",
                   why);
  }
  for (auto& waiter : conn.waiters) unpark(waiter);
  waiting_.fetch_sub(static_cast<int>(conn.waiters.size()), std::memory_order_relaxed);
  conn.waiters.clear();
  const int fd = conn.sock.fd();
  epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  conns_.erase(fd);  // destroys conn and closes the socket
  connections_.fetch_sub(1, std::memory_order_relaxed);
}

std::string TCPStoreServer::Loop::checkShape(const Message& m) const {
  auto want = [&](size_t keys, size_t values) -> std::string {
    if (m.keys.size() == keys && m.values.size() == values) return {};
    return detail::str(store_protocol::opName(m.op), " needs ", keys, " key(s) and ", values,
                       " value(s), got ", m.keys.size(), " and ", m.values.size());
  };
  switch (m.op) {
    case Op::kSet:
      return want(1, 1);
    case Op::kGet:
    case Op::kAdd:
    case Op::kDelete:
      return want(1, 0);
    case Op::kCompareSet:
      return want(1, 2);
    case Op::kNumKeys:
    case Op::kCancel:
      return want(0, 0);
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return m.values.empty() ? std::string() : want(m.keys.size(), 0);
    case Op::kMultiSet:
      return m.keys.size() == m.values.size() ? std::string() : want(m.keys.size(), m.keys.size());
    default:
      return detail::str("a client may not send ", store_protocol::opName(m.op));
  }
}

void TCPStoreServer::Loop::handle(Conn& conn, Message& m) {
  if (!conn.authed) {
    handleHello(conn, m);
    return;
  }
  if (m.op == Op::kHello) {
    markDead(conn, "second hello on one connection", true);
    return;
  }
  if (std::string bad = checkShape(m); !bad.empty()) {
    markDead(conn, bad, true);
    return;
  }
  for (const auto& key : m.keys) {
    if (key.empty()) {
      replyError(conn, m.id,
                 detail::str(store_protocol::opName(m.op), ": store keys must be non-empty"));
      return;
    }
  }
  Message r;
  r.op = Op::kOk;
  r.id = m.id;
  switch (m.op) {
    case Op::kSet:
      setKey(m.keys[0], std::move(m.values[0]));
      break;
    case Op::kMultiSet:
      for (size_t i = 0; i < m.keys.size(); ++i) setKey(m.keys[i], std::move(m.values[i]));
      break;
    case Op::kGet:
    case Op::kWait:
    case Op::kMultiGet: {
      auto waiter = std::make_shared<Waiter>(Waiter{&conn, m.id, m.op, std::move(m.keys), {}});
      if (present(waiter->keys)) {
        answerWaiter(*waiter);
      } else {
        conn.waiters.push_back(waiter);
        waiting_.fetch_add(1, std::memory_order_relaxed);
        park(waiter);
      }
      return;
    }
    case Op::kAdd: {
      int64_t current = 0;
      auto it = data_.find(m.keys[0]);
      if (it != data_.end() && !store_protocol::parseInt64(it->second, current)) {
        replyError(conn, m.id,
                   detail::str("add(\"", m.keys[0],
                               "\"): the key holds a value that is not a decimal integer"));
        return;
      }
      int64_t result = 0;
      if (__builtin_add_overflow(current, m.number, &result)) {
        replyError(conn, m.id,
                   detail::str("add(\"", m.keys[0], "\", ", m.number,
                               "): overflows int64 (current ", current, ")"));
        return;
      }
      setKey(m.keys[0], toBytes(std::to_string(result)));
      r.number = result;
      break;
    }
    case Op::kCompareSet: {
      const std::string& key = m.keys[0];
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (m.values[0].empty()) {
          r.values.push_back(m.values[1]);
          setKey(key, std::move(m.values[1]));
        } else {
          r.values.push_back(std::move(m.values[0]));
        }
      } else {
        if (it->second == m.values[0]) it->second = std::move(m.values[1]);
        r.values.push_back(it->second);
      }
      break;
    }
    case Op::kDelete:
      r.number = data_.erase(m.keys[0]) > 0 ? 1 : 0;
      break;
    case Op::kCheck:
      r.number = present(m.keys) ? 1 : 0;
      break;
    case Op::kNumKeys:
      r.number = static_cast<int64_t>(data_.size());
      break;
    case Op::kCancel: {
      const uint64_t target = static_cast<uint64_t>(m.number);
      for (auto it = conn.waiters.begin(); it != conn.waiters.end(); ++it) {
        if ((*it)->id != target) continue;
        auto waiter = *it;
        conn.waiters.erase(it);
        waiting_.fetch_sub(1, std::memory_order_relaxed);
        unpark(waiter);
        replyError(conn, target,
                   detail::str(store_protocol::opName(waiter->op), " cancelled by the client"));
        break;
      }
      break;
    }
    default:
      break;  // checkShape refused everything else
  }
  // The writer hears back before the waiters it wakes: whoever learns of a key from a wait
  // can rely on its writer having been answered.
  reply(conn, std::move(r));
  std::vector<std::string> created = std::move(created_);
  created_.clear();
  for (const auto& key : created) keyCreated(key);
}

void TCPStoreServer::Loop::handleHello(Conn& conn, const Message& m) {
  if (m.op != Op::kHello) {
    markDead(conn, detail::str("sent ", store_protocol::opName(m.op), " before the hello"), true);
    return;
  }
  if (m.keys.size() != 1 || m.values.size() != 1 || m.keys[0].empty()) {
    markDead(conn, "malformed hello (needs a client id and a token)", true);
    return;
  }
  const std::string token(m.values[0].begin(), m.values[0].end());
  if (!constantTimeEqual(token, token_)) {
    // Tell the client why before closing; best effort, the socket is not waited on.
    auto frame = store_protocol::encode(
        Message{Op::kError, m.id, 0, {"authentication failed: wrong LOOM_STORE_TOKEN"}, {}});
    (void)!::send(conn.sock.fd(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    markDead(conn,
             token.empty() ? "no token given (LOOM_STORE_TOKEN is set on the server)"
                           : "wrong token (LOOM_STORE_TOKEN differs)",
             true);
    return;
  }
  conn.authed = true;
  const int rank = static_cast<int>(m.number);
  size_t joinedNow = 0;
  {
    std::lock_guard<std::mutex> lock(joinMu_);
    clientIds_.insert(m.keys[0]);
    joinedNow = clientIds_.size();
    if (m.number >= 0 && m.number <= INT32_MAX) ranks_.insert(rank);
  }
  joined_.notify_all();
  LOOM_LOG_DEBUG("TCPStore server ", address_, ": client ", conn.peer, " joined (rank ", rank, ", ",
                 joinedNow, "/", numWorkers_, ")");
  reply(conn, Message{Op::kOk, m.id, 0, {}, {}});
}

void TCPStoreServer::Loop::reply(Conn& conn, Message message) {
  if (conn.dead) return;
  store_protocol::encode(message, conn.out);
  flush(conn);
}

void TCPStoreServer::Loop::replyError(Conn& conn, uint64_t id, const std::string& what) {
  reply(conn, Message{Op::kError, id, 0, {what.substr(0, store_protocol::kMaxKeyBytes)}, {}});
}

void TCPStoreServer::Loop::flush(Conn& conn) {
  const int fd = conn.sock.fd();
  while (conn.outStart < conn.out.size()) {
    const ssize_t w = ::send(fd, conn.out.data() + conn.outStart, conn.out.size() - conn.outStart,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      conn.outStart += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    markDead(conn, "write failed: " + detail::errnoText(errno), false);
    return;
  }
  if (conn.outStart == conn.out.size()) {
    conn.out.clear();
    conn.outStart = 0;
  } else if (conn.out.size() - conn.outStart > kMaxPendingOutput) {
    markDead(conn,
             detail::str("client does not read its replies (", conn.out.size() - conn.outStart,
                         " bytes pending)"),
             true);
    return;
  }
  updateInterest(conn);
}

void TCPStoreServer::Loop::updateInterest(Conn& conn) {
  const bool want = conn.outStart < conn.out.size();
  if (want == conn.wantWrite) return;
  conn.wantWrite = want;
  epoll_event ev{};
  ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
  ev.data.fd = conn.sock.fd();
  epoll_ctl(epoll_, EPOLL_CTL_MOD, conn.sock.fd(), &ev);
}

bool TCPStoreServer::Loop::present(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (data_.count(key) == 0) return false;
  }
  return true;
}

void TCPStoreServer::Loop::answerWaiter(Waiter& waiter) {
  Message r{Op::kOk, waiter.id, 0, {}, {}};
  if (waiter.op != Op::kWait) {
    for (const auto& key : waiter.keys) r.values.push_back(data_.at(key));
  }
  reply(*waiter.conn, std::move(r));
}

void TCPStoreServer::Loop::park(const std::shared_ptr<Waiter>& waiter) {
  for (const auto& key : waiter->keys) {
    if (data_.count(key) == 0) {
      waiter->parkedOn = key;
      parked_[key].push_back(waiter);
      return;
    }
  }
}

void TCPStoreServer::Loop::unpark(const std::shared_ptr<Waiter>& waiter) {
  auto it = parked_.find(waiter->parkedOn);
  if (it == parked_.end()) return;
  it->second.remove(waiter);
  if (it->second.empty()) parked_.erase(it);
}

void TCPStoreServer::Loop::setKey(const std::string& key, Bytes value) {
  auto [it, created] = data_.insert_or_assign(key, std::move(value));
  (void)it;
  if (created) created_.push_back(key);
}

void TCPStoreServer::Loop::keyCreated(const std::string& key) {
  auto it = parked_.find(key);
  if (it == parked_.end()) return;
  std::list<std::shared_ptr<Waiter>> ready = std::move(it->second);
  parked_.erase(it);
  for (auto& waiter : ready) {
    if (!present(waiter->keys)) {
      park(waiter);
      continue;
    }
    waiter->conn->waiters.remove(waiter);
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    answerWaiter(*waiter);
  }
}

void TCPStoreServer::Loop::waitForWorkers(int numWorkers, milliseconds timeout) {
  Deadline deadline(timeout);
  std::unique_lock<std::mutex> lock(joinMu_);
  auto enough = [&] { return static_cast<int>(clientIds_.size()) >= numWorkers; };
  joined_.wait_until(lock, deadline.end(), [&] { return stopped_ || enough(); });
  if (enough()) return;
  if (stopped_) {
    LOOM_THROW(IoError, "TCPStore server ", address_, " stopped while waiting for workers (",
               clientIds_.size(), "/", numWorkers, " joined)");
  }
  std::string missing;
  for (int rank = 0; rank < numWorkers; ++rank) {
    if (ranks_.count(rank) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
  }
  LOOM_THROW(
      TimeoutError, clientIds_.size(), "/", numWorkers, " workers joined TCPStore server ",
      address_, " after ", deadline.elapsed().count(), " ms",
      ranks_.empty() ? std::string(" (no client gave its rank)") : "; missing ranks: " + missing);
}

TCPStoreServer::TCPStoreServer(const TCPStoreServerOptions& options)
    : loop_(std::make_unique<Loop>(options)) {}

TCPStoreServer::~TCPStoreServer() = default;

int TCPStoreServer::port() const {
  return loop_->port_;
}

const std::string& TCPStoreServer::address() const {
  return loop_->address_;
}

void TCPStoreServer::waitForWorkers(int numWorkers, milliseconds timeout) {
  loop_->waitForWorkers(numWorkers, timeout);
}

int TCPStoreServer::numJoined() const {
  std::lock_guard<std::mutex> lock(loop_->joinMu_);
  return static_cast<int>(loop_->clientIds_.size());
}

std::set<int> TCPStoreServer::joinedRanks() const {
  std::lock_guard<std::mutex> lock(loop_->joinMu_);
  return loop_->ranks_;
}

int TCPStoreServer::numWaiting() const {
  return loop_->waiting_.load(std::memory_order_relaxed);
}

int TCPStoreServer::numConnections() const {
  return loop_->connections_.load(std::memory_order_relaxed);
}

void TCPStoreServer::stop() {
  loop_->stop();
}

}  // namespace loom
