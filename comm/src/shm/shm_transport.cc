#include "shm/shm_transport_impl.h"

#include "loom/common/schedule_noise.h"

namespace loom::comm::shm {

// ---- setup ----

std::unique_ptr<ShmTransport> ShmTransport::create(Store& store, int rank, int size,
                                                   const std::vector<int>& local,
                                                   const ShmTransportOptions& options) {
  const int n = static_cast<int>(local.size());
  const int me = static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  LOOM_CHECK(me < n, "rank ", rank, " is not among the local ranks of its shm transport");
  size_t ringBytes = options.ringBytes != 0 ? options.ringBytes
                     : n <= 4               ? size_t{1} << 20
                                            : size_t{256} << 10;
  const WaitBudget budget = waitBudget(n, options.spinUs, options.yieldUs);
  ringBytes = roundUp(ringBytes, p2p::kPage);
  static_assert(sizeof(Header) <= p2p::kPage && sizeof(Control) <= p2p::kPage &&
                sizeof(Ring) <= p2p::kPage);
  const size_t total = p2p::kPage + n * p2p::kPage + size_t(n) * n * (p2p::kPage + ringBytes);
  auto init = [&](void* base, size_t) {
    auto* header = new (base) Header{};
    header->ranks = n;
    header->ringBytes = ringBytes;
    header->abortingRank = -1;
    auto* b = static_cast<uint8_t*>(base);
    for (int r = 0; r < n; ++r) new (b + p2p::kPage + r * p2p::kPage) Control{};
    for (int r = 0; r < n * n; ++r)
      new (b + p2p::kPage + n * p2p::kPage + r * (p2p::kPage + ringBytes)) Ring{};
    header->magic = p2p::kMagic;
  };
  auto check = [&](const void* base, size_t bytes) {
    const auto* header = static_cast<const Header*>(base);
    if (header->magic != p2p::kMagic || header->ranks != n || header->ringBytes != ringBytes ||
        bytes != total) {
      LOOM_THROW(IoError, "rank ", rank, ": the shared-memory transport segment does not match ",
                 "(", n, " local ranks, ", ringBytes, "-byte rings; was LOOM_SHM_RING_BYTES set ",
                 "differently on the ranks?)");
    }
  };
  auto segment = Segment::create(store, me, n, total, options.keyPrefix, options.timeout, init,
                                 check, options.memfd);
  return std::unique_ptr<ShmTransport>(
      new ShmTransport(rank, size, local, ringBytes, budget, std::move(segment)));
}

ShmTransport::ShmTransport(int rank, int size, std::vector<int> local, size_t ringBytes,
                           WaitBudget budget, std::unique_ptr<Segment> segment)
    : rank_(rank),
      size_(size),
      local_(std::move(local)),
      me_(static_cast<int>(std::find(local_.begin(), local_.end(), rank) - local_.begin())),
      ringBytes_(ringBytes),
      budget_(budget),
      segment_(std::move(segment)),
      header_(static_cast<Header*>(segment_->base())) {
  for (size_t i = 0; i < local_.size(); ++i) {
    peers_.push_back(std::make_unique<Peer>(rank, local_[i]));
  }
  control(me_).pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  lastHealthNs_ = nowNs();
  thread_ = std::thread([this] { progressThread(); });
}

ShmTransport::~ShmTransport() {
  stop_.store(true);
  Control& mine = control(me_);
  mine.doorbell.fetch_add(1);
  futexWakeAll(&mine.doorbell, true);
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Say goodbye: peers fail only what still needs this rank.
    LOOM_NOISE();
    mine.closed.store(1, std::memory_order_release);
    if (!failed_.load()) {
      failed_.store(true);
      failure_ = detail::str("rank ", rank_, ": the shared-memory transport was destroyed");
      for (auto& p : peers_) {
        for (auto& r : p->sends) r->fail(failure_);
        p->matcher.failAll(failure_);
      }
    }
  }
  for (int i = 0; i < static_cast<int>(local_.size()); ++i) {
    if (i != me_) ringDoorbell(i);
  }
}

