// ProcessGroupNccl (nccl_backend.h) over NcclApi: how an operation goes from the caller to
// NCCL and back.
//
// How it works. post() runs on the issuing thread with the issue lock held. It records a pooled
// event on the caller's stream and makes the group's internal `stream` wait for it (the
// operation is ordered after the caller's work), then either enqueues the operation on `stream`
// (a collective: first the open point-to-point `batch`, if any) or adds it to `batch` (send /
// recv). After each enqueue a pooled `done` event is recorded on `stream`; the Work and the
// watchdog hold it. Everything that touches the communicator holds NcclState::mu, because the
// batch may be issued by the issuing thread, a waiting thread or the watchdog's timer.
//
// Lock order: the issue lock (ProcessGroup), then NcclState::mu, then the watchdog's own lock
// (never held across a device call).
//
// Files: this one has the group (setup, post, the failure diagnosis, the enqueue of each
// collective) and NcclState's communicator calls; nccl_work.cc the Work (wait, host wait, poll);
// nccl_p2p_batch.cc the point-to-point batch and its timer; nccl_state.h what they share.
#include "nccl/nccl_backend.h"

#include <mutex>
#include <thread>
#include <vector>

#include "diagnostics/flight_recorder.h"
#include "diagnostics/group_diagnostics.h"
#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/process_group/nccl.h"
#include "loom/store/store.h"
#include "nccl/nccl_api.h"
#include "nccl/nccl_event_pool.h"
#include "nccl/nccl_state.h"
#include "nccl/nccl_watchdog.h"
#include "pg_checks.h"
#include "pg_failure.h"
#include "record_hooks.h"

