// ProcessGroup: the public face of Loom's communication (c10d's ProcessGroup).
//
// Contract
// - A group is `size()` ranks; this object is rank `rank()`. Every rank of the group issues
//   the same collectives in the same order with matching arguments (dtype, count, reduce op,
//   root). Each collective gets the next sequence number of the group (1, 2, ...), the same on
//   every rank; send/recv get a per-peer sequence number instead ("send#3 to rank 1"), since
//   point-to-point traffic is not collective.
// - Every operation is asynchronous: the call checks its arguments on the caller's thread
//   (InvalidArgumentError, thrown at once, for a root out of range, buffer sizes that do not
//   match the world size, mismatched dtypes, a bitwise reduce op on a floating-point dtype,
//   a buffer on a device the backend cannot use), then queues the operation and returns its
//   Work; issuing never waits for an earlier operation. Operations run one at a time in
//   issue order, on the group's own thread, so the caller computes while they run; a
//   backend may instead run an operation on the thread that waits for it (Work::wait on an
//   operation that has not started: the comm backend does, which spares issue-then-wait two
//   thread wake-ups), never out of order. Buffers are caller-owned and must stay valid until
//   the Work completes.
// - Issue operations on one group from one thread at a time (or serialize the calls): the
//   issue order defines the sequence numbers. Threads may take turns (c10d allows it), but two
//   threads issuing at once take an order that can differ between ranks, which pairs different
//   buffers across ranks: silently wrong results, or a hang. A thread that starts to issue while
//   another thread of the process is inside an issue call on the same group gets an
//   InvalidArgumentError naming both threads and operations, and the group is aborted with the
//   same text (its peers fail naming it), since the ranks' orders may already differ. Calls
//   that do not overlap in time cannot be told from turns and are not caught.
// - send / recv take the same queue; consecutive send / recv operations are started together
//   (backends may batch them), so a ring exchange (send right, then recv left) does not
//   deadlock whatever the size. A send with no matching recv posted behind it may block the
//   queue until the peer receives.
// - Every operation has a deadline: its options' timeout, or the group's. A TimeoutError
//   names the operation, its sequence number, the peer waited on and the bytes outstanding,
//   and the ranks that did not report the failure (the suspects).
// - Failure: an IoError (a peer died, a connection was reset, a deadline passed, abort()) makes
//   the group unusable. The failing operation's Work holds the error; every queued and future
//   operation fails at once with an IoError that names the original cause. Destroy the group
//   (that never hangs) and create a new one.
// - Debug mode: LOOM_DEBUG=DETAIL (or options.debug) makes every collective first compare its
//   signature (op, dtype, count, reduce op, root, sequence number) across ranks through the
//   store; on a mismatch every rank throws InvalidArgumentError printing each signature and
//   the ranks that used it. The group stays usable after a mismatch.
// - Flight recorder (loom/process_group/diagnostics.h, docs/diagnostics.md): the group keeps
//   its last flightRecorderEntries operations in a ring (issue, start and end times, state),
//   at a cost of a few clock reads per operation. When a collective fails, every rank's error
//   carries one explanation built from every rank's ring ("rank 2 never entered collective
//   #5 ..."); dumpFlightRecord() and SIGUSR1 dump the ring to the store and to dumpDir. With
//   the recorder on, each group runs one more thread (blocked in a store wait, answering other
//   ranks' dump requests), and the first such group installs a SIGUSR1 handler unless the
//   program has its own.
// - Destruction waits for queued operations (each bounded by its deadline), then closes the
//   connections. Call abort() first to drop them instead.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/types.h"
#include "loom/process_group/diagnostics.h"
#include "loom/process_group/work.h"

