// ReplayRing: the last bytes of one direction of a tcp connection, kept so that they can be
// sent again after the connection was re-established (tcp_heal.cc).
//
// The stream of a connection is numbered from 0 (every header and payload byte the sender
// wrote, in order). The ring holds the bytes [end() - size(), end()) of that stream: append()
// adds the next bytes at end(), and once capacity() bytes are held the oldest are dropped. A
// reader asks for the bytes from some stream position on (copyFrom); a position older than the
// ring holds is refused, never answered with other bytes.
//
// Memory: capacity() bytes allocated once, untouched (so not resident) until written.
// Not thread-safe: the owner's lock (Peer::sendMu) guards it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace loom::comm::tcp {

class ReplayRing {
 public:
  ReplayRing() = default;
  explicit ReplayRing(size_t capacity)
      : data_(capacity > 0 ? new uint8_t[capacity] : nullptr), capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  // Stream position after the last byte appended.
  uint64_t end() const { return end_; }
  // Bytes held (at most capacity()).
  size_t size() const { return size_; }
  // The oldest stream position still held.
  uint64_t begin() const { return end_ - size_; }

  // The next `n` bytes of the stream; only the last capacity() of them are kept.
  void append(const void* src, size_t n) {
    end_ += n;
    // (A zero-byte send may come with a null buffer: memcpy must not see it.)
    if (capacity_ == 0 || n == 0) return;
    const auto* p = static_cast<const uint8_t*>(src);
    if (n >= capacity_) {
      p += n - capacity_;
      n = capacity_;
    }
    // Write [end_ - n, end_) at its place modulo capacity_, in up to two pieces.
    size_t at = static_cast<size_t>((end_ - n) % capacity_);
    const size_t first = std::min(n, capacity_ - at);
    std::memcpy(data_.get() + at, p, first);
    std::memcpy(data_.get(), p + first, n - first);
    size_ = std::min(capacity_, size_ + n);
  }

  // The bytes [from, end()) when the ring still holds them (false otherwise).
  bool copyFrom(uint64_t from, std::vector<uint8_t>& out) const {
    if (from < begin() || from > end_) return false;
    const size_t n = static_cast<size_t>(end_ - from);
    out.resize(n);
    if (n == 0) return true;
    const size_t at = static_cast<size_t>(from % capacity_);
    const size_t first = std::min(n, capacity_ - at);
    std::memcpy(out.data(), data_.get() + at, first);
    std::memcpy(out.data() + first, data_.get(), n - first);
    return true;
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
  uint64_t end_ = 0;
  size_t size_ = 0;
};

// Where sending resumes on a re-established connection (TcpTransport::installLocked): the ring
// holds the stream up to the front message (ring.end()), of which `frontOffset` bytes (header
// and payload) were written; the peer says it read `peerConsumed` bytes. kOk sets `replay` to the
// bytes [peerConsumed, ring.end()) to send again from the ring (empty when the peer read into
// the front message) and `resumeAt` to where the front message continues (0: from its start).
// Apart from the transport so that it can be tested and fuzzed alone (tests/fuzz).
enum class ResendPlan {
  kOk,
  kAheadOfWritten,  // the peer claims more than was written: the two ends disagree
  kOlderThanRing,   // the peer needs bytes the ring no longer holds
};
inline ResendPlan planResend(const ReplayRing& ring, size_t frontOffset, uint64_t peerConsumed,
                             std::vector<uint8_t>& replay, size_t& resumeAt) {
  const uint64_t frontStart = ring.end();
  if (peerConsumed > frontStart + frontOffset) return ResendPlan::kAheadOfWritten;
  replay.clear();
  resumeAt = 0;
  if (peerConsumed >= frontStart) {
    resumeAt = static_cast<size_t>(peerConsumed - frontStart);
  } else if (!ring.copyFrom(peerConsumed, replay)) {
    return ResendPlan::kOlderThanRing;
  }
  return ResendPlan::kOk;
}

}  // namespace loom::comm::tcp
