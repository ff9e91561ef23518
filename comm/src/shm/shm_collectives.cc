#include "shm/shm_collectives.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/algorithms.h"
#include "loom/comm/reduce.h"
#include "shm/arena.h"
#include "shm/fold.h"
#include "shm/shm_single_copy.h"
#include "shm/shm_steps.h"
#include "shm/stream_copy.h"
#include "signature.h"
#include "tag.h"

namespace loom::comm::shm {

Arena::Call makeCall(Arena& arena, OpType kind, const CollectiveOptions& opts, size_t count,
                     DType dtype, int op, int root, bool exact) {
  // The public collectives resolve a zero timeout to the Context's (collectives.cc); a caller
  // of this layer that did not (a test driving an arena directly) gets the Context's default.
  const std::chrono::milliseconds timeout =
      opts.timeout.count() > 0 ? opts.timeout : ContextOptions{}.timeout;
  Arena::Call call{0,
                   timeout,
                   count * dtypeSize(dtype),
                   packSignature(kind, dtype, count, op >= 0,
                                 static_cast<ReduceOp>(op >= 0 ? op : 0), root >= 0, root, exact),
                   static_cast<uint8_t>(kind),
                   opts.seq};
  arena.checkUsable(call);
  return call;
}

void zeroCountStep(Arena& arena, const Arena::Call& call, Meet meet, int root) {
  const bool isRoot = arena.rank() == root;
  const bool posts = meet == Meet::kAll || (meet == Meet::kRootPosts) == isRoot;
  // A rooted meet compares every rank's call as the rooted collectives do (Arena::announceCall):
  // a gather's root before it waits for the posts, a receiver its root's before it waits for its
  // post, and the others' before it returns.
  const bool rooted = meet != Meet::kAll;
  const bool gatherRoot = meet == Meet::kOthersPost && isRoot;
  if (rooted) arena.announceCall(call);
  if (gatherRoot) arena.checkAnnouncedAll(call);
  if (meet == Meet::kRootPosts && !isRoot) arena.checkAnnounced(call, root);
  if (posts) {
    arena.acquireSlot(call);
    arena.post(call);
  }
  if (meet == Meet::kAll || gatherRoot) {
    arena.waitPostedAll(call);
  } else if (meet == Meet::kRootPosts && !isRoot) {
    arena.waitPosted(call, root);
  }
  if (rooted && !gatherRoot) arena.checkAnnouncedAll(call, meet == Meet::kRootPosts ? root : -1);
  // Every rank waited for every post (the all-reduce's small path), or a rooted step: then
  // the consumed counter says when the slot is free again, as in the rooted collectives.
  arena.finishStep(meet != Meet::kAll);
}

void stageChunk(Arena& arena, const void* in, size_t offset, size_t c, size_t es) {
  uint8_t* mine = arena.slot(arena.rank(), arena.step());
  const size_t begin = segmentBegin(c, arena.size(), arena.rank());
  const size_t end = begin + segmentCount(c, arena.size(), arena.rank());
  std::memcpy(mine, at(in, offset * es), begin * es);
  std::memcpy(mine + end * es, at(in, (offset + end) * es), (c - end) * es);
}

void stageSlices(uint8_t* slot, const void* in, size_t count, size_t offset, size_t c, size_t es,
                 int size, int skip) {
  for (int j = 0; j < size; ++j) {
    if (j != skip) std::memcpy(slot + j * c * es, at(in, (j * count + offset) * es), c * es);
  }
}

void copyOutReduced(Arena& arena, const Arena::Call& call, void* out, size_t offset, size_t c,
                    size_t es, bool stream) {
  const int me = arena.rank();
  const int size = arena.size();
  for (int k = 0; k < size; ++k) {
    const int q = (me + k) % size;  // start with our own sub-slice: it is ready
    arena.waitReduced(call, q);
    const size_t begin = segmentBegin(c, size, q);
    copyOut(at(out, (offset + begin) * es), arena.slot(q, arena.step()) + begin * es,
            segmentCount(c, size, q) * es, stream);
  }
}

size_t chunkElements(const Arena& arena, size_t elementSize, int pieces, size_t totalBytes) {
  const size_t budget = totalBytes >= kWholeSlotBytes
                            ? arena.slotBytes()
                            : std::min(arena.slotBytes(), kCacheChunkBytes);
  return std::max<size_t>(1, budget / (elementSize * static_cast<size_t>(pieces)));
}

namespace {

void copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

// dst = the fold (fold.h: x_0 op x_1 op ..., rank order, reads rotated by this rank) of `n`
// elements at byte offset `offset` of every rank's staging for the current step (`staged`
// bytes per rank: Arena::staging). dst must not overlap any staging.
void reduceSlots(Arena& arena, ReduceFn fn, void* dst, size_t staged, size_t offset, size_t n,
                 size_t es) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const size_t block = foldBlockElements(arena.size(), es, n);
  fold(
      fn, arena.size(), arena.rank(), n, block, arena.foldSkew(),
      [&](int q, size_t begin, size_t) { return arena.staging(q, staged) + offset + begin * es; },
      [&](size_t b) { return d + b * block * es; }, [](size_t, void*, size_t, size_t) {});
}

// The split reduction of one chunk of `c` elements (at element `offset` of the collective)
// already posted by every rank: this rank folds its sub-slice (fold.h: rank order, reads
// rotated) into its own slot and marks it reduced. Its own operand comes from `in` (stageChunk
// left it out of the slot).
void reduceOwnSubSlice(Arena& arena, const Arena::Call& call, ReduceFn fn, ReduceOp op, DType dtype,
                       const void* in, size_t offset, size_t c) {
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  arena.waitPostedAll(call);
  const size_t begin = segmentBegin(c, arena.size(), me);
  const size_t n = segmentCount(c, arena.size(), me);
  if (n > 0) {
    // The own sub-slice of this rank's slot was not staged (stageChunk): it is the
    // accumulator; this rank's operand comes from `in`.
    uint8_t* dst = arena.slot(me, arena.step()) + begin * es;
    const uint8_t* own = static_cast<const uint8_t*>(in) + (offset + begin) * es;
    const size_t block = foldBlockElements(arena.size(), es, n);
    fold(
        fn, arena.size(), me, n, block, arena.foldSkew(),
        [&](int q, size_t b, size_t) -> const void* {
          return q == me ? own + b * es : arena.slot(q, arena.step()) + (begin + b) * es;
        },
        [&](size_t b) { return dst + b * block * es; }, [](size_t, void*, size_t, size_t) {});
    if (op == ReduceOp::kAvg) divideBy(dst, n, dtype, arena.size());
  }
  arena.markReduced();
}

// ---- the staged all-reduce with helper threads (copy_helpers.h) ----

// Bytes [lo, hi) of the concatenation of `count` pieces (piece(i) gives dst, src and bytes),
// copied in runs of at most Arena::kPartRunBytes with a stop check before each: false when
// stopped early.
template <class Piece>
bool copyRange(const Arena& arena, int count, Piece&& piece, size_t lo, size_t hi, bool stream) {
  size_t base = 0;
  for (int i = 0; i < count && base < hi; ++i) {
    const auto [dst, src, bytes] = piece(i);
    const size_t a = std::max(lo, base);
    const size_t b = std::min(hi, base + bytes);
    for (size_t x = a; x < b; x += Arena::kPartRunBytes) {
      if (arena.partsStopped()) return false;
      copyOut(dst + (x - base), src + (x - base), std::min(Arena::kPartRunBytes, b - x), stream);
    }
    base += bytes;
  }
  return true;
}

// Where part `part` of `parts` of a range of `total` units starts: equal shares, cut at
// multiples of `align` units (a cache line), the last part ends at `total`.
size_t partStart(size_t total, int part, int parts, size_t align) {
  if (part >= parts) return total;
  return total / static_cast<size_t>(parts) * static_cast<size_t>(part) / align * align;
}

struct CopyPiece {
  uint8_t* dst;
  const uint8_t* src;
  size_t bytes;
};

// One step of the staged all-reduce (chunk `c` at element `offset`) with its copy in, its fold
// of the own sub-slice and its copy out each shared by this thread and the arena's helpers
// (Arena::parallel). The same protocol as the one-thread step in allreduce() (post, reduced
// mark, no consumed counter), so ranks with and without helpers work together, and the same
// fold per element (fold.h: rank order; a part folds a contiguous range of the sub-slice), so
// the same bits. Every wait for a peer runs on this thread, between the parallel parts.
void allreduceStepWithHelpers(Arena& arena, const Arena::Call& call, ReduceFn fn, ReduceOp op,
                              DType dtype, const void* in, void* out, size_t offset, size_t c,
                              bool stream) {
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  const size_t line = std::max<size_t>(1, 64 / es);
  const size_t begin = segmentBegin(c, size, me);
  const size_t n = segmentCount(c, size, me);
  const size_t end = begin + n;
  arena.acquireSlot(call);
  uint8_t* mine = arena.slot(me, arena.step());
  const uint8_t* src = static_cast<const uint8_t*>(in) + offset * es;
  // Copy in: all but the own sub-slice (stageChunk).
  const CopyPiece staged[2] = {{mine, src, begin * es},
                               {mine + end * es, src + end * es, (c - end) * es}};
  const size_t inBytes = (c - n) * es;
  arena.parallel(call, arena.partsFor(inBytes), [&](int part, int parts) {
    return copyRange(
        arena, 2, [&](int i) { return staged[i]; }, partStart(inBytes, part, parts, 64),
        partStart(inBytes, part + 1, parts, 64), false);
  });
  arena.post(call);
  arena.waitPostedAll(call);
  // The fold of the own sub-slice (reduceOwnSubSlice), its elements cut between the parts.
  if (n > 0) {
    std::vector<const uint8_t*> peers(static_cast<size_t>(size));
    for (int q = 0; q < size; ++q) {
      peers[q] = q == me ? src + begin * es : arena.slot(q, arena.step()) + begin * es;
    }
    uint8_t* dst = mine + begin * es;
    const bool skew = arena.foldSkew();
    // A run reads `size` operands of `run` elements: about kPartRunBytes in all.
    const size_t run = std::max(line, Arena::kPartRunBytes / (es * static_cast<size_t>(size)));
    arena.parallel(
        call, arena.partsFor(n * es * static_cast<size_t>(size)), [&](int part, int parts) {
          const size_t lo = partStart(n, part, parts, line);
          const size_t hi = partStart(n, part + 1, parts, line);
          for (size_t x = lo; x < hi; x += run) {
            if (arena.partsStopped()) return false;
            const size_t m = std::min(run, hi - x);
            const size_t block = foldBlockElements(size, es, m);
            fold(
                fn, size, me, m, block, skew,
                [&](int q, size_t b, size_t) -> const void* { return peers[q] + (x + b) * es; },
                [&](size_t b) { return dst + (x + b * block) * es; },
                [](size_t, void*, size_t, size_t) {});
            if (op == ReduceOp::kAvg) divideBy(dst + x * es, m, dtype, size);
          }
          return true;
        });
  }
  arena.markReduced();
  // Copy out once every sub-slice is reduced (the one-thread step copies each as it comes).
  for (int k = 0; k < size; ++k) arena.waitReduced(call, (me + k) % size);
  const size_t outBytes = c * es;
  uint8_t* dstOut = static_cast<uint8_t*>(out) + offset * es;
  arena.parallel(call, arena.partsFor(outBytes), [&](int part, int parts) {
    return copyRange(
        arena, size,
        [&](int q) {
          const size_t b = segmentBegin(c, size, q);
          return CopyPiece{dstOut + b * es, arena.slot(q, arena.step()) + b * es,
                           segmentCount(c, size, q) * es};
        },
        partStart(outBytes, part, parts, 64), partStart(outBytes, part + 1, parts, 64), stream);
  });
  arena.finishStep(false);  // every rank waited for every post: see allreduce()'s small path
}

}  // namespace

