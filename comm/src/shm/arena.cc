#include "shm/arena.h"

#include "loom/common/schedule_noise.h"
#include "shm/arena_layout.h"
#include "shm/copy_helpers.h"
#include "shm/os.h"
#include "shm/ptrace.h"
#include "shm/segment.h"
#include "shm/stream_copy.h"
#include "signature.h"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfenv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "loom/comm/transport.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"
#include "tag.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_SHM_PAUSE() _mm_pause()
#else
#define LOOM_SHM_PAUSE() \
  do {                   \
  } while (0)
#endif

namespace loom::comm::shm {

namespace {

constexpr uint64_t kMagic = 0x4c4f4f4d53484d31ull;  // "LOOMSHM1"
constexpr uint32_t kVersion = 5;  // 2: boxes; 3: 64-bit counts; 4: abortInvalid; 5: announced
// Spinning while the awaited rank last ran on this very CPU: none. It cannot run while we spin
// (unless it migrated since its last publish, which the yield loop's checks catch as fast), so
// a wait yields at once. It was 2 us: with 3 or 4 ranks on 2 CPUs that was most of a small
// collective's time (4 ranks, 8-byte all-reduce 7.1 -> 5.4 us; 3 ranks 6.3 -> 2.8 us).
constexpr int64_t kSameCpuSpinNs = 0;
// Pauses spent looking at a counter before the first clock read of a wait: a peer that is
// about to post (a small collective between running ranks) usually arrives within them (a
// pause is 10-65 cycles, so this is well under a microsecond).
constexpr int kPreSpinPauses = 32;
constexpr int kReduced = 0, kConsumed = 1;
constexpr const char* kPostWhat = "post its data";
const char* const kCounterNames[] = {"finish its reduction", "finish reading"};

std::string namespaceId(const char* path) {
  char buf[128];
  const ssize_t n = ::readlink(path, buf, sizeof(buf) - 1);
  if (n <= 0) return "?";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

int copyThreadsFor(int setting, int cpus, int localRanks) {
  if (setting >= 0) return std::min(setting, CopyHelpers::kMaxThreads);
  const int spare = cpus / std::max(1, localRanks) - 1;
  return std::clamp(spare, 0, CopyHelpers::kMaxThreads);
}

const char* peerAccessName(PeerAccess access) {
  switch (access) {
    case PeerAccess::kStaged:
      return "staged (buffers outside Loom windows)";
    case PeerAccess::kCrossMemory:
      return "cross-memory attach";
    case PeerAccess::kWindow:
      return "zero-copy window (buffers inside Loom windows)";
  }
  return "unknown";
}

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

std::string hostIdentity(const std::string& overrideId) {
  if (!overrideId.empty()) return detail::str("override|", overrideId);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return detail::str(readFirstLine("/proc/sys/kernel/random/boot_id"), "|", host, "|",
                     namespaceId("/proc/self/ns/net"), "|", namespaceId("/proc/self/ns/ipc"), "|",
                     namespaceId("/proc/self/ns/mnt"));
}

std::unique_ptr<Arena> Arena::create(Store& store, int rank, int size,
                                     const ArenaOptions& options) {
  size_t slotBytes = options.slotBytes != 0 ? options.slotBytes
                     : size <= 4            ? size_t{2} << 20
                                            : size_t{1} << 20;
  const WaitBudget budget = waitBudget(size, options.spinUs, options.yieldUs);
  slotBytes = roundUp(std::max<size_t>(slotBytes, kPage), kPage);
  const size_t perRankBytes = kPage + kSlots * slotBytes;
  const size_t totalBytes = kPage + size * perRankBytes;
  static_assert(sizeof(Header) <= kPage && sizeof(Control) <= kPage);
  auto init = [&](void* base, size_t) {
    auto* header = new (base) Header{};
    header->size = size;
    header->slotBytes = slotBytes;
    header->perRankBytes = perRankBytes;
    header->blamedRank = -1;
    header->abortingRank = -1;
    for (int r = 0; r < size; ++r) {
      new (static_cast<uint8_t*>(base) + kPage + r * perRankBytes) Control{};
    }
    header->version = kVersion;
    header->magic = kMagic;
  };
  // Every rank computes the same layout from the same options (rank 0's slot size travels in
  // the header only as a check: a rank with another slot size is refused).
  auto check = [&](const void* base, size_t bytes) {
    const auto* header = static_cast<const Header*>(base);
    if (header->magic != kMagic || header->version != kVersion || header->size != size ||
        header->slotBytes != slotBytes || bytes != totalBytes) {
      LOOM_THROW(IoError, "rank ", rank,
                 ": the shared-memory segment does not match this group "
                 "(world size ",
                 size, ", slot bytes ", slotBytes, ", ", totalBytes,
                 " bytes; "
                 "was shmSlotBytes / LOOM_SHM_SLOT_BYTES set differently on the ranks?)");
    }
  };
  auto segment = Segment::create(store, rank, size, totalBytes, options.keyPrefix, options.timeout,
                                 init, check, options.memfd);
  std::unique_ptr<Arena> arena(new Arena(rank, size, slotBytes, budget, std::move(segment)));
  arena->foldSkew_ = options.foldSkew;
  arena->copyThreads_ = copyThreadsFor(options.copyThreads, usableCpus(), size);
  // Helpers spin while idle only when every rank and helper has a CPU of its own.
  arena->helperSpinNs_ = (arena->copyThreads_ + 1) * size <= usableCpus() ? arena->spinNs_ : 0;
  if (rank == 0 && arena->copyThreads_ > 0) {
    LOOM_LOG_INFO("shared memory: ", arena->copyThreads_,
                  " helper threads per rank share the staged all-reduce's copies and folds of "
                  ">= ",
                  kHelperMinStepBytes >> 10, " KiB per step (LOOM_SHM_COPY_THREADS=",
                  options.copyThreads < 0 ? "auto" : std::to_string(options.copyThreads), ", ",
                  usableCpus(), " CPUs, ", size, " local ranks)");
  }
  arena->control(rank).pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  arena->probeSingleCopy(store, options);
  arena->probeWindows(store, options);
  return arena;
}

Arena::Arena(int rank, int size, size_t slotBytes, WaitBudget budget,
             std::unique_ptr<Segment> segment)
    : rank_(rank),
      size_(size),
      slotBytes_(slotBytes),
      segment_(std::move(segment)),
      base_(segment_->base()),
      header_(static_cast<Header*>(base_)),
      spinNs_(budget.spinNs),
      yieldNs_(budget.yieldNs),
      mappings_(static_cast<size_t>(size)) {
  // Every rank's control block, slots and boxes, computed once (they are looked up several
  // times per operation).
  auto* first = static_cast<uint8_t*>(base_) + kPage;
  const size_t perRank = header_->perRankBytes;
  for (int r = 0; r < size; ++r) {
    uint8_t* block = first + r * perRank;
    controls_.push_back(reinterpret_cast<Control*>(block));
    slots_.push_back(block + kPage);
  }
  for (int s = 0; s < kSlots; ++s) {
    for (int r = 0; r < size; ++r) boxes_.push_back(controls_[r]->box[s].data);
  }
}

Arena::~Arena() {
  helpers_.reset();      // idle (every task was waited for): stops and joins them
  endGrant(readGrant_);  // no read permission outlives the group
  for (auto& peer : mappings_) {
    for (const Mapping& m : peer) ::munmap(m.local, m.bytes);
  }
  LOOM_NOISE();
  control(rank_).closed.store(1, std::memory_order_release);
  control(rank_).wake.fetch_add(1);
  if (header_->sleepers.load() > 0) futexWakeAll(&control(rank_).wake);
}

const std::string& Arena::segmentName() const {
  return segment_->name();
}

void Arena::abort(int blamedRank, const std::string& reason, bool invalid) {
  uint32_t expected = 0;
  if (header_->aborted.compare_exchange_strong(expected, 1)) {
    header_->blamedRank = blamedRank;
    header_->abortingRank = rank_;
    header_->abortInvalid = invalid ? 1 : 0;
    std::snprintf(header_->reason, sizeof(header_->reason), "%s", reason.c_str());
    header_->aborted.store(2, std::memory_order_release);
  }
  for (int r = 0; r < size_; ++r) {
    control(r).wake.fetch_add(1);
    futexWakeAll(&control(r).wake);
  }
}

void Arena::fail(const Call& call, int blamedRank, const std::string& what, bool timeout) {
  const std::string message = detail::str("rank ", rank_, ": ", call.name(),
                                          " over shared memory (", call.bytes, " bytes): ", what);
  abort(blamedRank, message);
  if (transport_ != nullptr) transport_->abort(message);
  if (timeout) throw TimeoutError(message);
  throw IoError(message);
}

void Arena::failMismatch(const Call& call, int peer, const std::string& what) {
  const std::string message = detail::str("rank ", rank_, ": ", call.name(),
                                          " over shared memory (", call.bytes, " bytes): ", what);
  abort(peer, message, true);
  if (transport_ != nullptr) transport_->abort(message);
  throw InvalidArgumentError(message);
}

std::string Arena::transportFailure() const {
  // A failed transport fails every new request with its first reason; ask it.
  try {
    transport_->isend((rank_ + 1) % size_, nullptr, 0, ~uint64_t{0})->test();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "unknown reason";
}

std::string Arena::Call::name() const {
  return detail::str(opTypeName(static_cast<OpType>(kind)), "#", seq);
}

void Arena::throwAborted(const Call& call) {
  for (int i = 0; i < 1000000 && header_->aborted.load(std::memory_order_acquire) != 2; ++i) {
    LOOM_SHM_PAUSE();
  }
  const std::string reason = header_->reason;
  const std::string message = detail::str(
      "rank ", rank_, ": ", call.name(), ": the shared-memory group failed (rank ",
      header_->abortingRank, " reported, blaming rank ", header_->blamedRank, "): ", reason);
  if (transport_ != nullptr) transport_->abort(message);
  // A mismatch found by another rank is the same mistake here: every rank's error has the
  // root cause's type, whichever rank saw it first.
  if (header_->abortInvalid != 0) throw InvalidArgumentError(message);
  throw IoError(message);
}

void Arena::checkUsable(const Call& call) {
  if (header_->aborted.load(std::memory_order_relaxed) != 0 ||
      (transport_ != nullptr && transport_->failed())) {
    checkHealth(call, rank_, "start");
  }
}

bool Arena::checkHealth(const Call& call, int peer, const char* what,
                        const std::atomic<uint64_t>* counter, uint64_t target,
                        const std::atomic<uint64_t>* alt, uint64_t altTarget) {
  // A peer publishes its counter before it closes or exits, so once it is seen gone, one more
  // read of the counter tells a finished peer from a failed one. Both counters a wait accepts
  // are read: a peer that announced a rooted call (its stamp, not a post), finished the call and
  // destroyed its context between a receiver's last look and this check was blamed for closing
  // (seen under ctest -j6: "rank 0 destroyed its context while rank 2 waited for it to start
  // the collective" in a broadcast every rank called with root 3).
  auto published = [&] {
    return (counter != nullptr && counter->load(std::memory_order_acquire) >= target) ||
           (alt != nullptr && alt->load(std::memory_order_acquire) >= altTarget);
  };
  // A rank that fails sets the abort flag before it throws, so before it can exit: a peer seen
  // dead (or its sockets closed) while the flag is set may be a casualty of the failure the
  // flag names, and the flag is read again before a death is blamed (a rank that reported rank
  // 2's death and exited was named as the dead one when it exited between the two reads).
  const auto throwIfAborted = [&] {
    if (header_->aborted.load(std::memory_order_acquire) != 0) throwAborted(call);
  };
  throwIfAborted();
  if (transport_ != nullptr && transport_->failed()) {
    throwIfAborted();
    // Usually a peer died and its sockets closed first: name it if so.
    for (int q = 0; q < size_; ++q) {
      const pid_t pid = control(q).pid.load(std::memory_order_acquire);
      if (q != rank_ && pid > 0 && pid != ::getpid() && !processAlive(pid)) {
        throwIfAborted();
        fail(call, q, detail::str("rank ", q, " (pid ", pid, ") died"), false);
      }
    }
    fail(call, -1, detail::str("the context was aborted: ", transportFailure()), false);
  }
  Control& ctl = control(peer);
  const pid_t pid = ctl.pid.load(std::memory_order_acquire);
  if (pid > 0 && pid != ::getpid() && !processAlive(pid)) {
    if (published()) return false;
    throwIfAborted();
    fail(call, peer,
         detail::str("rank ", peer, " (pid ", pid, ") died while rank ", rank_,
                     " waited for it to ", what),
         false);
  }
  if (ctl.closed.load(std::memory_order_acquire) != 0) {
    if (published()) return false;
    throwIfAborted();
    fail(call, peer,
         detail::str("rank ", peer, " destroyed its context while rank ", rank_,
                     " waited for it to ", what, " (mismatched collectives?)"),
         false);
  }
  if (armDeadline(call, nowNs()) <= 0) {
    fail(call, peer,
         detail::str("timed out after ", call.timeout.count(), " ms waiting for rank ", peer,
                     " to ", what, " (", call.bytes - std::min(call.done, call.bytes), " of ",
                     call.bytes, " bytes outstanding)"),
         true);
  }
  return true;
}

int64_t Arena::armDeadline(const Call& call, int64_t now) {
  if (call.deadlineNs == 0) {
    call.deadlineNs =
        now + std::chrono::duration_cast<std::chrono::nanoseconds>(call.timeout).count();
  }
  return call.deadlineNs - now;
}

void Arena::waitFor(const Call& call, int peer, const std::atomic<uint64_t>& value, uint64_t target,
                    const char* what, const std::atomic<uint64_t>* other, uint64_t altTarget) {
  Control& ctl = control(peer);
  const auto ready = [&] {
    return value.load(std::memory_order_acquire) >= target ||
           (other != nullptr && other->load(std::memory_order_acquire) >= altTarget);
  };
  if (ready()) return;
  // Spinning is futile while the awaited rank last ran on our own CPU (a loaded machine put
  // both ranks on one core): then give the core away almost at once.
  const bool sameCpu = ctl.cpu.load(std::memory_order_relaxed) == ::sched_getcpu();
  if (!sameCpu) {
    for (int i = 0; i < kPreSpinPauses; ++i) {
      LOOM_SHM_PAUSE();
      if (ready()) return;
    }
  }
  const int64_t spinNs = sameCpu ? kSameCpuSpinNs : spinNs_;
  const int64_t start = nowNs();
  armDeadline(call, start);
  for (int64_t now = start; now - start < spinNs; now = nowNs()) {
    for (int i = 0; i < 64; ++i) {
      LOOM_SHM_PAUSE();
      if (ready()) return;
    }
  }
  for (int64_t now = nowNs(); now - start < spinNs + yieldNs_; now = nowNs()) {
    ::sched_yield();
    if (ready()) return;
  }
  for (;;) {
    LOOM_NOISE();  // the peer may publish, finish and close between the last look and the check
    if (!checkHealth(call, peer, what, &value, target, other, altTarget)) return;
    header_->sleepers.fetch_add(1);
    const uint32_t seen = ctl.wake.load();
    if (ready()) {
      header_->sleepers.fetch_sub(1);
      return;
    }
    futexWait(&ctl.wake, seen, 20 * 1000 * 1000);  // 20 ms: the health checks' period
    header_->sleepers.fetch_sub(1);
    if (ready()) return;
  }
}

void Arena::publish(int counter, uint64_t value) {
  LOOM_NOISE();
  control(rank_).counters[counter].store(value, std::memory_order_release);
  announce();
}

void Arena::announce() {
  Control& ctl = control(rank_);
  // Stored only when it changed: the line stays shared in the waiters' caches.
  const int cpu = ::sched_getcpu();
  if (ctl.cpu.load(std::memory_order_relaxed) != cpu) ctl.cpu.store(cpu, std::memory_order_relaxed);
  ctl.wake.fetch_add(1);
  if (header_->sleepers.load() > 0) futexWakeAll(&ctl.wake);
}

void Arena::acquireSlot(const Call& call) {
  if (step_ < kSlots) return;
  // Done with step_ - kSlots: posted step_ - 1 (its previous box says step_), or consumed
  // step_ - kSlots. The box comes first: this rank read that line in the previous step and
  // the peer has not written it since, so the check is a cache hit.
  const int previous = slotOf(step_ - 1);
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) {
      const Control& ctl = control(q);
      waitFor(call, q, ctl.box[previous].posted, step_, kCounterNames[kConsumed],
              &ctl.counters[kConsumed], step_ - kSlots + 1);
    }
  }
}

void Arena::post(const Call& call) {
  Control& mine = control(rank_);
  const int s = slotOf(step_);
  mine.postedSeq[s] = call.seq;
  mine.postedBytes[s] = call.bytes;
  mine.postedKind[s] = call.kind;
  Box& box = mine.box[s];
  LOOM_NOISE();
  box.signature = call.signature.word;
  box.signatureExtra = static_cast<uint32_t>(call.signature.extra);
  box.access = static_cast<uint16_t>(call.access);
  box.variant = static_cast<uint16_t>(call.variant);
  box.posted.store(step_ + 1, std::memory_order_release);
  announce();
}

void Arena::waitPosted(const Call& call, int peer) {
  const Control& theirs = control(peer);
  const int s = slotOf(step_);
  const Box& box = theirs.box[s];
  waitFor(call, peer, box.posted, step_ + 1, kPostWhat);
  // Both words in the box's one line: counts compare in 64 bits for one more compare.
  if (box.signature != call.signature.word ||
      box.signatureExtra != static_cast<uint32_t>(call.signature.extra) ||
      box.access != static_cast<uint16_t>(call.access)) [[unlikely]] {
    checkPostedBox(call, peer);  // names the difference
  }
}

void Arena::waitPostedAll(const Call& call) {
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) waitPosted(call, q);
  }
}

