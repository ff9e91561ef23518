// Reduce-scatter: rank r ends with the reduction of slice r of every rank's input.
//
// Ring (bandwidth-optimal), the reduce-scatter half of allreduce_ring.cc: steps
// k = 0 .. size-2, rank r sends slice (r - k - 1) to `next` and receives slice (r - k - 2)
// from `prev`, reducing it with its own input slice. Intermediate results go to a `partial`
// scratch buffer (slot 1, one slice per rank), from which the next step sends them; the last
// step reduces into out. Chunked and pipelined like the all-reduce: chunk c of step k is sent
// on as chunk c of step k + 1 as soon as it is reduced. Where the receives land:
// - 2 ranks (one step): in kWindow chunk buffers (scratch slot 0), reposted as chunks are
//   consumed, with the step-0 sends paced like the receives (chunk c + kWindow leaves once
//   chunk c arrived), so that each reaches a posted receive; the small window stays in cache.
// - 3 ranks and more: each in its own place of `partial` (the slices a rank receives are all
//   different), all posted up front, where the chunk is reduced in place; every step-0 chunk
//   is sent at once. A chunk of step k + 1 that arrives while this rank still waits for step k
//   then finds its receive posted. Through a window of 4 chunks it landed in the transport's
//   unexpected-message queue instead (a fresh buffer and a second copy): at 4 ranks a third of
//   the bytes took that detour until 27 Nov 2026.
//
// Direct: every rank sends slice j of its input to rank j and reduces the `size` slices it
// receives in rank order (one round; for small messages): the uneven reduce-scatter
// (uneven.cc) with equal counts.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

namespace {
constexpr size_t kWindow = 4;  // chunks in flight at 2 ranks
}

void reduceScatterRing(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop) {
  const int size = op.size();
  const int rank = op.rank();
  const int next = (rank + 1) % size;
  const int prev = (rank - 1 + size) % size;
  const size_t esize = dtypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, rop);
  const size_t chunkElems = std::max<size_t>(1, op.chunkBytes() / esize);
  const size_t chunks = (count + chunkElems - 1) / chunkElems;
  const size_t perChunk = (count + chunks - 1) / chunks;
  auto chunkCount = [&](size_t c) { return std::min(count, (c + 1) * perChunk) - c * perChunk; };
  auto segment = [&](int s) { return ((s % size) + size) % size; };
  // Receive i (step k = i / chunks, chunk c = i % chunks) is slice (rank - k - 2)'s chunk c.
  auto offsetOf = [&](size_t i) {
    const int s = segment(rank - static_cast<int>(i / chunks) - 2);
    return (s * count + (i % chunks) * perChunk) * esize;
  };

  const size_t steps = static_cast<size_t>(size - 1);
  const size_t total = steps * chunks;
  const bool paced = steps == 1;  // 2 ranks
  const size_t ahead = paced ? std::min(kWindow, total) : total;
  const size_t windowBytes = perChunk * esize;
  auto* window =
      paced ? static_cast<uint8_t*>(op.context().scratch(windowBytes * kWindow, 0)) : nullptr;
  // With one step every receive is reduced straight into out: no intermediate result, no
  // partial buffer (`last` below always holds when paced).
  auto* partial =
      paced ? nullptr : static_cast<uint8_t*>(op.context().scratch(count * esize * size, 1));
  // Where receive i lands.
  auto landing = [&](size_t i) {
    return paced ? window + (i % kWindow) * windowBytes : partial + offsetOf(i);
  };
  std::vector<RequestPtr> sends;
  std::vector<RequestPtr> recvs(ahead);
  auto post = [&](size_t i) {
    recvs[i % ahead] = op.recv(prev, landing(i), chunkCount(i % chunks) * esize,
                               static_cast<uint32_t>(i / chunks));
  };
  for (size_t i = 0; i < ahead; ++i) post(i);
  auto postFirstSend = [&](size_t c) {
    const size_t offset = (segment(rank - 1) * count + c * perChunk) * esize;
    sends.push_back(op.send(next, at(in, offset), chunkCount(c) * esize, 0));
  };
  const size_t firstSends = paced ? std::min(kWindow, chunks) : chunks;
  for (size_t c = 0; c < firstSends; ++c) postFirstSend(c);
  for (size_t i = 0; i < total; ++i) {
    const size_t k = i / chunks, c = i % chunks;
    const size_t n = chunkCount(c);
    const size_t offset = offsetOf(i);
    op.wait(recvs[i % ahead]);
    const bool last = k + 1 == steps;
    uint8_t* dst = last ? at(out, c * perChunk * esize) : partial + offset;
    // The received chunk is the second operand on both paths (the same bits).
    reduce(dst, at(in, offset), landing(i), n);
    if (paced) {
      if (i + ahead < total) post(i + ahead);
      if (i + kWindow < chunks) postFirstSend(i + kWindow);
    }
    if (!last) {
      sends.push_back(op.send(next, dst, n * esize, static_cast<uint32_t>(k + 1)));
    } else if (rop == ReduceOp::kAvg) {
      divideBy(dst, n, dtype, size);
    }
  }
  op.waitAll(sends);
}

void reduceScatterDirect(Op& op, const void* in, void* out, size_t count, DType dtype,
                         ReduceOp rop) {
  const std::vector<size_t> counts(op.size(), count);
  reduceScattervDirect(op, in, out, counts, dtype, rop);
}

}  // namespace loom::comm
