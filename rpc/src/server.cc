#include "server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

#include "loom/common/logging.h"
#include "loom/store/peer_auth.h"
#include "thread_start.h"

namespace loom::rpc::detail {

namespace {
constexpr int kTickMs = 100;
// Handshakes in progress at once, and how long one may take (at most the call timeout): a new
// connection beyond the first drops the oldest, so silent connections cannot keep callers out.
constexpr size_t kMaxHandshakes = 64;
constexpr milliseconds kHandshakeTimeout{10000};
}  // namespace

// ---- the request pool ----

class Pool {
 public:
  using Task = std::function<void()>;

  // `threads` idle threads; when one cannot start, the ones started are joined and the error
  // names `who` (they waited for good, each holding the pool).
  static std::shared_ptr<Pool> start(int threads, const std::string& who) {
    auto pool = std::make_shared<Pool>();
    try {
      for (int i = 0; i < threads; ++i) {
        pool->threads_.push_back(detail::startThread(
            detail::failPoolThreadStarts, [pool] { pool->run(); },
            &detail::poolThreadStartsBeforeFailure));
      }
    } catch (const std::system_error& e) {
      const size_t started = pool->threads_.size();
      pool->stop(milliseconds(0));  // idle: they are joined
      LOOM_THROW(IoError, who, ": cannot start request thread ", started + 1, " of ", threads,
                 " (RpcOptions::numThreads, LOOM_RPC_THREADS): ", e.what());
    }
    return pool;
  }