void allreduce(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
               DType dtype, ReduceOp op) {
  Arena::Call call = makeCall(arena, OpType::kAllreduce, opts, count, dtype, static_cast<int>(op));
  if (count == 0) return zeroCountStep(arena, call, Meet::kAll);
  const ReduceFn fn = reduceFunction(dtype, op);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  WindowRef windows[2];
  call.access = choosePeerAccess(arena, OpType::kAllreduce, count * es, in, count * es, out,
                                 count * es, windows);
  if (call.access != PeerAccess::kStaged) {
    return singleCopyAllreduce(arena, call, windows, in, out, count, dtype, op);
  }
  if (count * es <= std::min(kSmallBytes, arena.slotBytes())) {
    // Up to Arena::kBoxBytes the data travels in the post's own cache line (the box).
    const size_t bytes = count * es;
    arena.acquireSlot(call);
    std::memcpy(arena.staging(me, bytes), in, bytes);
    arena.post(call);
    arena.waitPostedAll(call);
    // Every rank reduces in rank order, so every rank computes bit-identical results.
    fn(out, arena.staging(0, bytes), arena.staging(1, bytes), count);
    for (int q = 2; q < size; ++q) fn(out, out, arena.staging(q, bytes), count);
    if (op == ReduceOp::kAvg) divideBy(out, count, dtype, size);
    // Every rank waited for every post of this step: the slot's reuse is seen through the
    // next posts (Arena::acquireSlot), so no consumed counter is published. The same holds
    // for every step of all-reduce, reduce-scatter, all-gather, all-to-all and barrier; the
    // rooted collectives, where some ranks wait for one rank only, still publish it.
    arena.finishStep(false);
    return;
  }
  const size_t chunk = chunkElements(arena, es, 1, count * es);
  const bool stream = count * es >= kStreamOutputBytes;
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    if (arena.copyThreads() > 0 && c * es >= Arena::kHelperMinStepBytes) {
      allreduceStepWithHelpers(arena, call, fn, op, dtype, in, out, offset, c, stream);
      continue;
    }
    arena.acquireSlot(call);
    stageChunk(arena, in, offset, c, es);
    arena.post(call);
    reduceOwnSubSlice(arena, call, fn, op, dtype, in, offset, c);
    copyOutReduced(arena, call, out, offset, c, es, stream);
    arena.finishStep(false);  // every rank waited for every post: see the small path
  }
  if (stream) fenceStreams();
}