uint32_t Arena::postedVariant(int peer) const {
  return control(peer).box[slotOf(step_)].variant;
}

void Arena::markReduced() {
  publish(kReduced, step_ + 1);
}

void Arena::waitReduced(const Call& call, int peer) {
  if (peer != rank_) {
    waitFor(call, peer, control(peer).counters[kReduced], step_ + 1, kCounterNames[kReduced]);
  }
}

void Arena::waitReducedAll(const Call& call) {
  for (int q = 0; q < size_; ++q) waitReduced(call, q);
}

void Arena::finishStep(bool announce) {
  if (announce) publish(kConsumed, step_ + 1);
  ++step_;
}

void Arena::waitFinishedAll(const Call& call) {
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) {
      waitFor(call, q, control(q).counters[kConsumed], step_, kCounterNames[kConsumed]);
    }
  }
}

// ---- helper threads (copy_helpers.h) ----

CopyHelpers::CopyHelpers(int threads, const std::atomic<uint32_t>* aborted, int64_t spinNs,
                         int64_t yieldNs)
    : aborted_(aborted), spinNs_(spinNs), yieldNs_(yieldNs), owner_(::getpid()) {
  threads = std::clamp(threads, 0, kMaxThreads);
  threads_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) {
    try {
      threads_.emplace_back([this, i] { loop(i); });
    } catch (const std::exception& e) {
      LOOM_LOG_WARNING("shared memory: started ", i, " of ", threads,
                       " helper threads for the staged copies (", e.what(),
                       "); the rank runs with those");
      break;
    }
  }
}

