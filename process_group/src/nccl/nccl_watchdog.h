// Watchdog: the NCCL backend's thread that watches the operations enqueued on a group's stream
// when nobody waits on them (PyTorch's ProcessGroupNCCL watchdog, written for Loom): it polls
// each operation's completion event and the communicator's asynchronous error, keeps the flight
// recorder's start / end / state of the operations, and aborts the communicator when an
// operation's deadline passes or the communicator reports an error. Free of CUDA and NCCL
// headers: the device is reached through WatchdogDevice, which the backend implements with
// cudaEventQuery / ncclCommGetAsyncError / ncclCommAbort and tests implement with a fake.
//
// Contract
// - track() is called in enqueue order (one stream: events complete in that order). An
//   operation counts as started when the watchdog finds it at the head of the stream (every
//   earlier one completed): its recorded start is that moment, within one poll interval.
// - One pass per interval: the head's event is queried while it completes (each completion
//   moves to the next); then the asynchronous error; then every pending deadline. A failure
//   (event error, async error, deadline) aborts the device once, records every pending
//   operation as failed, calls onFailure(reason, timedOut) once on the watchdog thread, and
//   ends the watching (later track() calls are recorded as failed at once). The handler gets
//   the operation that failed (the first pending one for an asynchronous error), null when that
//   operation was tracked without its OpDesc.
// - tighten() brings a tracked operation's deadline forward (a bounded host wait on it): the
//   watchdog then aborts at the earlier of the two, which is what ends a wait blocked in
//   cudaEventSynchronize (aborting the communicator ends its kernels).
// - setTimer() runs one callback on the watchdog thread at a given time (the backend issues a
//   point-to-point batch that nobody ended); a later setTimer replaces an earlier one.
// - The destructor stops the thread and joins it; a pass never blocks except in the device's
//   calls.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/process_group/process_group.h"

namespace loom::diag {
class FlightRecorder;
}

namespace loom::nccl_detail {

class WatchdogDevice {
 public:
  enum class Status { kPending, kDone, kFailed };
  virtual ~WatchdogDevice() = default;
  // The completion of the operation whose handle was tracked (a CUDA event); `error` set when
  // kFailed.
  virtual Status query(const std::shared_ptr<void>& handle, std::string& error) = 0;
  // The communicator's asynchronous error ("" when none).
  virtual std::string asyncError() = 0;
  // Aborts the communicator; called at most once.
  virtual void abort(const std::string& reason) = 0;
};

class Watchdog {
 public:
  using FailureHandler =
      std::function<void(const std::string& reason, bool timedOut, const OpDesc* op)>;
  // `recorder` may be null (recorder off); `who` prefixes messages ("rank 2").
  Watchdog(std::shared_ptr<WatchdogDevice> device, diag::FlightRecorder* recorder, std::string who,
           FailureHandler onFailure,
           std::chrono::microseconds interval = std::chrono::microseconds(1000));
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // An enqueued operation: its completion handle, flight record id (0: none), "allreduce#5
  // (4096 bytes)" for messages, its timeout (counted from now).
  void track(std::shared_ptr<void> handle, uint64_t recordId, std::string description,
             std::chrono::milliseconds timeout, std::shared_ptr<const OpDesc> op = nullptr);
  // The operations tracked with `handle` time out no later than `deadline` (as "timed out after
  // `waited` ms in a bounded wait").
  void tighten(const std::shared_ptr<void>& handle, std::chrono::steady_clock::time_point deadline,
               std::chrono::milliseconds waited);
  void setTimer(std::chrono::steady_clock::time_point when, std::function<void()> fn);
  size_t pending() const;
  // The failure's reason ("" while none).
  std::string failure() const;
  // Whether an operation tracked with `handle` was still pending when the watching failed (or
  // was tracked after): its event may have completed only because the communicator was aborted.
  bool failedPending(const std::shared_ptr<void>& handle) const;

 private:
  struct Entry {
    std::shared_ptr<void> handle;
    uint64_t recordId;
    std::string description;
    std::chrono::milliseconds timeout;
    Deadline deadline;
    std::shared_ptr<const OpDesc> op;
    bool started = false;
    // Set by tighten(): an earlier deadline and how long the waiter gave it.
    std::optional<std::chrono::steady_clock::time_point> waitDeadline;
    std::chrono::milliseconds waited{0};
  };
  void loop();
  void pass();
  void fail(const std::string& reason, bool timedOut, std::shared_ptr<const OpDesc> op);

  const std::shared_ptr<WatchdogDevice> device_;
  diag::FlightRecorder* const recorder_;
  const std::string who_;
  const FailureHandler onFailure_;
  const std::chrono::microseconds interval_;

  mutable std::mutex mu_;  // guards the fields below; never held across a device call
  std::condition_variable wake_;
  std::deque<Entry> entries_;
  bool stopping_ = false;
  std::string failure_;
  std::vector<std::shared_ptr<void>> failedHandles_;
  std::optional<std::chrono::steady_clock::time_point> timerAt_;
  std::function<void()> timer_;
  std::thread thread_;
};

}  // namespace loom::nccl_detail