  void submit(Task task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

  // Lets queued tasks run, waits up to `bound` for all to finish, then joins the threads (or
  // detaches the busy ones). Returns how many were still busy.
  size_t stop(milliseconds bound) {
    Deadline deadline(bound);
    size_t busy = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      idle_.wait_until(lock, deadline.end(), [&] { return queue_.empty() && running_ == 0; });
      stop_ = true;
      queue_.clear();
      busy = running_;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) {
      if (busy > 0) {
        t.detach();  // each thread owns a reference to the pool; it ends on its own
      } else {
        t.join();
      }
    }
    threads_.clear();
    return busy;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Task task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      lock.unlock();
      task();  // tasks catch their own exceptions
      task = nullptr;
      lock.lock();
      --running_;
      if (queue_.empty() && running_ == 0) idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_;
  std::deque<Task> queue_;
  size_t running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// ---- one inbound connection ----

struct Connection {
  net::Socket sock;
  std::string what;  // "worker 'trainer1' (rank 1) from 10.0.0.2:51234"
  std::string callerName;
  int callerRank = -1;
  std::mutex writeMu;
  std::atomic<bool> broken{false};
  std::atomic<bool> finished{false};  // its reader thread ended (the acceptor joins it)

  void reply(wire::Kind kind, uint64_t id, const std::vector<uint8_t>& payload,
             milliseconds timeout) {
    if (broken) return;
    try {
      std::lock_guard<std::mutex> lock(writeMu);
      wire::writeFrame(sock.fd(), kind, id, 0, 0, "", payload, Deadline(timeout), what);
    } catch (const std::exception& e) {
      LOOM_LOG_WARNING("rpc: answer to call #", id, " from ", what, " lost: ", e.what());
      broken = true;
      ::shutdown(sock.fd(), SHUT_RDWR);
    }
  }
};

// ---- values made by remote() ----

struct RRefSlot {
  struct Waiter {
    std::weak_ptr<Connection> conn;
    uint64_t callId;
  };
  bool ready = false;
  wire::Kind answer = wire::Kind::kResult;  // kError when making it raised
  std::vector<uint8_t> payload;             // the encoded value, or the encoded error
  std::vector<Waiter> waiters;
};

struct RRefTable {
  std::mutex mu;
  std::map<uint64_t, std::shared_ptr<RRefSlot>> slots;
};

// ---- the server ----

Server::Server(std::shared_ptr<Core> core)
    : core_(std::move(core)), rrefs_(std::make_shared<RRefTable>()) {
  try {
    listen_ = net::listenOn(core_->self.host, 0);
  } catch (const IoError& e) {
    LOOM_THROW(IoError, "rpc: worker '", core_->self.name, "' cannot listen on ", core_->self.host,
               ", the address it publishes (RpcOptions::host, LOOM_RPC_HOST): ", e.what());
  }
  net::setNonBlocking(listen_.fd(), true);
  port_ = net::localPort(listen_.fd());
}

Server::~Server() {
  stop(milliseconds(0));
}

void Server::start() {
  pool_ = Pool::start(
      std::max(1, core_->numThreads),
      loom::detail::str("rpc: worker '", core_->self.name, "' (rank ", core_->self.rank, ")"));
  acceptor_ = std::thread([this] {
    // A background thread never lets an exception escape (std::terminate would end the
    // process); serve() handles a failed thread start itself, so this is a last resort.
    try {
      acceptLoop();
    } catch (const std::exception& e) {
      LOOM_LOG_ERROR("rpc: worker '", core_->self.name,
                     "' stopped accepting connections: ", e.what());
    }
  });
}

// Accepted connections first run the authentication handshake (wire.h), all of them side by
// side in this one poll loop and bounded in number and time, so a stranger that says nothing
// holds no thread and stalls nobody. A connection that passes gets its reader thread, unless
// maxConnections are open: then it is refused (closed, logged).
void Server::acceptLoop() {
  auth::InboundSet pending(sizeof(wire::Opening), kMaxHandshakes);
  auto check = [&](std::span<const uint8_t> bytes) -> std::string {
    wire::Opening o;
    std::memcpy(&o, bytes.data(), sizeof(o));
    if (o.magic != wire::kAuthMagic || o.version != wire::kVersion) {
      return "not a Loom RPC worker of this version";
    }
    if (o.to != core_->self.rank) return loom::detail::str("it calls rank ", o.to);
    if (o.rank < 0 || o.rank >= core_->worldSize) {
      return loom::detail::str("it says it is rank ", o.rank);
    }
    return {};
  };
  while (!stop_) {
    reap();
    Clock::time_point wake = Clock::now() + milliseconds(kTickMs);
    std::vector<pollfd> fds{pending.listenerPollFd(listen_.fd(), wake)};
    pending.addPollFds(fds, wake);
    const auto waitMs = std::chrono::ceil<milliseconds>(wake - Clock::now()).count();
    ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(waitMs, 0, kTickMs)));
    if (stop_) break;
    std::vector<auth::InboundSet::Accepted> done;
    std::vector<auth::InboundSet::Refused> refused;
    pending.advance(fds, 1, core_->key, wire::kAuthLabel, check, done, refused);
    for (const auto& r : refused) {
      LOOM_LOG_WARNING("rpc: worker '", core_->self.name, "' refused a connection from ", r.address,
                       ": ", r.why);
    }
    for (auto& a : done) {
      try {
        serve(std::move(a.socket));
      } catch (const std::exception& e) {
        LOOM_LOG_ERROR("rpc: worker '", core_->self.name, "' refused a connection: ", e.what());
      }
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    std::vector<std::string> dropped;
    const int error = pending.acceptAll(
        listen_.fd(), Clock::now() + std::min(core_->timeout, kHandshakeTimeout), dropped);
    for (const std::string& address : dropped) {
      LOOM_LOG_WARNING("rpc: worker '", core_->self.name, "' dropped a connection from ", address,
                       ": ", kMaxHandshakes,
                       " handshakes were in progress (a flood of connections?)");
    }
    if (error != 0) {
      // Out of descriptors, say: the connection stays queued and the listener backs off
      // (InboundSet::listenerPollFd); logged once per run of failures.
      LOOM_LOG_WARNING("rpc: ", core_->self.name, ": ", pending.acceptFailure());
    }
  }
}

void Server::serve(net::Socket s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int>(connections_.size()) >= core_->maxConnections) {
    LOOM_LOG_WARNING("rpc: worker '", core_->self.name, "' refused a connection from ",
                     net::peerAddressOf(s.fd()), ": ", connections_.size(),
                     " connection(s) open, the most it serves (RpcOptions::maxConnections, "
                     "LOOM_RPC_MAX_CONNECTIONS)");
    return;
  }
  net::setNoDelay(s.fd());
  auto conn = std::make_shared<Connection>();
  conn->what = "a caller at " + net::peerAddressOf(s.fd());
  conn->sock = std::move(s);
  // The two lists grow together or not at all: room first (a push_back that throws after the
  // thread started would leave a joinable thread nobody joins), then the thread, then both.
  connections_.reserve(connections_.size() + 1);
  threads_.reserve(threads_.size() + 1);
  std::thread reader;
  try {
    reader = startThread(failConnectionThreadStarts, [this, conn] {
      connectionLoop(conn);
      conn->finished = true;
    });
  } catch (const std::system_error& e) {
    // Out of threads (EAGAIN): refuse this one connection (closed as conn goes); the caller
    // sees it closed and its call fails, and the connections already served go on.
    LOOM_LOG_ERROR("rpc: worker '", core_->self.name, "' refused ", conn->what,
                   ": cannot start its reader thread: ", e.what());
    return;
  }
  connections_.push_back(conn);
  threads_.push_back(std::move(reader));
}

void Server::reap() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < connections_.size();) {
      if (connections_[i]->finished) {
        done.push_back(std::move(threads_[i]));
        connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i));
        threads_.erase(threads_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  for (std::thread& t : done) t.join();
}

