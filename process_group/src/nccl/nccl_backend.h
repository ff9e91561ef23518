// The NCCL backend. Private to loom_process_group: users get it through
// createProcessGroup("nccl", ...). This header is free of CUDA and NCCL headers; the backend's
// logic (nccl_backend.cc) reaches the device only through NcclApi (nccl_api.h), so that it is
// unit-tested on a fake device without a GPU, and built with or without NCCL.
//
// ProcessGroupNccl contract (on top of ProcessGroup's; c10d's ProcessGroupNCCL semantics)
// - CUDA buffers on the group's device only (options.nccl.device, else options.nccl.localRank
//   (LOCAL_RANK) or the rank modulo the device count). No device visible: NotAvailableError, before
//   the store is touched, so every rank of a device-less job fails alike.
// - Setup: every rank counts its incarnations of the group on the store (add on
//   nccl/<group>/incarnation/<rank>; <group> is options.groupName or "default"); rank 0 creates
//   the ncclUniqueId and publishes it under nccl/<group>/<incarnation>/unique_id; the others
//   wait for that key (options.timeout). A group re-created on a store that persists therefore
//   never reads an earlier incarnation's id. The communicator is non-blocking: its setup and
//   every enqueue are polled against the deadline and aborted (ncclCommAbort) when it passes.
// - Streams. One communicator and one internal CUDA stream per group; operations are enqueued on
//   it on the issuing thread, in issue order. The caller's stream is, in this order, the
//   thread's innermost NcclStreamGuard (loom/process_group/nccl.h), options.nccl.stream, or the
//   thread's default stream (the legacy default stream, or cudaStreamPerThread with
//   options.nccl.perThreadDefaultStream). An operation is ordered after the work queued on the
//   caller's stream when it is issued (an event recorded there, waited for by the internal
//   stream). Events come from a pool (nccl_event_pool.h).
// - Work::wait() makes the waiting thread's caller's stream wait for the operation
//   (cudaStreamWaitEvent) and returns without blocking the host; it throws at once when the
//   operation or the group already failed. Work::wait(timeout), and wait() with
//   options.nccl.blockingWait, block the host: the event is queried back to back for
//   options.nccl.hostSpin (50 us; a small operation ends within that), then the thread waits in
//   cudaEventSynchronize, which spins, yields or sleeps as the CUDA context's scheduling flags
//   say (cudaSetDeviceFlags; by default it spins where the cores outnumber the contexts, as
//   torch's waits do; the events are plain, not blocking-sync: measured on an H200, a
//   blocking-sync wake-up added ~100 us to a 5 ms operation), bounded by the operation's
//   deadline and the timeout: the watchdog aborts the communicator when the earlier passes, which
//   ends the kernels and the wait, and the Work fails with TimeoutError. isCompleted() queries the
//   event and never waits for the operation (it may issue an open point-to-point batch). Buffers
//   stay valid until the Work completed (isCompleted, or a host-blocking wait).
// - Point-to-point. Consecutive send / recv operations form one batch, issued as one NCCL group
//   (ncclGroupStart / ncclGroupEnd) when it ends: at the next other operation, at the end of
//   batchSendRecv (every batchSendRecv is one group), when one of its Works is waited on or
//   polled, at destruction, or when none of that happened options.nccl.p2pBatchWindow after
//   its first operation (the watchdog issues it). So a ring exchange (send right, recv left) is
//   one group and does not deadlock. NCCL matches a rank's sends to a peer with the peer's
//   receives in order; it has no tags (a non-zero tag is InvalidArgumentError) and no receive
//   from any source (InvalidArgumentError).
// - Reductions (nccl_api.h, ncclReductionOf): c10d's: bool SUM/MAX/BOR are logical OR (ncclMax
//   on bytes), PROD/MIN/BAND logical AND (ncclMin); AVG is ncclAvg (refused for bool); other
//   bitwise ops are InvalidArgumentError naming the reason. Out-of-place allreduce, broadcast
//   and reduce pass their input and output to NCCL (which takes both).
// - Failure. The watchdog (nccl_watchdog.h) aborts the communicator at an operation's deadline
//   or on an asynchronous error; the group is then broken. The failing operation's error is the
//   comm backend's cross-rank diagnosis (pg_failure.h: every rank's report and flight record
//   through the store, the analysis naming the rank that never arrived or died), computed on
//   the watchdog thread within the report window; every other queued and later operation fails
//   with IoError naming that cause. LOOM_DEBUG=DETAIL checks each collective's signature
//   across ranks through the store on the issuing thread before it is enqueued (a mismatch is
//   InvalidArgumentError on every rank; nothing was enqueued and the group stays usable).
// - Destruction issues an open batch, waits for the outstanding operations (bounded by
//   options.timeout), then destroys the communicator, or aborts it when the group is broken or
//   the wait expired.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "loom/process_group/process_group.h"

namespace loom {

class Store;

// CUDA devices visible to this process; 0 when there is none or the driver is missing (always 0
// when built without NCCL).
int ncclDeviceCount() noexcept;
// When ncclDeviceCount() is 0: why, with CUDA's error (for the NotAvailableError).
std::string ncclNoDeviceReason();

// With the real device (built with NCCL only).
std::shared_ptr<ProcessGroup> createProcessGroupNccl(std::shared_ptr<Store> store, int rank,
                                                     int size, const ProcessGroupOptions& options);

namespace nccl_detail {

class NcclApi;

// The backend over `api` (the real one, or a test's fake).
std::shared_ptr<ProcessGroup> createProcessGroupNcclOn(std::shared_ptr<NcclApi> api,
                                                       std::shared_ptr<Store> store, int rank,
                                                       int size,
                                                       const ProcessGroupOptions& options);

// The store key of incarnation `incarnation` (1, 2, ...) of group `group`'s unique id.
std::string uniqueIdKey(const std::string& group, int64_t incarnation);
// This rank's next incarnation of `group` on `store` (1 for its first).
int64_t nextIncarnation(Store& store, const std::string& group, int rank);

// Before any device call: this process claims `rank` of `group` on `store` (rank_claim.h, under
// "nccl/<group>/claim/<rank>"), then waits up to `timeout` until every rank has claimed its own.
// A second process with this rank is refused (InvalidArgumentError naming both, published under
// "nccl/<group>/setup-failed"), and the ranks still waiting stop at once with that error; a rank
// that never claims is a TimeoutError naming it. A group the same processes create again finds
// every claim in place and returns at once. Nothing for a group of one.
std::string claimKey(const std::string& group, int rank);
void claimGroupRank(Store& store, const std::string& group, int rank, int size,
                    std::chrono::milliseconds timeout);

// Rank 0 publishes `id` under uniqueIdKey(group, its next incarnation) and returns it; the other
// ranks wait up to `timeout` for their incarnation's key (TimeoutError naming it) and return what
// they read. A value of the wrong size is an IoError naming the key, its size and `idBytes`.
std::string exchangeUniqueId(Store& store, const std::string& group, int rank,
                             const std::string& id, size_t idBytes,
                             std::chrono::milliseconds timeout);

// The device this rank uses: `requested` when >= 0 (checked against `deviceCount`), else
// `localRank` (or the rank when localRank < 0) modulo `deviceCount`.
int pickDevice(int requested, int localRank, int rank, int deviceCount);

}  // namespace nccl_detail

}  // namespace loom
