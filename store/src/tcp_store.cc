#include "loom/store/tcp_store.h"

#include <poll.h>
#include <unistd.h>

#include <optional>
#include <random>
#include <thread>

#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/common/settings.h"
#include "loom/common/socket.h"
#include "loom/store/store_protocol.h"

namespace loom {

using store_protocol::DecodeStatus;
using store_protocol::Message;
using store_protocol::Op;

struct TCPStore::Connection {
  net::Socket sock;
  uint64_t nextId = 1;
};

namespace {

std::string randomClientId() {
  std::random_device rd;
  const uint64_t hi = rd();
  const uint64_t lo = rd();
  char buf[40];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>((hi << 32) ^ lo));
  return buf;
}

std::string quoteKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", \"" : "\"") + keys[i] + "\"";
  if (keys.size() > 8) out += detail::str(" and ", keys.size() - 8, " more");
  return out;
}

void sendFrame(int fd, const Message& m, const Deadline& deadline, const std::string& what) {
  const std::vector<uint8_t> frame = store_protocol::encode(m);
  net::writeFull(fd, frame.data(), frame.size(), deadline, what);
}

Message readFrame(int fd, const Deadline& deadline, const std::string& what) {
  std::vector<uint8_t> buf(store_protocol::kHeaderBytes);
  net::readFull(fd, buf.data(), buf.size(), deadline, what);
  Message m;
  auto result = store_protocol::decode(buf.data(), buf.size(), m);
  if (result.status == DecodeStatus::kNeedMore) {
    uint64_t length = 0;
    for (int i = 16; i < 24; ++i) length = (length << 8) | buf[i];
    buf.resize(store_protocol::kHeaderBytes + static_cast<size_t>(length));
    net::readFull(fd, buf.data() + store_protocol::kHeaderBytes, static_cast<size_t>(length),
                  deadline, what);
    result = store_protocol::decode(buf.data(), buf.size(), m);
  }
  if (result.status != DecodeStatus::kOk) {
    LOOM_THROW(IoError, "malformed reply from ", what, ": ",
               result.status == DecodeStatus::kError ? result.error : "incomplete frame");
  }
  return m;
}

std::string errorText(const Message& reply) {
  return reply.keys.empty() ? std::string("(no message)") : reply.keys[0];
}

}  // namespace

TCPStore::TCPStore(std::string host, int port, const TCPStoreOptions& options)
    : host_(std::move(host)),
      port_(port),
      options_(options),
      clientId_(randomClientId()),
      pid_(::getpid()) {
  setTimeout(options.timeout);
  if (!options_.reconnectTimeout) {
    options_.reconnectTimeout =
        milliseconds(settings::integer("LOOM_STORE_RECONNECT_MS").value_or(0));
  }
  if (options.isServer) {
    TCPStoreServerOptions serverOptions;
    serverOptions.port = port;
    serverOptions.token = options.token;
    serverOptions.numWorkers = options.numWorkers;
    serverOptions.dataDir = options.dataDir;
    server_ = std::make_unique<TCPStoreServer>(serverOptions);
    port_ = server_->port();
  }
  address_ = net::formatHostPort(host_, port_);
  release(connect());
  if (server_ && options.numWorkers > 0 && options.waitForWorkers) {
    server_->waitForWorkers(options.numWorkers, options.timeout);
  }
}

TCPStore::~TCPStore() {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.clear();  // close our connections before the in-process server (if any) stops
}

std::unique_ptr<TCPStore::Connection> TCPStore::connect(milliseconds limit) {
  if (limit <= milliseconds(0)) limit = timeout();
  auto conn = std::make_unique<Connection>();
  const std::string what = "TCPStore server " + address_;
  conn->sock = net::connectTo(host_, port_, limit);
  net::setNoDelay(conn->sock.fd());
  // A Loom store answers the hello at once (its epoll loop does nothing else first); something
  // else listening on the port (another program, a store of another job) may never answer.
  // So the hello has its own bound, not the whole timeout (300 s in the programs).
  const milliseconds helloLimit = std::min(limit, std::max(options_.helloTimeout, milliseconds(1)));
  Deadline deadline(helloLimit);
  Message hello{Op::kHello, conn->nextId++, options_.rank, {clientId_}, {toBytes(options_.token)}};
  sendFrame(conn->sock.fd(), hello, deadline, what);
  Message reply;
  try {
    reply = readFrame(conn->sock.fd(), deadline, what);
  } catch (const TimeoutError& e) {
    if (helloLimit == limit) throw;
    LOOM_THROW(TimeoutError, what, " did not answer the hello within ", helloLimit.count(),
               " ms (is it a Loom store? something else may listen on that port): ", e.what());
  } catch (const IoError& e) {
    LOOM_THROW(IoError, what, " closed the connection during the hello (is it a Loom store? ",
               "does LOOM_STORE_TOKEN match?): ", e.what());
  }
  if (reply.op == Op::kError) {
    LOOM_THROW(IoError, what, " refused this client: ", errorText(reply));
  }
  return conn;
}

