#include "loom/process_group/process_group.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "diagnostics/group_diagnostics.h"
#include "diagnostics/tracer.h"
#include "issue_scope.h"
#include "loom/common/error.h"
#include "loom/common/fork.h"
#include "loom/common/logging.h"
#include "pg_checks.h"

namespace loom {

DebugLevel parseDebugLevel(std::string_view value) {
  std::string v(value);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::toupper(c); });
  if (v.empty() || v == "OFF" || v == "0") return DebugLevel::kOff;
  if (v == "INFO") return DebugLevel::kInfo;
  if (v == "DETAIL") return DebugLevel::kDetail;
  LOOM_THROW(InvalidArgumentError, "LOOM_DEBUG='", value,
             "' is not a debug level; expected OFF, INFO or DETAIL");
}

const char* debugLevelName(DebugLevel level) {
  switch (level) {
    case DebugLevel::kOff:
      return "OFF";
    case DebugLevel::kInfo:
      return "INFO";
    case DebugLevel::kDetail:
      return "DETAIL";
  }
  return "?";
}

ProcessGroup::ProcessGroup(std::string backend, std::shared_ptr<Store> store, int rank, int size,
                           ProcessGroupOptions options)
    : backend_(std::move(backend)),
      store_(std::move(store)),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      debug_(options_.debug.value_or(DebugLevel::kOff)),
      forkGeneration_(forkGeneration()),
      creatorPid_(static_cast<long>(::getpid())) {
  LOOM_CHECK(store_ != nullptr, "a ProcessGroup needs a store");
  LOOM_CHECK(size_ >= 1, "world size must be at least 1, got ", size_);
  LOOM_CHECK(rank_ >= 0 && rank_ < size_, "rank ", rank_, " is out of range for world size ", size_,
             " (expected 0 <= rank < ", size_, ")");
  LOOM_CHECK(options_.timeout.count() > 0, "timeout must be positive, got ",
             options_.timeout.count(), " ms");
  sendSeq_.assign(size_, 0);
  recvSeq_.assign(size_, 0);
  LOOM_CHECK(options_.flightRecorderEntries >= 0, "flightRecorderEntries must be >= 0, got ",
             options_.flightRecorderEntries);
  if (options_.flightRecorderPreciseEvery < 1) {
    LOOM_THROW(InvalidArgumentError, who(), ": flightRecorderPreciseEvery must be at least 1, got ",
               options_.flightRecorderPreciseEvery,
               " (LOOM_FLIGHT_RECORDER_PRECISE_EVERY; 1 times every operation precisely)");
  }
  if (options_.flightRecorderEntries > 0) {
    diagnostics_ = std::make_unique<diag::GroupDiagnostics>(
        diag::Identity{rank_, size_, options_.groupName, backend_, options_.parentRanks,
                       options_.hostsStore.value_or(rank_ == options_.storeHostRank)},
        store_, static_cast<size_t>(options_.flightRecorderEntries),
        options_.comm.context.algorithm, options_.dumpDir, options_.heartbeatInterval,
        options_.diagnosticsClockSkewUs);
    recorder_ = &diagnostics_->recorder();
    recorder_->setPreciseEvery(static_cast<uint64_t>(options_.flightRecorderPreciseEvery));
  }
  if (!options_.traceDir.empty()) {
    // The group's operations are traced from their flight record ids.
    LOOM_CHECK(diagnostics_ != nullptr, who(), ": LOOM_TRACE (traceDir '", options_.traceDir,
               "') needs the flight recorder; LOOM_FLIGHT_RECORDER_ENTRIES is 0");
    traceOwner_ = trace::open(options_.traceDir, rank_);
    traceStarts_ = std::make_unique<int64_t[]>(kTraceSlots);
    traceLane_ = trace::lane("collectives " + (options_.groupName.empty() ? std::string("default")
                                                                          : options_.groupName));
  }
}

ProcessGroup::~ProcessGroup() {
  if (traceOwner_) trace::close();
}

void ProcessGroup::leave() {
  if (!diagnostics_) return;
  const bool failed = isBroken();
  diagnostics_->leave(failed ? std::chrono::milliseconds(0)
                             : std::min(options_.leaveTimeout, options_.timeout));
}

void ProcessGroup::traceStart(const OpDesc& op) {
  traceStarts_[op.recordId % kTraceSlots] = trace::nowUs();
}