namespace loom {

namespace {

thread_local void* tlsStream = nullptr;
thread_local bool tlsStreamSet = false;

}  // namespace

NcclStreamGuard::NcclStreamGuard(void* cudaStream)
    : previous_(tlsStream), previousSet_(tlsStreamSet) {
  tlsStream = cudaStream;
  tlsStreamSet = true;
}

NcclStreamGuard::~NcclStreamGuard() {
  tlsStream = previous_;
  tlsStreamSet = previousSet_;
}

void* NcclStreamGuard::current() {
  return tlsStreamSet ? tlsStream : nullptr;
}

#ifndef LOOM_HAVE_NCCL
int ncclDeviceCount() noexcept {
  return 0;
}
std::string ncclNoDeviceReason() {
  return "built without NCCL (LOOM_WITH_NCCL=OFF)";
}
#endif

namespace nccl_detail {

// The caller's stream on this thread (nccl_backend.h, "Streams").
Stream callerStream(const NcclOptions& options) {
  if (tlsStreamSet) return tlsStream;
  if (options.stream != nullptr) return options.stream;
  return options.perThreadDefaultStream ? perThreadDefaultStream() : legacyDefaultStream();
}

NcclState::~NcclState() {
  try {
    DeviceGuard guard(*api, device);
    if (comm != nullptr && !aborted) {
      // A broken communicator is aborted (never waits); a healthy one is destroyed.
      if (broken) {
        api->commAbort(comm);
      } else {
        api->commDestroy(comm);
      }
    }
    if (scratch != nullptr) api->deviceFree(scratch);
    if (stream != nullptr) api->destroyStream(stream);
  } catch (...) {
  }
}

void NcclState::failLocked(const std::string& why) {
  if (!broken) {
    broken = true;
    cause = why;
  }
  if (comm != nullptr && !aborted) {
    aborted = true;
    api->commAbort(comm);
  }
}

void NcclState::settleLocked(int first, const Deadline& deadline, const std::string& what) {
  int state = first;
  while (state == kNcclInProgress) {
    if (deadline.expired()) {
      const std::string why = who + ": " + what + " did not finish within " +
                              std::to_string(deadline.elapsed().count()) +
                              " ms (NCCL still in progress; communicator aborted)";
      failLocked(why);
      throw TimeoutError(why);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (api->commGetAsyncError(comm, &state) != kNcclSuccess) break;
  }
  if (state != kNcclSuccess) {
    const std::string why = who + ": " + what + " failed: " + api->errorString(state) + " (" +
                            api->lastError(comm) + ")";
    failLocked(why);
    throw IoError(why);
  }
}

void NcclState::checkResult(int r, const std::string& what, const Deadline& deadline) {
  if (r != kNcclSuccess && r != kNcclInProgress) {
    const std::string why = who + ": " + what + " could not be enqueued: " + api->errorString(r) +
                            " (" + api->lastError(comm) + ")";
    failLocked(why);
    throw IoError(why);
  }
  settleLocked(r, deadline, what + " (enqueue)");
}

namespace {

// The watchdog's view of the device: the operations' events and the communicator.
class ApiWatchdogDevice final : public WatchdogDevice {
 public:
  explicit ApiWatchdogDevice(std::shared_ptr<NcclState> state) : state_(std::move(state)) {}
  Status query(const std::shared_ptr<void>& handle, std::string& error) override {
    switch (state_->api->queryEvent(handle.get(), error)) {
      case NcclApi::EventState::kDone:
        return Status::kDone;
      case NcclApi::EventState::kPending:
        return Status::kPending;
      case NcclApi::EventState::kFailed:
        break;
    }
    return Status::kFailed;
  }
  std::string asyncError() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    // Failed through a Work's own poll or abort(): the watchdog stops with that cause.
    if (state_->broken) return "the group failed: " + state_->cause;
    if (state_->comm == nullptr || state_->aborted) return {};
    int async = kNcclSuccess;
    if (state_->api->commGetAsyncError(state_->comm, &async) != kNcclSuccess) return {};
    if (async == kNcclSuccess || async == kNcclInProgress) return {};
    return state_->api->errorString(async) + " (" + state_->api->lastError(state_->comm) + ")";
  }
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    // The watchdog found this failure: the failure handler's diagnosis settles it. A group that
    // failed earlier (abort(), a failed enqueue) has its cause already.
    if (!state_->broken) state_->diagnosing = true;
    state_->failLocked(reason);
  }

 private:
  std::shared_ptr<NcclState> state_;
};

class ProcessGroupNccl final : public ProcessGroup {
 public:
  ProcessGroupNccl(std::shared_ptr<NcclApi> api, std::shared_ptr<Store> store, int rank, int size,
                   const ProcessGroupOptions& options, int device)
      : ProcessGroup("nccl", std::move(store), rank, size, options),
        state_(std::make_shared<NcclState>(api, who(), rank, size, device, options.nccl)) {
    if (options.nccl.hostSpin < std::chrono::microseconds(0) ||
        options.nccl.hostSpin > std::chrono::seconds(10)) {
      LOOM_THROW(InvalidArgumentError, who(), ": nccl.hostSpin must be 0 to 10 s, got ",
                 options.nccl.hostSpin.count(), " us");
    }
    NcclApi& a = *state_->api;
    const Deadline deadline(options.timeout);
    DeviceGuard guard(a, device);
    std::string id(a.uniqueIdBytes(), '\0');
    if (rank == 0) {
      const int r = a.getUniqueId(id);
      if (r != kNcclSuccess) {
        LOOM_THROW(IoError, who(), ": ncclGetUniqueId failed: ", a.errorString(r));
      }
    }
    id = exchangeUniqueId(*this->store(), options.groupName, rank, id, a.uniqueIdBytes(),
                          options.timeout);
    state_->stream = a.createStream();
    state_->scratch = a.deviceAlloc(sizeof(int32_t));
    state_->recorder = diagnostics() != nullptr ? &diagnostics()->recorder() : nullptr;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      const int r = a.commInitRank(&state_->comm, size, id, rank);
      if (r != kNcclSuccess && r != kNcclInProgress) {
        LOOM_THROW(IoError, who(), ": ncclCommInitRankConfig failed: ", a.errorString(r));
      }
      state_->settleLocked(r, deadline,
                           "ncclCommInitRankConfig (size " + std::to_string(size) + ")");
    }
    // Watches the stream when nobody waits: flight record start / end, abort on a deadline or
    // an asynchronous error, then the cross-rank diagnosis.
    watchdog_ = std::make_shared<Watchdog>(
        std::make_shared<ApiWatchdogDevice>(state_), state_->recorder, who(),
        [this](const std::string& reason, bool timedOut, const OpDesc* op) {
          diagnose(reason, timedOut, op);
        });
    state_->watchdog = watchdog_;
  }

