// ShmTransport's data path: a request's wait (spin, yield, sleep on the doorbell) and moving
// bytes between the caller's buffers and the rings (all under mu_).
#include "shm/shm_transport_impl.h"

namespace loom::comm::shm {

bool ShmRequest::wait(const Deadline& deadline) {
  if (check()) return true;
  // Spin, moving data ourselves, while that is cheaper than sleeping; then yield the core
  // for a while; then sleep (the arena's policy, arena.h; budgets from waitBudget, os.h).
  // Spinning is futile while the peer last ran on our own CPU (a loaded machine put both on
  // one core): then yield at once (as the arena's waits, arena.cc's kSameCpuSpinNs).
  const int peerIndex = t_->indexOf(peer());
  const bool sameCpu =
      t_->control(peerIndex).cpu.load(std::memory_order_relaxed) == ::sched_getcpu();
  const int64_t spin = sameCpu ? 0 : t_->budget_.spinNs;
  const int64_t yield = t_->budget_.yieldNs;
  {
    struct Polling {
      ShmTransport* t;
      explicit Polling(ShmTransport* tt) : t(tt) { t->beginPolling(); }
      ~Polling() { t->endPolling(); }
    } polling(t_);
    // The budgets count time without progress: a long transfer that keeps moving keeps its
    // waiter awake (sleeping would cost a wake-up per ring's worth of data).
    int64_t start = nowNs();
    int64_t now = start;
    do {
      if (t_->tryProgress()) start = nowNs();
      if (check()) return true;
      for (int i = 0; i < 16; ++i) LOOM_SHMT_PAUSE();
    } while ((now = nowNs()) - start < spin);
    while (now - start < spin + yield && !deadline.expired()) {
      ::sched_yield();
      if (t_->tryProgress()) start = nowNs();
      if (check()) return true;
      now = nowNs();
    }
  }
  // Then sleep on this rank's doorbell, progressing on every ring of it.
  ShmTransport::Control& mine = t_->control(t_->me_);
  for (;;) {
    t_->tryProgress();
    if (check()) return true;
    const auto left = deadline.remaining();
    if (deadline.expired()) return false;
    mine.waiters.fetch_add(1);
    mine.sleeping.fetch_add(1);
    const uint32_t seen = mine.doorbell.load();
    if (!finished() && !t_->workVisible()) {
      const int64_t leftNs = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      futexWait(&mine.doorbell, seen,
                static_cast<long>(std::clamp<int64_t>(leftNs, 1000, p2p::kHealthPeriodNs)), true);
    }
    mine.sleeping.fetch_sub(1);
    mine.waiters.fetch_sub(1);
  }
}

// ---- moving data (all under mu_) ----

bool ShmTransport::progressLocked() {
  if (failed_.load(std::memory_order_relaxed)) return false;
  bool moved = false;
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
    if (i == me_) continue;
    moved = drainLocked(i) || moved;
    if (!peers_[i]->sends.empty()) moved = pushSendsLocked(i) || moved;
    if (failed_.load(std::memory_order_relaxed)) return moved;
  }
  return moved;
}

