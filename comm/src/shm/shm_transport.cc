#include "shm/shm_transport.h"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

#include "loom/common/error.h"
#include "shm/segment.h"
#include "tag.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_SHMT_PAUSE() _mm_pause()
#else
#define LOOM_SHMT_PAUSE() \
  do {                    \
  } while (0)
#endif

namespace loom::comm::shm {

namespace {

constexpr uint64_t kMagic = 0x4c4f4f4d50325031ull;  // "LOOMP2P1"
constexpr size_t kPage = 4096;
constexpr size_t kHeaderBytes = 16;
constexpr int64_t kHealthPeriodNs = 20 * 1000 * 1000;

size_t roundUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

int64_t nowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, long ns, bool shared) {
  timespec ts{static_cast<time_t>(ns / 1000000000), ns % 1000000000};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE,
            expected, &ts, nullptr, 0);
}

void futexWake(std::atomic<uint32_t>* word, bool shared) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE,
            INT_MAX, nullptr, nullptr, 0);
}

bool processAlive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  std::ifstream in(path);
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return !stat.empty();
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

int usableCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// Ring copies: `pos` is a monotonic byte count; the ring holds `ringBytes` at `data`.
void copyToRing(uint8_t* data, size_t ringBytes, uint64_t pos, const void* src, size_t n) {
  const size_t off = pos % ringBytes;
  const size_t first = std::min(n, ringBytes - off);
  std::memcpy(data + off, src, first);
  if (n > first) std::memcpy(data, static_cast<const uint8_t*>(src) + first, n - first);
}

void copyFromRing(void* dst, const uint8_t* data, size_t ringBytes, uint64_t pos, size_t n) {
  const size_t off = pos % ringBytes;
  const size_t first = std::min(n, ringBytes - off);
  std::memcpy(dst, data + off, first);
  if (n > first) std::memcpy(static_cast<uint8_t*>(dst) + first, data, n - first);
}

}  // namespace

struct ShmTransport::Header {
  uint64_t magic;
  int32_t ranks;
  uint64_t ringBytes;
  // 0 = healthy, 1 = an abort is being written, 2 = aborted (reason valid).
  alignas(64) std::atomic<uint32_t> aborted;
  int32_t abortingRank;  // Context rank
  char reason[512];
};

struct ShmTransport::Control {
  // Bumped whenever this rank has something to do; its sleeping threads FUTEX_WAIT on it.
  alignas(64) std::atomic<uint32_t> doorbell;
  std::atomic<int32_t> sleeping;  // threads of this rank asleep on the doorbell
  std::atomic<int32_t> waiters;   // of which waiting on a request (not the progress thread)
  std::atomic<int32_t> polling;   // threads of this rank spinning in a wait
  std::atomic<int32_t> cpu;       // where the rank last moved data (sched_getcpu)
  alignas(64) std::atomic<int32_t> pid;
  std::atomic<uint32_t> closed;  // the rank destroyed its transport (after its last message)
};

struct ShmTransport::Ring {
  alignas(64) std::atomic<uint64_t> head;  // written by the sender
  std::atomic<uint32_t> writerWaiting;     // the sender has sends that did not fit
  alignas(64) std::atomic<uint64_t> tail;  // written by the receiver
  std::atomic<uint32_t> readerWaiting;     // the receiver has receives posted
};

struct ShmTransport::Unexpected {
  uint64_t tag;
  size_t bytes;
  std::unique_ptr<uint8_t[]> data;  // not zeroed: it is overwritten from the ring
  bool complete = false;
};

// ---- requests ----

class ShmRequest final : public Request {
 public:
  ShmRequest(ShmTransport* t, int peer, bool send, void* data, size_t bytes, uint64_t tag)
      : t_(t),
        peer_(peer),
        send_(send),
        data_(static_cast<uint8_t*>(data)),
        bytes_(bytes),
        tag_(tag) {}

  bool test() override {
    if (state_.load(std::memory_order_acquire) == kPending) t_->tryProgress();
    return check();
  }

  bool wait(const Deadline& deadline) override;

  int peer() const override { return peer_; }
  bool isSend() const override { return send_; }
  size_t bytes() const override { return bytes_; }
  uint64_t tag() const override { return tag_; }
  size_t bytesOutstanding() const override {
    return bytes_ - std::min(bytes_, done_.load(std::memory_order_relaxed));
  }