namespace loom {

class Store;
namespace diag {
class GroupDiagnostics;
class FlightRecorder;
}  // namespace diag

enum class DebugLevel : uint8_t { kOff, kInfo, kDetail };
// Parses a LOOM_DEBUG value: empty = kOff; OFF, 0, INFO, DETAIL (any case). Anything else is
// an InvalidArgumentError naming the value and the accepted ones.
DebugLevel parseDebugLevel(std::string_view value);
const char* debugLevelName(DebugLevel level);

// Options of the comm backend: comm/ algorithms over a comm::Context ("tcp": TCP between
// hosts, shared memory within one; "verbs": RDMA). The other backends do not read them.
struct CommBackendOptions {
  // The Context's own options (host, shared memory, ...); unset fields take their LOOM_*
  // variables when the Context is created (comm/context.h). Its timeout must be left at its
  // default or equal ProcessGroupOptions::timeout, which is the one deadline of the group
  // (InvalidArgumentError otherwise).
  // context.algorithm forces one comm algorithm for every collective (kAuto: by size and
  // world size, or LOOM_ALGO).
  comm::ContextOptions context{};
  // The hand-off (docs/handoff.md), in microseconds, 0 to 1000000: how long the worker leaves
  // a fresh lone operation to the thread that will wait on it (LOOM_PG_GRACE_US), and how
  // long it naps while waiting threads run operations themselves (LOOM_PG_NAP_US). 0 turns
  // either off.
  int graceUs = 50;
  int napUs = 1000;
};

// Options of the nccl backend (its contract: process_group/src/nccl/nccl_backend.h; the per-call
// stream: loom/process_group/nccl.h).
struct NcclOptions {
  // CUDA device ordinal; -1 picks localRank modulo the visible devices.
  int device = -1;
  // This process's rank on its node (LOCAL_RANK); -1 = the group rank.
  int localRank = -1;
  // The caller's stream (a cudaStream_t) for every operation of the group: each is ordered after
  // the work queued on it, and Work::wait() makes it wait. nullptr: the issuing thread's default
  // stream (an NcclStreamGuard on the thread overrides both).
  void* stream = nullptr;
  // Whether the issuing thread's default stream is its per-thread one (cudaStreamPerThread: code
  // built with nvcc --default-stream per-thread or CUDA_API_PER_THREAD_DEFAULT_STREAM) rather
  // than the legacy default stream.
  bool perThreadDefaultStream = false;
  // c10d's blocking wait: Work::wait() also blocks the host until the operation completed
  // (after a hostSpin of queries, in cudaEventSynchronize, which spins, yields or sleeps as the
  // CUDA context's scheduling flags say; bounded by the operation's deadline).
  bool blockingWait = false;
  // How long a host wait (blockingWait, Work::wait(timeout)) queries the operation's event back
  // to back before it waits in cudaEventSynchronize, in [0, 10 s] (LOOM_NCCL_WAIT_SPIN_US).
  std::chrono::microseconds hostSpin{50};
  // Consecutive send / recv operations are issued to NCCL as one group when the batch ends: at
  // the next other operation, at the end of batchSendRecv, when one of them is waited on or
  // polled, or, when nothing of that happens, this long after the batch's first operation.
  std::chrono::milliseconds p2pBatchWindow{5};
};

// Fields left at their defaults take the environment's values at the entry points
// (createProcessGroup, initProcessGroup; docs/env.md): LOOM_DEBUG, LOOM_FLIGHT_RECORDER_ENTRIES,
// LOOM_DUMP_DIR, LOOM_HEARTBEAT_MS, LOOM_TRACE, LOOM_PG_GRACE_US, LOOM_PG_NAP_US, LOCAL_RANK.
struct ProcessGroupOptions {
  // Connection setup deadline and default deadline of every operation.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Unset: LOOM_DEBUG (kOff when that is unset too).
  std::optional<DebugLevel> debug = std::nullopt;
  // Shown in messages ("rank 1 of group/2"); newGroup names its groups "group/<id>".
  std::string groupName{};
  // Set by newGroup: the members' ranks in the parent group, so that messages can be mapped
  // back ("rank 1 of group/2 (parent ranks 1,3)"). Peers named by the comm layer use the
  // group's own numbering.
  std::vector<int> parentRanks{};
  // After a failure, how long a rank waits for the other ranks' failure reports before it
  // raises (so that its error can name the ranks that never reported). Capped at timeout / 2.
  std::chrono::milliseconds failureReportWindow{2000};
  // Operations the flight recorder keeps (LOOM_FLIGHT_RECORDER_ENTRIES); 0 turns it off, and
  // with it the dumps and the failure analysis.
  int flightRecorderEntries = 2000;
  // Every how many operations (by sequence number; rounded up to a power of two) the
  // recorder reads the time-stamp counter for their start and end
  // (LOOM_FLIGHT_RECORDER_PRECISE_EVERY; docs/diagnostics.md, "Times"), besides every
  // operation of 64 KiB or more: the others take the backend's millisecond tick while it has
  // one. 1: every operation (~10% of an 8-byte shm all-reduce where reading the counter is
  // slow, as under some hypervisors).
  int flightRecorderPreciseEvery = 256;
  // Where dumps are written as JSON, one file per rank and group (LOOM_DUMP_DIR); empty: the
  // store only.
  std::string dumpDir{};
  // How often each rank's flight recorder publishes a heartbeat in the store
  // (LOOM_HEARTBEAT_MS): its host, pid, time and progress, which the failure analysis reads to
  // tell a rank that is alive but not progressing (stopped, hung) from a dead one. 0: only the
  // first beat, at construction (host and pid: the same-host process check still works).
  std::chrono::milliseconds heartbeatInterval{1000};
  // Tests only: microseconds added to every time this rank's diagnostics read (flight record,
  // heartbeats, clock estimate), as on a host whose clock is that far off. 0 in real use.
  int64_t diagnosticsClockSkewUs = 0;
  // The rank whose process hosts the store's server (initProcessGroup sets 0: rank 0 hosts the
  // TCPStore); -1: not a rank (a standalone loom-store, a FileStore) or unknown. A failure that
  // finds the store gone then names that rank as the store host that died.
  int storeHostRank = -1;
  // Whether this process hosts the server of the group's store, so that its exit takes the
  // store away from the other ranks (torch's TCPStore under env://, initProcessGroup's: rank
  // 0). Leaving the group (leave(), destruction) then waits up to leaveTimeout for every other
  // rank to stop using the store first: their diagnostics threads' requests would otherwise
  // fail (docs/diagnostics.md, "Leaving a group"). Unset: rank == storeHostRank.
  std::optional<bool> hostsStore{};
  std::chrono::milliseconds leaveTimeout{10000};
  // Where this process writes its Chrome / Perfetto trace (LOOM_TRACE;
  // loom/process_group/trace.h): the first group created with one opens it; empty: no trace.
  std::string traceDir{};