void ProcessGroup::publishRecorderTick(std::chrono::steady_clock::time_point now) {
  if (recorder_ == nullptr) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch());
  recorder_->publishTick(now == std::chrono::steady_clock::time_point{}
                             ? 0
                             : static_cast<uint64_t>(std::max<int64_t>(ns.count(), 1)));
}

void ProcessGroup::recordCollectivesInIssueOrder() {
  if (recorder_ != nullptr) recorder_->setCollectivesInOrder(true);
}

void ProcessGroup::traceEnd(const OpDesc& op, bool failed) {
  if (op.recordId != 0) {
    int64_t& start = traceStarts_[op.recordId % kTraceSlots];
    const int64_t end = trace::nowUs();
    // An operation that failed before it started has no start: a point at its end.
    trace::completeOn(
        traceLane_, op.describe(), "collective", start != 0 ? start : end, end,
        detail::str("\"seq\": ", op.seq, ", \"bytes\": ", op.count * dtypeSize(op.dtype),
                    ", \"count\": ", op.count, ", \"dtype\": \"", dtypeName(op.dtype),
                    "\", \"state\": \"", failed ? "failed" : "done", "\""));
    start = 0;
  }
}

std::string ProcessGroup::dumpFlightRecord() {
  if (!diagnostics_) {
    LOOM_THROW(InvalidArgumentError, who(),
               ": dumpFlightRecord: the flight recorder is off (flightRecorderEntries = 0, or "
               "LOOM_FLIGHT_RECORDER_ENTRIES=0)");
  }
  return diagnostics_->dump("request");
}

diag::StragglerTable ProcessGroup::stragglers(std::optional<std::chrono::milliseconds> timeout) {
  if (!diagnostics_) {
    LOOM_THROW(InvalidArgumentError, who(),
               ": stragglers: the flight recorder is off (flightRecorderEntries = 0, or "
               "LOOM_FLIGHT_RECORDER_ENTRIES=0)");
  }
  if (!sharedStore()) {
    LOOM_THROW(InvalidArgumentError, who(),
               ": stragglers goes through the group's store, and this ", backend_,
               " group was created without one the ranks share (null store, or initProcessGroup "
               "without MASTER_ADDR); set MASTER_ADDR and MASTER_PORT, or pass a shared store");
  }
  // The rank that hosts the store waits until every rank has read the records (rank 0 when the
  // host is unknown or outside this group).
  const int host =
      options_.storeHostRank >= 0 && options_.storeHostRank < size_ ? options_.storeHostRank : 0;
  return diag::exchangeStragglers(*store_, rank_, size_, diagnostics_->recordJson("stragglers"),
                                  ++stragglerRounds_, timeout.value_or(options_.timeout), host);
}

uint64_t ProcessGroup::lastSeq() const {
  std::lock_guard<std::mutex> lock(issueMu_);
  return collectiveSeq_;
}

std::string ProcessGroup::who() const {
  std::string out = "rank " + std::to_string(rank_);
  if (!options_.groupName.empty()) out += " of " + options_.groupName;
  if (!options_.parentRanks.empty()) {
    out += " (parent ranks ";
    for (size_t i = 0; i < options_.parentRanks.size(); ++i) {
      out += (i ? "," : "") + std::to_string(options_.parentRanks[i]);
    }
    out += ")";
  }
  return out;
}

void ProcessGroup::checkBuffer(const BufferView& buf, const char* opName, const char* what) const {
  if (buf.data == nullptr && buf.count > 0) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", opName, ": ", what, " is null but its count is ",
               buf.count);
  }
  checkDevice(buf, opName);
}

void ProcessGroup::checkRoot(int root, const char* opName, const char* what) const {
  if (root < 0 || root >= size_) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", opName, ": ", what, " ", root,
               " is out of range for a group of size ", size_, " (expected 0 <= ", what, " < ",
               size_, ")");
  }
}

namespace pg_checks {

// The helpers take the group, not who(): its string is built only for an error.
void checkSameDtype(const ProcessGroup& pg, const char* opName, const BufferView& in,
                    const BufferView& out) {
  if (in.dtype != out.dtype) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName, ": input and output dtypes differ (",
               dtypeName(in.dtype), " vs ", dtypeName(out.dtype), ")");
  }
  if (!(in.device == out.device)) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName,
               ": input and output are on different devices (", deviceName(in.device), " vs ",
               deviceName(out.device), ")");
  }
}

void checkSameCount(const ProcessGroup& pg, const char* opName, const BufferView& in,
                    const BufferView& out) {
  if (in.count != out.count) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName, ": input has ", in.count,
               " elements but output has ", out.count, "; they must be equal");
  }
}