  // Under the transport's lock.
  void complete() {
    done_.store(bytes_, std::memory_order_relaxed);
    // seq_cst: pairs with the waiter's "waiters++, then look at state_" (no lost wake-up).
    state_.store(kDone, std::memory_order_seq_cst);
  }
  void failWith(const std::string& error) {
    if (state_.load(std::memory_order_relaxed) != kPending) return;
    error_ = error;
    state_.store(kFailed, std::memory_order_seq_cst);
  }
  void progressed(size_t done) { done_.store(std::min(done, bytes_), std::memory_order_relaxed); }

 private:
  friend class ShmTransport;
  static constexpr int kPending = 0, kDone = 1, kFailed = 2;

  bool check() const {
    const int s = state_.load(std::memory_order_acquire);
    if (s == kDone) return true;
    if (s == kFailed) throw IoError(error_);
    return false;
  }

  ShmTransport* const t_;
  const int peer_;
  const bool send_;
  uint8_t* const data_;
  const size_t bytes_;
  const uint64_t tag_;
  std::atomic<int> state_{kPending};
  std::atomic<size_t> done_{0};
  std::string error_;
};

bool ShmRequest::wait(const Deadline& deadline) {
  if (check()) return true;
  // Spin, moving data ourselves, while that is cheaper than sleeping; then yield the core
  // for a while; then sleep (the arena's policy, arena.h). Spinning is futile while the peer
  // last ran on our own CPU (a loaded machine put both on one core): then yield almost at once.
  static const int64_t spinNs = []() -> int64_t {
    if (const char* env = std::getenv("LOOM_SHM_SPIN_US"); env != nullptr && *env != '\0') {
      return std::atoll(env) * 1000;
    }
    return -1;
  }();
  const bool oversubscribed = t_->local_.size() > static_cast<size_t>(usableCpus());
  const int peerIndex = t_->indexOf(peer_);
  const bool sameCpu =
      t_->control(peerIndex).cpu.load(std::memory_order_relaxed) == ::sched_getcpu();
  const int64_t spin = sameCpu ? 2000 : spinNs >= 0 ? spinNs : oversubscribed ? 3000 : 1000000;
  const int64_t yield = oversubscribed ? 2000000 : 1000000;
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
    if (state_.load(std::memory_order_seq_cst) == kPending && !t_->workVisible()) {
      const int64_t leftNs = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      futexWait(&mine.doorbell, seen,
                static_cast<long>(std::clamp<int64_t>(leftNs, 1000, kHealthPeriodNs)), true);
    }
    mine.sleeping.fetch_sub(1);
    mine.waiters.fetch_sub(1);
  }
}

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
  if (const char* env = std::getenv("LOOM_SHM_RING_BYTES"); env != nullptr && *env != '\0') {
    const long long v = std::atoll(env);
    LOOM_CHECK(v >= 4096, "LOOM_SHM_RING_BYTES must be at least 4096, got '", env, "'");
    ringBytes = static_cast<size_t>(v);
  }
  ringBytes = roundUp(ringBytes, kPage);
  static_assert(sizeof(Header) <= kPage && sizeof(Control) <= kPage && sizeof(Ring) <= kPage);
  const size_t total = kPage + n * kPage + size_t(n) * n * (kPage + ringBytes);
  auto init = [&](void* base, size_t) {
    auto* header = new (base) Header{};
    header->ranks = n;
    header->ringBytes = ringBytes;
    header->abortingRank = -1;
    auto* b = static_cast<uint8_t*>(base);
    for (int r = 0; r < n; ++r) new (b + kPage + r * kPage) Control{};
    for (int r = 0; r < n * n; ++r) new (b + kPage + n * kPage + r * (kPage + ringBytes)) Ring{};
    header->magic = kMagic;
  };
  auto check = [&](const void* base, size_t bytes) {
    const auto* header = static_cast<const Header*>(base);
    if (header->magic != kMagic || header->ranks != n || header->ringBytes != ringBytes ||
        bytes != total) {
      LOOM_THROW(IoError, "rank ", rank, ": the shared-memory transport segment does not match ",
                 "(", n, " local ranks, ", ringBytes, "-byte rings; was LOOM_SHM_RING_BYTES set ",
                 "differently on the ranks?)");
    }
  };
  auto segment =
      Segment::create(store, me, n, total, options.keyPrefix, options.timeout, init, check);
  return std::unique_ptr<ShmTransport>(
      new ShmTransport(rank, size, local, ringBytes, std::move(segment)));
}

ShmTransport::ShmTransport(int rank, int size, std::vector<int> local, size_t ringBytes,
                           std::unique_ptr<Segment> segment)
    : rank_(rank),
      size_(size),
      local_(std::move(local)),
      me_(static_cast<int>(std::find(local_.begin(), local_.end(), rank) - local_.begin())),
      ringBytes_(ringBytes),
      segment_(std::move(segment)),
      header_(static_cast<Header*>(segment_->base())) {
  for (size_t i = 0; i < local_.size(); ++i) {
    peers_.push_back(std::make_unique<Peer>());
    peers_.back()->rank = local_[i];
  }
  control(me_).pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  lastHealthNs_ = nowNs();
  thread_ = std::thread([this] { progressThread(); });
}

