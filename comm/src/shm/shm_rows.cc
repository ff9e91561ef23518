// The n-ary shared-memory reductions (shm_collectives.h: allreduceRows, reduceRows,
// reduceScatterRows): the staged paths of allreduce, reduce and reduceScatter, with the fold of
// two operands at a time replaced by one call that gets every rank's operand of a sub-slice at
// once. The reproducible mode's exact sums (comm/src/reproducible.cc) take them: its result
// does not depend on the order of the operands, but it needs all of them together.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"
#include "shm/arena.h"
#include "shm/shm_collectives.h"
#include "shm/shm_single_copy.h"
#include "shm/shm_steps.h"
#include "shm/stream_copy.h"

namespace loom::comm::shm {

namespace {

// Step of the split reduction shared by allreduceRows and reduceRows: stage the chunk but this
// rank's sub-slice, post, wait for every post, reduce the sub-slice (this rank's operand from
// `in`, the others from their slots) into this rank's slot, mark it reduced.
void reduceOwnRows(Arena& arena, const Arena::Call& call, const void* in, size_t offset, size_t c,
                   size_t es, std::vector<const void*>& rows, const RowsReducer& reduce) {
  const int me = arena.rank();
  arena.acquireSlot(call);
  stageChunk(arena, in, offset, c, es);
  arena.post(call);
  arena.waitPostedAll(call);
  const size_t begin = segmentBegin(c, arena.size(), me);
  const size_t n = segmentCount(c, arena.size(), me);
  if (n > 0) {
    for (int q = 0; q < arena.size(); ++q) {
      rows[q] = q == me ? at(in, (offset + begin) * es) : arena.slot(q, arena.step()) + begin * es;
    }
    reduce(rows, n, arena.slot(me, arena.step()) + begin * es);
  }
  arena.markReduced();
}

}  // namespace

void allreduceRows(Arena& arena, const CollectiveOptions& opts, const void* in, void* out,
                   size_t count, DType dtype, ReduceOp op, const RowsReducer& reduce) {
  Arena::Call call =
      makeCall(arena, OpType::kAllreduce, opts, count, dtype, static_cast<int>(op), -1, true);
  if (count == 0) return zeroCountStep(arena, call, Meet::kAll);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  // Buffers in Windows on every rank: the window all-reduce's one pass (DDP's buckets). No
  // cross-memory path for the rows: every rank takes the staged one instead, alike.
  WindowRef windows[2];
  call.access = choosePeerAccess(arena, OpType::kAllreduce, count * es, in, count * es, out,
                                 count * es, windows);
  if (call.access == PeerAccess::kWindow) {
    return windowAllreduceRows(arena, call, windows, in, out, count, dtype, reduce);
  }
  call.access = PeerAccess::kStaged;
  std::vector<const void*> rows(size);
  if (count * es <= std::min(kSmallBytes, arena.slotBytes())) {
    // As allreduce's small path: one step, every rank reduces the whole buffer from every
    // rank's staging (its own too, so that `out` may be `in`).
    const size_t bytes = count * es;
    arena.acquireSlot(call);
    std::memcpy(arena.staging(me, bytes), in, bytes);
    arena.post(call);
    arena.waitPostedAll(call);
    for (int q = 0; q < size; ++q) rows[q] = arena.staging(q, bytes);
    reduce(rows, count, out);
    arena.finishStep(false);
    return;
  }
  const size_t chunk = chunkElements(arena, es, 1, count * es);
  const bool stream = count * es >= kStreamOutputBytes;
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    reduceOwnRows(arena, call, in, offset, c, es, rows, reduce);
    copyOutReduced(arena, call, out, offset, c, es, stream);
    arena.finishStep(false);  // every rank waited for every post (allreduce's small path)
  }
  if (stream) fenceStreams();
}

void reduceRows(Arena& arena, const CollectiveOptions& opts, const void* in, void* out,
                size_t count, DType dtype, ReduceOp op, int root, const RowsReducer& reduce) {
  Arena::Call call =
      makeCall(arena, OpType::kReduce, opts, count, dtype, static_cast<int>(op), root, true);
  if (count == 0) return zeroCountStep(arena, call, Meet::kAll);
  const size_t es = dtypeSize(dtype);
  // Inputs in Windows on every rank: read in place (shm_single_copy.h, windowReduceRows). No
  // cross-memory path: every rank stages instead.
  WindowRef windows[2];
  call.access =
      choosePeerAccess(arena, OpType::kReduce, count * es, in, count * es, nullptr, 0, windows);
  if (call.access == PeerAccess::kWindow) {
    return windowReduceRows(arena, call, windows, in, out, count, dtype, root, reduce);
  }
  call.access = PeerAccess::kStaged;
  std::vector<const void*> rows(arena.size());
  const size_t chunk = chunkElements(arena, es, 1, count * es);
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    reduceOwnRows(arena, call, in, offset, c, es, rows, reduce);
    if (arena.rank() == root) copyOutReduced(arena, call, out, offset, c, es, false);
    arena.finishStep();  // the others wait for the root's reads through the consumed counter
  }
}

void reduceScatterRows(Arena& arena, const CollectiveOptions& opts, const void* in, void* out,
                       size_t count, DType dtype, ReduceOp op, const RowsReducer& reduce) {
  Arena::Call call =
      makeCall(arena, OpType::kReduceScatter, opts, count, dtype, static_cast<int>(op), -1, true);
  if (count == 0) return zeroCountStep(arena, call, Meet::kAll);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  // Inputs in Windows on every rank: each rank reads its slice of every input in place (ZeRO-1's
  // flat vector, torch tensors from loom_torch.empty). As for the rows' all-reduce, no
  // cross-memory path: every rank stages instead.
  WindowRef windows[2];
  call.access = choosePeerAccess(arena, OpType::kReduceScatter, count * es, in,
                                 count * es * static_cast<size_t>(size), nullptr, 0, windows);
  if (call.access == PeerAccess::kWindow) {
    return windowReduceScatterRows(arena, call, windows, in, out, count, dtype, reduce);
  }
  call.access = PeerAccess::kStaged;
  std::vector<const void*> rows(size);
  // This rank's own slice is read from `in` unless the output overlaps it (the reducer's output
  // must not alias its operands): then it is staged like the others.
  const uint8_t* own = at(in, me * count * es);
  const auto* o = static_cast<const uint8_t*>(out);
  const bool overlaps = o < own + count * es && own < o + count * es;
  const size_t chunk = chunkElements(arena, es, size, count * es * size);
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    const size_t staged = c * es * static_cast<size_t>(size);
    arena.acquireSlot(call);
    stageSlices(arena.staging(me, staged), in, count, offset, c, es, size, overlaps ? -1 : me);
    arena.post(call);
    arena.waitPostedAll(call);
    for (int q = 0; q < size; ++q) {
      rows[q] = q == me && !overlaps ? own + offset * es : arena.staging(q, staged) + me * c * es;
    }
    reduce(rows, c, at(out, offset * es));
    arena.finishStep(false);  // every rank waited for every post (allreduce's small path)
  }
}

}  // namespace loom::comm::shm
