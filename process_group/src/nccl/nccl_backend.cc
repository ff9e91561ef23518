#include "nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "diagnostics/flight_recorder.h"
#include "diagnostics/group_diagnostics.h"
#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"
#include "nccl/nccl_watchdog.h"
#include "record_hooks.h"

namespace loom {

int ncclDeviceCount() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

namespace nccl_detail {

std::string exchangeUniqueId(Store& store, int rank, const std::string& id, size_t idBytes,
                             std::chrono::milliseconds timeout) {
  if (rank == 0) {
    store.set(kUniqueIdKey, id);
    return id;
  }
  store.wait({kUniqueIdKey}, timeout);
  const std::string got = store.getString(kUniqueIdKey);
  if (got.size() != idBytes) {
    LOOM_THROW(IoError, "rank ", rank, ": store key ", kUniqueIdKey, " holds ", got.size(),
               " bytes; expected an ncclUniqueId of ", idBytes, " bytes");
  }
  return got;
}

int pickDevice(int requested, int localRank, int rank, int deviceCount) {
  LOOM_CHECK_T(NotAvailableError, deviceCount > 0, "nccl backend: no CUDA device is visible");
  if (requested >= 0) {
    if (requested >= deviceCount) {
      LOOM_THROW(InvalidArgumentError, "nccl backend: device ", requested, " requested but only ",
                 deviceCount, " CUDA device(s) are visible");
    }
    return requested;
  }
  return (localRank >= 0 ? localRank : rank) % deviceCount;
}

void checkNcclReduceOp(const std::string& who, const char* opName, ReduceOp op) {
  if (isBitwise(op)) {
    LOOM_THROW(InvalidArgumentError, who, ": ", opName, ": NCCL has no bitwise reductions (",
               reduceOpName(op), "); use the tcp backend for ", reduceOpName(op));
  }
}

}  // namespace nccl_detail

namespace {

ncclDataType_t toNccl(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt8:
      return ncclInt8;
    case DType::kUInt8:
      return ncclUint8;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kBool:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t toNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
    default:
      return ncclSum;  // bitwise ops are rejected before
  }
}

void cudaCheck(cudaError_t err, const std::string& who, const char* what) {
  if (err != cudaSuccess) {
    LOOM_THROW(IoError, who, ": ", what, " failed: ", cudaGetErrorString(err));
  }
}

// Makes `device` current for a scope and restores the caller's device afterwards, so that
// issuing an operation never changes the calling thread's CUDA device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    ok_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return ok_; }

 private:
  int previous_ = -1;
  cudaError_t ok_ = cudaSuccess;
};

// State shared by the group and its Works (a Work may outlive its group).
struct NcclState {
  std::string who;
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // one int32 on the device for barrier()

  std::mutex mu;  // guards comm use (enqueue, abort), broken, cause
  bool broken = false;
  bool aborted = false;
  std::string cause;

  // Marks the group broken and aborts the communicator (first call wins). Requires mu held.
  void failLocked(const std::string& why) {
    if (!broken) {
      broken = true;
      cause = why;
    }
    if (comm && !aborted) {
      aborted = true;
      ncclCommAbort(comm);
    }
  }

  // Polls the non-blocking communicator until its pending call settles or `deadline`
  // passes. Requires mu held.
  void settleLocked(ncclResult_t first, const Deadline& deadline, const std::string& what) {
    ncclResult_t state = first;
    while (state == ncclInProgress) {
      if (deadline.expired()) {
        const std::string why = who + ": " + what + " did not finish within " +
                                std::to_string(deadline.elapsed().count()) +
                                " ms (NCCL still in progress; communicator aborted)";
        failLocked(why);
        throw TimeoutError(why);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
    }
    if (state != ncclSuccess) {
      const std::string why = who + ": " + what + " failed: " + ncclGetErrorString(state) + " (" +
                              ncclGetLastError(comm) + ")";
      failLocked(why);
      throw IoError(why);
    }
  }

  ~NcclState() {
    DeviceGuard guard(device);
    if (comm && !aborted) {
      // A broken communicator is aborted (never waits); a healthy one is destroyed.
      if (broken) {
        ncclCommAbort(comm);
      } else {
        ncclCommDestroy(comm);
      }
    }
    if (scratch) cudaFree(scratch);
    if (stream) cudaStreamDestroy(stream);
  }
};

// A CUDA event shared by its Work and the watchdog; destroyed with the last of them.
using EventHandle = std::shared_ptr<void>;
EventHandle makeEvent(const std::string& who) {
  cudaEvent_t event = nullptr;
  cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), who, "cudaEventCreate");
  return EventHandle(event, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
}

