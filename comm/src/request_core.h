// RequestCore: the part of a Request (transport.h) that every transport shares: what the
// transfer is (peer, direction, buffer, bytes, tag), its state machine pending -> done |
// failed with the stored error, and how many bytes moved so far. A transport subclasses it
// only for how a waiter waits and makes progress (wait(), and poll() for test()) and for whom
// to wake when the request finishes (onFinished()).
//
// State machine: complete() and fail() each move the request out of pending at most once; the
// first wins and later calls are no-ops (a request may be failed by a transport failure while
// its last bytes arrive). fail() first claims the request (failing), then writes the error,
// then publishes failed, so that whoever sees failed also sees the error and two failers never
// write it at once; readers treat failing as pending. The transitions are seq_cst: a waiter
// that announces itself (a counter or flag), then looks at the state, and a finisher that
// stores the state, then looks for announced waiters, never both miss each other.
//
// Errors: a failed request throws IoError from test()/wait(), or InvalidArgumentError when it
// was failed as the caller's mistake (a receive whose size differs from the message's).
//
// Thread-safety: complete/fail/setBytesDone from any thread (transports call them under the
// lock that guards the queue holding the request); test and the accessors from any thread;
// wait from one thread at a time (transport.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/comm/transport.h"
#include "signature.h"

namespace loom::comm {

class RequestCore : public Request {
 public:
  enum class Failure : uint8_t { kIo, kInvalidArgument };

  RequestCore(int peer, bool send, const void* data, size_t bytes, uint64_t tag)
      : peer_(peer),
        send_(send),
        data_(static_cast<uint8_t*>(const_cast<void*>(data))),
        bytes_(bytes),
        tag_(tag),
        signature_(SignatureScope::current()) {}

  // Pending: one progress step (poll()), then as check().
  bool test() final {
    if (!finished()) poll();
    return check();
  }

  int peer() const final { return peer_; }
  bool isSend() const final { return send_; }
  size_t bytes() const final { return bytes_; }
  uint64_t tag() const final { return tag_; }
  // The collective's wire signature (signature.h), taken from the creating thread; unknown:
  // none.
  const Signature& signature() const { return signature_; }
  size_t bytesOutstanding() const final { return bytes_ - std::min(bytes_, bytesDone()); }

  // The caller's buffer (sends read it, receives write it).
  uint8_t* data() const { return data_; }

  // Done or failed (false while failing: the error is not published yet). seq_cst: a waiter
  // announces itself, then asks (see the state machine above); on x86 and ARM it costs what an
  // acquire load costs.
  bool finished() const { return state_.load(std::memory_order_seq_cst) >= kDone; }
  // True when done, false while pending; throws the stored error when failed. Never progresses.
  bool check() const {
    const uint32_t s = state_.load(std::memory_order_acquire);
    if (s == kFailed) throwError();
    return s == kDone;
  }

  // pending -> done (all bytes moved). False when the request had already finished.
  bool complete() {
    done_.store(bytes_, std::memory_order_relaxed);
    uint32_t expected = kPending;
    if (!state_.compare_exchange_strong(expected, kDone, std::memory_order_seq_cst)) return false;
    onFinished();
    return true;
  }
  // pending -> failed with `error`. False when the request had already finished.
  bool fail(const std::string& error, Failure kind = Failure::kIo);

  // Progress for bytesOutstanding(): bytes moved so far (may overshoot bytes(): padding).
  void setBytesDone(size_t n) { done_.store(n, std::memory_order_relaxed); }
  size_t bytesDone() const { return done_.load(std::memory_order_relaxed); }

 protected:
  // test() on a pending request: one non-blocking progress step, if the transport has one.
  virtual void poll() {}
  // Called once, on the thread whose complete() or fail() won, after the new state is
  // published: wake whoever may sleep on this request.
  virtual void onFinished() {}

 private:
  static constexpr uint32_t kPending = 0, kFailing = 1, kDone = 2, kFailed = 3;

  [[noreturn]] void throwError() const;

  const int peer_;
  const bool send_;
  uint8_t* const data_;
  const size_t bytes_;
  const uint64_t tag_;
  const Signature signature_;
  std::atomic<uint32_t> state_{kPending};
  std::atomic<size_t> done_{0};
  Failure failure_ = Failure::kIo;  // written before state_ becomes kFailed
  std::string error_;               // likewise
};

}  // namespace loom::comm
