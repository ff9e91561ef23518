#include "comm_backend.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "comm_backend_impl.h"
#include "diagnostics/group_diagnostics.h"
#include "loom/comm/collectives.h"
#include "loom/comm/context.h"
#include "loom/comm/transport.h"
#include "loom/common/deadline.h"
#include "loom/common/error.h"
#include "loom/common/logging.h"
#include "loom/store/store.h"
#include "monitored_barrier.h"
#include "pg_checks.h"
#include "record_hooks.h"

namespace loom {

using namespace comm_pg;

namespace {

bool isAnySource(const OpDesc& op) {
  return op.type == OpType::kRecv && op.root == kAnySource;
}

comm::CollectiveOptions collectiveOptions(const OpDesc& op) {
  comm::CollectiveOptions copts;
  copts.timeout = op.timeout;
  copts.seq = op.seq;
  return copts;
}

// The peer a failure names, for the flight record.
int failedPeer(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return diag::peerNamedIn(e.what());
  } catch (...) {
    return -1;
  }
}

// A hand-off setting in microseconds; the range is LOOM_PG_GRACE_US's and LOOM_PG_NAP_US's.
std::chrono::microseconds handoffMicros(const ProcessGroup& pg, const char* field, int value) {
  if (value < 0 || value > 1000000) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", pg.backendName(), " process group: ", field,
               " = ", value, " is out of range; expected microseconds in [0, 1000000]");
  }
  return std::chrono::microseconds(value);
}

}  // namespace

ProcessGroupComm::ProcessGroupComm(std::string backend, std::shared_ptr<Store> store, int rank,
                                   int size, const ProcessGroupOptions& options,
                                   const ContextFactory& makeContext)
    : ProcessGroup(std::move(backend), std::move(store), rank, size, options),
      grace_(handoffMicros(*this, "options.comm.graceUs", options.comm.graceUs)),
      nap_(handoffMicros(*this, "options.comm.napUs", options.comm.napUs)),
      mu_(issueMutex()),
      registryKey_(comm_pg::newRegistryKey()) {
  // The group's timeout is the Context's: a different one set there would be ignored.
  const comm::ContextOptions defaults;
  if (options.comm.context.timeout != defaults.timeout &&
      options.comm.context.timeout != options.timeout) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", backendName(),
               " process group: options.comm.context.timeout (",
               options.comm.context.timeout.count(), " ms) differs from options.timeout (",
               options.timeout.count(),
               " ms); set options.timeout, the deadline of the group and its Context");
  }
  comm::ContextOptions ctxOptions = options.comm.context;
  ctxOptions.timeout = options.timeout;
  ctx_ = makeContext(*this->store(), rank, size, ctxOptions);
  reproducible_ = ctx_->reproducible();
  // One at a time, from the queue's head: direct operations, the worker and the lock path
  // alike (comm_handoff.cc).
  recordCollectivesInIssueOrder();
  worker_ = std::thread([this] { workerLoop(); });
}

std::string ProcessGroupComm::transportSummary() const {
  return ctx_->transportSummary();
}

std::string ProcessGroupComm::tuningSummary() const {
  return ctx_->tuning();
}

void ProcessGroupComm::checkOp(const OpDesc& op) const {
  if (reproducible_ && pg_checks::isReduction(op.type) && op.reduceOp == ReduceOp::kProd &&
      isFloatingPoint(op.dtype)) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", opTypeName(op.type), ": reduce op ",
               reduceOpName(op.reduceOp), " over ", dtypeName(op.dtype),
               " cannot be made reproducible, and this group reduces in reproducible mode "
               "(LOOM_REPRODUCIBLE, ContextOptions::reproducible: sum and avg over floating "
               "dtypes are correctly rounded; min, max and integer ops are exact already)");
  }
}

ProcessGroupComm::~ProcessGroupComm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  leave();
  // Lookups already fail (the group's use count is 0); this frees the entry.
  if (registered_) comm_pg::unregisterGroup(registryKey_);
  if (debugLevel() != DebugLevel::kOff) {
    const HandoffStats& st = stats_;
    LOOM_LOG_INFO(
        who(), ": hand-off: ", st.inlineRuns + directRuns_.load(std::memory_order_relaxed),
        " operations run by their waiters (", directRuns_.load(std::memory_order_relaxed),
        " directly), ", st.workerRuns, " by the worker; the worker was woken by ", st.issueWakes,
        " issues and ", st.waiterWakes, " waiters, waited ", st.workerWaits, " times (",
        st.graceWaits, " holding a fresh operation for its waiter)");
  }
}

