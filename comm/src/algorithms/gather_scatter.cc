// Gather, scatter and all-to-all: direct exchanges. Every receive is posted before any send
// so that data lands in place; the root's own block is a local copy (skipped in place).
// Gather in place: root's in == out + root * count. Scatter in place: root's
// out == in + root * count. All-to-all in place (in == out): the input is copied to scratch
// first, since blocks are overwritten while others are still being sent.
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

void gatherDirect(Op& op, const void* in, void* out, size_t count, DType dtype, int root) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t bytes = count * dtypeSize(dtype);
  std::vector<RequestPtr> reqs;
  if (rank != root) {
    reqs.push_back(op.send(root, in, bytes, 0));
  } else {
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) reqs.push_back(op.recv(peer, at(out, peer * bytes), bytes, 0));
    }
    void* mine = at(out, rank * bytes);
    if (mine != in) std::memmove(mine, in, bytes);
  }
  op.waitAll(reqs);
}

void scatterDirect(Op& op, const void* in, void* out, size_t count, DType dtype, int root) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t bytes = count * dtypeSize(dtype);
  std::vector<RequestPtr> reqs;
  if (rank != root) {
    reqs.push_back(op.recv(root, out, bytes, 0));
  } else {
    for (int i = 1; i < size; ++i) {
      const int peer = (rank + i) % size;
      reqs.push_back(op.send(peer, at(in, peer * bytes), bytes, 0));
    }
    const void* mine = at(in, rank * bytes);
    if (mine != out) std::memmove(out, mine, bytes);
  }
  op.waitAll(reqs);
}

void alltoallDirect(Op& op, const void* in, void* out, size_t count, DType dtype) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t bytes = count * dtypeSize(dtype);
  if (in == out) {
    void* copy = op.context().scratch(bytes * size, 0);
    std::memcpy(copy, in, bytes * size);
    in = copy;
  }
  std::vector<RequestPtr> reqs;
  for (int i = 1; i < size; ++i) {
    const int peer = (rank - i + size) % size;
    reqs.push_back(op.recv(peer, at(out, peer * bytes), bytes, 0));
  }
  for (int i = 1; i < size; ++i) {
    const int peer = (rank + i) % size;
    reqs.push_back(op.send(peer, at(in, peer * bytes), bytes, 0));
  }
  std::memcpy(at(out, rank * bytes), at(in, rank * bytes), bytes);
  op.waitAll(reqs);
}

}  // namespace loom::comm