void reduce(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
            DType dtype, ReduceOp op, int root) {
  Arena::Call call =
      makeCall(arena, OpType::kReduce, opts, count, dtype, static_cast<int>(op), root);
  if (count == 0) return zeroCountStep(arena, call, Meet::kAll);
  const ReduceFn fn = reduceFunction(dtype, op);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  // The peers read the inputs; the root's output (which only the root can look up) decides
  // inside the window path. There is no cross-memory reduce: that choice stages.
  WindowRef windows[2];
  call.access =
      choosePeerAccess(arena, OpType::kReduce, count * es, in, count * es, nullptr, 0, windows);
  if (call.access == PeerAccess::kWindow) {
    return windowReduce(arena, call, windows, in, out, count, dtype, op, root);
  }
  call.access = PeerAccess::kStaged;
  const size_t chunk = chunkElements(arena, es, 1, count * es);
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    arena.acquireSlot(call);
    stageChunk(arena, in, offset, c, es);
    arena.post(call);
    reduceOwnSubSlice(arena, call, fn, op, dtype, in, offset, c);
    if (me == root) copyOutReduced(arena, call, out, offset, c, es, false);
    arena.finishStep();
  }
}

void reduceScatter(Arena& arena, const CollectiveOptions& opts, const void* in, void* out,
                   size_t count, DType dtype, ReduceOp op) {
  Arena::Call call =
      makeCall(arena, OpType::kReduceScatter, opts, count, dtype, static_cast<int>(op));
  if (count == 0) return zeroCountStep(arena, call, Meet::kAll);
  const ReduceFn fn = reduceFunction(dtype, op);
  const size_t es = dtypeSize(dtype);
  WindowRef windows[2];
  call.access =
      choosePeerAccess(arena, OpType::kReduceScatter, count * es, in,
                       count * es * static_cast<size_t>(arena.size()), nullptr, 0, windows);
  if (call.access != PeerAccess::kStaged) {
    return singleCopyReduceScatter(arena, call, windows, in, out, count, dtype, op);
  }
  const int me = arena.rank();
  const int size = arena.size();
  const size_t chunk = chunkElements(arena, es, size, count * es * size);
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    const size_t staged = c * es * static_cast<size_t>(size);
    arena.acquireSlot(call);
    stageSlices(arena.staging(me, staged), in, count, offset, c, es, size);
    arena.post(call);
    arena.waitPostedAll(call);
    void* dst = at(out, offset * es);
    // This rank's own slice is staged too, so the fold reads every operand from the slots.
    reduceSlots(arena, fn, dst, staged, me * c * es, c, es);
    if (op == ReduceOp::kAvg) divideBy(dst, c, dtype, size);
    arena.finishStep(false);  // every rank waited for every post (all-reduce's small path)
  }
}