void ProcessGroupComm::checkDevice(const BufferView& buf, const char* opName) const {
  if (buf.device.type != DeviceType::kCpu) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", opName, ": the ", backendName(),
               " backend takes CPU buffers, got a ", deviceName(buf.device),
               " buffer (use the nccl backend for CUDA memory)");
  }
}

bool ProcessGroupComm::isBroken() const {
  return brokenFlag_.load(std::memory_order_acquire);
}

bool ProcessGroupComm::markBroken(const std::string& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return false;
  broken_ = true;
  brokenFlag_.store(true, std::memory_order_release);
  brokenCause_ = cause;
  return true;
}

void ProcessGroupComm::abort(const std::string& reason) {
  std::shared_ptr<comm::Context> ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) {
      broken_ = true;
      brokenFlag_.store(true, std::memory_order_release);
      brokenCause_ = who() + ": aborted: " + reason;
    }
    ctx = ctx_;
  }
  wake_.notify_all();
  if (ctx) ctx->abort(reason);
}

void ProcessGroupComm::execute(CommWork& work, Item* owner) {
  std::string cause;
  if (brokenFlag_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    cause = brokenCause_;
  }
  if (!cause.empty()) {
    recordEnd(work.op, true);
    work.markFailed(std::make_exception_ptr(IoError(
        who() + ": " + work.op.describe() + " was not run: the group failed earlier: " + cause)));
    return;
  }
  if (isCollective(work.op.type) && debugLevel() == DebugLevel::kDetail) {
    try {
      checkSignature(work.op);
    } catch (const InvalidArgumentError&) {
      // A signature mismatch is seen alike by every rank: the op is skipped everywhere and
      // the group stays consistent.
      recordEnd(work.op, true);
      work.markFailed(std::current_exception());
      return;
    } catch (...) {
      recordEnd(work.op, true);
      work.markFailed(handleFailure(work.op, std::current_exception()));
      return;
    }
  }
  if (isAnySource(work.op)) {
    recordStart(work.op);
    try {
      work.setSourceRank(comm::recvAny(*ctx_, work.op.out.data, work.op.count, work.op.dtype,
                                       work.op.tag, collectiveOptions(work.op)));
      recordEnd(work.op, false);
      work.markCompleted();
    } catch (...) {
      recordEnd(work.op, true);
      work.markFailed(handleFailure(work.op, std::current_exception()));
    }
    return;
  }
  if (!isCollective(work.op.type)) {
    runPointToPoint(*owner);
    return;
  }
  recordStart(work.op);
  try {
    run(work.op);
    recordEnd(work.op, false);
    work.markCompleted();
  } catch (...) {
    recordEnd(work.op, true, failedPeer(std::current_exception()));
    work.markFailed(handleFailure(work.op, std::current_exception()));
  }
}

