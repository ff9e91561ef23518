// Ring all-reduce: a reduce-scatter followed by an all-gather around the ring
// rank -> rank + 1, both chunked and pipelined.
//
// How it works
// - The buffer is cut into `size` segments (segmentBegin/segmentCount); each segment into
//   `chunks` chunks of at most op.chunkBytes(). Every message is one chunk.
// - Reduce-scatter, steps k = 0 .. size-2: rank r sends segment (r - k - 1) to `next` and
//   receives segment (r - k - 2) from `prev`, reducing it into out with its own input:
//   out[seg] = received (op) in[seg]. At step 0 the segment sent comes from `in`; later
//   steps send the partial result written into out one step before. After the last step,
//   segment r of out holds the full reduction.
// - Pipelining: the loop walks (step, chunk) in order; as soon as chunk c of step k is
//   reduced it is sent as chunk c of step k + 1, while later chunks are already arriving.
//   Out of place, every reduce-scatter receive is posted up front straight into its place in
//   out and reduced there (out = received (op) in): no window buffer, no unexpected message.
//   In place, the receives go into scratch slots, posted as chunks are consumed: `kWindow`
//   slots with paced step-0 sends at 2 ranks, two whole steps of slots (all step-0 chunks
//   sent at once) from 3 ranks on (measurements in bench/kernels/README.md).
// - All-gather, steps k = 0 .. size-2: rank r sends segment (r - k) and receives segment
//   (r - k - 1) straight into out. Chunk c of the final segment r is sent (step 0) right
//   after its last reduction, so the two phases overlap too. All all-gather receives are
//   posted together, after the reduce-scatter ones (roughly in the order their data arrives;
//   by causality a chunk of segment s can only arrive after this rank sent its own
//   contribution to it, so nothing still being read is overwritten).
// - avg: the final segment is divided by size once, before it is sent around.
// - Tags: step field k for reduce-scatter step k, (size - 1 + k) for all-gather step k;
//   chunks of one step share the tag and rely on in-order matching.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

namespace {
constexpr size_t kWindow = 4;  // chunks in flight in the reduce-scatter phase
}