// ---- layout ----

int ShmTransport::indexOf(int peer) const {
  const auto it = std::lower_bound(local_.begin(), local_.end(), peer);
  return it != local_.end() && *it == peer ? static_cast<int>(it - local_.begin()) : -1;
}

bool ShmTransport::reaches(int peer) const {
  return peer != rank_ && indexOf(peer) >= 0;
}

ShmTransport::Control& ShmTransport::control(int index) const {
  return *reinterpret_cast<Control*>(static_cast<uint8_t*>(segment_->base()) + p2p::kPage +
                                     index * p2p::kPage);
}

ShmTransport::Ring& ShmTransport::ring(int from, int to) const {
  const size_t n = local_.size();
  return *reinterpret_cast<Ring*>(static_cast<uint8_t*>(segment_->base()) + p2p::kPage +
                                  n * p2p::kPage + (from * n + to) * (p2p::kPage + ringBytes_));
}

uint8_t* ShmTransport::ringData(int from, int to) const {
  return reinterpret_cast<uint8_t*>(&ring(from, to)) + p2p::kPage;
}

// ---- the public operations ----

RequestPtr ShmTransport::isend(int peer, const void* data, size_t bytes, uint64_t tag) {
  const int i = indexOf(peer);
  LOOM_CHECK(i >= 0 && i != me_, "shm isend: rank ", peer, " is not another rank on this host");
  auto req = std::make_shared<ShmRequest>(this, peer, true, data, bytes, tag);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load() || failedByAbortLocked()) {
    req->fail(failure_, failureKind_);
  } else if (control(i).closed.load(std::memory_order_acquire) != 0) {
    req->fail(detail::str("rank ", rank_, ": cannot send ", describeTag(tag), " to rank ", peer,
                          ": it closed its shared-memory transport"));
  } else {
    peers_[i]->sends.push_back(req);
    pushSendsLocked(i);
  }
  return req;
}

RequestPtr ShmTransport::irecv(int peer, void* data, size_t bytes, uint64_t tag) {
  const int i = indexOf(peer);
  LOOM_CHECK(i >= 0 && i != me_, "shm irecv: rank ", peer, " is not another rank on this host");
  // As the matcher's pointer type: passing it on costs no reference-count round trip.
  std::shared_ptr<RequestCore> req =
      std::make_shared<ShmRequest>(this, peer, false, data, bytes, tag);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) {
    req->fail(failure_, failureKind_);
    return req;
  }
  drainLocked(i);  // take what already arrived, so that matching sees it
  LOOM_NOISE();    // the peer may write its message and close before the match below
  if (failed_.load()) {
    req->fail(failure_, failureKind_);
    return req;
  }
  Peer& p = *peers_[i];
  std::string error;
  const auto closedWithNothingArriving = [&] {
    return control(i).closed.load(std::memory_order_acquire) != 0 && !p.matcher.incoming().active;
  };
  TagMatcher::Match match = p.matcher.receive(req, error);
  // A peer writes its last messages into the ring before it says it closed: once it is seen
  // closed, the ring is drained once more and the receive matched again before it is called
  // lost (a message written and the transport closed between the drain above and the check
  // would otherwise be blamed on the sender).
  if (match == TagMatcher::Match::kNone && closedWithNothingArriving()) {
    drainLocked(i);
    if (failed_.load()) {
      req->fail(failure_, failureKind_);
      return req;
    }
    match = p.matcher.receive(req, error);
  }
  switch (match) {
    case TagMatcher::Match::kDone:
      return req;
    case TagMatcher::Match::kArriving:
      break;  // the rest of it lands in the caller's buffer
    case TagMatcher::Match::kError:
      failLocked(error, true, true);
      req->fail(failure_, failureKind_);
      return req;
    case TagMatcher::Match::kNone:
      if (closedWithNothingArriving()) {
        if (failedByAbortLocked()) {
          req->fail(failure_, failureKind_);
        } else {
          req->fail(detail::str("rank ", rank_, ": rank ", peer,
                                " closed its shared-memory transport before sending ",
                                describeTag(tag)));
        }
        return req;
      }
      p.matcher.post(req);
      break;
  }
  ring(i, me_).readerWaiting.store(1);
  drainLocked(i);
  return req;
}

