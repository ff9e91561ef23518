// Recursive-doubling all-reduce: the latency-optimal algorithm for small messages
// (log2(size) rounds of one whole-buffer exchange).
//
// How it works
// - p2 is the largest power of two <= size and rem = size - p2. First the 2*rem lowest ranks
//   fold in pairs: even rank 2i sends its input to 2i + 1 and sits out; odd rank 2i + 1
//   reduces it into out. The p2 remaining ranks get virtual ranks 0 .. p2-1.
// - Round with `mask` = 1, 2, 4, ...: each virtual rank exchanges out with virtual rank
//   (vrank ^ mask) and reduces the received buffer into out. Both partners compute
//   reduce(lower rank's value, higher rank's value), so every rank ends with the same bits.
// - avg divides once at the end; then the odd ranks send the result back to the even ranks
//   that sat out.
// Tags: step 0 for the fold, 1 + round for the rounds, 63 for the final send-back.
#include <cstring>

#include "algorithms/algorithms.h"

namespace loom::comm {

void allreduceRecursiveDoubling(Op& op, const void* in, void* out, size_t count, DType dtype,
                                ReduceOp rop) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t bytes = count * dtypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, rop);
  int p2 = 1;
  while (p2 * 2 <= size) p2 *= 2;
  const int rem = size - p2;
  void* tmp = op.context().scratch(bytes, 0);
  const int vrank = foldIn(op, in, out, count, dtype, reduce, rem);
  if (vrank < 0) return;
  if (rank >= 2 * rem && out != in) std::memcpy(out, in, bytes);
  auto realRank = [&](int v) { return unfoldedRank(v, rem); };
  uint32_t round = 1;
  for (int mask = 1; mask < p2; mask <<= 1, ++round) {
    const int partner = realRank(vrank ^ mask);
    auto s = op.send(partner, out, bytes, round);
    auto r = op.recv(partner, tmp, bytes, round);
    op.wait(r);
    op.wait(s);
    if (partner < rank) {
      reduce(out, tmp, out, count);
    } else {
      reduce(out, out, tmp, count);
    }
  }
  if (rop == ReduceOp::kAvg) divideBy(out, count, dtype, size);
  foldOut(op, out, bytes, rem);
}

int foldIn(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceFn reduce, int rem) {
  const int rank = op.rank();
  const size_t bytes = count * dtypeSize(dtype);
  if (rank >= 2 * rem) return rank - rem;
  if (rank % 2 == 0) {
    auto s = op.send(rank + 1, in, bytes, 0);
    auto r = op.recv(rank + 1, out, bytes, 63);
    op.wait(s);
    op.wait(r);
    return -1;
  }
  void* tmp = op.context().scratch(bytes, 0);
  auto r = op.recv(rank - 1, tmp, bytes, 0);
  op.wait(r);
  reduce(out, tmp, in, count);  // the lower rank's value first
  return rank / 2;
}

void foldOut(Op& op, const void* out, size_t bytes, int rem) {
  const int rank = op.rank();
  if (rank < 2 * rem && rank % 2 == 1) {
    auto s = op.send(rank - 1, out, bytes, 63);
    op.wait(s);
  }
}

}  // namespace loom::comm
