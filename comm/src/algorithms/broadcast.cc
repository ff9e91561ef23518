// Broadcast: root's buffer to every rank. Ranks are renumbered relative to the root,
// vrank = (rank - root) mod size, so every algorithm below is written for root 0.
//
// Chain (large messages): vrank v receives from v - 1 and forwards to v + 1, chunk by chunk,
// so all links carry data at once and the time is about bytes / bandwidth + (size - 2)
// chunk times. All receives are posted up front straight into buf.
//
// Tree (small messages): binomial tree. A rank receives once from its parent (vrank with the
// lowest set bit cleared), then sends to children vrank + mask for decreasing masks below
// that bit: ceil(log2(size)) rounds.
//
// Direct: the root sends to every rank (one round, root-bound bandwidth).
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

void broadcastChain(Op& op, void* buf, size_t count, DType dtype, int root) {
  const int size = op.size();
  const int vrank = (op.rank() - root + size) % size;
  const int prev = (op.rank() - 1 + size) % size;
  const int next = (op.rank() + 1) % size;
  const bool last = vrank == size - 1;
  const size_t esize = dtypeSize(dtype);
  const size_t chunkElems = std::max<size_t>(1, op.chunkBytes() / esize);
  const size_t chunks = (count + chunkElems - 1) / chunkElems;
  const size_t perChunk = (count + chunks - 1) / chunks;
  auto chunkCount = [&](size_t c) { return std::min(count, (c + 1) * perChunk) - c * perChunk; };
  std::vector<RequestPtr> recvs, sends;
  if (vrank > 0) {
    for (size_t c = 0; c < chunks; ++c) {
      recvs.push_back(op.recv(prev, at(buf, c * perChunk * esize), chunkCount(c) * esize, 0));
    }
  }
  for (size_t c = 0; c < chunks; ++c) {
    if (vrank > 0) op.wait(recvs[c]);
    if (!last)
      sends.push_back(op.send(next, at(buf, c * perChunk * esize), chunkCount(c) * esize, 0));
  }
  op.waitAll(sends);
}

void broadcastTree(Op& op, void* buf, size_t count, DType dtype, int root) {
  const int size = op.size();
  const int vrank = (op.rank() - root + size) % size;
  const size_t bytes = count * dtypeSize(dtype);
  auto real = [&](int v) { return (v + root) % size; };
  int mask = 1;
  while (mask < size) {
    if (vrank & mask) {
      auto r = op.recv(real(vrank - mask), buf, bytes, 0);
      op.wait(r);
      break;
    }
    mask <<= 1;
  }
  std::vector<RequestPtr> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vrank + mask < size) sends.push_back(op.send(real(vrank + mask), buf, bytes, 0));
  }
  op.waitAll(sends);
}

void broadcastDirect(Op& op, void* buf, size_t count, DType dtype, int root) {
  const int size = op.size();
  const size_t bytes = count * dtypeSize(dtype);
  std::vector<RequestPtr> reqs;
  if (op.rank() == root) {
    for (int i = 1; i < size; ++i) reqs.push_back(op.send((root + i) % size, buf, bytes, 0));
  } else {
    reqs.push_back(op.recv(root, buf, bytes, 0));
  }
  op.waitAll(reqs);
}

}  // namespace loom::comm