  ~ProcessGroupNccl() override {
    // Issue what is batched, then wait for what is queued, bounded by the group's timeout;
    // abort when it does not finish.
    try {
      state_->flush();
      const Deadline deadline(options().timeout);
      DeviceGuard guard(*state_->api, state_->device);
      for (;;) {
        if (state_->api->streamIdle(state_->stream)) break;
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
    watchdog_.reset();  // joins its thread (and a diagnosis it runs) before the group goes
    leave();
  }

  void abort(const std::string& reason) override {
    const std::string cause = who() + ": aborted: " + reason;
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      first = !state_->broken;
      state_->failLocked(cause);
    }
    // As the comm backend: the abort's report and flight record go to the store (on the
    // exchange's own thread: abort() never waits), for the ranks that fail later.
    if (first) {
      const auto window = std::min(options().failureReportWindow, options().timeout / 2);
      pg_failure::FailureExchange::start(
          store(), rank(), size(), "io\n" + cause,
          diagnostics() ? diagnostics()->dumpLocal("abort", diag::GroupDiagnostics::kFailureEntries)
                        : "",
          window, false);
    }
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
    switch (op.type) {
      case OpType::kReduceScatterv:
        LOOM_THROW(InvalidArgumentError, who(),
                   ": reduce_scatterv: NCCL has no reduce-scatter with uneven counts; pad every "
                   "rank's block to the largest count and use reduceScatter, or use a tcp group");
      case OpType::kMonitoredBarrier:
        LOOM_THROW(InvalidArgumentError, who(),
                   ": monitored_barrier is not supported by the nccl backend (as in c10d); run it "
                   "on a tcp group over the same store");
      default:
        break;
    }
    if (pg_checks::isReduction(op.type)) {
      (void)ncclReductionOf(who(), opTypeName(op.type), op.dtype, op.reduceOp);
    }
    if (op.type == OpType::kRecv && op.root == kAnySource) {
      LOOM_THROW(InvalidArgumentError, who(),
                 ": recv from any source: NCCL receives from one named rank only (ncclRecv takes "
                 "its peer); name the source, or use a tcp group");
    }
    if ((op.type == OpType::kSend || op.type == OpType::kRecv) && op.tag != 0) {
      LOOM_THROW(InvalidArgumentError, who(), ": ", opTypeName(op.type),
                 ": NCCL has no message tags (got tag ", op.tag,
                 "); use tag 0: NCCL matches a rank's sends to a peer with the peer's receives "
                 "in issue order");
    }
  }

  std::shared_ptr<Work> post(OpDesc&& desc) override {
    auto op = std::make_shared<const OpDesc>(std::move(desc));
    auto work = std::make_shared<NcclWork>(*op, rank(), state_);
    if (op->type == OpType::kRecv) work->setSourceRank(op->root);  // NCCL names its peer
    const bool p2p = op->type == OpType::kSend || op->type == OpType::kRecv;
    try {
      // DETAIL: the signatures of every rank's collective, before anything is enqueued; a
      // mismatch fails this Work and leaves the group usable.
      if (debugLevel() == DebugLevel::kDetail && isCollective(op->type) && !isBroken()) {
        try {
          pg_failure::checkSignatureInStore(*this, *op, lastSignatureSeq_);
        } catch (const InvalidArgumentError&) {
          recordEnd(*op, true);
          work->markFailed(std::current_exception());
          return work;
        } catch (const std::exception& e) {
          // The ranks did not all reach the check (or the store failed): the group is unusable.
          std::lock_guard<std::mutex> lock(state_->mu);
          state_->failLocked(e.what());
          throw;
        }
      }
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->broken) {
        throw IoError(who() + ": " + op->describe() +
                      " was not run: the group failed earlier: " + state_->cause);
      }
      NcclApi& a = *state_->api;
      DeviceGuard guard(a, state_->device);
      {
        // Ordered after the work queued on the caller's stream (the event's latest record is
        // what the wait captures, so it goes back to the pool at once).
        EventHandle ready = state_->events.acquire();
        a.recordEvent(ready.get(), callerStream(state_->options));
        a.streamWaitEvent(state_->stream, ready.get());
      }
      if (p2p) {
        state_->batch.push_back(PendingP2P{op, work});
        if (state_->batch.size() == 1) armBatchTimer(*watchdog_, state_);
        return work;
      }
      state_->flushLocked();
      if (state_->broken) {
        throw IoError(who() + ": " + op->describe() +
                      " was not run: the group failed: " + state_->cause);
      }
      enqueueLocked(*op);
      EventHandle done = state_->events.acquire();
      a.recordEvent(done.get(), state_->stream);
      work->setIssued(done);
      watchdog_->track(
          std::move(done), op->recordId,
          op->describe() + " (" + std::to_string(op->count * dtypeSize(op->dtype)) + " bytes)",
          op->timeout, op);
    } catch (...) {
      recordEnd(*op, true);
      work->markFailed(std::current_exception());
    }
    return work;
  }