void broadcast(Arena& arena, const CollectiveOptions& opts, void* buf, size_t count, DType dtype,
               int root) {
  Arena::Call call = makeCall(arena, OpType::kBroadcast, opts, count, dtype, -1, root);
  if (count == 0) return zeroCountStep(arena, call, Meet::kRootPosts, root);
  const size_t es = dtypeSize(dtype);
  WindowRef windows[2];
  call.access =
      choosePeerAccess(arena, OpType::kBroadcast, count * es, buf, count * es, nullptr, 0, windows);
  if (call.access != PeerAccess::kStaged) {
    arena.announceCall(call);
    return singleCopyBroadcast(arena, call, windows, buf, count, dtype, root);
  }
  const bool isRoot = arena.rank() == root;
  const size_t chunk = chunkElements(arena, es, 1, count * es);
  const bool stream = count * es >= kStreamOutputBytes;
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    // The first step compares every rank's call (Arena::announceCall): the root after its post,
    // a receiver its root's before it waits for that post and the others' after its copy.
    const bool first = offset == 0;
    if (first) arena.announceCall(call);
    if (isRoot) {
      arena.acquireSlot(call);
      std::memcpy(arena.staging(root, c * es), at(buf, offset * es), c * es);
      arena.post(call);
    } else {
      if (first) arena.checkAnnounced(call, root);
      arena.waitPosted(call, root);
      copyOut(at(buf, offset * es), arena.staging(root, c * es), c * es, stream);
    }
    if (first) arena.checkAnnouncedAll(call, root);
    arena.finishStep();
  }
  if (stream) fenceStreams();
}

