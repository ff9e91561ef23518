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
//   ends the watching (later track() calls are recorded as failed at once).
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
#include <string>
#include <thread>

#include "loom/common/deadline.h"

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
  using FailureHandler = std::function<void(const std::string& reason, bool timedOut)>;
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
             std::chrono::milliseconds timeout);
  size_t pending() const;
  // The failure's reason ("" while none).
  std::string failure() const;

 private:
  struct Entry {
    std::shared_ptr<void> handle;
    uint64_t recordId;
    std::string description;
    std::chrono::milliseconds timeout;
    Deadline deadline;
    bool started = false;
  };
  void loop();
  void pass();
  void fail(const std::string& reason, bool timedOut);

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
  std::thread thread_;
};

}  // namespace loom::nccl_detail