CopyHelpers::~CopyHelpers() {
  if (::getpid() != owner_) {
    // A forked child: the threads are the parent's; nothing to join (and join would fail).
    new std::vector<std::thread>(std::move(threads_));  // leaked on purpose
    return;
  }
  stop_.store(true);
  task_.fetch_add(1u << 8);
  futexWakeAll(&task_, false);
  for (std::thread& t : threads_) t.join();
}

int CopyHelpers::threads() const {
  return ::getpid() == owner_ ? static_cast<int>(threads_.size()) : 0;
}

void CopyHelpers::start(int parts, Part part, void* context) {
  part_ = part;
  context_ = context;
  waited_ = static_cast<uint32_t>(parts - 1);
  cancel_.store(false, std::memory_order_relaxed);
  incomplete_.store(false, std::memory_order_relaxed);
  finished_.store(0, std::memory_order_relaxed);
  const uint32_t generation = (task_.load(std::memory_order_relaxed) >> 8) + 1;
  task_.store(generation << 8 | static_cast<uint32_t>(parts));  // seq_cst: see loop()
  if (idleSleepers_.load() > 0) futexWakeAll(&task_, false);
}

bool CopyHelpers::waitFinished(int64_t timeoutNs) {
  const auto done = [&] { return finished_.load(std::memory_order_acquire) >= waited_; };
  if (done()) return true;
  const int64_t start = nowNs();
  for (int64_t now = start; now - start < std::min(spinNs_, timeoutNs); now = nowNs()) {
    for (int i = 0; i < 64; ++i) {
      LOOM_SHM_PAUSE();
      if (done()) return true;
    }
  }
  for (int64_t now = nowNs(); now - start < std::min(spinNs_ + yieldNs_, timeoutNs);
       now = nowNs()) {
    ::sched_yield();
    if (done()) return true;
  }
  for (int64_t now = nowNs(); now - start < timeoutNs; now = nowNs()) {
    const uint32_t seen = finished_.load();
    callerSleeps_.fetch_add(1);
    if (!done())
      futexWait(&finished_, seen, std::min<int64_t>(timeoutNs - (now - start), 20'000'000), false);
    callerSleeps_.fetch_sub(1);
    if (done()) return true;
  }
  return done();
}

