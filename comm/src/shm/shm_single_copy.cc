#include "shm/shm_single_copy.h"

#include <algorithm>
#include <cstring>

#include "algorithms/algorithms.h"
#include "loom/comm/reduce.h"

namespace loom::comm::shm {

namespace {

constexpr int kIn = 0, kOut = 1;

// Publishes this rank's buffers and posts the collective's one step.
void postBuffers(Arena& arena, const Arena::Call& call, const void* in, const void* out) {
  arena.acquireSlot(call);
  arena.publishBuffers(in, out);
  arena.post(call);
}

// Ends the step and waits until no peer reads this rank's buffers any more.
void finish(Arena& arena, const Arena::Call& call) {
  arena.finishStep();
  arena.waitFinishedAll(call);
}

// dst[0, n) = own[0, n) (op) every peer's elements at byte offset `offset` of its input, read
// through the bounce buffer a chunk at a time; peers in rank order. dst may equal own.
void reduceFromPeers(Arena& arena, const Arena::Call& call, ReduceFn fn, DType dtype,
                     const void* own, void* dst, size_t offset, size_t n) {
  const size_t es = dtypeSize(dtype);
  const size_t chunk = Arena::kBounceBytes / es;
  uint8_t* bounce = arena.bounce();
  for (size_t done = 0; done < n; done += chunk) {
    const size_t m = std::min(chunk, n - done);
    bool started = false;
    for (int q = 0; q < arena.size(); ++q) {
      if (q == arena.rank()) continue;
      arena.readPeer(call, q, arena.peerBuffer(q, kIn) + offset + done * es, bounce, m * es);
      fn(at(dst, done * es), started ? at(dst, done * es) : at(own, done * es), bounce, m);
      started = true;
    }
    call.done += m * es;
  }
}

}  // namespace

bool useSingleCopy(const Arena& arena, OpType, size_t) {
  // No crossover on the measured machine (shm_single_copy.h): only a forced path runs it.
  return arena.singleCopy() && arena.singleCopyForced();
}

void singleCopyAllreduce(Arena& arena, const Arena::Call& call, const void* in, void* out,
                         size_t count, DType dtype, ReduceOp op) {
  const ReduceFn fn = reduceFunction(dtype, op);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  postBuffers(arena, call, in, out);
  arena.waitPostedAll(call);
  const size_t begin = segmentBegin(count, size, me);
  const size_t n = segmentCount(count, size, me);
  reduceFromPeers(arena, call, fn, dtype, at(in, begin * es), at(out, begin * es), begin * es, n);
  if (op == ReduceOp::kAvg && n > 0) divideBy(at(out, begin * es), n, dtype, size);
  arena.markReduced();
  for (int k = 1; k < size; ++k) {
    const int q = (me + k) % size;
    arena.waitReduced(call, q);
    const size_t qBegin = segmentBegin(count, size, q);
    arena.readPeer(call, q, arena.peerBuffer(q, kOut) + qBegin * es, at(out, qBegin * es),
                   segmentCount(count, size, q) * es);
    call.done += segmentCount(count, size, q) * es;
  }
  finish(arena, call);
}

void singleCopyReduceScatter(Arena& arena, const Arena::Call& call, const void* in, void* out,
                             size_t count, DType dtype, ReduceOp op) {
  const ReduceFn fn = reduceFunction(dtype, op);
  const size_t es = dtypeSize(dtype);
  const size_t mine = arena.rank() * count * es;
  postBuffers(arena, call, in, out);
  arena.waitPostedAll(call);
  reduceFromPeers(arena, call, fn, dtype, at(in, mine), out, mine, count);
  if (op == ReduceOp::kAvg) divideBy(out, count, dtype, arena.size());
  finish(arena, call);
}

void singleCopyBroadcast(Arena& arena, const Arena::Call& call, void* buf, size_t count,
                         DType dtype, int root) {
  if (arena.rank() == root) {
    postBuffers(arena, call, buf, buf);
    finish(arena, call);
    return;
  }
  arena.waitPosted(call, root);
  arena.readPeer(call, root, arena.peerBuffer(root, kIn), buf, count * dtypeSize(dtype));
  arena.finishStep();
}

void singleCopyAllgather(Arena& arena, const Arena::Call& call, const void* in, void* out,
                         size_t count, DType dtype) {
  const size_t bytes = count * dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  postBuffers(arena, call, in, out);
  for (int k = 1; k < size; ++k) {
    const int q = (me + k) % size;
    arena.waitPosted(call, q);
    arena.readPeer(call, q, arena.peerBuffer(q, kIn), at(out, q * bytes), bytes);
    call.done += bytes;
  }
  if (at(out, me * bytes) != in) std::memcpy(at(out, me * bytes), in, bytes);
  finish(arena, call);
}

}  // namespace loom::comm::shm