ShmTransport::~ShmTransport() {
  stop_.store(true);
  Control& mine = control(me_);
  mine.doorbell.fetch_add(1);
  futexWake(&mine.doorbell, true);
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Say goodbye: peers fail only what still needs this rank.
    mine.closed.store(1, std::memory_order_release);
    if (!failed_.load()) {
      failed_.store(true);
      failure_ = detail::str("rank ", rank_, ": the shared-memory transport was destroyed");
      for (auto& p : peers_) {
        for (auto& r : p->sends) r->failWith(failure_);
        for (auto& r : p->posted) r->failWith(failure_);
        if (p->in.request) p->in.request->failWith(failure_);
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
  return *reinterpret_cast<Control*>(static_cast<uint8_t*>(segment_->base()) + kPage +
                                     index * kPage);
}

ShmTransport::Ring& ShmTransport::ring(int from, int to) const {
  const size_t n = local_.size();
  return *reinterpret_cast<Ring*>(static_cast<uint8_t*>(segment_->base()) + kPage + n * kPage +
                                  (from * n + to) * (kPage + ringBytes_));
}

uint8_t* ShmTransport::ringData(int from, int to) const {
  return reinterpret_cast<uint8_t*>(&ring(from, to)) + kPage;
}

// ---- the public operations ----

RequestPtr ShmTransport::isend(int peer, const void* data, size_t bytes, uint64_t tag) {
  const int i = indexOf(peer);
  LOOM_CHECK(i >= 0 && i != me_, "shm isend: rank ", peer, " is not another rank on this host");
  auto req = std::make_shared<ShmRequest>(this, peer, true, const_cast<void*>(data), bytes, tag);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) {
    req->failWith(failure_);
  } else if (control(i).closed.load(std::memory_order_acquire) != 0) {
    req->failWith(detail::str("rank ", rank_, ": cannot send ", describeTag(tag), " to rank ", peer,
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
  auto req = std::make_shared<ShmRequest>(this, peer, false, data, bytes, tag);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) {
    req->failWith(failure_);
    return req;
  }
  drainLocked(i);  // take what already arrived, so that matching sees it
  if (failed_.load()) {
    req->failWith(failure_);
    return req;
  }
  Peer& p = *peers_[i];
  auto it = std::find_if(p.unexpected.begin(), p.unexpected.end(),
                         [&](const auto& u) { return u->tag == tag; });
  if (it != p.unexpected.end()) {
    std::shared_ptr<Unexpected> u = *it;
    if (u->bytes != bytes) {
      const std::string error =
          detail::str("rank ", rank_, ": rank ", peer, " sent ", u->bytes, " bytes for ",
                      describeTag(tag), " but this rank receives ", bytes,
                      " bytes (ranks called the collective with different counts or dtypes)");
      failLocked(error, true);
      req->failWith(failure_);
      return req;
    }
    p.unexpected.erase(it);
    if (u->complete) {
      if (bytes > 0) std::memcpy(data, u->data.get(), bytes);
      req->complete();
      return req;
    }
    // Still arriving (it is the message being read): keep what came, the rest lands here.
    const size_t have = std::min(p.in.got, bytes);
    if (have > 0) std::memcpy(data, u->data.get(), have);
    p.in.unexpected.reset();
    p.in.request = req;
    p.in.target = static_cast<uint8_t*>(data);
    req->progressed(have);
  } else {
    for (const auto& u : p.unexpected) {
      if (tagKind(u->tag) != tagKind(tag) && tagSeq(u->tag) == tagSeq(tag) && tagSeq(tag) != 0 &&
          tagKind(u->tag) != OpKind::kP2P && tagKind(tag) != OpKind::kP2P) {
        failLocked(detail::str("rank ", rank_, ": mismatched collectives: rank ", peer, " sent ",
                               describeTag(u->tag), " while this rank runs ", describeTag(tag)),
                   true);
        req->failWith(failure_);
        return req;
      }
    }
    if (control(i).closed.load(std::memory_order_acquire) != 0 && !p.in.active) {
      req->failWith(detail::str("rank ", rank_, ": rank ", peer,
                                " closed its shared-memory transport before sending ",
                                describeTag(tag)));
      return req;
    }
    p.posted.push_back(req);
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
  std::string text;
  for (const auto& u : peers_[i]->unexpected) {
    text += detail::str(text.empty() ? "" : ", ", describeTag(u->tag), " (", u->bytes, " bytes)");
  }
  return text;
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
      size_t space = ringBytes_ - (p.head - tail);
      if (!p.headerSent) {
        if (space < kHeaderBytes) {
          full = true;
          break;
        }
        const uint64_t header[2] = {req.tag_, req.bytes_};
        copyToRing(data, ringBytes_, p.head, header, kHeaderBytes);
        p.head += kHeaderBytes;
        space -= kHeaderBytes;
        p.headerSent = true;
        p.sent = 0;
        moved = true;
      }
      const size_t padded = roundUp(req.bytes_, 16);
      const size_t n = std::min(space, padded - p.sent);
      if (n > 0) {
        const size_t payload = p.sent < req.bytes_ ? std::min(n, req.bytes_ - p.sent) : 0;
        if (payload > 0) copyToRing(data, ringBytes_, p.head, req.data_ + p.sent, payload);
        p.head += n;
        p.sent += n;
        req.progressed(p.sent);
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
  bool moved = false;
  while (!failed_.load(std::memory_order_relaxed)) {
    if (!p.in.active) {
      if (head - p.tail < kHeaderBytes) break;
      uint64_t header[2];
      copyFromRing(header, data, ringBytes_, p.tail, kHeaderBytes);
      p.tail += kHeaderBytes;
      moved = true;
      p.in = Incoming{};
      p.in.active = true;
      p.in.tag = header[0];
      p.in.bytes = header[1];
      p.in.padded = roundUp(header[1], 16);
      matchHeaderLocked(i);
      if (failed_.load(std::memory_order_relaxed)) break;
      if (p.in.padded == 0) {
        completeIncomingLocked(i);
        continue;
      }
    }
    const size_t avail = head - p.tail;
    if (avail == 0) break;
    const size_t n = std::min<size_t>(avail, p.in.padded - p.in.got);
    if (p.in.got < p.in.bytes) {
      copyFromRing(p.in.target + p.in.got, data, ringBytes_, p.tail,
                   std::min(n, p.in.bytes - p.in.got));
    }
    p.tail += n;
    p.in.got += n;
    moved = true;
    if (p.in.request) p.in.request->progressed(p.in.got);
    if (p.in.got == p.in.padded) completeIncomingLocked(i);
  }
  if (moved) {
    control(me_).cpu.store(::sched_getcpu(), std::memory_order_relaxed);
    r.tail.store(p.tail, std::memory_order_seq_cst);
    if (r.writerWaiting.load(std::memory_order_seq_cst) != 0) ringDoorbell(i);
  }
  r.readerWaiting.store(!p.posted.empty() || (p.in.active && p.in.request) ? 1 : 0,
                        std::memory_order_relaxed);
  return moved;
}

void ShmTransport::matchHeaderLocked(int i) {
  Peer& p = *peers_[i];
  const uint64_t tag = p.in.tag;
  auto it =
      std::find_if(p.posted.begin(), p.posted.end(), [&](const auto& r) { return r->tag_ == tag; });
  if (it != p.posted.end()) {
    if ((*it)->bytes_ != p.in.bytes) {
      failLocked(detail::str("rank ", rank_, ": rank ", p.rank, " sent ", p.in.bytes, " bytes for ",
                             describeTag(tag), " but this rank receives ", (*it)->bytes_,
                             " bytes (ranks called the collective with different counts or "
                             "dtypes)"),
                 true);
      return;
    }
    p.in.request = std::move(*it);
    p.posted.erase(it);
    p.in.target = p.in.request->data_;
    return;
  }
  for (const auto& r : p.posted) {
    if (tagKind(r->tag_) != tagKind(tag) && tagSeq(r->tag_) == tagSeq(tag) && tagSeq(tag) != 0 &&
        tagKind(tag) != OpKind::kP2P && tagKind(r->tag_) != OpKind::kP2P) {
      failLocked(detail::str("rank ", rank_, ": mismatched collectives: rank ", p.rank, " sent ",
                             describeTag(tag), " while this rank runs ", describeTag(r->tag_)),
                 true);
      return;
    }
  }
  auto u = std::make_shared<Unexpected>();
  u->tag = tag;
  u->bytes = p.in.bytes;
  u->data.reset(new uint8_t[std::max<size_t>(p.in.bytes, 1)]);
  p.in.unexpected = u;
  p.in.target = u->data.get();
  p.unexpected.push_back(std::move(u));
}

void ShmTransport::completeIncomingLocked(int i) {
  Peer& p = *peers_[i];
  if (p.in.request) {
    p.in.request->complete();
    notifyCompletion();
  } else if (p.in.unexpected) {
    p.in.unexpected->complete = true;
  }
  p.in = Incoming{};
}

void ShmTransport::failLocked(const std::string& reason, bool propagate) {
  if (failed_.load()) return;
  failure_ = reason;
  failed_.store(true, std::memory_order_release);
  for (auto& p : peers_) {
    for (auto& r : p->sends) r->failWith(reason);
    for (auto& r : p->posted) r->failWith(reason);
    if (p->in.request) p->in.request->failWith(reason);
    p->sends.clear();
    p->posted.clear();
    p->in = Incoming{};
    p->sendsPending.store(false);
  }
  if (propagate) {
    uint32_t expected = 0;
    if (header_->aborted.compare_exchange_strong(expected, 1)) {
      header_->abortingRank = rank_;
      std::snprintf(header_->reason, sizeof(header_->reason), "%s", reason.c_str());
      header_->aborted.store(2, std::memory_order_release);
    }
    for (int i = 0; i < static_cast<int>(local_.size()); ++i) {
      control(i).doorbell.fetch_add(1);
      futexWake(&control(i).doorbell, true);
    }
  }
  if (Transport* sibling = sibling_.load(std::memory_order_acquire)) sibling->abort(reason);
  notifyCompletion();
}

bool ShmTransport::busyLocked() const {
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
    const Peer& p = *peers_[i];
    if (i != me_ && (!p.sends.empty() || !p.posted.empty() || p.in.active)) return true;
  }
  return false;
}

void ShmTransport::failClosedPeerLocked(int i) {
  Peer& p = *peers_[i];
  const std::string why = detail::str("rank ", rank_, ": rank ", p.rank,
                                      " closed its shared-memory transport while this rank ");
  for (auto& r : p.sends) r->failWith(why + "still sends " + describeTag(r->tag_) + " to it");
  p.sends.clear();
  p.headerSent = false;
  p.sendsPending.store(false);
  // What it sent before closing was drained just before this; what is still missing never comes.
  for (auto& r : p.posted) r->failWith(why + "waits for " + describeTag(r->tag_));
  p.posted.clear();
  if (p.in.request) p.in.request->failWith(why + "waits for " + describeTag(p.in.tag));
  if (p.in.active) {
    p.in = Incoming{};
  }
  notifyCompletion();
}

void ShmTransport::checkHealthLocked() {
  if (failed_.load()) return;
  if (header_->aborted.load(std::memory_order_acquire) != 0) {
    for (int k = 0; k < 1000000 && header_->aborted.load(std::memory_order_acquire) != 2; ++k) {
      LOOM_SHMT_PAUSE();
    }
    failLocked(detail::str("rank ", rank_, ": the shared-memory transport failed (rank ",
                           header_->abortingRank, " reported): ", header_->reason),
               false);
    return;
  }
  Transport* const sibling = sibling_.load(std::memory_order_acquire);
  const bool siblingFailed = sibling != nullptr && sibling->failed();
  for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
    if (i == me_) continue;
    Peer& p = *peers_[i];
    // When tcp failed, usually a peer died and its sockets closed first: name it if so.
    if (!siblingFailed && p.sends.empty() && p.posted.empty() && !p.in.active) continue;
    Control& c = control(i);
    if (c.closed.load(std::memory_order_acquire) != 0) {
      drainLocked(i);
      if (!p.sends.empty() || !p.posted.empty() || p.in.active) failClosedPeerLocked(i);
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
    futexWake(&c.doorbell, true);
  }
}

void ShmTransport::notifyCompletion() {
  // Threads of this rank waiting on a request sleep on its doorbell.
  Control& mine = control(me_);
  if (mine.waiters.load(std::memory_order_seq_cst) > 0) {
    mine.doorbell.fetch_add(1, std::memory_order_seq_cst);
    futexWake(&mine.doorbell, true);
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
    futexWake(&mine.doorbell, true);
  }
}

void ShmTransport::progressThread() {
  Control& mine = control(me_);
  while (!stop_.load(std::memory_order_acquire)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      progressLocked();
      const int64_t now = nowNs();
      if (now - lastHealthNs_ >= kHealthPeriodNs) {
        lastHealthNs_ = now;
        checkHealthLocked();
      }
    }
    mine.sleeping.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = mine.doorbell.load(std::memory_order_seq_cst);
    if (!stop_.load() && !(workVisible() && !failed_.load())) {
      futexWait(&mine.doorbell, seen, kHealthPeriodNs, true);
    }
    mine.sleeping.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace loom::comm::shm
