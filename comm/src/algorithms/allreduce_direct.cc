// Direct all-reduce: every rank sends its whole input to every other rank and reduces the
// `size` inputs itself, in rank order (so every rank computes the same bits). One round of
// latency, (size - 1) times the bandwidth of a ring: for small worlds and small messages.
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

void allreduceDirect(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t bytes = count * dtypeSize(dtype);
  auto* inputs = static_cast<uint8_t*>(op.context().scratch(bytes * size, 0));
  // In place, the input is copied aside first: out is overwritten from the first reduce.
  const void* mine = in;
  if (out == in) {
    std::memcpy(inputs + rank * bytes, in, bytes);
    mine = inputs + rank * bytes;
  }
  std::vector<RequestPtr> recvs(size), sends;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) recvs[peer] = op.recv(peer, inputs + peer * bytes, bytes, 0);
  }
  for (int i = 1; i < size; ++i) sends.push_back(op.send((rank + i) % size, mine, bytes, 0));
  reduceInRankOrder(op, out, mine, inputs, recvs, count, dtype, rop);
  op.waitAll(sends);
}

}  // namespace loom::comm