  CommBackendOptions comm{};  // "tcp" and "verbs"
  NcclOptions nccl{};         // "nccl"
};

using OptionalTimeout = std::optional<std::chrono::milliseconds>;  // unset: the group's

// Every member of the options structs has a default, so that designated initializers such as
// pg.broadcast(buf, {.root = 1}) compile without -Wmissing-field-initializers warnings.

struct AllreduceOptions {
  ReduceOp reduceOp = ReduceOp::kSum;
  OptionalTimeout timeout = std::nullopt;
};
struct BroadcastOptions {
  int root = 0;
  OptionalTimeout timeout = std::nullopt;
};
struct ReduceOptions {
  ReduceOp reduceOp = ReduceOp::kSum;
  int root = 0;
  OptionalTimeout timeout = std::nullopt;
};
struct AllgatherOptions {
  OptionalTimeout timeout = std::nullopt;
};
struct ReduceScatterOptions {
  ReduceOp reduceOp = ReduceOp::kSum;
  OptionalTimeout timeout = std::nullopt;
};
struct GatherOptions {
  int root = 0;
  OptionalTimeout timeout = std::nullopt;
};
struct ScatterOptions {
  int root = 0;
  OptionalTimeout timeout = std::nullopt;
};
struct AlltoallOptions {
  OptionalTimeout timeout = std::nullopt;
};
struct BarrierOptions {
  OptionalTimeout timeout = std::nullopt;
};
struct SendRecvOptions {
  OptionalTimeout timeout = std::nullopt;
};
struct MonitoredBarrierOptions {
  OptionalTimeout timeout = std::nullopt;
  // On rank 0, after a timeout: false names the first rank that did not arrive (c10d's
  // default), true names every rank that did not arrive by the deadline.
  bool waitAllRanks = false;
};

// One entry of batchSendRecv (c10d's P2POp): a send to or a receive from `peer`.
struct PointToPointOp {
  OpType type = OpType::kSend;  // kSend or kRecv
  BufferView buf{};
  int peer = 0;
  uint64_t tag = 0;
};

// OpDesc::root of a receive from any source.
constexpr int kAnySource = -1;

// One issued operation as a backend receives it, arguments already checked. `count` is the
// per-rank element count the comm layer takes (comm/collectives.h).
struct OpDesc {
  OpType type = OpType::kBarrier;
  BufferView in;
  BufferView out;
  size_t count = 0;
  DType dtype = DType::kUInt8;
  ReduceOp reduceOp = ReduceOp::kSum;
  int root = 0;  // root of rooted collectives; the peer of send / recv (kAnySource: any)
  uint64_t tag = 0;
  uint64_t seq = 0;
  std::chrono::milliseconds timeout{0};
  // The uneven collectives' element counts per rank: alltoallv's inSplits (`inCounts`) and
  // outSplits (`outCounts`), the per-rank counts of allgatherv, gatherv and reduceScatterv
  // (`inCounts`). `count` is then the total this rank sends.
  std::vector<size_t> inCounts{};
  std::vector<size_t> outCounts{};
  // allreduceCoalesced's buffers (in place); `count` is their total.
  std::vector<BufferView> buffers{};
  bool waitAllRanks = false;  // monitoredBarrier
  uint64_t recordId = 0;      // its flight recorder entry (0: not recorded)
  // Its start and end go to the recorder's in-order progress words (FlightRecorder::
  // recordIssue says so; the comm backend's collectives).
  bool recordInOrder = false;