void checkOverlap(const ProcessGroup& pg, const char* opName, const BufferView& in,
                  const BufferView& out, size_t offset, bool inInsideOut) {
  if (in.data == nullptr || out.data == nullptr || !(in.device == out.device)) return;
  const size_t es = dtypeSize(in.dtype);
  const auto* i = static_cast<const uint8_t*>(in.data);
  const auto* o = static_cast<const uint8_t*>(out.data);
  const size_t inBytes = in.count * es, outBytes = out.count * es;
  if (inBytes == 0 || outBytes == 0 || !(i < o + outBytes && o < i + inBytes)) return;
  if (inInsideOut ? i == o + offset * es : o == i + offset * es) return;
  LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName, ": the output (", out.count,
             " elements at ", out.data, ") overlaps the input (", in.count, " elements at ",
             in.data, ") without being its in-place form (",
             offset == 0   ? "one buffer, output == input"
             : inInsideOut ? "input == output + "
                           : "output == input + ",
             offset == 0 ? "" : detail::str(offset, " elements, this rank's block"),
             "); pass separate buffers or the in-place form");
}

bool sameView(const BufferView& a, const BufferView& b) {
  return a.data == b.data && a.count == b.count && a.dtype == b.dtype && a.device == b.device;
}

void checkReduceOpFor(const ProcessGroup& pg, const char* opName, ReduceOp op, DType dtype) {
  if (isBitwise(op) && isFloatingPoint(dtype)) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName, ": reduce op ", reduceOpName(op),
               " is bitwise and needs an integer dtype, got ", dtypeName(dtype));
  }
  // What the engines refuse when they run (comm::checkReduceOp) is refused here too, before
  // the operation is issued: refused there, it would fail the group on every rank.
  try {
    loom::checkReduceOp(op, dtype);
  } catch (const Error& e) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName, ": ", e.what());
  }
}

void checkTag(const ProcessGroup& pg, const char* opName, uint64_t tag) {
  if (tag > kMaxTag) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName, ": tag ", tag,
               " is too large; tags go up to 2^56 - 1 = ", kMaxTag);
  }
}

}  // namespace pg_checks

using namespace pg_checks;

void ProcessGroup::checkSameProcess(OpType type) const {
  if (forkGenerationNow() == forkGeneration_) [[likely]]
    return;
  LOOM_THROW(InvalidArgumentError, who(), ": ", opTypeName(type),
             ": this group was created by process ", creatorPid_, ", and this process (",
             ::getpid(),
             ") is a child it made with fork(): the group's threads and "
             "connections stayed in the parent; create a new group in the child");
}

void ProcessGroup::concurrentIssue(OpType mine, uint64_t other) {
  const std::string what = detail::str(
      who(), ": ", opTypeName(mine), " was issued by thread ", issue_scope::threadId(),
      " while thread ", other >> 8, " was issuing ", opTypeName(static_cast<OpType>(other & 0xff)),
      " on the same group: two threads issuing at once can take different orders on different "
      "ranks, which pairs different buffers across ranks (silently wrong results, or a hang). "
      "Issue a group's operations from one thread at a time (threads may take turns), or give "
      "each thread its own group (newGroup; torch: dist.new_group)");
  LOOM_LOG_ERROR(what, "; aborting the group");
  abort(what);
  LOOM_THROW(InvalidArgumentError, what);
}

std::shared_ptr<Work> ProcessGroup::issue(OpDesc&& op, const OptionalTimeout& timeout) {
  checkSameProcess(op.type);  // first: a fork() child's copy of issuer_ may name a parent thread
  IssueScope scope(*this, op.type);
  prepare(op, timeout);
  std::lock_guard<std::mutex> lock(issueMu_);
  return postLocked(std::move(op));
}

void ProcessGroup::prepare(OpDesc& op, const OptionalTimeout& timeout) const {
  op.timeout = timeout ? *timeout : options_.timeout;
  if (op.timeout.count() <= 0) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", opTypeName(op.type),
               ": timeout must be positive, got ", op.timeout.count(), " ms");
  }
  checkOp(op);
}