void CopyHelpers::loop(int index) {
  // The default floating-point environment, whatever the thread that made the helpers had (a
  // thread inherits its creator's): the reductions run here must round as the caller's own
  // code in reproducible.cc expects (round to nearest, no flush-to-zero).
  std::fesetenv(FE_DFL_ENV);
  uint32_t seen = 0;
  for (;;) {
    // Wait for the next task: spin, yield, then sleep (50 ms at a time, so that a stop is seen
    // even if a wake-up were lost).
    uint32_t now = task_.load(std::memory_order_acquire);
    if (now == seen && !stop_.load(std::memory_order_relaxed)) {
      const int64_t start = nowNs();
      for (int64_t t = start; now == seen && t - start < spinNs_; t = nowNs()) {
        for (int i = 0; i < 64 && now == seen; ++i) {
          LOOM_SHM_PAUSE();
          now = task_.load(std::memory_order_acquire);
        }
      }
      for (int64_t t = nowNs(); now == seen && t - start < spinNs_ + yieldNs_; t = nowNs()) {
        ::sched_yield();
        now = task_.load(std::memory_order_acquire);
      }
      while (now == seen && !stop_.load(std::memory_order_relaxed)) {
        // seq_cst with start(): either it sees this sleeper or the load below sees its task.
        idleSleepers_.fetch_add(1);
        now = task_.load();
        if (now == seen) futexWait(&task_, seen, 50'000'000, false);
        idleSleepers_.fetch_sub(1);
        now = task_.load(std::memory_order_acquire);
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = now;
    const int parts = static_cast<int>(now & 0xff);
    if (index + 1 >= parts) continue;  // not part of this task
    if (!part_(context_, index + 1, parts)) incomplete_.store(true, std::memory_order_relaxed);
    fenceStreams();          // the part's non-temporal stores, before the caller is told
    finished_.fetch_add(1);  // seq_cst: see waitFinished()
    if (callerSleeps_.load() > 0) futexWakeAll(&finished_, false);
  }
}

int Arena::partsFor(size_t bytes) const {
  if (copyThreads_ == 0) return 1;
  const size_t parts = std::max<size_t>(1, bytes / kHelperMinPartBytes);
  return static_cast<int>(std::min<size_t>(parts, static_cast<size_t>(copyThreads_) + 1));
}

int Arena::helperThreadsRunning() const {
  return helpers_ != nullptr ? helpers_->threads() : 0;
}

bool Arena::partsStopped() const {
  return helpers_ != nullptr ? helpers_->stopRequested()
                             : header_->aborted.load(std::memory_order_relaxed) != 0;
}

void Arena::runParallel(const Call& call, int parts, CopyHelpers::Part part, void* context) {
  if (parts > 1 && helpers_ == nullptr) {
    helpers_ =
        std::make_unique<CopyHelpers>(copyThreads_, &header_->aborted, helperSpinNs_, yieldNs_);
  }
  parts = helpers_ != nullptr ? std::min(parts, helpers_->threads() + 1) : 1;
  if (parts <= 1) {
    if (part(context, 0, 1)) return;
    checkHealth(call, rank_, "copy");  // throws: the group failed (the only reason to stop)
    fail(call, rank_, "a copy stopped without a reason", false);
  }
  helpers_->start(parts, part, context);
  const bool mine = part(context, 0, parts);
  bool timedOut = false;
  // The helpers only copy local memory: they finish within microseconds to milliseconds. The
  // wait still has the call's deadline and watches the group's abort flag (the parts stop at
  // their next check once it is set, so the wait ends soon after either).
  while (!helpers_->waitFinished(20'000'000)) {
    if (header_->aborted.load(std::memory_order_relaxed) != 0) continue;  // they are stopping
    if (!timedOut && armDeadline(call, nowNs()) <= 0) {
      timedOut = true;
      helpers_->cancel();
    }
  }
  if (mine && helpers_->complete() && !timedOut) return;
  if (timedOut) {
    fail(call, rank_,
         detail::str("timed out after ", call.timeout.count(), " ms waiting for rank ", rank_,
                     "'s helper threads (LOOM_SHM_COPY_THREADS) to finish a copy"),
         true);
  }
  checkHealth(call, rank_, "copy");  // throws: the group failed (the only reason to stop)
  fail(call, rank_, "a helper thread stopped a copy without a reason", false);
}

}  // namespace loom::comm::shm
