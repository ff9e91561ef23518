#include "loom/store/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"
#include "loom/store/store_protocol.h"
#include "store_state.h"

namespace loom {

using store_protocol::DecodeStatus;
using store_protocol::Message;
using store_protocol::Op;

std::string defaultStoreToken() {
  return settings::text("LOOM_STORE_TOKEN").value_or(std::string());
}

StoreFsync defaultStoreFsync() {
  return settings::choice("LOOM_STORE_FSYNC").value_or("always") == "never" ? StoreFsync::kNever
                                                                            : StoreFsync::kAlways;
}

namespace {

// Bytes of replies a client may leave unread before it is considered stuck and dropped.
constexpr size_t kMaxPendingOutput = size_t{512} << 20;
// Bytes a connection may send before its hello is accepted (a hello is tiny).
constexpr size_t kMaxHelloBytes = size_t{64} << 10;
// Bytes read from one connection per wake-up, so one fast sender cannot starve the others.
constexpr size_t kReadBudget = size_t{1} << 20;

bool constantTimeEqual(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<uint8_t>(a[i]) ^ (i < b.size() ? static_cast<uint8_t>(b[i]) : 0);
  return diff == 0;
}

}  // namespace

// The event loop. One thread waits in epoll_wait on the listening socket, the stop eventfd and
// every client socket (level-triggered). A readable client is drained into its input buffer
// (at most kReadBudget per wake-up), whole frames are decoded from the front and handled in
// order: the hello by the loop (token, join bookkeeping), everything else by StoreState, whose
// replies are appended to the output buffer and written at once; what the socket does not
// take waits for EPOLLOUT. A client that breaks the rules is marked dead and closed once the
// current event is handled, so no handler ever runs on a destroyed connection.
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
  int64_t keysLoaded_ = 0;
  int64_t bytesDropped_ = 0;
  StoreState state_;  // the keys and the parked requests; loop thread only

 private:
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
  };

  void run();
  void accept();
  void onReadable(Conn& conn);
  void onWritable(Conn& conn);
  void close(Conn& conn, const std::string& why, bool warn);
  void markDead(Conn& conn, const std::string& why, bool warn);
  void closeDead();
  // epoll_wait timeout: until the earliest hello deadline, or forever when none is pending.
  int helloWaitMs() const;
  // Closes connections that connected but never said hello in time (they hold a socket each).
  void dropSilentClients();
  void handle(Conn& conn, Message& request);
  void handleHello(Conn& conn, const Message& request);
  void reply(Conn& conn, Message message);
  void flush(Conn& conn);
  void updateInterest(Conn& conn);

  std::string token_;
  int numWorkers_;
  net::Socket listen_;
  net::Socket epoll_;   // the epoll instance (an owned fd like any other)
  net::Socket stopFd_;  // eventfd that stop() writes to wake the loop
  std::thread thread_;
  std::once_flag stopOnce_;

  // Loop-thread state.
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;  // by fd
  std::vector<int> dead_;
  milliseconds helloTimeout_;
  std::unordered_map<int, Clock::time_point> helloDue_;  // fd -> hello deadline
};

TCPStoreServer::Loop::Loop(const TCPStoreServerOptions& options)
    : state_([this](int fd, Message reply) {
        auto it = conns_.find(fd);
        if (it != conns_.end()) this->reply(*it->second, std::move(reply));
      }),
      token_(options.token),
      numWorkers_(options.numWorkers),
      helloTimeout_(options.helloTimeout) {
  LOOM_CHECK_LE(token_.size(), store_protocol::kMaxTokenBytes, "LOOM_STORE_TOKEN is too long");
  if (!options.dataDir.empty()) {
    // Loaded before the socket exists: no client ever sees a partial state.
    StoreLogOptions logOptions;
    logOptions.dir = options.dataDir;
    logOptions.fsync = options.fsync;
    logOptions.compactBytes = options.compactBytes;
    const StoreLog::Loaded& loaded = state_.persistTo(logOptions);
    keysLoaded_ = static_cast<int64_t>(loaded.keys);
    bytesDropped_ = static_cast<int64_t>(loaded.droppedBytes);
    LOOM_LOG_INFO("TCPStore server: ", loaded.keys, " key(s) loaded from ", options.dataDir, " (",
                  loaded.records, " log record(s) replayed)");
  }
  listen_ = net::listenOn(options.host, options.port);
  port_ = net::localPort(listen_.fd());
  address_ = net::formatHostPort(options.host, port_);
  net::setNonBlocking(listen_.fd());
  epoll_ =
      net::Socket(LOOM_SYSCHECK(epoll_create1(EPOLL_CLOEXEC), "epoll_create1 for TCPStore server"));
  stopFd_ = net::Socket(LOOM_SYSCHECK(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), "eventfd"));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_.fd();
  LOOM_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, listen_.fd(), &ev), "epoll_ctl");
  ev.data.fd = stopFd_.fd();
  LOOM_SYSCHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, stopFd_.fd(), &ev), "epoll_ctl");
  thread_ = std::thread([this] { run(); });
  LOOM_LOG_INFO("TCPStore server listening on ", address_);
}

