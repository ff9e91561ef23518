#include "shm/shm_single_copy.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"
#include "loom/comm/reduce.h"
#include "shm/fold.h"
#include "shm/stream_copy.h"

namespace loom::comm::shm {

namespace {

constexpr int kIn = 0, kOut = 1;

// Publishes this rank's buffers (and on the window path their Windows) and posts the
// collective's one step.
void postBuffers(Arena& arena, const Arena::Call& call, const WindowRef windows[2], const void* in,
                 const void* out) {
  arena.acquireSlot(call);
  if (call.access == PeerAccess::kWindow) {
    arena.publishBuffers(in, out, &windows[kIn], &windows[kOut]);
  } else {
    arena.publishBuffers(in, out);
  }
  arena.post(call);
}

// Ends the step and waits until no peer reads this rank's buffers any more.
void finish(Arena& arena, const Arena::Call& call) {
  arena.finishStep();
  arena.waitFinishedAll(call);
}

constexpr uint32_t kRootOutputInWindow = 1;  // Arena::Call::variant of a window reduce

// A window reduce's post: every rank's input; the root, which alone knows where its output
// lies, posts it too, with whether it is in a window as the step's variant. Returns once every
// rank posted.
void postRootOutput(Arena& arena, Arena::Call& call, WindowRef windows[2], const void* in,
                    void* out, size_t bytes, int root) {
  if (arena.rank() == root) {
    const auto outWindow = findWindow(out, bytes);
    if (outWindow) windows[kOut] = *outWindow;
    call.variant = outWindow ? kRootOutputInWindow : 0;
    postBuffers(arena, call, windows, in, out);
  } else {
    postBuffers(arena, call, windows, in, nullptr);
  }
  arena.waitPostedAll(call);
}

// Where this rank writes its reduced segment at byte `offset` of a window reduce's root's output.
uint8_t* rootOutputAt(Arena& arena, const Arena::Call& call, void* out, size_t offset, int root) {
  return arena.rank() == root ? static_cast<uint8_t*>(at(out, offset))
                              : arena.peerWindowForWrite(call, root, kOut) + offset;
}

// The end of a one-pass window step: this rank's reads and writes of peers' buffers are done
// (its mark), and so are theirs of this rank's once every peer marked; nothing is left to wait
// for at the step's end.
void endOnePass(Arena& arena, const Arena::Call& call) {
  arena.markReduced();
  arena.waitReducedAll(call);
  arena.finishStep();
}

// The window reduce's protocol (shm_single_copy.h, windowReduce) around foldInto(begin, n,
// target, intoPeer), which folds elements [begin, begin + n) of every rank's input into
// `target`: with the root's output in a window, every rank its own segment into the root's
// output (`intoPeer` on the others: it lies in the root's window); otherwise the root the whole
// buffer into its output. Then the one-pass end: no input is read any more.
template <class FoldInto>
void windowReduceSteps(Arena& arena, Arena::Call& call, WindowRef windows[2], const void* in,
                       void* out, size_t count, size_t es, int root, FoldInto&& foldInto) {
  const int me = arena.rank();
  postRootOutput(arena, call, windows, in, out, count * es, root);
  if (arena.postedVariant(root) == kRootOutputInWindow) {
    const size_t begin = segmentBegin(count, arena.size(), me);
    foldInto(begin, segmentCount(count, arena.size(), me),
             rootOutputAt(arena, call, out, begin * es, root), me != root);
  } else if (me == root) {
    foldInto(0, count, static_cast<uint8_t*>(out), false);
  }
  endOnePass(arena, call);
}

// Every rank's operand at byte `offset` of its input, for the window path: this rank's own
// (`own`), the peers' read in place from their mapped windows. Resolved once per call (a lookup
// per block would cost a few percent of it).
std::vector<const uint8_t*> operandsAt(Arena& arena, const Arena::Call& call, const void* own,
                                       size_t offset) {
  std::vector<const uint8_t*> operands(static_cast<size_t>(arena.size()));
  for (int q = 0; q < arena.size(); ++q) {
    operands[q] = q == arena.rank() ? static_cast<const uint8_t*>(own)
                                    : arena.peerWindow(call, q, kIn) + offset;
  }
  return operands;
}

// Where reduceFromPeers' window path puts each reduced block besides dst.
enum class Deliver {
  kHere,       // dst is this rank's memory
  kEveryPeer,  // also at `offset` of every peer's output (the window all-reduce's second half)
  kIntoPeer,   // dst lies in a peer's window (a reduce's root): accumulate in the bounce buffer
};

// dst[0, n) = the fold (fold.h: x_0 op x_1 op ..., rank order, whichever rank owns the range,
// so the bits are the staged path's) of every rank's elements at byte offset `offset` of its
// input, this rank's own operand being `own`. dst may equal own.
// Window path only: `deliver` (above), and `op` kAvg divides each reduced block by the size
// before it is delivered (the cross-memory path leaves that to the caller).
void reduceFromPeers(Arena& arena, const Arena::Call& call, ReduceFn fn, DType dtype,
                     const void* own, void* dst, size_t offset, size_t n,
                     Deliver deliver = Deliver::kHere, ReduceOp op = ReduceOp::kSum) {
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  const auto* d = static_cast<uint8_t*>(dst);
  const auto* o = static_cast<const uint8_t*>(own);
  // When dst overlaps this rank's own operand (in place) and that operand is not among the
  // first two of the fold (x_0, x_1: read before the accumulator is first written), or dst is
  // shifted against it, blocks are accumulated in the bounce buffer and copied to dst when
  // done (own must still be read). So are they when dst is a peer's: each block is then
  // written there once, and the root's operand, which may be that very memory (a reduce in
  // place), is read before.
  const bool overlap = d < o + n * es && o < d + n * es;
  const bool viaBounce = (overlap && (me >= 2 || d != o)) || deliver == Deliver::kIntoPeer;
  const bool toPeers = deliver == Deliver::kEveryPeer;
  if (n == 0) return;
  uint8_t* bounce = arena.bounce();
  if (call.access == PeerAccess::kWindow) {
    // The peers' operands are mapped here: reduce them where they lie, skewed and rotated
    // (fold.h) so that the ranks read different peers at a time, with the accumulators of the
    // blocks in flight in cache. (Measured on the 2-vCPU EPYC VM: software prefetch of the
    // peers' lines, or prefetchw of dst's, changed nothing.)
    const size_t block = foldBlockElements(size, es, n, Arena::kBounceBytes);
    const size_t inFlight = static_cast<size_t>(size - 1);
    // Every peer's operand and output resolved once.
    const std::vector<const uint8_t*> operands = operandsAt(arena, call, own, offset);
    std::vector<uint8_t*> outputs(toPeers ? static_cast<size_t>(size) : 0);
    for (int q = 0; q < size && toPeers; ++q) {
      if (q != me) outputs[q] = arena.peerWindowForWrite(call, q, kOut) + offset;
    }
    fold(
        fn, size, me, n, block, arena.foldSkew(),
        [&](int q, size_t begin, size_t) -> const void* { return operands[q] + begin * es; },
        [&](size_t b) -> void* {
          return viaBounce ? bounce + (b % inFlight) * block * es
                           : static_cast<void*>(at(dst, b * block * es));
        },
        [&](size_t, void* acc, size_t begin, size_t m) {
          void* out = at(dst, begin * es);
          if (op == ReduceOp::kAvg) divideBy(acc, m, dtype, size);
          if (viaBounce) std::memcpy(out, acc, m * es);
          if (toPeers) {
            for (int k = 1; k < size; ++k) {
              const int q = (me + k) % size;
              std::memcpy(outputs[q] + begin * es, out, m * es);
            }
          }
          call.done += m * es;
        });
    return;
  }
  // Cross-memory: operands are kernel copies (process_vm_readv) into the bounce buffer, a
  // quarter of it at a time (x_0 and x_1 both in the first stage), block after block (no skew:
  // n-1 blocks in flight do not fit, and a call per small block would cost more than it
  // moves), with the accumulator in the last half when it cannot be dst.
  const size_t quarter = Arena::kBounceBytes / 4;
  const size_t block = std::max<size_t>(1, quarter / es);
  uint8_t* scratch = bounce + 2 * quarter;
  fold(
      fn, size, me, n, block, /*skew=*/false,
      [&](int q, size_t begin, size_t m) -> const void* {
        if (q == me) return o + begin * es;
        uint8_t* to = bounce + (q == 0 ? 0 : quarter);
        arena.readPeer(call, q, arena.peerBuffer(q, kIn) + offset + begin * es, to, m * es);
        return to;
      },
      [&](size_t b) -> void* {
        return viaBounce ? static_cast<void*>(scratch) : at(dst, b * block * es);
      },
      [&](size_t, void* acc, size_t begin, size_t m) {
        if (viaBounce) std::memcpy(at(dst, begin * es), acc, m * es);
        call.done += m * es;
      });
}

}  // namespace

// The smallest collective (nccl-tests' size: the buffer of all-reduce and broadcast, the
// gathered / scattered total of all-gather and reduce-scatter) that takes the window path by
// default. Broadcast, all-gather and reduce-scatter were measured on the 2-vCPU EPYC VM
// (docs/shm.md, "Zero-copy windows"; in-place times, window buffers on both sides of each
// A/B): they win from 16 KiB with a core per rank; with more ranks than cores the extra
// hand-overs cost a context switch each, and the crossover moves to 64 KiB (broadcast) and
// 256 KiB. The all-reduce, since it writes each reduced segment straight into every peer's
// output (one pass, no second hand-over), was measured on the 2-vCPU Xeon VM: it ties the
// staged path at 4 KiB and wins from 16 KiB at 2 and 4 ranks, with inputs rewritten before
// every iteration (loom-bench --touch) and without.
size_t defaultWindowMin(OpType kind, bool oversubscribed) {
  switch (kind) {
    // The reduce, like the all-reduce one pass with no second hand-over, was measured on the
    // 2-vCPU EPYC VM (in-place times, 5 interleaved rounds, LOOM_SHM_WINDOWS=0 against
    // LOOM_SHM_WINDOW_MIN_BYTES=1): 2 ranks 4 KiB 2.44 / 2.10 us, 16 KiB 4.70 / 2.54; 3 ranks on
    // 2 CPUs 4 KiB 10.45 / 9.85 (a tie), 16 KiB 13.78 / 11.16, 64 KiB 26.87 / 15.57.
    case OpType::kAllreduce:
    case OpType::kReduce:
      return size_t{16} << 10;
    case OpType::kBroadcast:
      return oversubscribed ? size_t{64} << 10 : size_t{16} << 10;
    default:
      return oversubscribed ? size_t{256} << 10 : size_t{16} << 10;
  }
}

PeerAccess choosePeerAccess(const Arena& arena, OpType kind, size_t bytes, const void* read,
                            size_t readBytes, const void* readToo, size_t readTooBytes,
                            WindowRef windows[2]) {
  const bool spread = kind == OpType::kAllgather || kind == OpType::kReduceScatter;
  const size_t total = spread ? bytes * static_cast<size_t>(arena.size()) : bytes;
  const auto min = [&] {
    return arena.windowMinBytes() != 0 ? arena.windowMinBytes()
                                       : defaultWindowMin(kind, arena.oversubscribed());
  };
  if (arena.windows() && bytes > 0 && total >= min()) {
    const auto first = findWindow(read, readBytes);
    const auto second = readToo != nullptr ? findWindow(readToo, readTooBytes) : first;
    if (first && second) {
      windows[kIn] = *first;
      windows[kOut] = *second;
      return PeerAccess::kWindow;
    }
  }
  // Built in, staging won everywhere on the machine it was measured on (docs/shm.md); a
  // tuning file can name the sizes where the single copy wins on this one.
  return arena.crossMemoryFor(kind, bytes) ? PeerAccess::kCrossMemory : PeerAccess::kStaged;
}

void singleCopyAllreduce(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                         const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const ReduceFn fn = reduceFunction(dtype, op);
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  postBuffers(arena, call, windows, in, out);
  arena.waitPostedAll(call);
  const size_t begin = segmentBegin(count, size, me);
  const size_t n = segmentCount(count, size, me);
  if (call.access == PeerAccess::kWindow) {
    // One pass: this rank's segment reduced and written into every rank's output at once.
    reduceFromPeers(arena, call, fn, dtype, at(in, begin * es), at(out, begin * es), begin * es, n,
                    Deliver::kEveryPeer, op);
    endOnePass(arena, call);
    return;
  }
  reduceFromPeers(arena, call, fn, dtype, at(in, begin * es), at(out, begin * es), begin * es, n);
  if (op == ReduceOp::kAvg && n > 0) divideBy(at(out, begin * es), n, dtype, size);
  arena.markReduced();
  for (int k = 1; k < size; ++k) {
    const int q = (me + k) % size;
    arena.waitReduced(call, q);
    const size_t qBegin = segmentBegin(count, size, q);
    arena.copyFromPeer(call, q, kOut, qBegin * es, at(out, qBegin * es),
                       segmentCount(count, size, q) * es);
    call.done += segmentCount(count, size, q) * es;
  }
  // Not streamed (unlike broadcast and all-gather): measured slower (2 ranks, in place,
  // 32 MiB 10.3 -> 8.6 GB/s), the output being the next reduction's operand here.
  finish(arena, call);
}

namespace {

// n elements of every rank's operand reduced with the n-ary reducer, a bounce buffer at a time
// (so that no target aliases an operand being read), each block copied to every target in
// order (the caller rotates them).
void reduceRowsInto(Arena& arena, const Arena::Call& call,
                    const std::vector<const uint8_t*>& operands,
                    const std::vector<uint8_t*>& targets, size_t n, size_t es,
                    const RowsReducer& reduce) {
  std::vector<const void*> rows(operands.size());
  uint8_t* bounce = arena.bounce();
  const size_t block = std::max<size_t>(1, Arena::kBounceBytes / es);
  for (size_t b = 0; b < n; b += block) {
    const size_t m = std::min(block, n - b);
    for (size_t q = 0; q < operands.size(); ++q) rows[q] = operands[q] + b * es;
    reduce(rows, m, bounce);
    for (uint8_t* t : targets) std::memcpy(t + b * es, bounce, m * es);
    call.done += m * es;
  }
}

}  // namespace

void windowAllreduceRows(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                         const void* in, void* out, size_t count, DType dtype,
                         const RowsReducer& reduce) {
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  postBuffers(arena, call, windows, in, out);
  arena.waitPostedAll(call);
  const size_t begin = segmentBegin(count, size, me);
  // Segment `me` of every rank's output, rotated, so that the ranks write different peers at a
  // time; this rank's own output last (in place, its operand was one of the rows just read).
  std::vector<uint8_t*> targets;
  for (int k = 1; k <= size; ++k) {
    const int q = (me + k) % size;
    targets.push_back(q == me ? static_cast<uint8_t*>(at(out, begin * es))
                              : arena.peerWindowForWrite(call, q, kOut) + begin * es);
  }
  reduceRowsInto(arena, call, operandsAt(arena, call, at(in, begin * es), begin * es), targets,
                 segmentCount(count, size, me), es, reduce);
  endOnePass(arena, call);
}

void windowReduceRows(Arena& arena, Arena::Call& call, WindowRef windows[2], const void* in,
                      void* out, size_t count, DType dtype, int root, const RowsReducer& reduce) {
  const size_t es = dtypeSize(dtype);
  windowReduceSteps(arena, call, windows, in, out, count, es, root,
                    [&](size_t begin, size_t n, uint8_t* target, bool /*intoPeer*/) {
                      // Through the bounce buffer already: no target aliases an operand.
                      reduceRowsInto(arena, call,
                                     operandsAt(arena, call, at(in, begin * es), begin * es),
                                     {target}, n, es, reduce);
                    });
}

void windowReduceScatterRows(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                             const void* in, void* out, size_t count, DType dtype,
                             const RowsReducer& reduce) {
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  const size_t mine = static_cast<size_t>(me) * count * es;
  postBuffers(arena, call, windows, in, out);
  arena.waitPostedAll(call);
  const auto* own = static_cast<const uint8_t*>(at(in, mine));
  auto* dst = static_cast<uint8_t*>(out);
  const std::vector<const uint8_t*> operands = operandsAt(arena, call, own, mine);
  std::vector<const void*> rows(static_cast<size_t>(size));
  // In place (the one overlap the collectives' validation lets through), through the bounce
  // buffer: the reducer's output must not be one of its operands. Otherwise straight into the
  // output, in blocks so that the progress counter moves.
  const bool viaBounce = dst == own;
  uint8_t* bounce = arena.bounce();
  const size_t block = std::max<size_t>(1, Arena::kBounceBytes / es);
  for (size_t b = 0; b < count; b += block) {
    const size_t m = std::min(block, count - b);
    for (int q = 0; q < size; ++q) rows[q] = operands[q] + b * es;
    if (viaBounce) {
      reduce(rows, m, bounce);
      std::memcpy(dst + b * es, bounce, m * es);
    } else {
      reduce(rows, m, dst + b * es);
    }
    call.done += m * es;
  }
  finish(arena, call);  // no peer reads this rank's input any more
}

void singleCopyReduceScatter(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                             const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  const ReduceFn fn = reduceFunction(dtype, op);
  const size_t es = dtypeSize(dtype);
  const size_t mine = arena.rank() * count * es;
  postBuffers(arena, call, windows, in, out);
  arena.waitPostedAll(call);
  reduceFromPeers(arena, call, fn, dtype, at(in, mine), out, mine, count);
  if (op == ReduceOp::kAvg) divideBy(out, count, dtype, arena.size());
  finish(arena, call);
}

void windowReduce(Arena& arena, Arena::Call& call, WindowRef windows[2], const void* in, void* out,
                  size_t count, DType dtype, ReduceOp op, int root) {
  const ReduceFn fn = reduceFunction(dtype, op);
  const size_t es = dtypeSize(dtype);
  windowReduceSteps(arena, call, windows, in, out, count, es, root,
                    [&](size_t begin, size_t n, uint8_t* target, bool intoPeer) {
                      reduceFromPeers(arena, call, fn, dtype, at(in, begin * es), target,
                                      begin * es, n, intoPeer ? Deliver::kIntoPeer : Deliver::kHere,
                                      op);
                    });
}

// Whether a window broadcast's root helps copy (see singleCopyBroadcast): when that spreads
// the copying over the cores better. Alone, the size-1 receivers each copy the whole buffer;
// assisted, every rank copies (size-1)/size of it. Per core, the busiest core's share of
// buffers is ceil(copiers / cpus) times what each copies: assisted wins when
// ceil(size / cpus) (size-1)/size < ceil((size-1) / cpus). With a core per rank it always
// does (2 ranks: half the time); 3 ranks on 2 cores lose (measured: 16 MiB 13.5 -> 8.2
// GB/s), 4 on 2 win (balanced 1.5 buffers per core instead of 2).
bool broadcastRootAssists(int size, int cpus) {
  if (size < 2 || cpus < 1) return false;
  const auto perCore = [&](int copiers) { return (copiers + cpus - 1) / cpus; };
  return perCore(size) * (size - 1) < perCore(size - 1) * size;
}

namespace {
constexpr uint32_t kRootAssists = 1;  // Arena::Call::variant of an assisted broadcast
}  // namespace

// Every rank publishes its buffer. Unassisted, each receiver copies the root's buffer (plain
// loads from its window, or process_vm_readv) and the root only waits until they are done.
// Assisted (window path only: the root writes into the receivers' windows; its choice, which
// it posts as the step's variant and the receivers follow), the buffer is cut into `size`
// segments; the receiver `i` places after the root gets segment i written into its buffer by
// the root and copies the other size-1 segments from the root's buffer itself, and waits for
// the root's "reduced" mark (all its writes done) before it returns. At 2 ranks with a core
// each, that is two cores copying at once instead of one (this VM: 2x the busbw from 64 KiB).
void singleCopyBroadcast(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                         void* buf, size_t count, DType dtype, int root) {
  const size_t es = dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  const bool window = call.access == PeerAccess::kWindow;
  const bool stream = window && count * es >= kStreamOutputBytes;
  if (me == root) {
    const bool assist = window && broadcastRootAssists(size, arena.cpus());
    call.variant = assist ? kRootAssists : 0;
    postBuffers(arena, call, windows, buf, buf);
    // Every rank's call, before this rank returns or writes into a receiver's buffer (broadcast()
    // announced it: Arena::announceCall).
    arena.checkAnnouncedAll(call);
    if (assist) {
      for (int i = 1; i < size; ++i) {
        const int r = (root + i) % size;
        arena.waitPosted(call, r);
        const size_t begin = segmentBegin(count, size, i) * es;
        const size_t bytes = segmentCount(count, size, i) * es;
        if (bytes != 0) {
          copyOut(arena.peerWindowForWrite(call, r, kOut) + begin, at(buf, begin), bytes, stream);
        }
        call.done += bytes;
      }
      if (stream) fenceStreams();
      arena.markReduced();  // every receiver's segment is written
    }
    finish(arena, call);
    return;
  }
  postBuffers(arena, call, windows, buf, buf);
  arena.checkAnnounced(call, root);  // a "root" on another path may never post
  arena.waitPosted(call, root);
  if (arena.postedVariant(root) != kRootAssists) {
    arena.copyFromPeer(call, root, kIn, 0, buf, count * es, stream);
    if (stream) fenceStreams();
    arena.checkAnnouncedAll(call, root);  // every other rank's call, before this rank returns
    arena.finishStep();
    return;
  }
  const int mine = (me - root + size) % size;
  for (int k = 1; k < size; ++k) {
    const int s = (mine + k) % size;
    const size_t begin = segmentBegin(count, size, s) * es;
    const size_t bytes = segmentCount(count, size, s) * es;
    arena.copyFromPeer(call, root, kIn, begin, at(buf, begin), bytes, stream);
    call.done += bytes;
  }
  if (stream) fenceStreams();
  arena.waitReduced(call, root);  // the root wrote segment `mine` of this buffer
  arena.checkAnnouncedAll(call, root);
  arena.finishStep();
}

void singleCopyAllgather(Arena& arena, const Arena::Call& call, const WindowRef windows[2],
                         const void* in, void* out, size_t count, DType dtype) {
  const size_t bytes = count * dtypeSize(dtype);
  const int me = arena.rank();
  const int size = arena.size();
  const bool stream = call.access == PeerAccess::kWindow && bytes * size >= kStreamOutputBytes;
  postBuffers(arena, call, windows, in, out);
  for (int k = 1; k < size; ++k) {
    const int q = (me + k) % size;
    arena.waitPosted(call, q);
    arena.copyFromPeer(call, q, kIn, 0, at(out, q * bytes), bytes, stream);
    call.done += bytes;
  }
  if (at(out, me * bytes) != in) copyOut(at(out, me * bytes), in, bytes, stream);
  if (stream) fenceStreams();
  finish(arena, call);
}

}  // namespace loom::comm::shm
