// The argument checks the ProcessGroup's methods share (process_group.cc and
// process_group_lists.cc): each throws InvalidArgumentError naming the group's rank, the
// operation and both values. They take the group, not who(): its string is built only for an
// error. isReduction: which operations the backends' checkOp look at the reduce op of.
#pragma once

#include <cstdint>

#include "loom/comm/collectives.h"
#include "loom/process_group/process_group.h"

namespace loom::pg_checks {

constexpr uint64_t kMaxTag = comm::kMaxPointToPointTag;

void checkSameDtype(const ProcessGroup& pg, const char* opName, const BufferView& in,
                    const BufferView& out);
void checkSameCount(const ProcessGroup& pg, const char* opName, const BufferView& in,
                    const BufferView& out);
bool sameView(const BufferView& a, const BufferView& b);
void checkReduceOpFor(const ProcessGroup& pg, const char* opName, ReduceOp op, DType dtype);
void checkTag(const ProcessGroup& pg, const char* opName, uint64_t tag);
// Input and output that overlap must be the operation's in-place form: `offset` elements is
// where this rank's block sits in the larger buffer (0: one buffer); `inInsideOut`: the input
// is the block of the output (all-gather, gather), else the output of the input (reduce-scatter,
// scatter; one buffer: either). Anything else is refused: some backends read peers' buffers in
// place, and every one writes blocks the other buffer still has to give.
void checkOverlap(const ProcessGroup& pg, const char* opName, const BufferView& in,
                  const BufferView& out, size_t offset, bool inInsideOut);

// Whether an operation of `type` reduces with its ReduceOp (allreduce, reduce, reduce_scatter,
// reduce_scatterv, allreduce_coalesced).
constexpr bool isReduction(OpType type) {
  switch (type) {
    case OpType::kAllreduce:
    case OpType::kReduce:
    case OpType::kReduceScatter:
    case OpType::kReduceScatterv:
    case OpType::kAllreduceCoalesced:
      return true;
    default:
      return false;
  }
}

}  // namespace loom::pg_checks
