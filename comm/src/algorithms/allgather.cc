// All-gather: out = concatenation of every rank's input, in rank order.
//
// Ring (bandwidth-optimal): steps k = 0 .. size-2, rank r sends block (r - k) to `next` and
// receives block (r - k - 1) from `prev` straight into out; the block received at step k is
// the one sent at step k + 1. Chunked: chunk c of a block is forwarded as soon as it arrived,
// so a block streams around the ring instead of hopping whole. All receives are posted up
// front (each lands in its own place). Step 0 sends straight from `in`, so the copy of the
// own block into out (skipped in place) overlaps the first transfer.
//
// Direct: every rank sends its input to every other rank (one round; small messages).
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

void allgatherRing(Op& op, const void* in, void* out, size_t count, DType dtype) {
  const int size = op.size();
  const int rank = op.rank();
  const int next = (rank + 1) % size;
  const int prev = (rank - 1 + size) % size;
  const size_t esize = dtypeSize(dtype);
  const size_t bytes = count * esize;
  const size_t chunkElems = std::max<size_t>(1, op.chunkBytes() / esize);
  const size_t chunks = (count + chunkElems - 1) / chunkElems;
  const size_t perChunk = (count + chunks - 1) / chunks;
  auto chunkCount = [&](size_t c) { return std::min(count, (c + 1) * perChunk) - c * perChunk; };
  auto block = [&](int b) { return ((b % size) + size) % size; };
  const size_t steps = static_cast<size_t>(size - 1);

  std::vector<RequestPtr> recvs(steps * chunks), sends;
  for (size_t k = 0; k < steps; ++k) {
    const int b = block(rank - static_cast<int>(k) - 1);
    for (size_t c = 0; c < chunks; ++c) {
      recvs[k * chunks + c] = op.recv(prev, at(out, b * bytes + c * perChunk * esize),
                                      chunkCount(c) * esize, static_cast<uint32_t>(k));
    }
  }
  for (size_t c = 0; c < chunks; ++c) {
    sends.push_back(op.send(next, at(in, c * perChunk * esize), chunkCount(c) * esize, 0));
  }
  void* mine = at(out, rank * bytes);
  if (mine != in) std::memcpy(mine, in, bytes);
  for (size_t k = 0; k + 1 < steps; ++k) {
    const int b = block(rank - static_cast<int>(k) - 1);
    for (size_t c = 0; c < chunks; ++c) {
      op.wait(recvs[k * chunks + c]);
      sends.push_back(op.send(next, at(out, b * bytes + c * perChunk * esize),
                              chunkCount(c) * esize, static_cast<uint32_t>(k + 1)));
    }
  }
  op.waitAll(recvs);
  op.waitAll(sends);
}

void allgatherDirect(Op& op, const void* in, void* out, size_t count, DType dtype) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t bytes = count * dtypeSize(dtype);
  std::vector<RequestPtr> reqs;
  for (int i = 1; i < size; ++i) {
    const int peer = (rank - i + size) % size;
    reqs.push_back(op.recv(peer, at(out, peer * bytes), bytes, 0));
  }
  for (int i = 1; i < size; ++i) reqs.push_back(op.send((rank + i) % size, in, bytes, 0));
  void* mine = at(out, rank * bytes);
  if (mine != in) std::memcpy(mine, in, bytes);
  op.waitAll(reqs);
}

}  // namespace loom::comm
