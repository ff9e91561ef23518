// The ProcessGroup methods that take lists: the uneven collectives (alltoallv, allgatherv,
// gatherv, reduceScatterv: a count per rank), allreduceCoalesced (a list of buffers),
// batchSendRecv (a list of sends and receives), and monitoredBarrier. As in process_group.cc,
// every argument is checked on the caller's thread before the operation takes a sequence
// number, so a bad call throws InvalidArgumentError and issues nothing.
#include <numeric>
#include <string>

#include "issue_scope.h"
#include "loom/common/error.h"
#include "loom/process_group/process_group.h"
#include "pg_checks.h"

namespace loom {

using namespace pg_checks;

namespace {

std::string joinCounts(const std::vector<size_t>& counts) {
  std::string out = "[";
  for (size_t i = 0; i < counts.size(); ++i) out += (i ? ", " : "") + std::to_string(counts[i]);
  return out + "]";
}

size_t sumOf(const std::vector<size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), size_t{0});
}

// Elements of the ranks before `rank`: where its block starts in the concatenation.
size_t countsBefore(const std::vector<size_t>& counts, int rank) {
  return std::accumulate(counts.begin(), counts.begin() + rank, size_t{0});
}

// A list of one count per rank that adds up to the buffer it describes.
void checkCounts(const ProcessGroup& pg, const char* opName, const char* what,
                 const std::vector<size_t>& counts, const char* bufferName, size_t bufferCount) {
  if (counts.size() != static_cast<size_t>(pg.size())) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName, ": ", what, " ", joinCounts(counts),
               " has ", counts.size(), " entries; expected one per rank (", pg.size(), ")");
  }
  if (sumOf(counts) != bufferCount) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": ", opName, ": ", what, " ", joinCounts(counts),
               " add up to ", sumOf(counts), " elements but the ", bufferName, " has ",
               bufferCount);
  }
}

// alltoallv's empty splits: equal blocks, as c10d.
std::vector<size_t> evenSplits(const ProcessGroup& pg, const char* what, const BufferView& buf) {
  if (buf.count % pg.size() != 0) {
    LOOM_THROW(InvalidArgumentError, pg.who(), ": alltoallv: ", what,
               " is empty (equal blocks) but ", buf.count, " elements do not split into ",
               pg.size(), " equal blocks");
  }
  return std::vector<size_t>(pg.size(), buf.count / pg.size());
}

}  // namespace

std::shared_ptr<Work> ProcessGroup::alltoallv(BufferView in, const std::vector<size_t>& inSplits,
                                              BufferView out, const std::vector<size_t>& outSplits,
                                              const AlltoallOptions& opts) {
  const char* name = "alltoallv";
  const bool inPlace = sameView(in, out);
  checkBuffer(in, name, inPlace ? "buffer" : "input");
  if (!inPlace) {
    checkBuffer(out, name, "output");
    checkSameDtype(*this, name, in, out);
  }
  if (!inPlace) checkOverlap(*this, name, in, out, 0, false);
  OpDesc op;
  op.inCounts = inSplits.empty() ? evenSplits(*this, "inSplits", in) : inSplits;
  op.outCounts = outSplits.empty() ? evenSplits(*this, "outSplits", out) : outSplits;
  checkCounts(*this, name, "inSplits", op.inCounts, "input", in.count);
  checkCounts(*this, name, "outSplits", op.outCounts, "output", out.count);
  op.type = OpType::kAlltoallv;
  op.in = in;
  op.out = out;
  op.count = in.count;
  op.dtype = in.dtype;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::allgatherv(BufferView in, BufferView out,
                                               const std::vector<size_t>& counts,
                                               const AllgatherOptions& opts) {
  const char* name = "allgatherv";
  checkBuffer(in, name, "input");
  checkBuffer(out, name, "output");
  checkSameDtype(*this, name, in, out);
  checkCounts(*this, name, "counts", counts, "output", out.count);
  if (in.count != counts[rank()]) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": input has ", in.count,
               " elements but counts ", joinCounts(counts), " give rank ", rank(), " ",
               counts[rank()]);
  }
  checkOverlap(*this, name, in, out, countsBefore(counts, rank()), true);
  OpDesc op;
  op.type = OpType::kAllgatherv;
  op.in = in;
  op.out = out;
  op.count = in.count;
  op.dtype = in.dtype;
  op.inCounts = counts;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::gatherv(BufferView in, BufferView out,
                                            const std::vector<size_t>& counts,
                                            const GatherOptions& opts) {
  const char* name = "gatherv";
  checkRoot(opts.root, name, "root");
  checkBuffer(in, name, "input");
  if (counts.size() != static_cast<size_t>(size())) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": counts ", joinCounts(counts), " has ",
               counts.size(), " entries; expected one per rank (", size(), ")");
  }
  if (in.count != counts[rank()]) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": input has ", in.count,
               " elements but counts ", joinCounts(counts), " give rank ", rank(), " ",
               counts[rank()]);
  }
  OpDesc op;
  if (rank() == opts.root) {
    checkBuffer(out, name, "output");
    checkSameDtype(*this, name, in, out);
    checkCounts(*this, name, "counts", counts, "output on the root", out.count);
    checkOverlap(*this, name, in, out, countsBefore(counts, rank()), true);
    op.out = out;
  }
  op.type = OpType::kGatherv;
  op.in = in;
  op.count = in.count;
  op.dtype = in.dtype;
  op.root = opts.root;
  op.inCounts = counts;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::reduceScatterv(BufferView in, BufferView out,
                                                   const std::vector<size_t>& counts,
                                                   const ReduceScatterOptions& opts) {
  const char* name = "reduce_scatterv";
  checkBuffer(in, name, "input");
  checkBuffer(out, name, "output");
  checkSameDtype(*this, name, in, out);
  checkReduceOpFor(*this, name, opts.reduceOp, in.dtype);
  checkCounts(*this, name, "counts", counts, "input", in.count);
  if (out.count != counts[rank()]) {
    LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": output has ", out.count,
               " elements but counts ", joinCounts(counts), " give rank ", rank(), " ",
               counts[rank()]);
  }
  checkOverlap(*this, name, in, out, countsBefore(counts, rank()), false);
  OpDesc op;
  op.type = OpType::kReduceScatterv;
  op.in = in;
  op.out = out;
  op.count = in.count;
  op.dtype = in.dtype;
  op.reduceOp = opts.reduceOp;
  op.inCounts = counts;
  return issue(std::move(op), opts.timeout);
}