size_t Server::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_.size();
}

void Server::connectionLoop(std::shared_ptr<Connection> conn) {
  const int fd = conn->sock.fd();
  while (!stop_ && !conn->broken) {
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, kTickMs);
    if (ready <= 0 || stop_) continue;
    try {
      handle(conn,
             wire::readFrame(fd, core_->maxMessageBytes, Deadline(core_->timeout), conn->what));
    } catch (const std::exception& e) {
      // A caller that shut down or died closes its end: that is the normal end of a connection.
      LOOM_LOG_DEBUG("rpc: ", core_->self.name, ": connection from ", conn->what,
                     " ended: ", e.what());
      conn->broken = true;
    }
  }
  // Whatever ended the loop, the caller must see the connection close, not wait for answers.
  ::shutdown(fd, SHUT_RDWR);
}

namespace {

// Runs the handler for one request; returns the answer's kind and payload.
std::pair<wire::Kind, std::vector<uint8_t>> runHandler(const Core& core,
                                                       const std::string& function,
                                                       const std::vector<uint8_t>& payload,
                                                       const CallContext& context) {
  try {
    const Handler* handler = core.functions->find(function);
    if (handler == nullptr) {
      LOOM_THROW(InvalidArgumentError, "no function '", function, "' is registered on worker '",
                 core.self.name, "'; registered: ", core.functions->names());
    }
    const Value args = decode(payload.data(), payload.size());
    std::vector<uint8_t> result = encode((*handler)(args, context));
    LOOM_CHECK(result.size() <= core.maxMessageBytes, "the result of '", function, "' takes ",
               result.size(), " bytes; at most ", core.maxMessageBytes,
               " allowed (RpcOptions::maxMessageBytes)");
    return {wire::Kind::kResult, std::move(result)};
  } catch (...) {
    std::string type, message;
    describeCurrentException(type, message);
    return {wire::Kind::kError, encodeError(type, message)};
  }
}

}  // namespace

