// The nccl backend's internal pieces, shared by its three files: nccl_backend.cc (the group: setup,
// post, the failure handling and the state's communicator calls), nccl_work.cc (NcclWork: a
// Work's completion, wait and host wait) and nccl_p2p_batch.cc (the open point-to-point batch:
// its issue as one NCCL group, and the timer that issues a batch nobody ended). How an operation
// goes from the caller to NCCL and back, and the lock order: nccl_backend.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "loom/common/deadline.h"
#include "loom/process_group/process_group.h"
#include "loom/process_group/work.h"
#include "nccl/nccl_api.h"
#include "nccl/nccl_event_pool.h"
#include "nccl/nccl_watchdog.h"

namespace loom::diag {
class FlightRecorder;
}

namespace loom::nccl_detail {

using Clock = std::chrono::steady_clock;
using EventHandle = std::shared_ptr<void>;

// The caller's stream on this thread (nccl_backend.h, "Streams"). nccl_backend.cc.
Stream callerStream(const NcclOptions& options);

// Makes `device` current for a scope and restores the caller's device afterwards, so that
// issuing an operation never changes the calling thread's CUDA device.
class DeviceGuard {
 public:
  DeviceGuard(NcclApi& api, int device) : api_(api), previous_(api.currentDevice()) {
    if (previous_ != device) api_.setDevice(device);
  }
  ~DeviceGuard() {
    try {
      if (previous_ >= 0 && api_.currentDevice() != previous_) api_.setDevice(previous_);
    } catch (...) {
    }
  }

 private:
  NcclApi& api_;
  const int previous_;
};

class NcclWork;

// One send or recv waiting in the open batch.
struct PendingP2P {
  std::shared_ptr<const OpDesc> op;
  std::shared_ptr<NcclWork> work;
};

// State shared by the group, its Works (a Work may outlive its group) and the watchdog's
// device.
struct NcclState {
  NcclState(std::shared_ptr<NcclApi> a, std::string w, int r, int n, int dev, NcclOptions o)
      : api(std::move(a)),
        who(std::move(w)),
        rank(r),
        size(n),
        device(dev),
        options(o),
        events(api) {}
  // Destroys the communicator, or aborts it when the group is broken (nccl_backend.cc).
  ~NcclState();

  const std::shared_ptr<NcclApi> api;
  const std::string who;
  const int rank;
  const int size;
  const int device;
  const NcclOptions options;
  Comm comm = nullptr;
  Stream stream = nullptr;
  void* scratch = nullptr;  // one int32 on the device for barrier()
  EventPool events;
  std::weak_ptr<Watchdog> watchdog;
  diag::FlightRecorder* recorder = nullptr;  // valid while a batch is open (the group lives)

  std::mutex mu;  // guards comm use (enqueue, abort), the batch and the failure fields
  std::condition_variable settled;
  bool broken = false;
  bool aborted = false;
  std::string cause;
  // The watchdog's failure: the cross-rank diagnosis runs (Works wait for it, bounded), then
  // the failing operation's error is `failedError` (its describe() is `failedOp`).
  bool diagnosing = false;
  std::string failedOp;
  std::exception_ptr failedError;
  std::vector<PendingP2P> batch;
  uint64_t batches = 0;  // batches issued (the timer knows whether its batch is still open)

  // nccl_backend.cc:
  // Marks the group broken and aborts the communicator (first call wins). Requires mu held.
  void failLocked(const std::string& why);
  // Polls the non-blocking communicator until its pending call settles or `deadline` passes.
  // Requires mu held.
  void settleLocked(int first, const Deadline& deadline, const std::string& what);
  // An enqueue's result `r`: fails the group (IoError) unless it succeeded or is in progress,
  // then settles it. Requires mu held.
  void checkResult(int r, const std::string& what, const Deadline& deadline);

  // nccl_p2p_batch.cc:
  // Issues the open batch as one NCCL group. Requires mu held.
  void flushLocked();
  // flushLocked under mu, with the group's device current.
  void flush();
};

// nccl_p2p_batch.cc: the watchdog issues the batch now open (state->batch non-empty, mu held)
// when nobody ended it after options.p2pBatchWindow.
void armBatchTimer(Watchdog& watchdog, const std::shared_ptr<NcclState>& state);

// An operation's Work (nccl_work.cc): completes by its `done` event, or fails with the group.
class NcclWork final : public Work {
 public:
  NcclWork(const OpDesc& op, int rank, std::shared_ptr<NcclState> state)
      : Work(opTypeName(op.type), op.seq, rank),
        description_(op.describe()),
        timeout_(op.timeout),
        state_(std::move(state)) {}

  // Set once by whoever enqueued the operation (state mu held), before anyone reads it.
  void setIssued(EventHandle done) {
    done_ = std::move(done);
    issued_.store(true, std::memory_order_release);
  }

  bool isCompleted() override;
  bool wait() override;
  bool wait(std::chrono::milliseconds timeout) override;

 private:
  // Issues the open batch when this Work is in it; false when that failed (the Work then holds
  // the error).
  bool ensureIssued();
  // Blocks the host until the operation completed: the event queried for up to
  // NcclOptions::hostSpin (a small operation completes within it), then cudaEventSynchronize
  // (which spins, yields or sleeps as the context's scheduling flags say), bounded by the watchdog
  // (the operation's deadline, and `deadline` when set).
  bool hostWait(std::optional<Clock::time_point> deadline,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Looks at the event and the group once; marks the Work when it is done or failed. With
  // `mayWait`, a failure whose cross-rank diagnosis runs is waited for (bounded by the report
  // window and the store's slack); without, the Work stays pending meanwhile.
  void poll(bool mayWait);

  const std::string description_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<NcclState> state_;
  std::atomic<bool> issued_{false};
  EventHandle done_;
};

}  // namespace loom::nccl_detail