// The watchdog's view of the device (nccl_watchdog.h): the operations' events and the
// communicator.
class CudaWatchdogDevice final : public nccl_detail::WatchdogDevice {
 public:
  explicit CudaWatchdogDevice(std::shared_ptr<NcclState> state) : state_(std::move(state)) {}
  Status query(const std::shared_ptr<void>& handle, std::string& error) override {
    const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(handle.get()));
    if (r == cudaSuccess) return Status::kDone;
    if (r == cudaErrorNotReady) return Status::kPending;
    error = cudaGetErrorString(r);
    return Status::kFailed;
  }
  std::string asyncError() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    // Failed through a Work's own poll or abort(): the watchdog stops with that cause.
    if (state_->broken) return "the group failed: " + state_->cause;
    if (state_->comm == nullptr || state_->aborted) return {};
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(state_->comm, &async) != ncclSuccess) return {};
    if (async == ncclSuccess || async == ncclInProgress) return {};
    return std::string(ncclGetErrorString(async)) + " (" + ncclGetLastError(state_->comm) + ")";
  }
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->failLocked(reason);
  }

 private:
  std::shared_ptr<NcclState> state_;
};

class NcclWork final : public Work {
 public:
  NcclWork(const OpDesc& op, int rank, std::shared_ptr<NcclState> state, EventHandle event,
           std::weak_ptr<ProcessGroup> group)
      : Work(opTypeName(op.type), op.seq, rank),
        description_(op.describe()),
        timeout_(op.timeout),
        deadline_(op.timeout),
        state_(std::move(state)),
        event_(std::move(event)),
        group_(std::move(group)) {}

  // Completion is observed, not pushed: the event and the communicator are polled.
  bool isCompleted() override { return Work::isCompleted() || poll(); }
  bool wait() override { return waitPolling(std::nullopt); }
  bool wait(std::chrono::milliseconds timeout) override {
    return waitPolling(std::chrono::steady_clock::now() + timeout);
  }

 protected:
  // wait(timeout) expired: abort the group (a TimeoutError always means it is unusable).
  void onWaitTimeout(const std::string& reason) override {
    if (auto group = group_.lock()) group->abort(reason);
  }

 private:
  static constexpr std::chrono::microseconds kPollInterval{50};

  bool waitPolling(std::optional<std::chrono::steady_clock::time_point> deadline) {
    const auto start = std::chrono::steady_clock::now();
    while (!isCompleted()) {
      if (deadline && std::chrono::steady_clock::now() >= *deadline) timedOut(start);
      std::this_thread::sleep_for(kPollInterval);
    }
    return finished();
  }

  // Looks at the event, the communicator's error and the deadline once; true once complete.
  bool poll() {
    const cudaError_t done = cudaEventQuery(static_cast<cudaEvent_t>(event_.get()));
    if (done == cudaSuccess) {
      markCompleted();
      return true;
    }
    std::lock_guard<std::mutex> lock(state_->mu);
    if (done != cudaErrorNotReady) {
      const std::string why =
          state_->who + ": " + description_ + " failed: " + cudaGetErrorString(done);
      state_->failLocked(why);
      markFailed(std::make_exception_ptr(IoError(why)));
      return true;
    }
    if (state_->broken) {
      markFailed(std::make_exception_ptr(IoError(state_->who + ": " + description_ +
                                                 " failed: the group failed: " + state_->cause)));
      return true;
    }
    ncclResult_t async = ncclSuccess;
    if (!state_->aborted) ncclCommGetAsyncError(state_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string why = state_->who + ": " + description_ +
                              " failed: " + ncclGetErrorString(async) + " (" +
                              ncclGetLastError(state_->comm) + ")";
      state_->failLocked(why);
      markFailed(std::make_exception_ptr(IoError(why)));
      return true;
    }
    if (deadline_.expired()) {
      const std::string why = state_->who + ": " + description_ + " timed out after " +
                              std::to_string(timeout_.count()) +
                              " ms (NCCL; the communicator was aborted)";
      state_->failLocked(why);
      markFailed(std::make_exception_ptr(TimeoutError(why)));
      return true;
    }
    return false;
  }

