// Reduce-scatter: rank r ends with the reduction of slice r of every rank's input.
//
// Ring (bandwidth-optimal), the reduce-scatter half of allreduce_ring.cc: steps
// k = 0 .. size-2, rank r sends slice (r - k - 1) to `next` and receives slice (r - k - 2)
// from `prev`, reducing it with its own input slice. Intermediate results go to a `partial`
// scratch buffer (slot 1) from which the next step sends them; the last step reduces straight
// into out. Chunked and pipelined like the all-reduce: chunk c of step k is sent on as chunk
// c of step k + 1 as soon as it is reduced, with kWindow receives posted ahead.
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
constexpr size_t kWindow = 4;
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

  const size_t windowBytes = perChunk * esize;
  auto* window = static_cast<uint8_t*>(op.context().scratch(windowBytes * kWindow, 0));
  auto* partial = static_cast<uint8_t*>(op.context().scratch(count * esize * size, 1));
  const size_t steps = static_cast<size_t>(size - 1);
  const size_t total = steps * chunks;
  std::vector<RequestPtr> sends;
  std::vector<RequestPtr> recvs(kWindow);
  auto post = [&](size_t i) {
    recvs[i % kWindow] = op.recv(prev, window + (i % kWindow) * windowBytes,
                                 chunkCount(i % chunks) * esize, static_cast<uint32_t>(i / chunks));
  };
  for (size_t i = 0; i < std::min<size_t>(kWindow, total); ++i) post(i);
  // Step 0 sends are paced like the receives (see allreduce_ring.cc).
  auto postFirstSend = [&](size_t c) {
    const size_t offset = (segment(rank - 1) * count + c * perChunk) * esize;
    sends.push_back(op.send(next, at(in, offset), chunkCount(c) * esize, 0));
  };
  for (size_t c = 0; c < std::min<size_t>(kWindow, chunks); ++c) postFirstSend(c);
  for (size_t i = 0; i < total; ++i) {
    const size_t k = i / chunks, c = i % chunks;
    const int s = segment(rank - static_cast<int>(k) - 2);
    const size_t n = chunkCount(c);
    const size_t offset = (s * count + c * perChunk) * esize;
    op.wait(recvs[i % kWindow]);
    const bool last = k + 1 == steps;
    uint8_t* dst = last ? at(out, c * perChunk * esize) : partial + offset;
    reduce(dst, at(in, offset), window + (i % kWindow) * windowBytes, n);
    if (i + kWindow < total) post(i + kWindow);
    if (i + kWindow < chunks) postFirstSend(i + kWindow);
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
