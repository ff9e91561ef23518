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
inline constexpr size_t kHeaderBytes = 16;
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

}  // namespace loom::comm::shm
