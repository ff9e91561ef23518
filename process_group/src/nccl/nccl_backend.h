// The NCCL backend (built only when LOOM_HAVE_NCCL). Private to loom_process_group: users get
// it through createProcessGroup("nccl", ...). This header is free of CUDA and NCCL headers.
//
// ProcessGroupNccl contract (on top of ProcessGroup's)
// - CUDA buffers on the group's device only (options.nccl.device, else options.nccl.localRank
//   (LOCAL_RANK) or the rank modulo the device count). No device visible: NotAvailableError, before
//   the store is touched, so every rank of a device-less job fails alike.
// - Setup: rank 0 creates the ncclUniqueId and publishes it in the store under
//   "nccl/unique_id"; the others wait for it (options.timeout). The communicator is created
//   non-blocking, so its setup and every enqueue are polled against a deadline and aborted
//   (ncclCommAbort) when it passes.
// - One communicator and one CUDA stream per group. An operation is enqueued on that stream
//   on the caller's thread (after the work already queued on the device's legacy default
//   stream), in issue order; its Work is a CUDA event. Work::wait / isCompleted poll the event
//   and the communicator's asynchronous error (ncclCommGetAsyncError); when the operation's
//   deadline (counted from issue) passes first, the communicator is aborted and the Work fails
//   with TimeoutError. After any failure the group is broken (every later operation fails at
//   once with IoError naming the cause).
// - Out-of-place allreduce, broadcast and reduce pass their input and output to ncclAllReduce,
//   ncclBroadcast and ncclReduce (which take both); in place, the two are one buffer.
// - Tags on send / recv are not supported by NCCL (InvalidArgumentError when non-zero);
//   bitwise reduce ops neither (InvalidArgumentError naming the op).
// - Destruction waits for the outstanding operations (bounded by options.timeout), then
//   destroys the communicator, or aborts it when the group is broken or the wait expired.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "loom/process_group/process_group.h"

namespace loom {

// CUDA devices visible to this process; 0 when there is none or the driver is missing.
int ncclDeviceCount() noexcept;

std::shared_ptr<ProcessGroup> createProcessGroupNccl(std::shared_ptr<Store> store, int rank,
                                                     int size, const ProcessGroupOptions& options);

namespace nccl_detail {

constexpr const char* kUniqueIdKey = "nccl/unique_id";

// Rank 0 publishes `id` under kUniqueIdKey and returns it; the other ranks wait up to
// `timeout` for it and return what they read. A value of the wrong size is an IoError naming
// the key, its size and `idBytes`.
std::string exchangeUniqueId(Store& store, int rank, const std::string& id, size_t idBytes,
                             std::chrono::milliseconds timeout);

// The device this rank uses: `requested` when >= 0 (checked against `deviceCount`), else
// `localRank` (or the rank when localRank < 0) modulo `deviceCount`.
int pickDevice(int requested, int localRank, int rank, int deviceCount);

// Throws InvalidArgumentError when NCCL cannot reduce `op` (bitwise ops) or move `dtype`.
void checkNcclReduceOp(const std::string& who, const char* opName, ReduceOp op);

}  // namespace nccl_detail

}  // namespace loom