std::shared_ptr<Work> ProcessGroup::allreduceCoalesced(const std::vector<BufferView>& bufs,
                                                       const AllreduceOptions& opts) {
  const char* name = "allreduce_coalesced";
  OpDesc op;
  op.type = OpType::kAllreduceCoalesced;
  if (!bufs.empty()) {
    op.dtype = bufs[0].dtype;
    op.in = op.out = bufs[0];
  }
  for (size_t i = 0; i < bufs.size(); ++i) {
    const std::string what = "buffer " + std::to_string(i);
    checkBuffer(bufs[i], name, what.c_str());
    if (bufs[i].dtype != bufs[0].dtype || !(bufs[i].device == bufs[0].device)) {
      LOOM_THROW(InvalidArgumentError, who(), ": ", name, ": buffer ", i, " is ",
                 dtypeName(bufs[i].dtype), " on ", deviceName(bufs[i].device), " but buffer 0 is ",
                 dtypeName(bufs[0].dtype), " on ", deviceName(bufs[0].device),
                 "; coalesced buffers share one dtype and device");
    }
    op.count += bufs[i].count;
  }
  checkReduceOpFor(*this, name, opts.reduceOp, op.dtype);
  op.reduceOp = opts.reduceOp;
  op.buffers = bufs;
  return issue(std::move(op), opts.timeout);
}

std::vector<std::shared_ptr<Work>> ProcessGroup::batchSendRecv(
    const std::vector<PointToPointOp>& ops, const SendRecvOptions& opts) {
  std::vector<OpDesc> descs;
  for (size_t i = 0; i < ops.size(); ++i) {
    const PointToPointOp& p = ops[i];
    if (p.type != OpType::kSend && p.type != OpType::kRecv) {
      LOOM_THROW(InvalidArgumentError, who(), ": batch_send_recv: entry ", i, " is a ",
                 opTypeName(p.type), "; entries are send or recv");
    }
    descs.push_back(pointToPointOp(p.type, p.buf, p.peer, p.tag));
    prepare(descs.back(), opts.timeout);
  }
  std::vector<std::shared_ptr<Work>> works;
  if (descs.empty()) return works;
  checkSameProcess(descs.front().type);
  IssueScope scope(*this, descs.front().type);
  std::lock_guard<std::mutex> lock(issueMu_);
  for (auto& d : descs) works.push_back(postLocked(std::move(d)));
  endPointToPointBatch();
  return works;
}

std::shared_ptr<Work> ProcessGroup::monitoredBarrier(const MonitoredBarrierOptions& opts) {
  OpDesc op;
  op.type = OpType::kMonitoredBarrier;
  op.waitAllRanks = opts.waitAllRanks;
  return issue(std::move(op), opts.timeout);
}

}  // namespace loom
