// Reduce: root's out = reduction of every rank's input. vrank = (rank - root) mod size.
//
// Tree: binomial tree, the mirror image of the broadcast tree. In round `mask` = 1, 2, ...,
// a vrank with that bit set sends its accumulator to vrank - mask and is done; the others
// receive from vrank + mask (if it exists) and reduce it into their accumulator, with their
// own (lower vrank) value as the left operand. The accumulator is out on the root and a
// scratch buffer elsewhere; the first reduce reads `in` directly, so no copy is made.
//
// Direct: every rank sends its input to the root, which reduces them in rank order.
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

void reduceTree(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop,
                int root) {
  const int size = op.size();
  const int vrank = (op.rank() - root + size) % size;
  const size_t bytes = count * dtypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, rop);
  auto real = [&](int v) { return (v + root) % size; };
  void* acc = vrank == 0 ? out : op.context().scratch(bytes, 1);
  void* tmp = op.context().scratch(bytes, 0);
  const void* current = in;  // the accumulated value so far
  for (int mask = 1; mask < size; mask <<= 1) {
    if (vrank & mask) {
      auto s = op.send(real(vrank - mask), current, bytes, 0);
      op.wait(s);
      return;
    }
    if (vrank + mask < size) {
      auto r = op.recv(real(vrank + mask), tmp, bytes, 0);
      op.wait(r);
      reduce(acc, current, tmp, count);
      current = acc;
    }
  }
  // Only the root gets here.
  if (current != out) std::memcpy(out, current, bytes);
  if (rop == ReduceOp::kAvg) divideBy(out, count, dtype, size);
}

void reduceDirect(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop,
                  int root) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t bytes = count * dtypeSize(dtype);
  if (rank != root) {
    auto s = op.send(root, in, bytes, 0);
    op.wait(s);
    return;
  }
  auto* inputs = static_cast<uint8_t*>(op.context().scratch(bytes * size, 0));
  const void* mine = in;
  if (out == in) {
    std::memcpy(inputs + rank * bytes, in, bytes);
    mine = inputs + rank * bytes;
  }
  std::vector<RequestPtr> recvs(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) recvs[peer] = op.recv(peer, inputs + peer * bytes, bytes, 0);
  }
  reduceInRankOrder(op, out, mine, inputs, recvs, count, dtype, rop);
}

}  // namespace loom::comm
