#include "loom/store/tcp_store.h"

#include <poll.h>

#include <random>

#include "loom/common/error.h"
#include "loom/common/logging.h"
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
    : host_(std::move(host)), port_(port), options_(options), clientId_(randomClientId()) {
  setTimeout(options.timeout);
  if (options.isServer) {
    TCPStoreServerOptions serverOptions;
    serverOptions.port = port;
    serverOptions.token = options.token;
    serverOptions.numWorkers = options.numWorkers;
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

std::unique_ptr<TCPStore::Connection> TCPStore::connect() {
  auto conn = std::make_unique<Connection>();
  const std::string what = "TCPStore server " + address_;
  conn->sock = net::connectTo(host_, port_, timeout());
  net::setNoDelay(conn->sock.fd());
  Deadline deadline(timeout());
  Message hello{Op::kHello, conn->nextId++, options_.rank, {clientId_}, {toBytes(options_.token)}};
  sendFrame(conn->sock.fd(), hello, deadline, what);
  Message reply;
  try {
    reply = readFrame(conn->sock.fd(), deadline, what);
  } catch (const TimeoutError&) {
    throw;
  } catch (const IoError& e) {
    LOOM_THROW(IoError, what, " closed the connection during the hello (is it a Loom store? ",
               "does LOOM_STORE_TOKEN match?): ", e.what());
  }
  if (reply.op == Op::kError) {
    LOOM_THROW(IoError, what, " refused this client: ", errorText(reply));
  }
  return conn;
}

std::unique_ptr<TCPStore::Connection> TCPStore::acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) {
      LOOM_THROW(IoError, "TCPStore client of ", address_,
                 " is unusable after an earlier error: ", broken_);
    }
    if (!idle_.empty()) {
      auto conn = std::move(idle_.back());
      idle_.pop_back();
      return conn;
    }
  }
  return connect();
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

Message TCPStore::call(Message request, milliseconds waitTimeout) {
  const std::string what = "TCPStore server " + address_;
  std::unique_ptr<Connection> conn = acquire();
  const int fd = conn->sock.fd();
  request.id = conn->nextId++;
  const Op op = request.op;
  Message reply;
  try {
    Deadline io(timeout());
    sendFrame(fd, request, io, what);
    if (waitTimeout >= milliseconds(0)) {
      // Wait for the answer without consuming anything, so that on timeout the connection is
      // still at a frame boundary and can cancel.
      Deadline waitDeadline(waitTimeout);
      for (;;) {
        pollfd pfd{fd, POLLIN, 0};
        const int ready = ::poll(&pfd, 1, waitDeadline.pollTimeoutMs(milliseconds(60000)));
        if (ready > 0) break;
        if (ready < 0 && errno != EINTR) LOOM_SYSCHECK(ready, "poll on ", what);
        if (!waitDeadline.expired()) continue;
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
                   waitDeadline.elapsed().count(), " ms waiting for key(s) ",
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
    release(std::move(conn));  // refused before sending: the connection is untouched
    throw;
  } catch (const IoError& e) {
    fail(detail::str("TCPStore ", store_protocol::opName(op), " of ", quoteKeys(request.keys),
                     " failed: ", e.what()));
  }
  if (reply.id != request.id) {
    fail(detail::str("TCPStore ", store_protocol::opName(op), ": ", what, " answered request ",
                     reply.id, " instead of ", request.id));
  }
  release(std::move(conn));
  if (reply.op == Op::kError) {
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