std::unique_ptr<TCPStore::Connection> TCPStore::acquire(bool& fresh, milliseconds connectLimit) {
  fresh = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) {
      LOOM_THROW(IoError, "TCPStore client of ", address_,
                 " is unusable after an earlier error: ", broken_);
    }
    if (::getpid() != pid_) {
      // A forked child must not talk on its parent's sockets: open its own (this closes only
      // the child's copies of the descriptors).
      idle_.clear();
      pid_ = ::getpid();
    }
    if (!idle_.empty()) {
      auto conn = std::move(idle_.back());
      idle_.pop_back();
      return conn;
    }
  }
  fresh = true;
  return connect(connectLimit);
}

void TCPStore::release(std::unique_ptr<Connection> conn) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(conn));
}

void TCPStore::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = why;
  }
  throw IoError(why);
}

namespace {

// A connection that broke under a request: the server went away (closed, reset, refused).
// `sent` says whether the request may have reached it.
struct ConnectionLost {
  std::string why;
  bool sent;
};

bool isConnectionLoss(const IoError& e) {
  if (dynamic_cast<const TimeoutError*>(&e) != nullptr) return false;
  const std::string_view what = e.what();
  return what.find("malformed reply") == std::string_view::npos;
}

// Requests whose repetition cannot change their outcome: sent again after a reconnect when
// the first copy may or may not have been applied. add and deleteKey are not (a second add
// adds twice; a second delete answers "absent"); compareSet is, as far as its caller can tell:
// a repeat returns the value the first one stored.
bool retryable(Op op) {
  return op != Op::kAdd && op != Op::kDelete;
}

}  // namespace

Message TCPStore::call(Message request, milliseconds waitTimeout) {
  std::optional<Deadline> waitDeadline;
  if (waitTimeout >= milliseconds(0)) waitDeadline.emplace(waitTimeout);
  std::optional<Deadline> reconnectDeadline;  // from the first loss of the server
  std::string firstLoss;
  for (;;) {
    try {
      milliseconds connectLimit{0};
      if (reconnectDeadline) {
        connectLimit = std::max(milliseconds(1), reconnectDeadline->remaining());
      }
      return callOnce(request, waitDeadline, connectLimit);
    } catch (const ConnectionLost& lost) {
      const Op op = request.op;
      if (*options_.reconnectTimeout <= milliseconds(0)) fail(lost.why);
      if (lost.sent && !retryable(op)) {
        // The store stays usable (the next call reconnects); only this answer is unknown.
        LOOM_THROW(IoError, lost.why, "; not sent again after reconnecting: a ",
                   store_protocol::opName(op),
                   " may have been applied before the server went away, and repeating it could "
                   "apply it twice");
      }
      if (!reconnectDeadline) {
        reconnectDeadline.emplace(*options_.reconnectTimeout);
        firstLoss = lost.why;
        LOOM_LOG_WARNING("TCPStore client of ", address_, ": lost the server (", lost.why,
                         "); reconnecting for up to ", options_.reconnectTimeout->count(), " ms");
      }
      if (reconnectDeadline->expired()) {
        fail(detail::str(firstLoss, "; could not reconnect within ",
                         options_.reconnectTimeout->count(),
                         " ms (LOOM_STORE_RECONNECT_MS): ", lost.why));
      }
      // A short pause so that a server that refuses connections is not hammered.
      std::this_thread::sleep_for(std::min(milliseconds(50), reconnectDeadline->remaining()));
    }
  }
}

std::unique_ptr<TCPStore::Connection> TCPStore::acquireLive(bool& fresh,
                                                            milliseconds connectLimit) {
  for (;;) {
    std::unique_ptr<Connection> conn = acquire(fresh, connectLimit);
    if (fresh || *options_.reconnectTimeout <= milliseconds(0)) return conn;
    // An idle connection to a server that went away reads as closed (EOF, or an error);
    // a healthy one has nothing to read, since nothing is in flight on it.
    pollfd pfd{conn->sock.fd(), POLLIN | POLLRDHUP, 0};
    if (::poll(&pfd, 1, 0) == 0) return conn;
  }
}

