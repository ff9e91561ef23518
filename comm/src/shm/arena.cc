#include "shm/arena.h"

#include "shm/os.h"
#include "shm/segment.h"
#include "shm/window_registry.h"
#include "signature.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
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
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "loom/comm/transport.h"
#include "loom/comm/window.h"
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
constexpr uint32_t kVersion = 1;
constexpr size_t kPage = 4096;
constexpr int64_t kSameCpuSpinNs = 2000;
constexpr int kPosted = 0, kReduced = 1, kConsumed = 2;
const char* const kCounterNames[] = {"post its data", "finish its reduction", "finish reading"};

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string namespaceId(const char* path) {
  char buf[128];
  const ssize_t n = ::readlink(path, buf, sizeof(buf) - 1);
  if (n <= 0) return "?";
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

struct Arena::Header {
  uint64_t magic;
  uint32_t version;
  int32_t size;
  uint64_t slotBytes;
  uint64_t perRankBytes;
  // 0 = healthy, 1 = an abort is being written, 2 = aborted (reason valid).
  alignas(64) std::atomic<uint32_t> aborted;
  int32_t blamedRank;
  int32_t abortingRank;
  char reason[512];
  alignas(64) std::atomic<uint32_t> sleepers;
};

struct Arena::Control {
  // posted / reduced / consumed: (last step done) + 1, written only by the owning rank.
  alignas(64) std::atomic<uint64_t> counters[3];
  // Bumped on every publish; sleepers FUTEX_WAIT on it.
  std::atomic<uint32_t> wake;
  std::atomic<int32_t> pid;
  std::atomic<int32_t> cpu;  // where the rank last published (sched_getcpu)
  std::atomic<uint32_t> closed;
  uint64_t signature[kSlots];
  // What the rank posted in each slot, for mismatch messages.
  uint64_t postedSeq[kSlots];
  uint64_t postedBytes[kSlots];
  uint32_t postedKind[kSlots];
  // The user buffers (in, out) of the single-copy step in each slot, as addresses in the
  // owner's process.
  uint64_t buffers[kSlots][2];
  // The access mode posted for each slot (PeerAccess), checked like the signature.
  uint32_t postedAccess[kSlots];
  // On the window path: the Windows holding those buffers (window.h), in the owner's process.
  uint64_t windowId[kSlots][2];
  int32_t windowFd[kSlots][2];
  uint64_t windowBase[kSlots][2];
  uint64_t windowBytes[kSlots][2];
};

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
      mappings_(static_cast<size_t>(size)) {}

Arena::~Arena() {
  for (auto& peer : mappings_) {
    for (const Mapping& m : peer) ::munmap(m.local, m.bytes);
  }
  control(rank_).closed.store(1, std::memory_order_release);
  control(rank_).wake.fetch_add(1);
  if (header_->sleepers.load() > 0) futexWakeAll(&control(rank_).wake);
}

const std::string& Arena::segmentName() const {
  return segment_->name();
}

Arena::Control& Arena::control(int rank) const {
  return *reinterpret_cast<Control*>(static_cast<uint8_t*>(base_) + kPage +
                                     rank * header_->perRankBytes);
}

uint8_t* Arena::slot(int rank, uint64_t step) {
  return static_cast<uint8_t*>(base_) + kPage + rank * header_->perRankBytes + kPage +
         slotOf(step) * slotBytes_;
}

void Arena::abort(int blamedRank, const std::string& reason) {
  uint32_t expected = 0;
  if (header_->aborted.compare_exchange_strong(expected, 1)) {
    header_->blamedRank = blamedRank;
    header_->abortingRank = rank_;
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
  abort(peer, message);
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

void Arena::checkUsable(const Call& call) {
  if (header_->aborted.load(std::memory_order_relaxed) != 0 ||
      (transport_ != nullptr && transport_->failed())) {
    checkHealth(call, rank_, "start");
  }
}

bool Arena::checkHealth(const Call& call, int peer, const char* what,
                        const std::atomic<uint64_t>* counter, uint64_t target) {
  // A peer publishes its counter before it closes or exits, so once it is seen gone, one more
  // read of the counter tells a finished peer from a failed one.
  auto published = [&] {
    return counter != nullptr && counter->load(std::memory_order_acquire) >= target;
  };
  const uint32_t aborted = header_->aborted.load(std::memory_order_acquire);
  if (aborted != 0) {
    for (int i = 0; i < 1000000 && header_->aborted.load(std::memory_order_acquire) != 2; ++i) {
      LOOM_SHM_PAUSE();
    }
    const std::string reason = header_->reason;
    const std::string message = detail::str(
        "rank ", rank_, ": ", call.name(), ": the shared-memory group failed (rank ",
        header_->abortingRank, " reported, blaming rank ", header_->blamedRank, "): ", reason);
    if (transport_ != nullptr) transport_->abort(message);
    throw IoError(message);
  }
  if (transport_ != nullptr && transport_->failed()) {
    // Usually a peer died and its sockets closed first: name it if so.
    for (int q = 0; q < size_; ++q) {
      const pid_t pid = control(q).pid.load(std::memory_order_acquire);
      if (q != rank_ && pid > 0 && pid != ::getpid() && !processAlive(pid)) {
        fail(call, q, detail::str("rank ", q, " (pid ", pid, ") died"), false);
      }
    }
    fail(call, -1, detail::str("the context was aborted: ", transportFailure()), false);
  }
  Control& ctl = control(peer);
  const pid_t pid = ctl.pid.load(std::memory_order_acquire);
  if (pid > 0 && pid != ::getpid() && !processAlive(pid)) {
    if (published()) return false;
    fail(call, peer,
         detail::str("rank ", peer, " (pid ", pid, ") died while rank ", rank_,
                     " waited for it to ", what),
         false);
  }
  if (ctl.closed.load(std::memory_order_acquire) != 0) {
    if (published()) return false;
    fail(call, peer,
         detail::str("rank ", peer, " destroyed its context while rank ", rank_,
                     " waited for it to ", what, " (mismatched collectives?)"),
         false);
  }
  if (call.deadline.expired()) {
    fail(call, peer,
         detail::str("timed out after ", call.timeout.count(), " ms waiting for rank ", peer,
                     " to ", what, " (", call.bytes - std::min(call.done, call.bytes), " of ",
                     call.bytes, " bytes outstanding)"),
         true);
  }
  return true;
}

void Arena::waitCounter(const Call& call, int peer, int counter, uint64_t target,
                        const char* what) {
  Control& ctl = control(peer);
  std::atomic<uint64_t>& value = ctl.counters[counter];
  if (value.load(std::memory_order_acquire) >= target) return;
  // Spinning is futile while the awaited rank last ran on our own CPU (a loaded machine put
  // both ranks on one core): then give the core away almost at once.
  const int64_t spinNs =
      ctl.cpu.load(std::memory_order_relaxed) == ::sched_getcpu() ? kSameCpuSpinNs : spinNs_;
  const int64_t start = nowNs();
  for (int64_t now = start; now - start < spinNs; now = nowNs()) {
    for (int i = 0; i < 64; ++i) {
      LOOM_SHM_PAUSE();
      if (value.load(std::memory_order_acquire) >= target) return;
    }
  }
  for (int64_t now = nowNs(); now - start < spinNs + yieldNs_; now = nowNs()) {
    ::sched_yield();
    if (value.load(std::memory_order_acquire) >= target) return;
  }
  for (;;) {
    if (!checkHealth(call, peer, what, &value, target)) return;
    header_->sleepers.fetch_add(1);
    const uint32_t seen = ctl.wake.load();
    if (value.load(std::memory_order_acquire) >= target) {
      header_->sleepers.fetch_sub(1);
      return;
    }
    futexWait(&ctl.wake, seen, 20 * 1000 * 1000);  // 20 ms: the health checks' period
    header_->sleepers.fetch_sub(1);
    if (value.load(std::memory_order_acquire) >= target) return;
  }
}

void Arena::publish(int counter, uint64_t value) {
  Control& ctl = control(rank_);
  ctl.cpu.store(::sched_getcpu(), std::memory_order_relaxed);
  ctl.counters[counter].store(value, std::memory_order_release);
  ctl.wake.fetch_add(1);
  if (header_->sleepers.load() > 0) futexWakeAll(&ctl.wake);
}

void Arena::acquireSlot(const Call& call) {
  if (step_ < kSlots) return;
  const uint64_t target = step_ - kSlots + 1;
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) waitCounter(call, q, kConsumed, target, kCounterNames[kConsumed]);
  }
}

void Arena::post(const Call& call) {
  Control& mine = control(rank_);
  const int s = slotOf(step_);
  mine.signature[s] = call.signature;
  mine.postedSeq[s] = call.seq;
  mine.postedBytes[s] = call.bytes;
  mine.postedKind[s] = call.kind;
  mine.postedAccess[s] = static_cast<uint32_t>(call.access);
  publish(kPosted, step_ + 1);
}

void Arena::waitPosted(const Call& call, int peer) {
  waitCounter(call, peer, kPosted, step_ + 1, kCounterNames[kPosted]);
  const Control& theirs = control(peer);
  const int s = slotOf(step_);
  if (theirs.signature[s] != call.signature) {
    const std::string other = detail::str(opTypeName(static_cast<OpType>(theirs.postedKind[s])),
                                          "#", theirs.postedSeq[s]);
    failMismatch(call, peer,
                 detail::str("mismatched collectives: rank ", rank_, " is in ", call.name(), " (",
                             call.bytes, " bytes): ", describeSignature(call.signature), ", rank ",
                             peer, " in ", other, " (", theirs.postedBytes[s],
                             " bytes): ", describeSignature(theirs.signature[s]),
                             "; the ranks called different collectives or passed different "
                             "arguments (count, dtype, op or root)"));
  }
  if (theirs.postedAccess[s] != static_cast<uint32_t>(call.access)) {
    failMismatch(
        call, peer,
        detail::str("rank ", rank_, " takes the ", peerAccessName(call.access), " path and rank ",
                    peer, " the ", peerAccessName(static_cast<PeerAccess>(theirs.postedAccess[s])),
                    " path for the same collective; every rank must pass buffers inside Loom "
                    "Windows (loom/comm/window.h), or none"));
  }
}

void Arena::waitPostedAll(const Call& call) {
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) waitPosted(call, q);
  }
}

