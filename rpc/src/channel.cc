#include "channel.h"

#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include "loom/common/logging.h"
#include "loom/store/peer_auth.h"
#include "thread_start.h"

namespace loom::rpc::detail {

namespace {
constexpr int kTickMs = 100;
}

Channel::Channel(Core& core, int peerRank)
    : core_(core),
      peer_(peerRank),
      what_(core.describe(peerRank) + " at " +
            net::formatHostPort(core.workers[static_cast<size_t>(peerRank)].host,
                                core.workers[static_cast<size_t>(peerRank)].port)) {}

Channel::~Channel() {
  close("the agent shut down");
}

void Channel::ensureConnected(const Deadline& deadline, const std::string& description) {
  if (sock_.valid()) return;
  const WorkerInfo& peer = core_.workers[static_cast<size_t>(peer_)];
  net::Socket s = net::connectTo(peer.host, peer.port, deadline.remaining());
  net::setNoDelay(s.fd());
  net::setKeepAlive(s.fd());
  // Prove this worker holds the job's key, and check that the callee does (peer_auth.h).
  wire::Opening opening;
  opening.rank = core_.self.rank;
  opening.to = peer_;
  const auth::Nonce nonce = auth::randomNonce();
  std::memcpy(opening.nonce, nonce.data(), sizeof(opening.nonce));
  auth::dial(s.fd(), core_.key, wire::kAuthLabel,
             {reinterpret_cast<const uint8_t*>(&opening), sizeof(opening)}, deadline, what_);
  wire::writeFrame(s.fd(), wire::Kind::kHello, static_cast<uint64_t>(core_.self.rank), 0, 0,
                   core_.self.name, {}, deadline, what_);
  sock_ = std::move(s);
  try {
    reader_ = startThread(failReaderThreadStarts, [this] { readerLoop(); });
  } catch (const std::system_error& e) {
    // Without its reader the connection would take requests and never deliver an answer (every
    // call would time out): close it, so that the next call connects again.
    sock_.reset();
    LOOM_THROW(IoError, "rpc: ", description, ": connected to ", what_,
               " but cannot start the thread that reads its answers: ", e.what());
  }
}

std::shared_ptr<CallState> Channel::call(wire::Kind kind, uint64_t id, const std::string& function,
                                         uint64_t aux, const std::vector<uint8_t>& payload,
                                         milliseconds timeout, const std::string& description) {
  auto state = std::make_shared<CallState>(description, function, timeout);
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      if (stop_) LOOM_THROW(IoError, "rpc: ", description, ": the agent shut down");
      if (!broken_.empty()) {
        LOOM_THROW(IoError, "rpc: ", description, " failed: the connection to ", what_,
                   " broke earlier: ", broken_);
      }
      ensureConnected(state->deadline(), description);
    } catch (const TimeoutError& e) {
      state->fail(std::make_exception_ptr(
          TimeoutError("rpc: " + description + ": cannot reach " + what_ + ": " + e.what())));
      return state;
    } catch (const IoError& e) {
      state->fail(std::current_exception());
      return state;
    }
    pending_.emplace(id, state);
    core_.addPending(1);
  }
  try {
    std::lock_guard<std::mutex> lock(writeMu_);
    // Read the fd under writeMu_: close() resets the socket only while holding it.
    {
      std::lock_guard<std::mutex> inner(mu_);
      if (!sock_.valid() || !broken_.empty()) return state;  // failed by breakWith already
      fd = sock_.fd();
    }
    // A fetch names no function on the wire: the owner finds the value by its id.
    wire::writeFrame(fd, kind, id, aux, static_cast<uint32_t>(timeout.count()),
                     kind == wire::Kind::kFetch ? std::string() : function, payload,
                     state->deadline(), what_);
  } catch (const std::exception& e) {
    breakWith(std::string("sending ") + description + " failed: " + e.what());
  }
  return state;
}

void Channel::post(wire::Kind kind, uint64_t aux, milliseconds timeout) {
  try {
    std::lock_guard<std::mutex> lock(writeMu_);
    int fd = -1;
    {
      std::lock_guard<std::mutex> inner(mu_);
      if (stop_ || !broken_.empty() || !sock_.valid()) return;
      fd = sock_.fd();
    }
    wire::writeFrame(fd, kind, 0, aux, 0, "", {}, Deadline(timeout), what_);
  } catch (const std::exception& e) {
    breakWith(std::string("sending a ") + wire::kindName(kind) + " failed: " + e.what());
  }
}

void Channel::breakWith(const std::string& why) {
  std::map<uint64_t, std::shared_ptr<CallState>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = why;
    failed.swap(pending_);
    // Wake the reader (and make the peer see EOF); the fd stays open until close().
    if (sock_.valid()) ::shutdown(sock_.fd(), SHUT_RDWR);
  }
  for (auto& [id, state] : failed) {
    state->fail(
        std::make_exception_ptr(IoError("rpc: " + state->description() +
                                        " failed: the connection to " + what_ + " broke: " + why)));
  }
  if (!failed.empty() && stop_) {
    LOOM_LOG_INFO("rpc: ", core_.self.name, ": ", why, "; ", failed.size(), " pending call(s) to ",
                  what_, " failed");
    core_.removePending(failed.size());
  } else if (!failed.empty()) {
    LOOM_LOG_WARNING("rpc: ", core_.self.name, ": connection to ", what_, " broke (", why, "); ",
                     failed.size(), " pending call(s) failed");
    core_.removePending(failed.size());
  }
}

void Channel::deliver(wire::Frame& frame) {
  std::shared_ptr<CallState> state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(frame.header.id);
    if (it == pending_.end()) return;  // expired already: the answer came too late
    state = std::move(it->second);
    pending_.erase(it);
  }
  core_.removePending(1);
  if (frame.kind() == wire::Kind::kResult) {
    try {
      state->succeed(decode(frame.payload.data(), frame.payload.size()));
    } catch (const std::exception&) {
      state->fail(std::current_exception());
    }
  } else {
    state->fail(decodeError(frame.payload, core_.workers[static_cast<size_t>(peer_)].name,
                            state->function()));
  }
}

void Channel::sweep() {
  size_t removed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->expireIfDue() || it->second->done()) {
        it = pending_.erase(it);
        ++removed;
      } else {
        ++it;
      }
    }
  }
  if (removed > 0) core_.removePending(removed);
}

void Channel::readerLoop() {
  const int fd = sock_.fd();
  Clock::time_point lastSweep = Clock::now();
  while (!stop_) {
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, kTickMs);
    if (stop_) return;
    // Expire overdue calls about once a tick, not on every answer.
    const Clock::time_point now = Clock::now();
    if (now - lastSweep >= std::chrono::milliseconds(kTickMs / 2)) {
      sweep();
      lastSweep = now;
    }
    if (ready <= 0) continue;
    try {
      wire::Frame frame =
          wire::readFrame(fd, core_.maxMessageBytes, Deadline(core_.timeout), what_);
      if (frame.kind() != wire::Kind::kResult && frame.kind() != wire::Kind::kError) {
        LOOM_THROW(IoError, "unexpected ", wire::kindName(frame.kind()), " frame from ", what_);
      }
      deliver(frame);
    } catch (const std::exception& e) {
      if (!stop_) breakWith(e.what());
      return;
    }
  }
}

void Channel::close(const std::string& why) {
  stop_ = true;
  breakWith(why);
  if (reader_.joinable()) reader_.join();
  std::lock_guard<std::mutex> write(writeMu_);
  std::lock_guard<std::mutex> lock(mu_);
  sock_.reset();
}

}  // namespace loom::rpc::detail
