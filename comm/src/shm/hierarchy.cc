#include "shm/hierarchy.h"

#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"
#include "loom/comm/context.h"
#include "loom/comm/reduce.h"
#include "shm/arena.h"
#include "shm/shm_collectives.h"

namespace loom::comm::shm {

void hierarchicalAllreduce(Context& ctx, const Hierarchy& hierarchy, const CollectiveOptions& opts,
                           const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * dtypeSize(dtype);
  const ReduceOp partialOp = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  // 1. Within the host: reduce into the leader's `out`.
  if (hierarchy.arena != nullptr) {
    reduce(*hierarchy.arena, opts, in, out, count, dtype, partialOp, 0);
  } else if (out != in && bytes > 0) {
    std::memcpy(out, in, bytes);
  }
  // 2. Across hosts: the leaders exchange their partials over tcp and reduce in leader order.
  if (hierarchy.leaderIndex >= 0) {
    const int hosts = static_cast<int>(hierarchy.leaders.size());
    const int me = hierarchy.leaderIndex;
    Op o(ctx, OpType::kAllreduce, opts);
    auto* partials = static_cast<uint8_t*>(ctx.scratch(bytes * hosts, 0));
    // Count 0 still exchanges its empty messages: they carry the signature (signature.h).
    if (bytes > 0) std::memcpy(partials + me * bytes, out, bytes);
    std::vector<RequestPtr> recvs(hosts), sends;
    for (int h = 0; h < hosts; ++h) {
      if (h != me) recvs[h] = o.recv(hierarchy.leaders[h], partials + h * bytes, bytes, 0);
    }
    for (int i = 1; i < hosts; ++i) {
      sends.push_back(o.send(hierarchy.leaders[(me + i) % hosts], partials + me * bytes, bytes, 0));
    }
    const ReduceFn fn = reduceFunction(dtype, partialOp);
    for (int h = 0; h < hosts; ++h) {
      if (recvs[h]) o.wait(recvs[h]);
      if (h == 1) fn(out, partials, partials + bytes, count);
      if (h >= 2) fn(out, out, partials + h * bytes, count);
    }
    o.waitAll(sends);
    if (op == ReduceOp::kAvg) divideBy(out, count, dtype, ctx.size());
  }
  // 3. Within the host: the leader broadcasts the result.
  if (hierarchy.arena != nullptr) broadcast(*hierarchy.arena, opts, out, count, dtype, 0);
}

}  // namespace loom::comm::shm