void allgather(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
               DType dtype) {
  Arena::Call call = makeCall(arena, OpType::kAllgather, opts, count, dtype);
  if (count == 0) return zeroCountStep(arena, call, Meet::kAll);
  const size_t es = dtypeSize(dtype);
  WindowRef windows[2];
  call.access =
      choosePeerAccess(arena, OpType::kAllgather, count * es, in, count * es, nullptr, 0, windows);
  if (call.access != PeerAccess::kStaged) {
    return singleCopyAllgather(arena, call, windows, in, out, count, dtype);
  }
  const int me = arena.rank();
  const int size = arena.size();
  const size_t chunk = chunkElements(arena, es, 1, count * es);
  const bool stream = count * es * size >= kStreamOutputBytes;
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    arena.acquireSlot(call);
    std::memcpy(arena.staging(me, c * es), at(in, offset * es), c * es);
    arena.post(call);
    for (int k = 1; k < size; ++k) {
      const int q = (me + k) % size;
      arena.waitPosted(call, q);
      copyOut(at(out, (q * count + offset) * es), arena.staging(q, c * es), c * es, stream);
    }
    copy(at(out, (me * count + offset) * es), at(in, offset * es), c * es);
    arena.finishStep(false);  // every rank waited for every post (all-reduce's small path)
  }
  if (stream) fenceStreams();
}