Message TCPStore::callOnce(Message request, const std::optional<Deadline>& waitDeadline,
                           milliseconds connectLimit) {
  const std::string what = "TCPStore server " + address_;
  const Op op = request.op;
  bool fresh = false;
  bool sent = false;
  std::unique_ptr<Connection> conn;
  Message reply;
  try {
    conn = acquireLive(fresh, connectLimit);
  } catch (const IoError& e) {
    // Also a TimeoutError: the server did not come back within the connect limit.
    if (*options_.reconnectTimeout > milliseconds(0)) {
      throw ConnectionLost{detail::str("TCPStore ", store_protocol::opName(op), ": cannot reach ",
                                       what, ": ", e.what()),
                           false};
    }
    throw;
  }
  try {
    const int fd = conn->sock.fd();
    request.id = conn->nextId++;
    Deadline io(timeout());
    sent = true;
    sendFrame(fd, request, io, what);
    if (waitDeadline) {
      // Wait for the answer without consuming anything, so that on timeout the connection is
      // still at a frame boundary and can cancel.
      for (;;) {
        pollfd pfd{fd, POLLIN, 0};
        const int ready = ::poll(&pfd, 1, waitDeadline->pollTimeoutMs(milliseconds(60000)));
        if (ready > 0) break;
        if (ready < 0 && errno != EINTR) LOOM_SYSCHECK(ready, "poll on ", what);
        if (!waitDeadline->expired()) continue;
        // Give up: cancel on the server, and take the answer if it raced the cancel.
        Deadline cancelDeadline(std::max(timeout(), milliseconds(1000)));
        Message cancel{Op::kCancel, conn->nextId++, static_cast<int64_t>(request.id), {}, {}};
        sendFrame(fd, cancel, cancelDeadline, what);
        bool raced = false;
        for (;;) {
          Message m = readFrame(fd, cancelDeadline, what);
          if (m.id == request.id && m.op == Op::kOk) {
            reply = std::move(m);
            raced = true;
          } else if (m.id == cancel.id) {
            break;
          }
        }
        release(std::move(conn));
        if (raced) return reply;
        LOOM_THROW(TimeoutError, "TCPStore ", store_protocol::opName(op), " timed out after ",
                   waitDeadline->elapsed().count(), " ms waiting for key(s) ",
                   quoteKeys(request.keys), " on ", address_);
      }
    }
    reply = readFrame(fd, Deadline(timeout()), what);
  } catch (const TimeoutError&) {
    // Either the wait's own timeout (the connection went back to the pool) or the server did
    // not answer within the store timeout: then the connection, possibly in the middle of a
    // frame, is dropped here but the store stays usable.
    throw;
  } catch (const InvalidArgumentError&) {
    if (conn) release(std::move(conn));  // refused before sending: the connection is untouched
    throw;
  } catch (const IoError& e) {
    const bool closed =
        std::string_view(e.what()).find("connection closed by") != std::string::npos;
    std::string why = detail::str(
        "TCPStore ", store_protocol::opName(op), " of ", quoteKeys(request.keys),
        " failed: ", e.what(),
        closed ? " (the server stopped, died, or dropped this client: see its log)" : "");
    if (isConnectionLoss(e)) throw ConnectionLost{std::move(why), sent};
    fail(why);
  }
  if (reply.id != request.id) {
    fail(detail::str("TCPStore ", store_protocol::opName(op), ": ", what, " answered request ",
                     reply.id, " instead of ", request.id));
  }
  release(std::move(conn));
  if (reply.op == Op::kError) {
    if (reply.number == store_protocol::kErrorIo) {
      LOOM_THROW(IoError, what, ": ", errorText(reply));
    }
    LOOM_THROW(InvalidArgumentError, what, ": ", errorText(reply));
  }
  return reply;
}

void TCPStore::checkKey(const std::string& key, const char* op) const {
  LOOM_CHECK(!key.empty(), "TCPStore ", op, ": store keys must be non-empty");
  LOOM_CHECK_LE(key.size(), store_protocol::kMaxKeyBytes, "TCPStore ", op, ": key too long");
}

void TCPStore::set(const std::string& key, const Bytes& value) {
  checkKey(key, "set");
  call(Message{Op::kSet, 0, 0, {key}, {value}});
}

Bytes TCPStore::get(const std::string& key) {
  checkKey(key, "get");
  Message reply = call(Message{Op::kGet, 0, 0, {key}, {}}, timeout());
  if (reply.values.size() != 1) fail("TCPStore get: malformed reply from " + address_);
  return std::move(reply.values[0]);
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  checkKey(key, "add");
  return call(Message{Op::kAdd, 0, delta, {key}, {}}).number;
}

Bytes TCPStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  checkKey(key, "compareSet");
  Message reply = call(Message{Op::kCompareSet, 0, 0, {key}, {expected, desired}});
  if (reply.values.size() != 1) fail("TCPStore compareSet: malformed reply from " + address_);
  return std::move(reply.values[0]);
}

bool TCPStore::deleteKey(const std::string& key) {
  checkKey(key, "deleteKey");
  return call(Message{Op::kDelete, 0, 0, {key}, {}}).number != 0;
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) checkKey(key, "check");
  return call(Message{Op::kCheck, 0, 0, keys, {}}).number != 0;
}

void TCPStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  for (const auto& key : keys) checkKey(key, "wait");
  call(Message{Op::kWait, 0, 0, keys, {}}, timeout);
}

int64_t TCPStore::numKeys() {
  return call(Message{Op::kNumKeys, 0, 0, {}, {}}).number;
}

std::vector<Bytes> TCPStore::multiGet(const std::vector<std::string>& keys) {
  for (const auto& key : keys) checkKey(key, "multiGet");
  Message reply = call(Message{Op::kMultiGet, 0, 0, keys, {}}, timeout());
  if (reply.values.size() != keys.size())
    fail("TCPStore multiGet: malformed reply from " + address_);
  return std::move(reply.values);
}

void TCPStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  LOOM_CHECK_EQ(keys.size(), values.size(), "multiSet needs one value per key");
  for (const auto& key : keys) checkKey(key, "multiSet");
  call(Message{Op::kMultiSet, 0, 0, keys, values});
}

}  // namespace loom