void allreduceRing(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop) {
  const int size = op.size();
  const int rank = op.rank();
  const int next = (rank + 1) % size;
  const int prev = (rank - 1 + size) % size;
  const size_t esize = dtypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, rop);

  const size_t maxSegment = segmentCount(count, size, 0);
  const size_t chunkElems = std::max<size_t>(1, op.chunkBytes() / esize);
  const size_t chunks = std::max<size_t>(1, (maxSegment + chunkElems - 1) / chunkElems);
  const size_t perChunk = (maxSegment + chunks - 1) / chunks;
  // Chunk c of segment s: elements [begin, begin + n) of the whole buffer.
  auto chunkOf = [&](int s, size_t c, size_t& begin, size_t& n) {
    const size_t segBegin = segmentBegin(count, size, s);
    const size_t segCount = segmentCount(count, size, s);
    const size_t lo = std::min(segCount, c * perChunk);
    const size_t hi = std::min(segCount, lo + perChunk);
    begin = segBegin + lo;
    n = hi - lo;
  };
  auto segment = [&](int s) { return ((s % size) + size) % size; };

  const size_t steps = static_cast<size_t>(size - 1);
  const size_t totalRecvs = steps * chunks;  // reduce-scatter receives, in (step, chunk) order

  std::vector<RequestPtr> sends;
  std::vector<RequestPtr> gatherRecvs(steps * chunks);
  // Posted after the reduce-scatter receives (after the last of them, except when paced), in
  // the order their data comes: a reduce-scatter chunk that arrives while only all-gather
  // receives are posted finds this rank "waiting" on its peer and is copied through an
  // unexpected-message buffer instead of waiting in the socket for its own receive (at the
  // start of a call, one that came before this rank entered it).
  // Posted once; the call before the all-gather loop below only matters if a change to the
  // posting points above it ever missed a case (then they are late, never absent).
  bool gatherPosted = false;
  auto postGatherRecvs = [&] {
    if (gatherPosted) return;
    gatherPosted = true;
    for (size_t k = 0; k < steps; ++k) {
      for (size_t c = 0; c < chunks; ++c) {
        size_t begin, n;
        chunkOf(segment(rank - static_cast<int>(k) - 1), c, begin, n);
        gatherRecvs[k * chunks + c] =
            op.recv(prev, at(out, begin * esize), n * esize, static_cast<uint32_t>(size - 1 + k));
      }
    }
  };
  auto postFirstSend = [&](size_t c) {
    size_t begin, n;
    chunkOf(segment(rank - 1), c, begin, n);
    sends.push_back(op.send(next, at(in, begin * esize), n * esize, 0));
  };
  // Reduce-scatter receive i = (step i / chunks, chunk i % chunks).
  auto scatterChunk = [&](size_t i, size_t& begin, size_t& n) {
    chunkOf(segment(rank - static_cast<int>(i / chunks) - 2), i % chunks, begin, n);
  };

  // Out of place: every reduce-scatter receive lands straight in its place in out and is
  // reduced there (out = received (op) in), so all of them are posted up front, no message
  // ever arrives unexpected, and there is no window buffer. A region of out that is a
  // reduce-scatter target is also an all-gather target, but its all-gather data can only
  // arrive after this rank's partial result for it has left (causality), so they never meet.
  // In place: the input of out's segments is still needed, so receives land in `slots`
  // scratch chunk buffers, receive i in slot i % slots, reposted as chunks are consumed:
  // - 2 ranks: kWindow slots, and the step-0 sends paced like the receives (chunk c + kWindow
  //   leaves once chunk c arrived), so that they reach the peer's posted window instead of
  //   its unexpected-message queue; the small window stays in cache.
  // - 3 ranks and more: two whole steps of slots (steps k and k + 1, double-buffered), every
  //   step-0 chunk sent at once: pacing made each chunk wait for the neighbour to be
  //   scheduled, which costs most when ranks share cores. A chunk of step k + 2 (from 4
  //   ranks) reaches this rank before its slot is free only if `prev` runs two steps ahead;
  //   it then waits in the transport's unexpected queue (a copy, not an error).
  const bool inPlace = in == out;
  const bool paced = inPlace && size == 2;
  const size_t slotBytes = perChunk * esize;
  const size_t slots = paced ? kWindow : std::min<size_t>(steps, 2) * chunks;
  uint8_t* window =
      inPlace ? static_cast<uint8_t*>(op.context().scratch(slotBytes * slots, 0)) : nullptr;
  const size_t ahead = inPlace ? std::min<size_t>(slots, totalRecvs) : totalRecvs;
  std::vector<RequestPtr> scatterRecvs(ahead);
  auto postScatterRecv = [&](size_t i) {
    size_t begin, n;
    scatterChunk(i, begin, n);
    uint8_t* dst = inPlace ? window + (i % slots) * slotBytes : at(out, begin * esize);
    scatterRecvs[i % ahead] = op.recv(prev, dst, n * esize, static_cast<uint32_t>(i / chunks));
  };
  for (size_t i = 0; i < ahead; ++i) postScatterRecv(i);
  // Paced (2 ranks in place), the peer's all-gather chunks come interleaved with its later
  // reduce-scatter chunks, so they are posted now, behind the first window.
  if (ahead == totalRecvs || paced) postGatherRecvs();
  // Step 0 sends come straight from the input (segment rank - 1, which no reduce-scatter
  // receive writes; its all-gather data arrives only after these bytes have left).
  const size_t firstSends = paced ? std::min<size_t>(kWindow, chunks) : chunks;
  for (size_t c = 0; c < firstSends; ++c) postFirstSend(c);

  for (size_t i = 0; i < totalRecvs; ++i) {
    const size_t k = i / chunks;
    size_t begin, n;
    scatterChunk(i, begin, n);
    op.wait(scatterRecvs[i % ahead]);
    uint8_t* dst = at(out, begin * esize);
    if (inPlace) {
      reduce(dst, dst, window + (i % slots) * slotBytes, n);
      if (i + slots < totalRecvs) {
        postScatterRecv(i + slots);
        if (i + slots + 1 == totalRecvs && !paced) postGatherRecvs();
      }
      if (paced && i + kWindow < chunks) postFirstSend(i + kWindow);
    } else {
      reduce(dst, dst, at(in, begin * esize), n);
    }
    if (k + 1 < steps) {
      sends.push_back(op.send(next, dst, n * esize, static_cast<uint32_t>(k + 1)));
    } else {
      if (rop == ReduceOp::kAvg) divideBy(dst, n, dtype, size);
      sends.push_back(op.send(next, dst, n * esize, static_cast<uint32_t>(size - 1)));
    }
  }
  postGatherRecvs();
  for (size_t k = 0; k < steps; ++k) {
    for (size_t c = 0; c < chunks; ++c) {
      op.wait(gatherRecvs[k * chunks + c]);
      if (k + 1 < steps) {
        size_t begin, n;
        chunkOf(segment(rank - static_cast<int>(k) - 1), c, begin, n);
        sends.push_back(
            op.send(next, at(out, begin * esize), n * esize, static_cast<uint32_t>(size + k)));
      }
    }
  }
  op.waitAll(sends);
}

}  // namespace loom::comm