void gather(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
            DType dtype, int root) {
  const Arena::Call call = makeCall(arena, OpType::kGather, opts, count, dtype, -1, root);
  if (count == 0) return zeroCountStep(arena, call, Meet::kOthersPost, root);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  const size_t chunk = chunkElements(arena, es, 1, count * es);
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    // The first step compares every rank's call (Arena::announceCall): a sender after its post,
    // the root before it waits for the posts.
    const bool first = offset == 0;
    if (first) arena.announceCall(call);
    if (me != root) {
      arena.acquireSlot(call);
      std::memcpy(arena.staging(me, c * es), at(in, offset * es), c * es);
      arena.post(call);
      if (first) arena.checkAnnouncedAll(call);
    } else {
      if (first) arena.checkAnnouncedAll(call);
      for (int q = 0; q < size; ++q) {
        if (q == me) continue;
        arena.waitPosted(call, q);
        std::memcpy(at(out, (q * count + offset) * es), arena.staging(q, c * es), c * es);
      }
      copy(at(out, (me * count + offset) * es), at(in, offset * es), c * es);
    }
    arena.finishStep();
  }
}

void scatter(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
             DType dtype, int root) {
  const Arena::Call call = makeCall(arena, OpType::kScatter, opts, count, dtype, -1, root);
  if (count == 0) return zeroCountStep(arena, call, Meet::kRootPosts, root);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  const size_t chunk = chunkElements(arena, es, size, count * es * size);
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    const size_t staged = c * es * static_cast<size_t>(size);
    call.done = offset * es;
    // The first step compares every rank's call as broadcast's does (Arena::announceCall).
    const bool first = offset == 0;
    if (first) arena.announceCall(call);
    if (me == root) {
      arena.acquireSlot(call);
      stageSlices(arena.staging(me, staged), in, count, offset, c, es, size, /*skip=*/me);
      arena.post(call);
      copy(at(out, offset * es), at(in, (me * count + offset) * es), c * es);
    } else {
      if (first) arena.checkAnnounced(call, root);
      arena.waitPosted(call, root);
      std::memcpy(at(out, offset * es), arena.staging(root, staged) + me * c * es, c * es);
    }
    if (first) arena.checkAnnouncedAll(call, root);
    arena.finishStep();
  }
}

void alltoall(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
              DType dtype) {
  const Arena::Call call = makeCall(arena, OpType::kAlltoall, opts, count, dtype);
  if (count == 0) return zeroCountStep(arena, call, Meet::kAll);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  const size_t chunk = chunkElements(arena, es, size, count * es * size);
  for (size_t offset = 0; offset < count; offset += chunk) {
    const size_t c = std::min(chunk, count - offset);
    call.done = offset * es;
    const size_t staged = c * es * static_cast<size_t>(size);
    arena.acquireSlot(call);
    stageSlices(arena.staging(me, staged), in, count, offset, c, es, size);
    arena.post(call);
    for (int k = 0; k < size; ++k) {
      const int q = (me + k) % size;
      if (q != me) arena.waitPosted(call, q);
      std::memcpy(at(out, (q * count + offset) * es), arena.staging(q, staged) + me * c * es,
                  c * es);
    }
    arena.finishStep(false);  // every rank waited for every post (all-reduce's small path)
  }
}

void barrier(Arena& arena, const CollectiveOptions& opts) {
  const Arena::Call call = makeCall(arena, OpType::kBarrier, opts, 0, DType::kUInt8);
  arena.acquireSlot(call);
  arena.post(call);
  arena.waitPostedAll(call);
  arena.finishStep(false);  // as the small all-reduce
}

}  // namespace loom::comm::shm
