// Who moves the bytes: pollPeer (a spinning waiter, try-lock), drive (a waiter: first busy
// polling every socket while bytes move, then blocked in poll()), and the progress thread's
// epoll loop (when nobody waits).
#include <poll.h>
#include <sched.h>
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

void TcpTransport::pollPeer(int peer, bool send) {
  for (int lane = 0; lane < lanes_; ++lane) {
    Peer& p = conn(peer, lane);
    Fault fault;
    if (send) {
      std::unique_lock<std::mutex> lock(p.sendMu, std::try_to_lock);
      if (lock.owns_lock()) fault = progressSendLocked(p);
    } else {
      std::unique_lock<std::mutex> lock(p.recvMu, std::try_to_lock);
      if (lock.owns_lock()) fault = progressRecvLocked(p);
    }
    if (fault) {
      onFault(p, fault);
      return;
    }
  }
  // The progress thread stands aside while anyone waits: finish queued sends to every peer
  // too (a peer may need them before it can answer).
  for (auto& q : conns_) {
    if (!q || (send && q->rank == peer) || !q->sendPending.load(std::memory_order_relaxed)) {
      continue;
    }
    Fault fault;
    {
      std::unique_lock<std::mutex> lock(q->sendMu, std::try_to_lock);
      if (lock.owns_lock()) fault = progressSendLocked(*q);
    }
    if (fault) {
      onFault(*q, fault);
      return;
    }
  }
}

void TcpTransport::notifyDriver() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(notifyFd_, &one, sizeof(one));
}

void TcpTransport::beginWait(const TcpRequest* request) {
  driving_.fetch_add(1);
  tlsDriving = true;
  tlsWaiting = request;
}

void TcpTransport::endWait() {
  tlsDriving = false;
  tlsWaiting = nullptr;
  lastWaitEnd_.store(Clock::now().time_since_epoch().count());
  driving_.fetch_sub(1);
}

bool TcpTransport::drive(const RequestCore& request, Clock::time_point end) {
  auto done = [&] { return request.finished(); };
  std::vector<pollfd> fds;
  std::vector<int> ids;
  fds.reserve(conns_.size() + 1);
  ids.reserve(conns_.size() + 1);
  // Busy phase first: poll() without a timeout (it reads the sockets' state without taking
  // their locks, unlike a recv or send that would fail) while bytes keep moving, yielding the
  // core when nothing is ready; blocked in poll() once busy_ passes without progress.
  bool busy = busy_.count() > 0;
  auto lastMoved = Clock::now();
  uint64_t seen = moved_.load(std::memory_order_relaxed);
  bool finished = done();
  while (!finished) {
    fds.clear();
    ids.clear();
    for (auto& p : conns_) {
      if (!p || !p->inEpoll.load()) continue;
      const short events = static_cast<short>((p->readPaused.load() ? 0 : POLLIN) |
                                              (p->sendPending.load() ? POLLOUT : 0));
      if (events == 0) continue;
      fds.push_back({p->pollFd.load(std::memory_order_relaxed), events, 0});
      ids.push_back(p->index);
    }
    fds.push_back({notifyFd_, POLLIN, 0});
    ids.push_back(-1);
    const auto now = Clock::now();
    if (now >= end) break;
    if (busy) {
      const uint64_t moved = moved_.load(std::memory_order_relaxed);
      if (moved != seen) {
        seen = moved;
        lastMoved = now;
      } else if (now - lastMoved > busy_) {
        busy = false;
      }
    }
    const auto left = std::chrono::duration_cast<milliseconds>(end - now).count() + 1;
    const int timeout = busy ? 0 : static_cast<int>(std::min<int64_t>(left, 100));
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    if (ready > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        if (ids[i] < 0) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(notifyFd_, &v, sizeof(v));
          continue;
        }
        Peer& p = *conns_[ids[i]];
        Fault fault;
        if (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) {
          std::lock_guard<std::mutex> lock(p.recvMu);
          fault = progressRecvLocked(p);
        }
        if (!fault && (fds[i].revents & POLLOUT)) {
          std::lock_guard<std::mutex> lock(p.sendMu);
          fault = progressSendLocked(p);
        }
        if (fault) onFault(p, fault);
      }
    } else if (busy) {
      // Another rank of this host may need this core to produce what we wait for.
      sched_yield();
    }
    finished = done();
  }
  return finished || done();
}

void TcpTransport::progressLoop() {
  epoll_event events[64];
  while (!stop_.load()) {
    const int64_t lingerEnd =
        lastWaitEnd_.load() + std::chrono::duration_cast<Clock::duration>(kLinger).count();
    if (driving_.load() > 0 || Clock::now().time_since_epoch().count() < lingerEnd) {
      // A waiting thread drives the sockets (or did a moment ago and probably will again):
      // stay out of its way, looking again every kLinger. Nothing wakes this thread when a
      // wait ends, so a run of collectives costs it no wake-ups; bytes that nobody waits
      // for meanwhile sit in the socket buffers for at most kLinger.
      pollfd pfd{wakeFd_, POLLIN, 0};
      ::poll(&pfd, 1, static_cast<int>(kLinger.count()));
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(wakeFd_, &v, sizeof(v));
      continue;
    }
    const int n = ::epoll_wait(epollFd_, events, 64, 1000);
    if (driving_.load() > 0) continue;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kWakeId) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wakeFd_, &v, sizeof(v));
        continue;
      }
      Peer& p = *conns_[static_cast<size_t>(events[i].data.u64)];
      Fault fault;
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        std::lock_guard<std::mutex> lock(p.recvMu);
        fault = progressRecvLocked(p);
      }
      if (!fault && (events[i].events & EPOLLOUT)) {
        std::lock_guard<std::mutex> lock(p.sendMu);
        fault = progressSendLocked(p);
      }
      if (fault) onFault(p, fault);
    }
  }
}

}  // namespace loom::comm::tcp
