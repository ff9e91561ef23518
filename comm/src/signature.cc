#include "signature.h"

namespace loom::comm {

uint64_t packSignature(OpType type, DType dtype, uint64_t count, bool reduces, ReduceOp op,
                       bool rooted, int root) {
  const uint64_t rootField = rooted ? (static_cast<uint64_t>(root) % 0xffffu) + 1 : 0;
  return (uint64_t{1} << 63) | (uint64_t{static_cast<uint8_t>(type) & 0x7fu} << 56) |
         (uint64_t{static_cast<uint8_t>(dtype) & 0xfu} << 52) |
         (reduces ? uint64_t{static_cast<uint8_t>(op) & 0xfu} << 48 : 0) | (rootField << 32) |
         (count & 0xffffffffu);
}

std::string describeSignature(uint64_t s) {
  if ((s >> 63) == 0) return "(no signature)";
  const auto type = static_cast<OpType>((s >> 56) & 0x7f);
  std::string out = opTypeName(type);
  if (type == OpType::kBarrier) return out + "()";
  out += std::string("(dtype=") + dtypeName(static_cast<DType>((s >> 52) & 0xf));
  const uint64_t count = s & 0xffffffffu;
  const bool uneven = type == OpType::kAlltoallv || type == OpType::kAllgatherv ||
                      type == OpType::kGatherv || type == OpType::kReduceScatterv;
  if (!uneven) out += ", count=" + std::to_string(count);
  switch (type) {
    case OpType::kAllreduce:
    case OpType::kReduceScatter:
    case OpType::kReduce:
    case OpType::kReduceScatterv:
      out += std::string(", op=") + reduceOpName(static_cast<ReduceOp>((s >> 48) & 0xf));
      break;
    default:
      break;
  }
  const uint64_t root = (s >> 32) & 0xffffu;
  if (root != 0) out += ", root=" + std::to_string(root - 1);
  return out + ")";
}

}  // namespace loom::comm
