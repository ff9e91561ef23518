// OpDesc's descriptions, apart from the ProcessGroup so that the flight record's reader and
// analysis (diagnostics/) can be built without it (tests/fuzz/doctor_dump_fuzzer.cc).
#include "loom/process_group/process_group.h"

namespace loom {

std::string OpDesc::describe() const {
  std::string out = std::string(opTypeName(type)) + "#" + std::to_string(seq);
  if (type == OpType::kSend) out += " to rank " + std::to_string(root);
  if (type == OpType::kRecv) {
    out += root == kAnySource ? " from any rank" : " from rank " + std::to_string(root);
  }
  return out;
}

std::string OpDesc::signature() const {
  std::string out = opTypeName(type);
  if (type == OpType::kBarrier || type == OpType::kMonitoredBarrier) {
    return out + "()#" + std::to_string(seq);
  }
  // alltoallv's splits differ between ranks by design; the list forms' counts agree.
  if (type == OpType::kAlltoallv) {
    return out + "(dtype=" + dtypeName(dtype) + ")#" + std::to_string(seq);
  }
  if (type == OpType::kAllgatherv || type == OpType::kGatherv || type == OpType::kReduceScatterv) {
    out += "(dtype=" + std::string(dtypeName(dtype)) + ", counts=[";
    for (size_t i = 0; i < inCounts.size(); ++i) {
      out += (i ? "," : "") + std::to_string(inCounts[i]);
    }
    out += "]";
    if (type == OpType::kReduceScatterv) out += std::string(", op=") + reduceOpName(reduceOp);
    if (type == OpType::kGatherv) out += ", root=" + std::to_string(root);
    return out + ")#" + std::to_string(seq);
  }
  out += "(dtype=" + std::string(dtypeName(dtype)) + ", count=" + std::to_string(count);
  switch (type) {
    case OpType::kAllreduce:
    case OpType::kReduceScatter:
    case OpType::kAllreduceCoalesced:
      out += std::string(", op=") + reduceOpName(reduceOp);
      break;
    case OpType::kReduce:
      out += std::string(", op=") + reduceOpName(reduceOp) + ", root=" + std::to_string(root);
      break;
    case OpType::kBroadcast:
    case OpType::kGather:
    case OpType::kScatter:
      out += ", root=" + std::to_string(root);
      break;
    default:
      break;
  }
  return out + ")#" + std::to_string(seq);
}

}  // namespace loom
