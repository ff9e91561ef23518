// ShmTransport's private pieces shared by its .cc files: the segment layout (header, per-rank
// control block, rings), the request object and the ring copies (shm_transport.h says how
// they work together).
#pragma once

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
#include "request_core.h"
#include "shm/os.h"
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

namespace p2p {

inline constexpr uint64_t kMagic = 0x4c4f4f4d50325031ull;  // "LOOMP2P1"
inline constexpr size_t kPage = 4096;
inline constexpr size_t kHeaderBytes = 32;  // tag, bytes, signature (2 words)
inline constexpr int64_t kHealthPeriodNs = 20 * 1000 * 1000;

// Ring copies: `pos` is a monotonic byte count; the ring holds `ringBytes` at `data`.
inline void copyToRing(uint8_t* data, size_t ringBytes, uint64_t pos, const void* src, size_t n) {
  const size_t off = pos % ringBytes;
  const size_t first = std::min(n, ringBytes - off);
  std::memcpy(data + off, src, first);
  if (n > first) std::memcpy(data, static_cast<const uint8_t*>(src) + first, n - first);
}

inline void copyFromRing(void* dst, const uint8_t* data, size_t ringBytes, uint64_t pos, size_t n) {
  const size_t off = pos % ringBytes;
  const size_t first = std::min(n, ringBytes - off);
  std::memcpy(dst, data + off, first);
  if (n > first) std::memcpy(static_cast<uint8_t*>(dst) + first, data, n - first);
}

}  // namespace p2p

struct ShmTransport::Header {
  uint64_t magic;
  int32_t ranks;
  uint64_t ringBytes;
  // 0 = healthy, 1 = an abort is being written, 2 = aborted (reason valid).
  alignas(64) std::atomic<uint32_t> aborted;
  int32_t abortingRank;   // Context rank
  uint32_t abortInvalid;  // 1: the ranks' calls disagree (InvalidArgumentError on every rank)
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

// ---- requests ----

// A shm request: the shared core (request_core.h) plus how a waiter waits
// (shm_transport_data.cc); test() makes one progress pass if the lock is free.
class ShmRequest final : public RequestCore {
 public:
  ShmRequest(ShmTransport* t, int peer, bool send, const void* data, size_t bytes, uint64_t tag)
      : RequestCore(peer, send, data, bytes, tag), t_(t) {}

  bool wait(const Deadline& deadline) override;

 private:
  void poll() override { t_->tryProgress(); }

  ShmTransport* const t_;
};

}  // namespace loom::comm::shm