std::shared_ptr<Work> ProcessGroup::postLocked(OpDesc&& op) {
  if (op.type == OpType::kSend) {
    op.seq = ++sendSeq_[op.root];
  } else if (op.type == OpType::kRecv) {
    op.seq = op.root == kAnySource ? ++recvAnySeq_ : ++recvSeq_[op.root];
  } else {
    op.seq = ++collectiveSeq_;
  }
  if (recorder_ != nullptr) op.recordId = recorder_->recordIssue(op, &op.recordInOrder);
  if (debug_ == DebugLevel::kDetail) LOOM_LOG_INFO(who(), ": issue ", op.signature());
  return post(std::move(op));
}

void ProcessGroup::checkInOut(const BufferView& in, const BufferView& out,
                              const char* opName) const {
  if (sameView(in, out)) {
    checkBuffer(in, opName, "buffer");
    return;
  }
  checkBuffer(in, opName, "input");
  checkBuffer(out, opName, "output");
  checkSameDtype(*this, opName, in, out);
  checkSameCount(*this, opName, in, out);
  checkOverlap(*this, opName, in, out, 0, false);
}

std::shared_ptr<Work> ProcessGroup::allreduce(BufferView buf, const AllreduceOptions& opts) {
  return allreduce(buf, buf, opts);
}

