#include "tag.h"

#include "loom/common/error.h"

namespace loom::comm {

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kNone:
      return "none";
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kAlltoall:
      return "alltoall";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kP2P:
      return "send/recv";
  }
  return "unknown";
}

std::string describeTag(uint64_t tag) {
  const OpKind kind = tagKind(tag);
  if (kind == OpKind::kP2P) return detail::str("send/recv tag ", tag & kMaxP2PTag);
  return detail::str(opKindName(kind), "#", tagSeq(tag), " step ", tagStep(tag));
}

}  // namespace loom::comm