void ProcessGroupComm::runPointToPoint(Item& first) {
  // The send / recv operations at the head of the queue run as one batch: each is posted on
  // the transport as soon as it reaches the head, and the batch is done when all completed.
  // While waiting, the batch keeps taking send / recv operations that arrive at the head
  // (checked every few milliseconds), so a send posted just before its matching receive (a
  // ring exchange: send to the right, then receive from the left) never waits for a peer
  // that is itself stuck in a send, whatever the message size.
  struct Pending {
    Item item;
    comm::RequestPtr request;
    Deadline deadline;
    bool done = false;
  };
  comm::Transport& transport = ctx_->transport();
  std::vector<Pending> batch;
  const auto post = [&](Item item) {
    const OpDesc& op = item->op;
    // The same wire tag as comm::send / comm::recv, so a group's send matches a comm::recv.
    const uint64_t tag = comm::pointToPointTag(op.tag);
    const size_t bytes = op.count * dtypeSize(op.dtype);
    Deadline deadline(op.timeout);
    recordStart(op);
    batch.push_back(Pending{std::move(item), nullptr, deadline, false});
    batch.back().request = op.type == OpType::kSend
                               ? transport.isend(op.root, op.in.data, bytes, tag)
                               : transport.irecv(op.root, op.out.data, bytes, tag);
  };
  const auto absorb = [&] {
    std::vector<Item> more;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!queue_.empty() && !isCollective(queue_.front()->op.type) &&
             !isAnySource(queue_.front()->op) && !broken_) {
        more.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    for (auto& item : more) post(std::move(item));
  };

  size_t current = 0;  // the operation an error is attributed to
  milliseconds slice = kP2PSliceMin;
  const OpDesc firstOp = first->op;
  const std::shared_ptr<Work> firstWork = first;
  try {
    post(std::move(first));
    absorb();
    for (;;) {
      bool allDone = true;
      bool progress = false;
      for (size_t i = 0; i < batch.size(); ++i) {
        if (batch[i].done) continue;
        current = i;
        if (batch[i].request->test()) {
          batch[i].done = true;
          if (batch[i].item->op.type == OpType::kRecv) {
            batch[i].item->setSourceRank(batch[i].item->op.root);
          }
          recordEnd(batch[i].item->op, false);
          batch[i].item->markCompleted();
          progress = true;
        } else {
          allDone = false;
        }
      }
      if (allDone) return;
      const size_t before = batch.size();
      absorb();
      progress = progress || batch.size() != before;
      slice = progress ? kP2PSliceMin : std::min(slice * 2, kP2PSliceMax);
      size_t next = 0;
      while (batch[next].done) ++next;
      current = next;
      Pending& p = batch[next];
      if (p.deadline.expired()) {
        const OpDesc& op = p.item->op;
        throw TimeoutError(who() + ": " + op.describe() + " timed out after " +
                           std::to_string(op.timeout.count()) + " ms waiting to " +
                           (op.type == OpType::kSend ? "send to" : "receive from") + " rank " +
                           std::to_string(op.root) + " (" + transport.peerAddress(op.root) +
                           "): " + std::to_string(p.request->bytesOutstanding()) + " of " +
                           std::to_string(p.request->bytes()) + " bytes outstanding (tag " +
                           std::to_string(op.tag) + ")");
      }
      p.request->wait(Deadline(std::min(p.deadline.remaining(), slice)));
    }
  } catch (...) {
    if (batch.empty()) {
      firstWork->markFailed(handleFailure(firstOp, std::current_exception()));
      return;
    }
    const int peer = failedPeer(std::current_exception());
    for (auto& p : batch) {
      if (!p.done) recordEnd(p.item->op, true, &p == &batch[current] ? peer : p.item->op.root);
    }
    auto error = handleFailure(batch[current].item->op, std::current_exception());
    for (auto& p : batch) {
      if (!p.done) p.item->markFailed(error);
    }
  }
}