void ShmTransport::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  failLocked(reason, true);
}

std::string ShmTransport::peerAddress(int peer) const {
  const int i = indexOf(peer);
  if (i < 0) return "?";
  return detail::str("shm (pid ", control(i).pid.load(), ")");
}

std::string ShmTransport::describeUnexpected(int peer) const {
  const int i = indexOf(peer);
  if (i < 0 || i == me_) return "";
  std::lock_guard<std::mutex> lock(mu_);
  return peers_[i]->matcher.describeUnexpected();
}

bool ShmTransport::probe(int peer, uint64_t tag) const {
  const int i = indexOf(peer);
  if (i < 0 || i == me_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return peers_[i]->matcher.hasUnexpected(tag);
}

void ShmTransport::failLocked(const std::string& reason, bool propagate, bool invalid) {
  if (failed_.load()) return;
  failure_ = reason;
  failureKind_ = invalid ? RequestCore::Failure::kInvalidArgument : RequestCore::Failure::kIo;
  failed_.store(true, std::memory_order_release);
  for (auto& p : peers_) {
    for (auto& r : p->sends) r->fail(reason, failureKind_);
    p->sends.clear();
    p->matcher.failAll(reason, false, failureKind_);
    p->sendsPending.store(false);
  }
  if (propagate) {
    uint32_t expected = 0;
    if (header_->aborted.compare_exchange_strong(expected, 1)) {
      header_->abortingRank = rank_;
      header_->abortInvalid = invalid ? 1 : 0;
      std::snprintf(header_->reason, sizeof(header_->reason), "%s", reason.c_str());
      header_->aborted.store(2, std::memory_order_release);
    }
    for (int i = 0; i < static_cast<int>(local_.size()); ++i) {
      control(i).doorbell.fetch_add(1);
      futexWakeAll(&control(i).doorbell, true);
    }
  }
  if (Transport* sibling = sibling_.load(std::memory_order_acquire)) sibling->abort(reason);
  notifyCompletion();
}

bool ShmTransport::busyLocked() const {
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
    if (i != me_ && peers_[i]->busy()) return true;
  }
  return false;
}

void ShmTransport::failClosedPeerLocked(int i) {
  // A peer that aborted the transport before it closed: the abort's reason is the cause, not
  // the close (checkHealthLocked fails everything with it).
  if (failedByAbortLocked()) return;
  Peer& p = *peers_[i];
  const std::string why = detail::str("rank ", rank_, ": rank ", p.rank,
                                      " closed its shared-memory transport while this rank ");
  for (auto& r : p.sends) r->fail(why + "still sends " + describeTag(r->tag()) + " to it");
  p.sends.clear();
  p.headerSent = false;
  p.sendsPending.store(false);
  // What it sent before closing was drained just before this; what is still missing never comes.
  p.matcher.failAll(why + "waits for ", true);
  notifyCompletion();
}

bool ShmTransport::failedByAbortLocked() {
  if (header_->aborted.load(std::memory_order_acquire) == 0) return false;
  checkHealthLocked();
  return failed_.load();
}