  void endPointToPointBatch() override {
    try {
      state_->flush();
    } catch (const std::exception& e) {
      // flushLocked fails the batch's Works itself; a device error here is on them too.
      LOOM_LOG_WARNING(who(), ": issuing the send/recv batch: ", e.what());
    }
  }

 private:
  // On the watchdog thread, after it aborted the communicator: the comm backend's cross-rank
  // failure exchange (pg_failure.h), whose outcome becomes the failing operation's error.
  void diagnose(const std::string& reason, bool timedOut, const OpDesc* op) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->diagnosing) return;  // the group had failed before the watchdog saw it
    }
    std::exception_ptr error;
    std::string message = reason;
    if (op != nullptr) {
      try {
        pg_failure::FailureCause cause;
        cause.what = reason;
        cause.timedOut = timedOut;
        const pg_failure::FailureOutcome outcome = pg_failure::exchangeReports(
            *this, *op, cause, pg_failure::ownMessage(*this, *op, reason),
            diagnostics()
                ? diagnostics()->dumpLocal("failure", diag::GroupDiagnostics::kFailureEntries)
                : "",
            {});
        message = outcome.message;
        error = outcome.error();
      } catch (const std::exception& e) {
        LOOM_LOG_WARNING(who(), ": the failure diagnosis failed: ", e.what());
      }
    }
    if (!error) {
      error = timedOut ? std::make_exception_ptr(TimeoutError(message))
                       : std::make_exception_ptr(IoError(message));
    }
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->cause == reason) state_->cause = message;
      state_->failedOp = op != nullptr ? op->describe() : "";
      state_->failedError = error;
      state_->diagnosing = false;
    }
    state_->settled.notify_all();
  }

  // Requires state_->mu held.
  void enqueueLocked(const OpDesc& op) {
    NcclState& s = *state_;
    NcclApi& a = *s.api;
    const Deadline deadline(op.timeout);
    const NcclType dt = ncclTypeOf(op.dtype);
    const auto red = [&] {
      return ncclReductionOf(who(), opTypeName(op.type), op.dtype, op.reduceOp).op;
    };
    const size_t bytes = op.count * dtypeSize(op.dtype);
    const std::string what = op.describe();
    int r = kNcclSuccess;
    switch (op.type) {
      case OpType::kAllreduce:
        r = a.allReduce(op.in.data, op.out.data, op.count, dt, red(), s.comm, s.stream);
        break;
      case OpType::kBroadcast:
        r = a.broadcast(op.in.data, op.out.data, op.count, dt, op.root, s.comm, s.stream);
        break;
      case OpType::kReduce:
        r = a.reduce(op.in.data, op.out.data ? op.out.data : op.in.data, op.count, dt, red(),
                     op.root, s.comm, s.stream);
        break;
      case OpType::kAllgather:
        r = a.allGather(op.in.data, op.out.data, op.count, dt, s.comm, s.stream);
        break;
      case OpType::kReduceScatter:
        r = a.reduceScatter(op.in.data, op.out.data, op.count, dt, red(), s.comm, s.stream);
        break;
      case OpType::kBarrier:
        r = a.allReduce(s.scratch, s.scratch, 1, NcclType::kInt32, NcclOp::kSum, s.comm, s.stream);
        break;
      case OpType::kSend:
      case OpType::kRecv:
        LOOM_THROW(InvalidArgumentError, who(), ": ", what, " goes through the batch");
      case OpType::kGather:
      case OpType::kScatter:
      case OpType::kAlltoall: {
        // Built from grouped point-to-point calls.
        char* in = static_cast<char*>(op.in.data);
        char* out = static_cast<char*>(op.out.data);
        a.groupStart();
        for (int peer = 0; peer < size(); ++peer) {
          const size_t at = static_cast<size_t>(peer) * bytes;
          if (op.type == OpType::kGather) {
            if (rank() == op.root) a.recv(out + at, op.count, dt, peer, s.comm, s.stream);
            if (peer == op.root) a.send(in, op.count, dt, peer, s.comm, s.stream);
          } else if (op.type == OpType::kScatter) {
            if (rank() == op.root) a.send(in + at, op.count, dt, peer, s.comm, s.stream);
            if (peer == op.root) a.recv(out, op.count, dt, peer, s.comm, s.stream);
          } else {
            a.send(in + at, op.count, dt, peer, s.comm, s.stream);
            a.recv(out + at, op.count, dt, peer, s.comm, s.stream);
          }
        }
        r = a.groupEnd();
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
        a.groupStart();
        for (int peer = 0; peer < size(); ++peer) {
          const bool receives = op.type != OpType::kGatherv || rank() == op.root;
          const bool sends = op.type != OpType::kGatherv || peer == op.root;
          // In place (allgatherv, gatherv's root): this rank's block already sits in out.
          const bool selfInPlace =
              !toAll && receives && peer == rank() && out + recvAt * esize == in;
          if (receives && recvCounts[peer] > 0 && !selfInPlace) {
            a.recv(out + recvAt * esize, recvCounts[peer], dt, peer, s.comm, s.stream);
          }
          if (toAll && sendCounts[peer] > 0) {
            a.send(in + sendAt * esize, sendCounts[peer], dt, peer, s.comm, s.stream);
          } else if (!toAll && sends && sendCounts[rank()] > 0 && !selfInPlace) {
            a.send(in, sendCounts[rank()], dt, peer, s.comm, s.stream);
          }
          sendAt += sendCounts[peer];
          recvAt += recvCounts[peer];
        }
        r = a.groupEnd();
        break;
      }
      case OpType::kAllreduceCoalesced: {
        // One grouped launch of an all-reduce per buffer, in place.
        const NcclOp rop = red();
        a.groupStart();
        for (const BufferView& b : op.buffers) {
          if (b.count == 0) continue;
          a.allReduce(b.data, b.data, b.count, dt, rop, s.comm, s.stream);
        }
        r = a.groupEnd();
        break;
      }
      case OpType::kReduceScatterv:
      case OpType::kMonitoredBarrier:
        LOOM_THROW(InvalidArgumentError, who(), ": ", what, " is not supported by nccl");
    }
    s.checkResult(r, what, deadline);
  }

  std::shared_ptr<NcclState> state_;
  // Destroyed (its thread joined) in the destructor, before the state and the base go.
  std::shared_ptr<Watchdog> watchdog_;
  uint64_t lastSignatureSeq_ = 0;  // DETAIL, issuing thread (issue lock)
};

}  // namespace

std::shared_ptr<ProcessGroup> createProcessGroupNcclOn(std::shared_ptr<NcclApi> api,
                                                       std::shared_ptr<Store> store, int rank,
                                                       int size,
                                                       const ProcessGroupOptions& options) {
  const int count = api->deviceCount();
  if (count == 0) {
    LOOM_THROW(NotAvailableError, "rank ", rank,
               ": nccl backend: no CUDA device is usable by this process (", api->whyNoDevice(),
               "); use the tcp backend for CPU buffers");
  }
  const int device = pickDevice(options.nccl.device, options.nccl.localRank, rank, count);
  // Before the device is touched: a second process with this rank must not create a context or
  // join NCCL's rendezvous in the first one's place.
  claimGroupRank(*store, options.groupName, rank, size, options.timeout);
  return std::make_shared<ProcessGroupNccl>(std::move(api), std::move(store), rank, size, options,
                                            device);
}

}  // namespace nccl_detail

}  // namespace loom