  // "allreduce#17", "send#3 to rank 1", "recv#2 from rank 0"
  std::string describe() const;
  // The debug-mode signature: "allreduce(dtype=float, count=1000, op=sum)#17".
  std::string signature() const;
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& backendName() const { return backend_; }
  const ProcessGroupOptions& options() const { return options_; }
  const std::shared_ptr<Store>& store() const { return store_; }
  // Whether store() is shared by the group's ranks. False only for an mpi group created without
  // one (null store, or initProcessGroup under mpirun without MASTER_ADDR): its store is private
  // to the rank, and what exchanges through the store (stragglers(), monitored_barrier) is
  // refused with InvalidArgumentError instead of waiting for ranks that can never answer.
  virtual bool sharedStore() const { return true; }
  DebugLevel debugLevel() const { return debug_; }
  // Sequence number of the last collective issued (0 before the first).
  uint64_t lastSeq() const;

  // In place: buf on every rank becomes the reduction of every rank's buf.
  std::shared_ptr<Work> allreduce(BufferView buf, const AllreduceOptions& opts = {});
  // Out of place: out (in.count) on every rank = the reduction of every rank's in; in is
  // left unchanged unless it is out.
  std::shared_ptr<Work> allreduce(BufferView in, BufferView out, const AllreduceOptions& opts = {});
  // buf on opts.root is copied into buf on every rank.
  std::shared_ptr<Work> broadcast(BufferView buf, const BroadcastOptions& opts = {});
  // Out of place: in on opts.root is copied into out on every rank (the root included); in is
  // ignored (may be empty) elsewhere.
  std::shared_ptr<Work> broadcast(BufferView in, BufferView out, const BroadcastOptions& opts = {});
  // In place on the root; other ranks' buf is left unchanged.
  std::shared_ptr<Work> reduce(BufferView buf, const ReduceOptions& opts = {});
  // Out of place: out (in.count) on opts.root = the reduction of every rank's in; in is left
  // unchanged unless it is out; out is ignored (may be empty) elsewhere.
  std::shared_ptr<Work> reduce(BufferView in, BufferView out, const ReduceOptions& opts = {});
  // out (size * in.count) = every rank's in, in rank order.
  std::shared_ptr<Work> allgather(BufferView in, BufferView out, const AllgatherOptions& opts = {});
  // out (in.count / size) on rank r = reduction of slice r of every rank's in.
  std::shared_ptr<Work> reduceScatter(BufferView in, BufferView out,
                                      const ReduceScatterOptions& opts = {});
  // out (size * in.count) on the root = every rank's in; out is ignored (may be empty)
  // elsewhere.
  std::shared_ptr<Work> gather(BufferView in, BufferView out, const GatherOptions& opts = {});
  // out (count) on rank r = slice r of the root's in (size * count); in is ignored elsewhere.
  std::shared_ptr<Work> scatter(BufferView in, BufferView out, const ScatterOptions& opts = {});
  // in and out hold size slices; slice j of out on rank r = slice r of rank j's in.
  std::shared_ptr<Work> alltoall(BufferView in, BufferView out, const AlltoallOptions& opts = {});
  std::shared_ptr<Work> barrier(const BarrierOptions& opts = {});