void Server::handle(const std::shared_ptr<Connection>& conn, wire::Frame frame) {
  const wire::Header& h = frame.header;
  const wire::Kind kind = frame.kind();
  if (kind == wire::Kind::kHello) {
    conn->callerName = frame.name;
    conn->callerRank = static_cast<int>(h.id);
    conn->what = "worker '" + frame.name + "' (rank " + std::to_string(h.id) + ") from " +
                 net::peerAddressOf(conn->sock.fd());
    return;
  }
  if (kind == wire::Kind::kDelete) {
    std::lock_guard<std::mutex> lock(rrefs_->mu);
    rrefs_->slots.erase(h.aux);
    return;
  }
  if (kind == wire::Kind::kFetch) {
    std::shared_ptr<RRefSlot> slot;
    {
      std::lock_guard<std::mutex> lock(rrefs_->mu);
      auto it = rrefs_->slots.find(h.aux);
      if (it != rrefs_->slots.end()) {
        slot = it->second;
        if (!slot->ready) {
          slot->waiters.push_back({conn, h.id});
          return;  // answered by the thread that makes the value
        }
      }
    }
    if (slot == nullptr) {
      conn->reply(wire::Kind::kError, h.id,
                  encodeError("loom::InvalidArgumentError",
                              "no value with RRef id " + std::to_string(h.aux) + " on worker '" +
                                  core_->self.name + "' (deleted, or never created)"),
                  core_->timeout);
    } else {
      conn->reply(slot->answer, h.id, slot->payload, core_->timeout);
    }
    return;
  }
  if (kind != wire::Kind::kRequest && kind != wire::Kind::kRemote) {
    LOOM_THROW(IoError, "unexpected ", wire::kindName(kind), " frame from ", conn->what);
  }

  std::shared_ptr<RRefSlot> slot;
  if (kind == wire::Kind::kRemote) {
    // Made before the request is queued, so that a fetch read after it always finds it.
    slot = std::make_shared<RRefSlot>();
    std::lock_guard<std::mutex> lock(rrefs_->mu);
    rrefs_->slots[h.aux] = slot;
  }
  const Deadline deadline{milliseconds(h.timeoutMs)};
  CallContext context{conn->callerName, conn->callerRank, std::move(frame.name), h.id};
  pool_->submit([core = core_, rrefs = rrefs_, conn, slot, deadline, context,
                 payload = std::move(frame.payload)]() {
    if (slot == nullptr && deadline.expired()) {
      LOOM_LOG_DEBUG("rpc: ", core->self.name, ": dropped call #", context.callId, " '",
                     context.function, "' from ", conn->what, ": its caller stopped waiting");
      return;
    }
    auto [answer, bytes] = runHandler(*core, context.function, payload, context);
    if (slot == nullptr) {
      conn->reply(answer, context.callId, bytes, core->timeout);
      return;
    }
    std::vector<RRefSlot::Waiter> waiters;
    {
      std::lock_guard<std::mutex> lock(rrefs->mu);
      slot->ready = true;
      slot->answer = answer;
      slot->payload = std::move(bytes);
      waiters.swap(slot->waiters);
    }
    // The creator learns that the value exists (null) or why it does not (the error).
    conn->reply(answer, context.callId,
                answer == wire::Kind::kResult ? encode(Value()) : slot->payload, core->timeout);
    for (const RRefSlot::Waiter& w : waiters) {
      if (auto c = w.conn.lock()) c->reply(slot->answer, w.callId, slot->payload, core->timeout);
    }
  });
}

size_t Server::ownedValues() const {
  std::lock_guard<std::mutex> lock(rrefs_->mu);
  return rrefs_->slots.size();
}

void Server::stop(milliseconds bound) {
  if (stop_.exchange(true)) return;
  if (acceptor_.joinable()) acceptor_.join();
  listen_.reset();
  size_t busy = 0;
  if (pool_) busy = pool_->stop(bound);
  if (busy > 0) {
    LOOM_LOG_WARNING("rpc: ", core_->self.name, ": ", busy,
                     " request(s) still running when the shutdown's deadline passed (waited ",
                     bound.count(), " ms more); their threads are left to finish");
  }
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& conn : connections_) ::shutdown(conn->sock.fd(), SHUT_RDWR);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
  std::lock_guard<std::mutex> lock(mu_);
  connections_.clear();
}

}  // namespace loom::rpc::detail