void ProcessGroupComm::run(const OpDesc& op) {
  comm::Context& ctx = *ctx_;
  const comm::CollectiveOptions copts = collectiveOptions(op);
  switch (op.type) {
    case OpType::kAllreduce:
      comm::allreduce(ctx, op.in.data, op.out.data, op.count, op.dtype, op.reduceOp, copts);
      break;
    case OpType::kBroadcast:
      // Out of place, the root's input reaches its own output here; the others receive
      // straight into their output.
      if (rank() == op.root && op.in.data != op.out.data && op.count > 0) {
        std::memcpy(op.out.data, op.in.data, op.count * dtypeSize(op.dtype));
      }
      comm::broadcast(ctx, op.out.data, op.count, op.dtype, op.root, copts);
      break;
    case OpType::kReduce:
      comm::reduce(ctx, op.in.data, op.out.data, op.count, op.dtype, op.reduceOp, op.root, copts);
      break;
    case OpType::kAllgather:
      comm::allgather(ctx, op.in.data, op.out.data, op.count, op.dtype, copts);
      break;
    case OpType::kReduceScatter:
      comm::reduceScatter(ctx, op.in.data, op.out.data, op.count, op.dtype, op.reduceOp, copts);
      break;
    case OpType::kGather:
      comm::gather(ctx, op.in.data, op.out.data, op.count, op.dtype, op.root, copts);
      break;
    case OpType::kScatter:
      comm::scatter(ctx, op.in.data, op.out.data, op.count, op.dtype, op.root, copts);
      break;
    case OpType::kAlltoall:
      comm::alltoall(ctx, op.in.data, op.out.data, op.count, op.dtype, copts);
      break;
    case OpType::kBarrier:
      comm::barrier(ctx, copts);
      break;
    case OpType::kSend:
      comm::send(ctx, op.in.data, op.count, op.dtype, op.root, op.tag, copts);
      break;
    case OpType::kRecv:
      comm::recv(ctx, op.out.data, op.count, op.dtype, op.root, op.tag, copts);
      break;
    case OpType::kAlltoallv:
      comm::alltoallv(ctx, op.in.data, op.inCounts, op.out.data, op.outCounts, op.dtype, copts);
      break;
    case OpType::kAllgatherv:
      comm::allgatherv(ctx, op.in.data, op.out.data, op.inCounts, op.dtype, copts);
      break;
    case OpType::kGatherv:
      comm::gatherv(ctx, op.in.data, op.out.data, op.inCounts, op.dtype, op.root, copts);
      break;
    case OpType::kReduceScatterv:
      comm::reduceScatterv(ctx, op.in.data, op.out.data, op.inCounts, op.dtype, op.reduceOp, copts);
      break;
    case OpType::kAllreduceCoalesced:
      runAllreduceCoalesced(ctx, op, copts);
      break;
    case OpType::kMonitoredBarrier:
      runMonitoredBarrier(*store(), rank(), size(), op, who());
      break;
  }
}

void ProcessGroupComm::runAllreduceCoalesced(comm::Context& ctx, const OpDesc& op,
                                             const comm::CollectiveOptions& copts) {
  // Packed into one staging buffer and reduced by one all-reduce: one sequence number, one
  // pass on the wire, and the algorithm chosen for the total size (many small buffers take
  // the ring or halving-doubling a large one would). The two copies cost memory bandwidth,
  // small beside the network; chunking the algorithms across a list of buffers would mean a
  // scatter-gather variant of every one of them. A single buffer is reduced in place.
  if (op.buffers.size() == 1) {
    const BufferView& b = op.buffers[0];
    comm::allreduce(ctx, b.data, b.data, b.count, op.dtype, op.reduceOp, copts);
    return;
  }
  const size_t esize = dtypeSize(op.dtype);
  std::vector<uint8_t> staging(op.count * esize);
  size_t offset = 0;
  for (const BufferView& b : op.buffers) {
    if (b.count > 0) std::memcpy(staging.data() + offset, b.data, b.bytes());
    offset += b.bytes();
  }
  comm::allreduce(ctx, staging.data(), staging.data(), op.count, op.dtype, op.reduceOp, copts);
  offset = 0;
  for (const BufferView& b : op.buffers) {
    if (b.count > 0) std::memcpy(b.data, staging.data() + offset, b.bytes());
    offset += b.bytes();
  }
}

void ProcessGroupComm::checkSignature(const OpDesc& op) {
  checkSignatureInStore(*this, op, lastSignatureSeq_);
}

std::exception_ptr ProcessGroupComm::handleFailure(const OpDesc& op, std::exception_ptr error) {
  const FailureCause cause = classify(error);
  const std::string own = ownMessage(*this, op, cause.what);
  markBroken(own);
  wake_.notify_all();
  // After publishing, close our connections so the peers blocked on us fail now.
  const FailureOutcome outcome = exchangeReports(
      *this, op, cause, own,
      diagnostics() ? diagnostics()->dumpLocal("failure", diag::GroupDiagnostics::kFailureEntries)
                    : "",
      [&] {
        std::shared_ptr<comm::Context> closing;
        {
          std::lock_guard<std::mutex> lock(mu_);
          closing = std::move(ctx_);
        }
      });
  {
    std::lock_guard<std::mutex> lock(mu_);
    brokenCause_ = outcome.message;
  }
  // The group is broken afterwards in every case.
  return outcome.error();
}

}  // namespace loom