  // Uneven counts (c10d's alltoall_base with split sizes and the list forms of all_gather and
  // gather). Splits and counts are in elements, one per rank, blocks packed in rank order.
  // InvalidArgumentError on the caller's thread when a list does not have size() entries or
  // does not add up to its buffer; a count that differs from what the peer sends fails the
  // operation naming it, both ranks and both sizes (the group is then broken).
  //
  // alltoallv: block j of in (inSplits[j]) goes to rank j; block j of out (outSplits[j])
  // comes from rank j. Empty splits mean equal blocks (count / size(), as c10d). in == out
  // (the same view) is in place.
  std::shared_ptr<Work> alltoallv(BufferView in, const std::vector<size_t>& inSplits,
                                  BufferView out, const std::vector<size_t>& outSplits,
                                  const AlltoallOptions& opts = {});
  // out (sum(counts)) = every rank's in (counts[r] elements on rank r), in rank order; every
  // rank passes the same counts.
  std::shared_ptr<Work> allgatherv(BufferView in, BufferView out, const std::vector<size_t>& counts,
                                   const AllgatherOptions& opts = {});
  // out (sum(counts)) on the root = every rank's in (counts[r] on rank r); out is ignored (may
  // be empty) elsewhere.
  std::shared_ptr<Work> gatherv(BufferView in, BufferView out, const std::vector<size_t>& counts,
                                const GatherOptions& opts = {});
  // out (counts[r]) on rank r = reduction of block r of every rank's in (sum(counts)).
  std::shared_ptr<Work> reduceScatterv(BufferView in, BufferView out,
                                       const std::vector<size_t>& counts,
                                       const ReduceScatterOptions& opts = {});
  // In place on every buffer: each of `bufs` (one dtype, one device, any counts) becomes the
  // reduction of that buffer on every rank, as one operation with one sequence number and one
  // pass on the wire (the comm backend packs them into one staging buffer).
  std::shared_ptr<Work> allreduceCoalesced(const std::vector<BufferView>& bufs,
                                           const AllreduceOptions& opts = {});
  // c10d's batch_isend_irecv: every entry checked first (nothing is issued when one is bad),
  // then issued back to back, so they run as one batch of point-to-point operations (see the
  // contract above). One Work per entry, in order.
  std::vector<std::shared_ptr<Work>> batchSendRecv(const std::vector<PointToPointOp>& ops,
                                                   const SendRecvOptions& opts = {});
  // c10d's monitored_barrier (through the store, not the data path): every rank reports its
  // arrival; rank 0 waits for all of them until the deadline, then releases the others. On
  // timeout rank 0's Work fails with a TimeoutError naming the ranks that did not arrive (the
  // first one, or all with opts.waitAllRanks) and the others' with that same message.
  std::shared_ptr<Work> monitoredBarrier(const MonitoredBarrierOptions& opts = {});
  // Point to point; `tag` tells apart concurrent messages between the same two ranks.
  std::shared_ptr<Work> send(BufferView buf, int dst, uint64_t tag = 0,
                             const SendRecvOptions& opts = {});
  std::shared_ptr<Work> recv(BufferView buf, int src, uint64_t tag = 0,
                             const SendRecvOptions& opts = {});
  // Receive from any source (c10d's recv_anysource): the first message with `tag` that another
  // rank sends, of buf.count elements; the Work's sourceRank() names the sender once it
  // completed. Runs on its own, not batched with neighbouring send / recv operations.
  std::shared_ptr<Work> recvAnySource(BufferView buf, uint64_t tag = 0,
                                      const SendRecvOptions& opts = {});