void ShmTransport::checkHealthLocked() {
  if (failed_.load()) return;
  if (header_->aborted.load(std::memory_order_acquire) != 0) {
    for (int k = 0; k < 1000000 && header_->aborted.load(std::memory_order_acquire) != 2; ++k) {
      LOOM_SHMT_PAUSE();
    }
    failLocked(detail::str("rank ", rank_, ": the shared-memory transport failed (rank ",
                           header_->abortingRank, " reported): ", header_->reason),
               false, header_->abortInvalid != 0);
    return;
  }
  Transport* const sibling = sibling_.load(std::memory_order_acquire);
  const bool siblingFailed = sibling != nullptr && sibling->failed();
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
    if (i == me_) continue;
    Peer& p = *peers_[i];
    // When tcp failed, usually a peer died and its sockets closed first: name it if so.
    if (!siblingFailed && !p.busy()) continue;
    Control& c = control(i);
    LOOM_NOISE();
    if (c.closed.load(std::memory_order_acquire) != 0) {
      drainLocked(i);
      if (p.busy()) failClosedPeerLocked(i);
      continue;
    }
    const pid_t pid = c.pid.load(std::memory_order_acquire);
    if (pid > 0 && pid != ::getpid() && !processAlive(pid)) {
      failLocked(detail::str("rank ", rank_, ": rank ", p.rank, " (pid ", pid,
                             ") died while this rank exchanged messages with it over shared "
                             "memory"),
                 true);
      return;
    }
  }
  if (siblingFailed) {
    // A failed transport fails every new request with its first reason: ask it.
    std::string why = "unknown reason";
    try {
      sibling->isend((rank_ + 1) % size_, nullptr, 0, ~uint64_t{0})->test();
    } catch (const std::exception& e) {
      why = e.what();
    }
    failLocked(detail::str("rank ", rank_, ": the context's tcp transport failed: ", why), false);
  }
}

// ---- waking and sleeping ----

bool ShmTransport::workVisible() const {
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
    if (i == me_) continue;
    const Ring& in = ring(i, me_);
    if (in.head.load(std::memory_order_seq_cst) != in.tail.load(std::memory_order_relaxed)) {
      return true;
    }
    if (peers_[i]->sendsPending.load(std::memory_order_acquire)) {
      const Ring& out = ring(me_, i);
      if (out.head.load(std::memory_order_relaxed) - out.tail.load(std::memory_order_acquire) <
          ringBytes_) {
        return true;
      }
    }
  }
  return header_->aborted.load(std::memory_order_relaxed) != 0;
}

void ShmTransport::ringDoorbell(int i) {
  Control& c = control(i);
  c.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleeping.load(std::memory_order_seq_cst) > 0 &&
      c.polling.load(std::memory_order_seq_cst) == 0) {
    futexWakeAll(&c.doorbell, true);
  }
}

void ShmTransport::notifyCompletion() {
  // Threads of this rank waiting on a request sleep on its doorbell.
  Control& mine = control(me_);
  if (mine.waiters.load(std::memory_order_seq_cst) > 0) {
    mine.doorbell.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&mine.doorbell, true);
  }
}

bool ShmTransport::tryProgress() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  return lock.owns_lock() && progressLocked();
}

void ShmTransport::beginPolling() {
  control(me_).polling.fetch_add(1, std::memory_order_seq_cst);
}

void ShmTransport::endPolling() {
  Control& mine = control(me_);
  mine.polling.fetch_sub(1, std::memory_order_seq_cst);
  // A writer that saw us polling did not wake anybody: if it left work, wake our sleepers.
  if (workVisible() && mine.sleeping.load(std::memory_order_seq_cst) > 0) {
    mine.doorbell.fetch_add(1);
    futexWakeAll(&mine.doorbell, true);
  }
}

void ShmTransport::progressThread() {
  Control& mine = control(me_);
  while (!stop_.load(std::memory_order_acquire)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      progressLocked();
      const int64_t now = nowNs();
      if (now - lastHealthNs_ >= p2p::kHealthPeriodNs) {
        lastHealthNs_ = now;
        checkHealthLocked();
      }
    }
    mine.sleeping.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = mine.doorbell.load(std::memory_order_seq_cst);
    if (!stop_.load() && !(workVisible() && !failed_.load())) {
      futexWait(&mine.doorbell, seen, p2p::kHealthPeriodNs, true);
    }
    mine.sleeping.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace loom::comm::shm