  const std::string description_;
  const std::chrono::milliseconds timeout_;
  const Deadline deadline_;
  std::shared_ptr<NcclState> state_;
  EventHandle event_;
  std::weak_ptr<ProcessGroup> group_;
};

class ProcessGroupNccl final : public ProcessGroup {
 public:
  ProcessGroupNccl(std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupOptions& options, int device)
      : ProcessGroup("nccl", std::move(store), rank, size, options),
        state_(std::make_shared<NcclState>()) {
    state_->who = who();
    state_->device = device;
    const Deadline deadline(options.timeout);
    DeviceGuard guard(device);
    cudaCheck(guard.status(), who(), "cudaSetDevice");
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (rank == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) {
        LOOM_THROW(IoError, who(), ": ncclGetUniqueId failed: ", ncclGetErrorString(r));
      }
    }
    const std::string idBytes = nccl_detail::exchangeUniqueId(
        *this->store(), rank, std::string(reinterpret_cast<const char*>(&id), sizeof(id)),
        sizeof(id), options.timeout);
    std::memcpy(&id, idBytes.data(), sizeof(id));

    cudaCheck(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), who(),
              "cudaStreamCreateWithFlags");
    cudaCheck(cudaMalloc(&state_->scratch, sizeof(int32_t)), who(), "cudaMalloc");

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    std::lock_guard<std::mutex> lock(state_->mu);
    const ncclResult_t r = ncclCommInitRankConfig(&state_->comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      LOOM_THROW(IoError, who(), ": ncclCommInitRankConfig failed: ", ncclGetErrorString(r));
    }
    state_->settleLocked(r, deadline, "ncclCommInitRankConfig (size " + std::to_string(size) + ")");
    // Watches the stream when nobody waits: flight record start / end, abort on a deadline or
    // an asynchronous error, and the failure dump.
    watchdog_ = std::make_unique<nccl_detail::Watchdog>(
        std::make_shared<CudaWatchdogDevice>(state_),
        diagnostics() != nullptr ? &diagnostics()->recorder() : nullptr, who(),
        [this](const std::string&, bool) {
          if (diagnostics() == nullptr) return;
          try {
            diagnostics()->dump("failure");
          } catch (const std::exception& e) {
            LOOM_LOG_WARNING(who(), ": could not publish the flight record: ", e.what());
          }
        });
  }

  ~ProcessGroupNccl() override {
    // Wait for what is queued, bounded by the group's timeout; abort when it does not finish.
    try {
      const Deadline deadline(options().timeout);
      DeviceGuard guard(state_->device);
      for (;;) {
        const cudaError_t r = cudaStreamQuery(state_->stream);
        if (r != cudaErrorNotReady) break;
        std::lock_guard<std::mutex> lock(state_->mu);
        if (state_->broken) break;
        if (deadline.expired()) {
          state_->failLocked(who() + ": destroyed with operations still running after " +
                             std::to_string(options().timeout.count()) + " ms");
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    } catch (...) {
    }
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->failLocked(who() + ": aborted: " + reason);
  }

  bool isBroken() const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->broken;
  }

 protected:
  void checkDevice(const BufferView& buf, const char* opName) const override {
    if (buf.device.type != DeviceType::kCuda || buf.device.index != state_->device) {
      LOOM_THROW(InvalidArgumentError, who(), ": ", opName,
                 ": the nccl backend of this group takes ",
                 deviceName(Device::cuda(state_->device)), " buffers, got a ",
                 deviceName(buf.device), " buffer");
    }
  }

  void checkOp(const OpDesc& op) const override {
    if (op.type == OpType::kAllreduce || op.type == OpType::kReduce ||
        op.type == OpType::kReduceScatter) {
      nccl_detail::checkNcclReduceOp(who(), opTypeName(op.type), op.reduceOp);
    }
    if (op.type == OpType::kAllreduceCoalesced) {
      nccl_detail::checkNcclReduceOp(who(), opTypeName(op.type), op.reduceOp);
    }
    if (op.type == OpType::kReduceScatterv) {
      LOOM_THROW(InvalidArgumentError, who(),
                 ": reduce_scatterv: NCCL has no reduce-scatter with "
                 "uneven counts; pad every rank's block to the largest count and use "
                 "reduceScatter, or use a tcp group");
    }
    if (op.type == OpType::kMonitoredBarrier) {
      LOOM_THROW(InvalidArgumentError, who(),
                 ": monitored_barrier is not supported by the nccl "
                 "backend (as in c10d); run it on a tcp group over the same store");
    }
    if (op.type == OpType::kRecv && op.root == kAnySource) {
      LOOM_THROW(InvalidArgumentError, who(),
                 ": recv from any source: NCCL receives from one "
                 "named rank only; use a tcp group");
    }
    if ((op.type == OpType::kSend || op.type == OpType::kRecv) && op.tag != 0) {
      LOOM_THROW(InvalidArgumentError, who(), ": ", opTypeName(op.type),
                 ": NCCL has no message tags (got tag ", op.tag,
                 "); use tag 0 and order the sends and receives");
    }
  }

  std::shared_ptr<Work> post(OpDesc&& op) override {
    const Deadline deadline(op.timeout);
    DeviceGuard guard(state_->device);
    cudaCheck(guard.status(), who(), "cudaSetDevice");
    EventHandle event = makeEvent(who());
    auto work = std::make_shared<NcclWork>(op, rank(), state_, event, weak_from_this());
    if (op.type == OpType::kRecv) work->setSourceRank(op.root);  // NCCL names its peer
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->broken) {
      work->markFailed(std::make_exception_ptr(
          IoError(who() + ": " + op.describe() +
                  " was not run: the group failed earlier: " + state_->cause)));
      return work;
    }
    try {
      enqueueLocked(op, deadline);
      cudaCheck(cudaEventRecord(static_cast<cudaEvent_t>(event.get()), state_->stream), who(),
                "cudaEventRecord");
      watchdog_->track(
          std::move(event), op.recordId,
          op.describe() + " (" + std::to_string(op.count * dtypeSize(op.dtype)) + " bytes)",
          op.timeout);
    } catch (...) {
      recordEnd(op, true);
      work->markFailed(std::current_exception());
    }
    return work;
  }

 private:
  // Requires state_->mu held.
  void enqueueLocked(const OpDesc& op, const Deadline& deadline) {
    NcclState& s = *state_;
    // Order after the work already queued on the legacy default stream.
    cudaEvent_t ready = nullptr;
    cudaCheck(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), who(), "cudaEventCreate");
    cudaCheck(cudaEventRecord(ready, cudaStreamLegacy), who(), "cudaEventRecord");
    cudaCheck(cudaStreamWaitEvent(s.stream, ready, 0), who(), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);

    const ncclDataType_t dt = toNccl(op.dtype);
    const size_t bytes = op.count * dtypeSize(op.dtype);
    const std::string what = op.describe();
    ncclResult_t r = ncclSuccess;
    switch (op.type) {
      case OpType::kAllreduce:
        r = ncclAllReduce(op.in.data, op.out.data, op.count, dt, toNccl(op.reduceOp), s.comm,
                          s.stream);
        break;
      case OpType::kBroadcast:
        r = ncclBroadcast(op.in.data, op.out.data, op.count, dt, op.root, s.comm, s.stream);
        break;
      case OpType::kReduce:
        r = ncclReduce(op.in.data, op.out.data ? op.out.data : op.in.data, op.count, dt,
                       toNccl(op.reduceOp), op.root, s.comm, s.stream);
        break;
      case OpType::kAllgather:
        r = ncclAllGather(op.in.data, op.out.data, op.count, dt, s.comm, s.stream);
        break;
      case OpType::kReduceScatter:
        r = ncclReduceScatter(op.in.data, op.out.data, op.count, dt, toNccl(op.reduceOp), s.comm,
                              s.stream);
        break;
      case OpType::kBarrier:
        r = ncclAllReduce(s.scratch, s.scratch, 1, ncclInt32, ncclSum, s.comm, s.stream);
        break;
      case OpType::kSend:
        r = ncclSend(op.in.data, op.count, dt, op.root, s.comm, s.stream);
        break;
      case OpType::kRecv:
        r = ncclRecv(op.out.data, op.count, dt, op.root, s.comm, s.stream);
        break;
      case OpType::kGather:
      case OpType::kScatter:
      case OpType::kAlltoall: {
        // Built from grouped point-to-point calls.
        char* in = static_cast<char*>(op.in.data);
        char* out = static_cast<char*>(op.out.data);
        ncclGroupStart();
        for (int peer = 0; peer < size(); ++peer) {
          const size_t at = static_cast<size_t>(peer) * bytes;
          if (op.type == OpType::kGather) {
            if (rank() == op.root) ncclRecv(out + at, op.count, dt, peer, s.comm, s.stream);
            if (peer == op.root) ncclSend(in, op.count, dt, peer, s.comm, s.stream);
          } else if (op.type == OpType::kScatter) {
            if (rank() == op.root) ncclSend(in + at, op.count, dt, peer, s.comm, s.stream);
            if (peer == op.root) ncclRecv(out, op.count, dt, peer, s.comm, s.stream);
          } else {
            ncclSend(in + at, op.count, dt, peer, s.comm, s.stream);
            ncclRecv(out + at, op.count, dt, peer, s.comm, s.stream);
          }
        }
        r = ncclGroupEnd();
        break;
      }
      case OpType::kAlltoallv:
      case OpType::kAllgatherv:
      case OpType::kGatherv: {
        // Grouped point-to-point calls, one per non-empty block (blocks packed in rank order).
        const size_t esize = dtypeSize(op.dtype);
        const bool toAll = op.type == OpType::kAlltoallv;
        const std::vector<size_t>& sendCounts = op.inCounts;
        const std::vector<size_t>& recvCounts = toAll ? op.outCounts : op.inCounts;
        char* in = static_cast<char*>(op.in.data);
        char* out = static_cast<char*>(op.out.data);
        size_t sendAt = 0, recvAt = 0;
        ncclGroupStart();
        for (int peer = 0; peer < size(); ++peer) {
          const bool receives = op.type != OpType::kGatherv || rank() == op.root;
          const bool sends = op.type != OpType::kGatherv || peer == op.root;
          // In place (allgatherv, gatherv's root): this rank's block already sits in out.
          const bool selfInPlace =
              !toAll && receives && peer == rank() && out + recvAt * esize == in;
          if (receives && recvCounts[peer] > 0 && !selfInPlace) {
            ncclRecv(out + recvAt * esize, recvCounts[peer], dt, peer, s.comm, s.stream);
          }
          if (toAll && sendCounts[peer] > 0) {
            ncclSend(in + sendAt * esize, sendCounts[peer], dt, peer, s.comm, s.stream);
          } else if (!toAll && sends && sendCounts[rank()] > 0 && !selfInPlace) {
            ncclSend(in, sendCounts[rank()], dt, peer, s.comm, s.stream);
          }
          sendAt += sendCounts[peer];
          recvAt += recvCounts[peer];
        }
        r = ncclGroupEnd();
        break;
      }
      case OpType::kAllreduceCoalesced:
        // One grouped launch of an all-reduce per buffer, in place.
        ncclGroupStart();
        for (const BufferView& b : op.buffers) {
          if (b.count == 0) continue;
          ncclAllReduce(b.data, b.data, b.count, dt, toNccl(op.reduceOp), s.comm, s.stream);
        }
        r = ncclGroupEnd();
        break;
      case OpType::kReduceScatterv:
      case OpType::kMonitoredBarrier:
        LOOM_THROW(InvalidArgumentError, who(), ": ", what, " is not supported by nccl");
    }
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string why = who() + ": " + what +
                              " could not be enqueued: " + ncclGetErrorString(r) + " (" +
                              ncclGetLastError(s.comm) + ")";
      s.failLocked(why);
      throw IoError(why);
    }
    s.settleLocked(r, deadline, what + " (enqueue)");
  }

  std::shared_ptr<NcclState> state_;
  // Declared after state_: destroyed (its thread joined) before the state goes.
  std::unique_ptr<nccl_detail::Watchdog> watchdog_;
};

}  // namespace

std::shared_ptr<ProcessGroup> createProcessGroupNccl(std::shared_ptr<Store> store, int rank,
                                                     int size, const ProcessGroupOptions& options) {
  const int count = ncclDeviceCount();
  if (count == 0) {
    LOOM_THROW(NotAvailableError, "rank ", rank,
               ": nccl backend: no CUDA device is visible to this process (cudaGetDeviceCount "
               "found none); use the tcp backend for CPU buffers");
  }
  const int device =
      nccl_detail::pickDevice(options.nccl.device, options.nccl.localRank, rank, count);
  return std::make_shared<ProcessGroupNccl>(std::move(store), rank, size, options, device);
}

}  // namespace loom