  // Fails every blocked, queued and future operation with IoError(reason). Thread-safe,
  // idempotent, never blocks for long.
  virtual void abort(const std::string& reason) = 0;
  // Ends this rank's background use of the group's store (the flight recorder's listener,
  // heartbeat and clock threads) and tells the other ranks; in the process that hosts the store
  // (options.hostsStore) of a group that has not failed, then waits up to
  // min(options.leaveTimeout, options.timeout) until every other rank has left too, or is dead
  // or stuck, so that the store outlives their use of it. Call it when the group's operations
  // are done (torch's destroy_process_group calls it through the backend's shutdown()); the
  // backends' destructors call it after their last operation. Idempotent; never throws.
  void leave();
  // True once the group failed (or was aborted); every operation then fails at once.
  virtual bool isBroken() const = 0;
  // What carries this rank's data, for logs and benchmark headers: the backend's name, or for
  // the tcp and verbs backends comm::Context::transportSummary() ("shm (all 4 ranks on this
  // host)", "tcp", ...). Fixed once the group is constructed.
  virtual std::string transportSummary() const { return backend_; }
  // Which algorithm tuning the group runs with, for the group-ready log line: for the tcp
  // backend comm::Context::tuning() ("built-in (...) [KEY]", "cache PATH [KEY]",
  // "LOOM_TUNING_FILE PATH [KEY]"); empty for backends that take none.
  virtual std::string tuningSummary() const { return {}; }
  // Whether the group's reductions run in reproducible mode (docs/reproducible.md: SUM and AVG
  // over floating dtypes correctly rounded, PROD over them refused). The comm backends (tcp,
  // verbs) report what their comm::Context decided when the group was created
  // (ContextOptions::reproducible, else LOOM_REPRODUCIBLE); false for backends without the
  // mode (nccl, mpi).
  virtual bool reproducible() const { return false; }

  // "rank 2" or "rank 1 of group/3 (parent ranks 1,3)": the prefix of every message.
  std::string who() const;

  // Dumps this rank's flight record now (docs/diagnostics.md): publishes it in the group's
  // store under flight/<rank>, writes it to options().dumpDir when set, and returns the JSON.
  // Blocks on the store at most its timeout. InvalidArgumentError when the recorder is off.
  std::string dumpFlightRecord();
  // Stragglers (docs/diagnostics.md): every rank calls it (in the same order relative to its
  // other stragglers() calls; it is a store exchange, not an operation of the group's queue).
  // Each rank publishes its flight record's start times through the store, waits for every
  // rank's (at most `timeout`, default the group's: TimeoutError naming the missing ranks) and
  // returns the table of arrival lateness per rank over the collectives every record holds.
  // InvalidArgumentError when the recorder is off, or the store is not shared (sharedStore()).
  diag::StragglerTable stragglers(std::optional<std::chrono::milliseconds> timeout = {});

 protected:
  ProcessGroup(std::string backend, std::shared_ptr<Store> store, int rank, int size,
               ProcessGroupOptions options);

  // Queues `op` (arguments checked, sequence number set) and returns its Work. Called with
  // the issue lock held, so the queue order is the sequence order.
  virtual std::shared_ptr<Work> post(OpDesc&& op) = 0;
  // The issue lock, held around post(). A backend may use it as its queue's lock too, so that
  // issuing an operation takes one lock, not two (the comm backend does); it must then never
  // hold it while calling back into this class.
  std::mutex& issueMutex() const { return issueMu_; }
  // Throws InvalidArgumentError when the backend cannot use a buffer on `buf.device`.
  virtual void checkDevice(const BufferView& buf, const char* opName) const = 0;
  // Backend-specific argument checks, before the operation takes a sequence number.
  virtual void checkOp(const OpDesc& op) const { (void)op; }
  // Called (issue lock held) after batchSendRecv posted its last entry: a backend that batches
  // point-to-point operations (nccl) issues the batch here.
  virtual void endPointToPointBatch() {}