void Arena::markReduced() {
  publish(kReduced, step_ + 1);
}

void Arena::waitReduced(const Call& call, int peer) {
  if (peer != rank_) waitCounter(call, peer, kReduced, step_ + 1, kCounterNames[kReduced]);
}

void Arena::waitReducedAll(const Call& call) {
  for (int q = 0; q < size_; ++q) waitReduced(call, q);
}

void Arena::finishStep() {
  publish(kConsumed, step_ + 1);
  ++step_;
}

void Arena::waitFinishedAll(const Call& call) {
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) waitCounter(call, q, kConsumed, step_, kCounterNames[kConsumed]);
  }
}

namespace {

// Reads `bytes` at `remote` in process `pid` into `local`; "" on success, else why not.
std::string readRemote(pid_t pid, uint64_t remote, void* local, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec mine{static_cast<uint8_t*>(local) + done, bytes - done};
    iovec theirs{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = ::process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::strerror(errno);
    if (n == 0) return "no bytes could be read (the address range ended)";
    done += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

namespace {

// A setup probe's exchange: publishes this rank's value under `prefix`<rank>, waits for every
// rank's and returns them in rank order.
std::vector<Bytes> publishProbe(Store& store, const std::string& prefix, int rank, int size,
                                const std::string& mine, std::chrono::milliseconds timeout) {
  store.set(detail::str(prefix, rank), mine);
  std::vector<std::string> keys;
  for (int q = 0; q < size; ++q) keys.push_back(detail::str(prefix, q));
  store.wait(keys, timeout);
  return store.multiGet(keys);
}

// A setup probe's agreement: publishes this rank's answer ("ok", or why not) under
// `prefix`ok/<rank>, waits for every rank's, and returns the first answer that is not "ok" (""
// when every rank said ok), so that every rank decides alike.
std::string agreeOnProbe(Store& store, const std::string& prefix, int rank, int size,
                         const std::string& failure, std::chrono::milliseconds timeout) {
  for (const Bytes& answer : publishProbe(store, prefix + "ok/", rank, size,
                                          failure.empty() ? std::string("ok") : failure, timeout)) {
    if (toString(answer) != "ok") return toString(answer);
  }
  return "";
}

}  // namespace

void Arena::probeSingleCopy(Store& store, const ArenaOptions& options) {
  const bool off = options.singleCopy == ShmSingleCopy::kOff;
  // Yama's ptrace_scope 1 lets only ancestors read a process; the ranks are siblings. EINVAL
  // (no yama) is fine.
  if (!off) (void)::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  probeWord_ = mix64(static_cast<uint64_t>(nowNs()) ^ (uint64_t(::getpid()) << 20) ^
                     uint64_t(rank_) ^ reinterpret_cast<uintptr_t>(this)) |
               1;
  // Every rank publishes "pid address word mode" (a rank with the path off publishes "off"),
  // reads every peer's word, and answers "ok" or why not; the path is on when every answer is
  // "ok", and forced to every size when every rank asked for that.
  const std::string prefix = options.keyPrefix + "/single-copy/";
  const bool forced = options.singleCopy == ShmSingleCopy::kOn;
  const std::vector<Bytes> peers =
      publishProbe(store, prefix, rank_, size_,
                   off ? std::string("off")
                       : detail::str(::getpid(), " ", reinterpret_cast<uintptr_t>(&probeWord_), " ",
                                     probeWord_, forced ? " on" : " auto"),
                   options.timeout);
  std::string failure = off ? detail::str("rank ", rank_, " has LOOM_SHM_SINGLE_COPY=off") : "";
  bool allForced = true;
  for (int q = 0; q < size_ && failure.empty(); ++q) {
    long long pid = 0;
    unsigned long long address = 0, word = 0, seen = 0;
    std::string mode;
    std::istringstream in(toString(peers[q]));
    if (toString(peers[q]) == "off") {
      failure = detail::str("rank ", q, " has LOOM_SHM_SINGLE_COPY=off");
    } else if (!(in >> pid >> address >> word >> mode)) {
      failure = detail::str("rank ", q, " published '", toString(peers[q]),
                            "'; expected 'pid address word mode'");
    }
    if (!failure.empty()) break;
    allForced = allForced && mode == "on";
    if (q == rank_) continue;
    const std::string why = readRemote(static_cast<pid_t>(pid), address, &seen, sizeof(seen));
    if (!why.empty()) {
      failure = detail::str("rank ", rank_, " could not read rank ", q, "'s memory (pid ", pid,
                            ") with process_vm_readv: ", why);
    } else if (seen != word) {
      failure = detail::str("rank ", rank_, " read ", seen, " from rank ", q,
                            "'s probe word, expected ", word);
    }
  }
  singleCopyFailure_ = agreeOnProbe(store, prefix, rank_, size_, failure, options.timeout);
  singleCopy_ = singleCopyFailure_.empty();
  singleCopyForced_ = singleCopy_ && allForced;
  if (!singleCopy_ && rank_ == 0 && !off) {
    if (forced) {
      LOOM_LOG_WARNING("shared memory: single copy was forced on (LOOM_SHM_SINGLE_COPY=on) but ",
                       singleCopyFailure_, "; every rank of the group uses the staged path");
    } else {
      LOOM_LOG_INFO("shared memory: single copy off (", singleCopyFailure_,
                    "); every rank of the group uses the staged path");
    }
  }
}

void Arena::publishBuffers(const void* in, const void* out, const WindowRef* inWindow,
                           const WindowRef* outWindow) {
  Control& mine = control(rank_);
  const int s = slotOf(step_);
  mine.buffers[s][0] = reinterpret_cast<uintptr_t>(in);
  mine.buffers[s][1] = reinterpret_cast<uintptr_t>(out);
  const WindowRef none;
  const WindowRef* windows[2] = {inWindow != nullptr ? inWindow : &none,
                                 outWindow != nullptr ? outWindow : &none};
  for (int which = 0; which < 2; ++which) {
    mine.windowId[s][which] = windows[which]->id;
    mine.windowFd[s][which] = windows[which]->fd;
    mine.windowBase[s][which] = windows[which]->base;
    mine.windowBytes[s][which] = windows[which]->bytes;
  }
}

uint64_t Arena::peerBuffer(int peer, int which) const {
  return control(peer).buffers[slotOf(step_)][which];
}

void Arena::readPeer(const Call& call, int peer, uint64_t remote, void* local, size_t bytes) {
  if (bytes == 0) return;
  const pid_t pid = control(peer).pid.load(std::memory_order_acquire);
  const std::string why = readRemote(pid, remote, local, bytes);
  if (why.empty()) return;
  checkHealth(call, peer, "let its buffer be read");  // names a dead peer
  fail(call, peer,
       detail::str("reading ", bytes, " bytes of rank ", peer, "'s buffer (pid ", pid,
                   ") with process_vm_readv failed: ", why,
                   " (the setup probe had succeeded; LOOM_SHM_SINGLE_COPY=off keeps the group "
                   "on the staged path)"),
       false);
}

namespace {

// Maps window `ref` of process `pid` read-only; nullptr and `why` when it cannot.
uint8_t* mapPeerWindow(pid_t pid, const WindowRef& ref, std::string& why) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", static_cast<int>(pid), ref.fd);
  char link[256] = {};
  const ssize_t n = ::readlink(path, link, sizeof(link) - 1);
  const std::string expected = "/memfd:" + windowMemfdName(ref.id) + " ";
  if (n < 0) {
    why = detail::str("readlink ", path, ": ", std::strerror(errno));
    return nullptr;
  }
  if (std::string(link, static_cast<size_t>(n)).rfind(expected, 0) != 0) {
    why = detail::str(path, " is '", link, "', expected the memfd ", windowMemfdName(ref.id),
                      " (was the window freed during the collective?)");
    return nullptr;
  }
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    why = detail::str("open ", path, ": ", std::strerror(errno));
    return nullptr;
  }
  void* local = ::mmap(nullptr, ref.bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (local == MAP_FAILED) {
    why = detail::str("mmap of ", ref.bytes, " bytes of ", path, ": ", std::strerror(err));
    return nullptr;
  }
  (void)::madvise(local, ref.bytes, MADV_DONTFORK);
  return static_cast<uint8_t*>(local);
}

}  // namespace

void Arena::probeWindows(Store& store, const ArenaOptions& options) {
  // Every rank publishes "pid fd id bytes word" of a one-page probe Window (or "off"), maps
  // every peer's and reads its word, and answers "ok" or why not; on when every answer is ok.
  const std::string prefix = options.keyPrefix + "/windows/";
  windowMinBytes_ = options.windowMinBytes;
  oversubscribed_ = size_ > usableCpus();
  std::shared_ptr<Window> probe;
  std::optional<WindowRef> ref;
  std::string failure =
      options.windows ? "" : detail::str("rank ", rank_, " has LOOM_SHM_WINDOWS=off");
  const uint64_t word = mix64(static_cast<uint64_t>(nowNs()) ^ uint64_t(rank_) << 40) | 1;
  if (failure.empty()) {
    try {
      probe = Window::allocate(kPage);
      *static_cast<uint64_t*>(probe->data()) = word;
      ref = findWindow(probe->data(), kPage);
    } catch (const std::exception& e) {
      failure = detail::str("rank ", rank_, " cannot allocate a window: ", e.what());
    }
  }
  const std::vector<Bytes> peers = publishProbe(
      store, prefix, rank_, size_,
      !failure.empty()
          ? std::string("off")
          : detail::str(::getpid(), " ", ref->fd, " ", ref->id, " ", ref->bytes, " ", word),
      options.timeout);
  for (int q = 0; q < size_ && failure.empty(); ++q) {
    long long pid = 0;
    WindowRef theirs;
    unsigned long long expected = 0;
    std::istringstream in(toString(peers[q]));
    if (toString(peers[q]) == "off") {
      failure = detail::str("rank ", q, " has the window path off");
      break;
    }
    if (!(in >> pid >> theirs.fd >> theirs.id >> theirs.bytes >> expected)) {
      failure = detail::str("rank ", q, " published '", toString(peers[q]),
                            "'; expected 'pid fd id bytes word'");
      break;
    }
    if (q == rank_) continue;
    std::string why;
    uint8_t* local = mapPeerWindow(static_cast<pid_t>(pid), theirs, why);
    if (local == nullptr) {
      failure = detail::str("rank ", rank_, " could not map rank ", q, "'s probe window: ", why);
      break;
    }
    const uint64_t seen = *reinterpret_cast<const uint64_t*>(local);
    ::munmap(local, theirs.bytes);
    if (seen != expected) {
      failure = detail::str("rank ", rank_, " read ", seen, " from rank ", q,
                            "'s probe window, expected ", expected);
    }
  }
  windowsFailure_ = agreeOnProbe(store, prefix, rank_, size_, failure, options.timeout);
  windows_ = windowsFailure_.empty();
  if (!windows_ && rank_ == 0 && options.windows) {
    LOOM_LOG_INFO("shared memory: zero-copy windows off (", windowsFailure_,
                  "); window buffers take the staged path on every rank");
  }
}

const uint8_t* Arena::peerWindow(const Call& call, int peer, int which) {
  const Control& theirs = control(peer);
  const int s = slotOf(step_);
  const uint64_t address = theirs.buffers[s][which];
  WindowRef ref;
  ref.id = theirs.windowId[s][which];
  ref.fd = theirs.windowFd[s][which];
  ref.base = theirs.windowBase[s][which];
  ref.bytes = theirs.windowBytes[s][which];
  const pid_t pid = theirs.pid.load(std::memory_order_acquire);
  if (ref.id == 0 || address < ref.base || address - ref.base >= ref.bytes) {
    fail(call, peer,
         detail::str("rank ", peer, " posted the window path without a window for buffer ", which,
                     " (address ", address, ", window ", ref.id, ")"),
         false);
  }
  // Threads as ranks map each other's windows too (through /proc/<own pid>/fd), as they map the
  // arena: every rank reads shared memory through its own mapping, so the ordering the arena's
  // counters give (each rank's own view of them) covers the windows alike.
  auto& mine = mappings_[static_cast<size_t>(peer)];
  ++useClock_;
  for (Mapping& m : mine) {
    if (m.id == ref.id) {
      m.lastUse = useClock_;
      return m.local + (address - ref.base);
    }
  }
  std::string why;
  uint8_t* local = mapPeerWindow(pid, ref, why);
  if (local == nullptr) {
    checkHealth(call, peer, "let its window be mapped");  // names a dead peer
    fail(call, peer,
         detail::str("mapping rank ", peer, "'s window ", ref.id, " (", ref.bytes, " bytes, pid ",
                     pid, ") failed: ", why,
                     " (the setup probe had succeeded; LOOM_SHM_WINDOWS=off keeps the group on "
                     "the staged path)"),
         false);
  }
  if (mine.size() >= kPeerMappings) {
    auto oldest =
        std::min_element(mine.begin(), mine.end(),
                         [](const Mapping& a, const Mapping& b) { return a.lastUse < b.lastUse; });
    ::munmap(oldest->local, oldest->bytes);
    mine.erase(oldest);
  }
  mine.push_back(Mapping{ref.id, local, ref.bytes, useClock_});
  return local + (address - ref.base);
}

void Arena::copyFromPeer(const Call& call, int peer, int which, size_t offset, void* local,
                         size_t bytes) {
  if (bytes == 0) return;
  if (call.access == PeerAccess::kWindow) {
    std::memcpy(local, peerWindow(call, peer, which) + offset, bytes);
  } else {
    readPeer(call, peer, peerBuffer(peer, which) + offset, local, bytes);
  }
}

uint8_t* Arena::bounce() {
  if (bounce_ == nullptr) {
    void* p = std::aligned_alloc(64, kBounceBytes);
    LOOM_CHECK(p != nullptr, "rank ", rank_, ": cannot allocate ", kBounceBytes,
               " bytes of single-copy scratch");
    bounce_ = {static_cast<uint8_t*>(p), std::free};
  }
  return bounce_.get();
}

}  // namespace loom::comm::shm