std::shared_ptr<Work> ProcessGroup::allreduce(BufferView in, BufferView out,
                                              const AllreduceOptions& opts) {
  const char* name = "allreduce";
  checkInOut(in, out, name);
  checkReduceOpFor(*this, name, opts.reduceOp, in.dtype);
  OpDesc op;
  op.type = OpType::kAllreduce;
  op.in = in;
  op.out = out;
  op.count = in.count;
  op.dtype = in.dtype;
  op.reduceOp = opts.reduceOp;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::broadcast(BufferView buf, const BroadcastOptions& opts) {
  return broadcast(buf, buf, opts);
}

std::shared_ptr<Work> ProcessGroup::broadcast(BufferView in, BufferView out,
                                              const BroadcastOptions& opts) {
  const char* name = "broadcast";
  checkRoot(opts.root, name, "root");
  OpDesc op;
  op.type = OpType::kBroadcast;
  if (rank_ == opts.root) {
    checkInOut(in, out, name);
    op.in = in;
  } else {
    checkBuffer(out, name, sameView(in, out) ? "buffer" : "output");
    op.in = out;  // not read: a backend that looks at it sees an in-place broadcast
  }
  op.out = out;
  op.count = out.count;
  op.dtype = out.dtype;
  op.root = opts.root;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::reduce(BufferView buf, const ReduceOptions& opts) {
  return reduce(buf, buf, opts);
}

std::shared_ptr<Work> ProcessGroup::reduce(BufferView in, BufferView out,
                                           const ReduceOptions& opts) {
  const char* name = "reduce";
  checkRoot(opts.root, name, "root");
  OpDesc op;
  op.type = OpType::kReduce;
  if (rank_ == opts.root) {
    checkInOut(in, out, name);
    op.out = out;
  } else {
    checkBuffer(in, name,
                sameView(in, out) ? "buffer"
                                  : "input");  // out stays empty: non-roots keep their input intact
  }
  checkReduceOpFor(*this, name, opts.reduceOp, in.dtype);
  op.in = in;
  op.count = in.count;
  op.dtype = in.dtype;
  op.reduceOp = opts.reduceOp;
  op.root = opts.root;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::allgather(BufferView in, BufferView out,
                                              const AllgatherOptions& opts) {
  const char* name = "allgather";
  checkBuffer(in, name, "input");
  checkBuffer(out, name, "output");
  checkSameDtype(*this, name, in, out);
  if (out.count != in.count * size_) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": output has ", out.count,
               " elements; expected world size * input count = ", size_, " * ", in.count, " = ",
               in.count * size_);
  }
  checkOverlap(*this, name, in, out, in.count * rank_, true);
  OpDesc op;
  op.type = OpType::kAllgather;
  op.in = in;
  op.out = out;
  op.count = in.count;
  op.dtype = in.dtype;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::reduceScatter(BufferView in, BufferView out,
                                                  const ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter";
  checkBuffer(in, name, "input");
  checkBuffer(out, name, "output");
  checkSameDtype(*this, name, in, out);
  checkReduceOpFor(*this, name, opts.reduceOp, in.dtype);
  if (in.count != out.count * size_) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": input has ", in.count,
               " elements; expected world size * output count = ", size_, " * ", out.count, " = ",
               out.count * size_);
  }
  checkOverlap(*this, name, in, out, out.count * rank_, false);
  OpDesc op;
  op.type = OpType::kReduceScatter;
  op.in = in;
  op.out = out;
  op.count = out.count;
  op.dtype = in.dtype;
  op.reduceOp = opts.reduceOp;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::gather(BufferView in, BufferView out,
                                           const GatherOptions& opts) {
  const char* name = "gather";
  checkRoot(opts.root, name, "root");
  checkBuffer(in, name, "input");
  OpDesc op;
  op.type = OpType::kGather;
  op.in = in;
  if (rank_ == opts.root) {
    checkBuffer(out, name, "output");
    checkSameDtype(*this, name, in, out);
    if (out.count != in.count * size_) {
      LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": output on the root has ", out.count,
                 " elements; expected world size * input count = ", size_, " * ", in.count, " = ",
                 in.count * size_);
    }
    checkOverlap(*this, name, in, out, in.count * rank_, true);
    op.out = out;
  }
  op.count = in.count;
  op.dtype = in.dtype;
  op.root = opts.root;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::scatter(BufferView in, BufferView out,
                                            const ScatterOptions& opts) {
  const char* name = "scatter";
  checkRoot(opts.root, name, "root");
  checkBuffer(out, name, "output");
  OpDesc op;
  op.type = OpType::kScatter;
  if (rank_ == opts.root) {
    checkBuffer(in, name, "input");
    checkSameDtype(*this, name, in, out);
    if (in.count != out.count * size_) {
      LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": input on the root has ", in.count,
                 " elements; expected world size * output count = ", size_, " * ", out.count, " = ",
                 out.count * size_);
    }
    checkOverlap(*this, name, in, out, out.count * rank_, false);
    op.in = in;
  }
  op.out = out;
  op.count = out.count;
  op.dtype = out.dtype;
  op.root = opts.root;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::alltoall(BufferView in, BufferView out,
                                             const AlltoallOptions& opts) {
  const char* name = "alltoall";
  checkBuffer(in, name, "input");
  checkBuffer(out, name, "output");
  checkSameDtype(*this, name, in, out);
  checkSameCount(*this, name, in, out);
  checkOverlap(*this, name, in, out, 0, false);
  if (in.count % size_ != 0) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": ", in.count,
               " elements do not split into world size ", size_, " equal slices");
  }
  OpDesc op;
  op.type = OpType::kAlltoall;
  op.in = in;
  op.out = out;
  op.count = in.count / size_;
  op.dtype = in.dtype;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::barrier(const BarrierOptions& opts) {
  OpDesc op;
  op.type = OpType::kBarrier;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::send(BufferView buf, int dst, uint64_t tag,
                                         const SendRecvOptions& opts) {
  return pointToPoint(OpType::kSend, buf, dst, tag, opts);
}

std::shared_ptr<Work> ProcessGroup::recv(BufferView buf, int src, uint64_t tag,
                                         const SendRecvOptions& opts) {
  return pointToPoint(OpType::kRecv, buf, src, tag, opts);
}

std::shared_ptr<Work> ProcessGroup::recvAnySource(BufferView buf, uint64_t tag,
                                                  const SendRecvOptions& opts) {
  const char* name = "recv";
  checkBuffer(buf, name, "buffer");
  checkTag(*this, name, tag);
  if (size_ == 1) {
    LOOM_THROW(InvalidArgumentError, who(), ": recv from any source: this rank is alone in its ",
               "group; no rank can send to it");
  }
  OpDesc op;
  op.type = OpType::kRecv;
  op.in = op.out = buf;
  op.count = buf.count;
  op.dtype = buf.dtype;
  op.root = kAnySource;
  op.tag = tag;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::pointToPoint(OpType type, BufferView buf, int peer,
                                                 uint64_t tag, const SendRecvOptions& opts) {
  return issue(pointToPointOp(type, buf, peer, tag), opts.timeout);
}

OpDesc ProcessGroup::pointToPointOp(OpType type, BufferView buf, int peer, uint64_t tag) const {
  const bool isSend = type == OpType::kSend;
  const char* name = isSend ? "send" : "recv";
  const char* peerWhat = isSend ? "destination rank" : "source rank";
  checkBuffer(buf, name, "buffer");
  checkTag(*this, name, tag);
  checkRoot(peer, name, peerWhat);
  if (peer == rank_) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": ", peerWhat, " ", peer,
               " is this rank; a rank cannot ", isSend ? "send to" : "receive from", " itself");
  }
  OpDesc op;
  op.type = type;
  op.in = op.out = buf;
  op.count = buf.count;
  op.dtype = buf.dtype;
  op.root = peer;
  op.tag = tag;
  return op;
}

}  // namespace loom