  // The flight recorder's hooks for the thread that runs an operation (no-ops when it is off).
  // Inline (an 8-byte shm all-reduce pays for two calls otherwise): defined in the library's
  // private record_hooks.h, which every backend that calls them includes.
  inline void recordStart(const OpDesc& op);
  // `peer`: the rank the operation waited on when it failed, -1 when unknown.
  inline void recordEnd(const OpDesc& op, bool failed, int peer = -1);
  // For a backend thread that wakes at least every millisecond or so while operations run on
  // other threads (the comm backend's worker while it naps): `now` is the steady clock it just
  // read, which the recorder then uses instead of reading a clock for most operations
  // (docs/diagnostics.md, "Times"). A default time_point withdraws it: call that before the
  // thread sleeps longer or runs an operation itself.
  void publishRecorderTick(std::chrono::steady_clock::time_point now);
  // For a backend that runs its collectives one at a time in issue order (the comm backend),
  // from its constructor: the recorder then keeps their start and end in per-group progress
  // words instead of their entries (docs/diagnostics.md, "Cost").
  void recordCollectivesInIssueOrder();
  // Null when the recorder is off.
  diag::GroupDiagnostics* diagnostics() const { return diagnostics_.get(); }

 private:
  std::shared_ptr<Work> issue(OpDesc&& op, const OptionalTimeout& timeout);
  // issue's two halves: the timeout and the backend's checks (no lock), then, with issueMu_
  // held, the sequence number and post().
  void prepare(OpDesc& op, const OptionalTimeout& timeout) const;
  std::shared_ptr<Work> postLocked(OpDesc&& op);
  void checkBuffer(const BufferView& buf, const char* opName, const char* what) const;
  void checkRoot(int root, const char* opName, const char* what) const;
  // An operation's input and output: one check when they are the same view, else both, with
  // equal dtypes, devices and counts.
  void checkInOut(const BufferView& in, const BufferView& out, const char* opName) const;
  // send and recv: argument checks, then issue (one body for both directions).
  std::shared_ptr<Work> pointToPoint(OpType type, BufferView buf, int peer, uint64_t tag,
                                     const SendRecvOptions& opts);
  // send and recv's checks; the OpDesc to issue.
  OpDesc pointToPointOp(OpType type, BufferView buf, int peer, uint64_t tag) const;

  const std::string backend_;
  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const ProcessGroupOptions options_;
  const DebugLevel debug_;

  // The process that made the group (common/fork.h): a fork() child that issues on it gets an
  // error instead of a lock its parent's thread held at the fork, held for good.
  const uint64_t forkGeneration_;
  void checkSameProcess(OpType type) const;  // throws in a fork() child
  // Two threads issuing at once (see the contract): issue() and batchSendRecv() run inside an
  // IssueScope, which holds the thread's id and operation in issuer_ (0: nobody issues) and
  // fails a second thread that finds it taken (concurrentIssue: it aborts the group, then
  // throws).
  class IssueScope;
  std::atomic<uint64_t> issuer_{0};
  [[noreturn]] void concurrentIssue(OpType mine, uint64_t other);
  const long creatorPid_;
  mutable std::mutex issueMu_;  // guards the counters below and orders post()
  uint64_t collectiveSeq_ = 0;
  std::vector<uint64_t> sendSeq_;  // per peer
  std::vector<uint64_t> recvSeq_;  // per peer
  uint64_t recvAnySeq_ = 0;        // receives from any source
  int nextGroupId_ = 0;            // newGroup's count of subgroups (factory.cc)

  std::unique_ptr<diag::GroupDiagnostics> diagnostics_;  // null when the recorder is off
  diag::FlightRecorder* recorder_ = nullptr;             // diagnostics_'s, for the hot path
  uint64_t stragglerRounds_ = 0;                         // stragglers() calls so far
  // The trace (options.traceDir): this group's lane (-1: not tracing), whether it opened the
  // trace, and its operations' start times by flight recorder id (recordStart -> recordEnd).
  static constexpr size_t kTraceSlots = 4096;
  int traceLane_ = -1;
  // The trace's halves of recordStart and recordEnd (out of line: only with LOOM_TRACE).
  void traceStart(const OpDesc& op);
  void traceEnd(const OpDesc& op, bool failed);
  bool traceOwner_ = false;
  std::unique_ptr<int64_t[]> traceStarts_;

  friend std::shared_ptr<ProcessGroup> newGroup(ProcessGroup& parent, const std::vector<int>& ranks,
                                                const ProcessGroupOptions& options);
};

}  // namespace loom
