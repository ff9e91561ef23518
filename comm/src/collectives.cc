// The public collectives: validate the arguments, pick an algorithm and run it (the
// shared-memory collectives when the Context has an arena and no algorithm was forced). Arguments
// are checked before the first message, so an InvalidArgumentError leaves the Context
// usable; any later error has aborted the transport (see algorithms/op.h).
#include "loom/comm/collectives.h"

#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/select.h"
#include "loom/comm/context.h"
#include "loom/common/error.h"
#include "shm/hierarchy.h"
#include "shm/shm.h"
#include "shm/shm_collectives.h"
#include "tag.h"

namespace loom::comm {

namespace {

void checkRoot(const Context& ctx, int root, const char* what) {
  LOOM_CHECK(root >= 0 && root < ctx.size(), what, ": root ", root,
             " is out of range for world size ", ctx.size());
}

void checkBuffer(const void* p, size_t count, const char* what, const char* name) {
  LOOM_CHECK(p != nullptr || count == 0, what, ": ", name, " is null but count is ", count);
}

void copyIfDifferent(void* out, const void* in, size_t bytes) {
  if (out != in && bytes > 0) std::memmove(out, in, bytes);
}

}  // namespace

void allreduce(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
               const CollectiveOptions& opts) {
  checkReduceOp(op, dtype);
  checkBuffer(in, count, "allreduce", "input");
  checkBuffer(out, count, "allreduce", "output");
  const size_t bytes = count * dtypeSize(dtype);
  const Algorithm algo = selectAlgorithm(OpType::kAllreduce, opts.algorithm,
                                         environmentAlgorithm(ctx), bytes, ctx.size());
  if (count == 0) return;
  if (ctx.size() == 1) {
    copyIfDifferent(out, in, bytes);
    return;  // avg over one rank is the value itself
  }
  if (auto* arena = shm::arenaFor(ctx, opts)) {
    return shm::allreduce(*arena, opts, in, out, count, dtype, op);
  }
  if (const auto* hierarchy = shm::hierarchyFor(ctx, opts)) {
    return shm::hierarchicalAllreduce(ctx, *hierarchy, opts, in, out, count, dtype, op);
  }
  Op o(ctx, OpType::kAllreduce, opts);
  switch (algo) {
    case Algorithm::kRing:
      return allreduceRing(o, in, out, count, dtype, op);
    case Algorithm::kDirect:
      return allreduceDirect(o, in, out, count, dtype, op);
    case Algorithm::kHalvingDoubling:
      return allreduceHalvingDoubling(o, in, out, count, dtype, op);
    default:
      return allreduceRecursiveDoubling(o, in, out, count, dtype, op);
  }
}

void broadcast(Context& ctx, void* buf, size_t count, DType dtype, int root,
               const CollectiveOptions& opts) {
  (void)dtypeSize(dtype);
  checkRoot(ctx, root, "broadcast");
  checkBuffer(buf, count, "broadcast", "buffer");
  const size_t bytes = count * dtypeSize(dtype);
  const Algorithm algo = selectAlgorithm(OpType::kBroadcast, opts.algorithm,
                                         environmentAlgorithm(ctx), bytes, ctx.size());
  if (count == 0 || ctx.size() == 1) return;
  if (auto* arena = shm::arenaFor(ctx, opts)) {
    return shm::broadcast(*arena, opts, buf, count, dtype, root);
  }
  Op o(ctx, OpType::kBroadcast, opts);
  switch (algo) {
    case Algorithm::kChain:
      return broadcastChain(o, buf, count, dtype, root);
    case Algorithm::kDirect:
      return broadcastDirect(o, buf, count, dtype, root);
    default:
      return broadcastTree(o, buf, count, dtype, root);
  }
}

void reduce(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
            int root, const CollectiveOptions& opts) {
  checkReduceOp(op, dtype);
  checkRoot(ctx, root, "reduce");
  checkBuffer(in, count, "reduce", "input");
  if (ctx.rank() == root) checkBuffer(out, count, "reduce", "output on the root");
  const size_t bytes = count * dtypeSize(dtype);
  const Algorithm algo = selectAlgorithm(OpType::kReduce, opts.algorithm, environmentAlgorithm(ctx),
                                         bytes, ctx.size());
  if (count == 0) return;
  if (ctx.size() == 1) {
    copyIfDifferent(out, in, bytes);
    return;
  }
  if (auto* arena = shm::arenaFor(ctx, opts)) {
    return shm::reduce(*arena, opts, in, out, count, dtype, op, root);
  }
  Op o(ctx, OpType::kReduce, opts);
  if (algo == Algorithm::kDirect) return reduceDirect(o, in, out, count, dtype, op, root);
  reduceTree(o, in, out, count, dtype, op, root);
}

void allgather(Context& ctx, const void* in, void* out, size_t count, DType dtype,
               const CollectiveOptions& opts) {
  checkBuffer(in, count, "allgather", "input");
  checkBuffer(out, count, "allgather", "output");
  const size_t bytes = count * dtypeSize(dtype);
  const Algorithm algo = selectAlgorithm(OpType::kAllgather, opts.algorithm,
                                         environmentAlgorithm(ctx), bytes, ctx.size());
  if (count == 0) return;
  if (ctx.size() == 1) {
    copyIfDifferent(out, in, bytes);
    return;
  }
  if (auto* arena = shm::arenaFor(ctx, opts)) {
    return shm::allgather(*arena, opts, in, out, count, dtype);
  }
  Op o(ctx, OpType::kAllgather, opts);
  if (algo == Algorithm::kDirect) return allgatherDirect(o, in, out, count, dtype);
  allgatherRing(o, in, out, count, dtype);
}

void reduceScatter(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                   const CollectiveOptions& opts) {
  checkReduceOp(op, dtype);
  checkBuffer(in, count, "reduce_scatter", "input");
  checkBuffer(out, count, "reduce_scatter", "output");
  const size_t bytes = count * dtypeSize(dtype);
  const Algorithm algo = selectAlgorithm(OpType::kReduceScatter, opts.algorithm,
                                         environmentAlgorithm(ctx), bytes, ctx.size());
  if (count == 0) return;
  if (ctx.size() == 1) {
    copyIfDifferent(out, in, bytes);
    return;
  }
  if (auto* arena = shm::arenaFor(ctx, opts)) {
    return shm::reduceScatter(*arena, opts, in, out, count, dtype, op);
  }
  Op o(ctx, OpType::kReduceScatter, opts);
  if (algo == Algorithm::kDirect) return reduceScatterDirect(o, in, out, count, dtype, op);
  reduceScatterRing(o, in, out, count, dtype, op);
}

void gather(Context& ctx, const void* in, void* out, size_t count, DType dtype, int root,
            const CollectiveOptions& opts) {
  checkRoot(ctx, root, "gather");
  checkBuffer(in, count, "gather", "input");
  if (ctx.rank() == root) checkBuffer(out, count, "gather", "output on the root");
  const size_t bytes = count * dtypeSize(dtype);
  (void)selectAlgorithm(OpType::kGather, opts.algorithm, environmentAlgorithm(ctx), bytes,
                        ctx.size());
  if (count == 0) return;
  if (ctx.size() == 1) {
    copyIfDifferent(out, in, bytes);
    return;
  }
  if (auto* arena = shm::arenaFor(ctx, opts)) {
    return shm::gather(*arena, opts, in, out, count, dtype, root);
  }
  Op o(ctx, OpType::kGather, opts);
  gatherDirect(o, in, out, count, dtype, root);
}

void scatter(Context& ctx, const void* in, void* out, size_t count, DType dtype, int root,
             const CollectiveOptions& opts) {
  checkRoot(ctx, root, "scatter");
  if (ctx.rank() == root) checkBuffer(in, count, "scatter", "input on the root");
  checkBuffer(out, count, "scatter", "output");
  const size_t bytes = count * dtypeSize(dtype);
  (void)selectAlgorithm(OpType::kScatter, opts.algorithm, environmentAlgorithm(ctx), bytes,
                        ctx.size());
  if (count == 0) return;
  if (ctx.size() == 1) {
    copyIfDifferent(out, in, bytes);
    return;
  }
  if (auto* arena = shm::arenaFor(ctx, opts)) {
    return shm::scatter(*arena, opts, in, out, count, dtype, root);
  }
  Op o(ctx, OpType::kScatter, opts);
  scatterDirect(o, in, out, count, dtype, root);
}

void alltoall(Context& ctx, const void* in, void* out, size_t count, DType dtype,
              const CollectiveOptions& opts) {
  checkBuffer(in, count, "alltoall", "input");
  checkBuffer(out, count, "alltoall", "output");
  const size_t bytes = count * dtypeSize(dtype);
  (void)selectAlgorithm(OpType::kAlltoall, opts.algorithm, environmentAlgorithm(ctx), bytes,
                        ctx.size());
  if (count == 0) return;
  if (ctx.size() == 1) {
    copyIfDifferent(out, in, bytes);
    return;
  }
  if (auto* arena = shm::arenaFor(ctx, opts)) {
    return shm::alltoall(*arena, opts, in, out, count, dtype);
  }
  Op o(ctx, OpType::kAlltoall, opts);
  alltoallDirect(o, in, out, count, dtype);
}

void barrier(Context& ctx, const CollectiveOptions& opts) {
  if (opts.algorithm != Algorithm::kAuto) {
    LOOM_THROW(InvalidArgumentError, "barrier has one algorithm (dissemination); got ",
               algorithmName(opts.algorithm));
  }
  if (ctx.size() == 1) return;
  if (auto* arena = shm::arenaFor(ctx, opts)) return shm::barrier(*arena, opts);
  Op o(ctx, OpType::kBarrier, opts);
  barrierDissemination(o);
}

uint64_t pointToPointTag(uint64_t tag) {
  static_assert(kMaxPointToPointTag == kMaxP2PTag, "public and wire tag limits agree");
  return makeP2PTag(tag);
}

void send(Context& ctx, const void* buf, size_t count, DType dtype, int peer, uint64_t tag,
          const CollectiveOptions& opts) {
  LOOM_CHECK(peer >= 0 && peer < ctx.size() && peer != ctx.rank(), "send: peer ", peer,
             " must be another rank of this world of size ", ctx.size(), " (this is rank ",
             ctx.rank(), ")");
  LOOM_CHECK(tag <= kMaxP2PTag, "send: tag ", tag, " exceeds the maximum ", kMaxP2PTag);
  checkBuffer(buf, count, "send", "buffer");
  CollectiveOptions o2 = opts;
  o2.seq = 0;  // the user's tag, not the sequence number, identifies point-to-point messages
  Op o(ctx, OpType::kSend, o2);
  auto r = o.sendTagged(peer, buf, count * dtypeSize(dtype), makeP2PTag(tag));
  o.wait(r);
}

void recv(Context& ctx, void* buf, size_t count, DType dtype, int peer, uint64_t tag,
          const CollectiveOptions& opts) {
  LOOM_CHECK(peer >= 0 && peer < ctx.size() && peer != ctx.rank(), "recv: peer ", peer,
             " must be another rank of this world of size ", ctx.size(), " (this is rank ",
             ctx.rank(), ")");
  LOOM_CHECK(tag <= kMaxP2PTag, "recv: tag ", tag, " exceeds the maximum ", kMaxP2PTag);
  checkBuffer(buf, count, "recv", "buffer");
  CollectiveOptions o2 = opts;
  o2.seq = 0;
  Op o(ctx, OpType::kRecv, o2);
  auto r = o.recvTagged(peer, buf, count * dtypeSize(dtype), makeP2PTag(tag));
  o.wait(r);
}

}  // namespace loom::comm
