// The arena's access to peers' user buffers (arena.h): the setup probes of the single-copy
// path (process_vm_readv) and of zero-copy windows, publishing a step's buffers, and reading
// them (readPeer, peerWindow, copyFromPeer). The steps and counters are in arena.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/window.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"
#include "shm/arena.h"
#include "shm/arena_layout.h"
#include "shm/os.h"
#include "shm/ptrace.h"
#include "shm/stream_copy.h"
#include "shm/window_registry.h"

namespace loom::comm::shm {

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
  struct Entry {
    long long pid = 0;
    unsigned long long address = 0, word = 0;
  };
  std::vector<Entry> entries(static_cast<size_t>(size_));
  for (int q = 0; q < size_ && failure.empty(); ++q) {
    Entry& e = entries[static_cast<size_t>(q)];
    std::string mode;
    std::istringstream in(toString(peers[q]));
    if (toString(peers[q]) == "off") {
      failure = detail::str("rank ", q, " has LOOM_SHM_SINGLE_COPY=off");
    } else if (!(in >> e.pid >> e.address >> e.word >> mode)) {
      failure = detail::str("rank ", q, " published '", toString(peers[q]),
                            "'; expected 'pid address word mode'");
    }
    allForced = allForced && mode == "on";
  }
  // Where Yama (ptrace_scope 1) lets only ancestors read a process, every rank names its
  // readers (ptrace.h: the one peer, or the peers' nearest common ancestor; never any process)
  // and the ranks meet once more before anyone reads. Alike on every rank: one kernel, and the
  // failure so far comes from what every rank read. The name stays only while the single copy
  // is in use (allowPeerReads).
  readerPids_.clear();
  for (const Entry& e : entries) readerPids_.push_back(static_cast<pid_t>(e.pid));
  ptracerNeeded_ = ptracerNeeded();
  if (failure.empty() && ptracerNeeded_) {
    // Held before anything can throw: ~Arena ends it on every way out.
    const std::string why = grantReads(readerPids_, readGrant_);
    if (!why.empty()) failure = detail::str("rank ", rank_, ": ", why);
    publishProbe(store, prefix + "ptracer/", rank_, size_, why.empty() ? "set" : "none",
                 options.timeout);
  }
  for (int q = 0; q < size_ && failure.empty(); ++q) {
    if (q == rank_) continue;
    const Entry& e = entries[static_cast<size_t>(q)];
    unsigned long long seen = 0;
    const std::string why = readRemote(static_cast<pid_t>(e.pid), e.address, &seen, sizeof(seen));
    if (!why.empty()) {
      failure = detail::str("rank ", rank_, " could not read rank ", q, "'s memory (pid ", e.pid,
                            ") with process_vm_readv: ", why,
                            yamaPtraceScope() >= 2
                                ? detail::str(" (Yama ptrace_scope ", yamaPtraceScope(),
                                              " forbids it; naming a reader cannot help)")
                                : std::string());
    } else if (seen != e.word) {
      failure = detail::str("rank ", rank_, " read ", seen, " from rank ", q,
                            "'s probe word, expected ", e.word);
    }
  }
  singleCopyFailure_ = agreeOnProbe(store, prefix, rank_, size_, failure, options.timeout);
  singleCopy_ = singleCopyFailure_.empty();
  singleCopyForced_ = singleCopy_ && allForced;
  // Forced on, the path is in use from the first collective: the name stays. Otherwise it is
  // withdrawn now and given again only if a collective takes the single copy (allowPeerReads).
  if (!singleCopyForced_) {
    endGrant(readGrant_);
    readGrant_ = 0;
  }
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

void Arena::allowPeerReads() {
  if (readGrant_ != 0 || !singleCopy_ || !ptracerNeeded_) return;
  // The probe named the same readers a moment ago; a failure now is reported by the reader.
  const std::string why = grantReads(readerPids_, readGrant_);
  if (!why.empty()) LOOM_LOG_WARNING("shared memory: rank ", rank_, ": ", why);
}

void Arena::publishBuffers(const void* in, const void* out, const WindowRef* inWindow,
                           const WindowRef* outWindow) {
  // Peers read these buffers with process_vm_readv unless they map their Windows.
  if (inWindow == nullptr) allowPeerReads();
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

void Arena::probeWindows(Store& store, const ArenaOptions& options) {
  // Every rank publishes "pid fd id bytes word" of a one-page probe Window (or "off"), maps
  // every peer's and reads its word, and answers "ok" or why not; on when every answer is ok.
  const std::string prefix = options.keyPrefix + "/windows/";
  windowMinBytes_ = options.windowMinBytes;
  cpus_ = usableCpus();
  oversubscribed_ = size_ > cpus_;
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

uint8_t* Arena::peerWindowForWrite(const Call& call, int peer, int which) {
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
                         size_t bytes, bool stream) {
  if (bytes == 0) return;
  if (call.access == PeerAccess::kWindow) {
    copyOut(local, peerWindow(call, peer, which) + offset, bytes, stream);
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