bool ShmTransport::pushSendsLocked(int i) {
  Peer& p = *peers_[i];
  Ring& r = ring(me_, i);
  uint8_t* data = ringData(me_, i);
  bool moved = false;
  for (;;) {
    const uint64_t tail = r.tail.load(std::memory_order_acquire);
    bool full = false;
    while (!p.sends.empty()) {
      ShmRequest& req = *p.sends.front();
      const size_t bytes = req.bytes();
      size_t space = ringBytes_ - (p.head - tail);
      if (!p.headerSent) {
        if (space < p2p::kHeaderBytes) {
          full = true;
          break;
        }
        const uint64_t header[4] = {req.tag(), bytes, req.signature().word, req.signature().extra};
        p2p::copyToRing(data, ringBytes_, p.head, header, p2p::kHeaderBytes);
        p.head += p2p::kHeaderBytes;
        space -= p2p::kHeaderBytes;
        p.headerSent = true;
        p.sent = 0;
        moved = true;
      }
      const size_t padded = roundUp(bytes, 16);
      const size_t n = std::min(space, padded - p.sent);
      if (n > 0) {
        const size_t payload = p.sent < bytes ? std::min(n, bytes - p.sent) : 0;
        if (payload > 0) p2p::copyToRing(data, ringBytes_, p.head, req.data() + p.sent, payload);
        p.head += n;
        p.sent += n;
        req.setBytesDone(p.sent);
        moved = true;
      }
      if (p.sent < padded) {
        full = true;
        break;
      }
      req.complete();
      p.sends.pop_front();
      p.headerSent = false;
      notifyCompletion();
    }
    if (moved) {
      control(me_).cpu.store(::sched_getcpu(), std::memory_order_relaxed);
      r.head.store(p.head, std::memory_order_seq_cst);
      // Wake the receiver when it waits for data, or when it must drain a full ring.
      if (full || r.readerWaiting.load(std::memory_order_seq_cst) != 0) ringDoorbell(i);
    }
    if (!full) {
      r.writerWaiting.store(0, std::memory_order_relaxed);
      break;
    }
    // Tell the receiver we wait for space, then look once more (it may have drained meanwhile
    // without seeing the flag).
    r.writerWaiting.store(1, std::memory_order_seq_cst);
    if (r.tail.load(std::memory_order_seq_cst) == tail) break;
  }
  p.sendsPending.store(!p.sends.empty(), std::memory_order_release);
  return moved;
}

bool ShmTransport::drainLocked(int i) {
  Peer& p = *peers_[i];
  Ring& r = ring(i, me_);
  const uint8_t* data = ringData(i, me_);
  const uint64_t head = r.head.load(std::memory_order_seq_cst);
  TagMatcher::Incoming& in = p.matcher.incoming();
  bool moved = false;
  while (!failed_.load(std::memory_order_relaxed)) {
    if (!in.active) {
      if (head - p.tail < p2p::kHeaderBytes) break;
      uint64_t header[4];
      p2p::copyFromRing(header, data, ringBytes_, p.tail, p2p::kHeaderBytes);
      p.tail += p2p::kHeaderBytes;
      moved = true;
      p.inPadded = roundUp(header[1], 16);
      p.inConsumed = 0;
      matchHeaderLocked(i, header[0], header[1], Signature{header[2], header[3]});
      if (failed_.load(std::memory_order_relaxed)) break;
      if (p.inPadded == 0) {
        completeIncomingLocked(i);
        continue;
      }
    }
    const size_t avail = head - p.tail;
    if (avail == 0) break;
    const size_t n = std::min<size_t>(avail, p.inPadded - p.inConsumed);
    if (p.inConsumed < in.bytes) {
      const size_t payload = std::min(n, in.bytes - p.inConsumed);
      p2p::copyFromRing(in.target + p.inConsumed, data, ringBytes_, p.tail, payload);
      p.matcher.arrived(payload);
    }
    p.tail += n;
    p.inConsumed += n;
    moved = true;
    if (p.inConsumed == p.inPadded) completeIncomingLocked(i);
  }
  if (moved) {
    control(me_).cpu.store(::sched_getcpu(), std::memory_order_relaxed);
    r.tail.store(p.tail, std::memory_order_seq_cst);
    if (r.writerWaiting.load(std::memory_order_seq_cst) != 0) ringDoorbell(i);
  }
  r.readerWaiting.store(p.matcher.waiting() ? 1 : 0, std::memory_order_relaxed);
  return moved;
}

void ShmTransport::matchHeaderLocked(int i, uint64_t tag, size_t bytes,
                                     const Signature& signature) {
  Peer& p = *peers_[i];
  std::string error;
  if (p.matcher.arrive(tag, bytes, signature, error)) return;
  if (!error.empty()) {
    failLocked(error, true, true);
    return;
  }
  if (!p.matcher.bufferIncoming(error)) failLocked(error, true);
}

void ShmTransport::completeIncomingLocked(int i) {
  if (peers_[i]->matcher.finishIncoming()) notifyCompletion();
}

}  // namespace loom::comm::shm