TCPStoreServer::Loop::~Loop() {
  stop();
}

void TCPStoreServer::Loop::stop() {
  std::call_once(stopOnce_, [this] {
    {
      std::lock_guard<std::mutex> lock(joinMu_);
      stopped_ = true;
    }
    joined_.notify_all();
    const uint64_t one = 1;
    if (::write(stopFd_.fd(), &one, sizeof(one)) < 0) {
      LOOM_LOG_ERROR("TCPStore server ", address_, ": cannot wake the loop to stop");
    }
    if (thread_.joinable()) thread_.join();
  });
}

void TCPStoreServer::Loop::run() {
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_.fd(), events, 64, helloWaitMs());
    if (n < 0) {
      if (errno == EINTR) continue;
      LOOM_LOG_ERROR("TCPStore server ", address_,
                     ": epoll_wait failed: ", detail::errnoText(errno));
      break;
    }
    bool stopping = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stopFd_.fd()) {
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
        if (!conn.dead && (events[i].events & EPOLLOUT)) onWritable(conn);
      } catch (const std::exception& e) {
        // Only this client's connection is affected (e.g. its buffer could not be grown).
        markDead(conn, e.what(), true);
      }
      closeDead();
    }
    dropSilentClients();
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
    if (epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      LOOM_LOG_WARNING("TCPStore server ", address_, ": cannot watch client ", conn->peer, ": ",
                       detail::errnoText(errno));
      continue;
    }
    LOOM_LOG_DEBUG("TCPStore server ", address_, ": client ", conn->peer, " connected");
    conns_.emplace(fd, std::move(conn));
    helloDue_.emplace(fd, Clock::now() + helloTimeout_);
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
  if (!conn.authed && conn.in.size() > kMaxHelloBytes) {
    // Only a client that proved it knows the token may make the server buffer big frames.
    markDead(conn, detail::str("more than ", kMaxHelloBytes, " bytes before the hello completed"),
             true);
    return;
  }
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

int TCPStoreServer::Loop::helloWaitMs() const {
  if (helloDue_.empty()) return -1;
  auto earliest = Clock::time_point::max();
  for (const auto& [fd, due] : helloDue_) earliest = std::min(earliest, due);
  const auto left = std::chrono::ceil<milliseconds>(earliest - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60000));
}

void TCPStoreServer::Loop::dropSilentClients() {
  if (helloDue_.empty()) return;
  const auto now = Clock::now();
  for (const auto& [fd, due] : helloDue_) {
    if (due > now) continue;
    auto it = conns_.find(fd);
    if (it != conns_.end()) {
      markDead(*it->second, detail::str("no hello within ", helloTimeout_.count(), " ms"), true);
    }
  }
  closeDead();
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
  const int fd = conn.sock.fd();
  state_.dropClient(fd);
  helloDue_.erase(fd);
  epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, fd, nullptr);
  conns_.erase(fd);  // destroys conn and closes the socket
  connections_.fetch_sub(1, std::memory_order_relaxed);
}

void TCPStoreServer::Loop::handle(Conn& conn, Message& m) {
  if (!conn.authed) {
    handleHello(conn, m);
    return;
  }
  if (std::string bad = state_.handle(conn.sock.fd(), m); !bad.empty()) markDead(conn, bad, true);
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
  helloDue_.erase(conn.sock.fd());
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
  epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, conn.sock.fd(), &ev);
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
  return loop_->state_.numWaiting();
}

int64_t TCPStoreServer::numKeysLoaded() const {
  return loop_->keysLoaded_;
}

int64_t TCPStoreServer::bytesDropped() const {
  return loop_->bytesDropped_;
}

int TCPStoreServer::numConnections() const {
  return loop_->connections_.load(std::memory_order_relaxed);
}

void TCPStoreServer::stop() {
  loop_->stop();
}

}  // namespace loom
