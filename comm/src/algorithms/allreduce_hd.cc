// Halving-doubling all-reduce (Rabenseifner): a reduce-scatter by recursive halving followed
// by an all-gather by recursive doubling. Each rank sends and receives 2 (p2 - 1) / p2 of the
// buffer, as in the ring, but in 2 log2(p2) pairwise exchanges instead of 2 (size - 1)
// neighbour steps: fewer points where a rank waits for another to be scheduled, which is what
// the ring loses when ranks share cores (4 ranks on 2 cores: bench/kernels/README.md).
//
// How it works
// - p2 is the largest power of two <= size and rem = size - p2. The 2*rem lowest ranks fold
//   in pairs first (as in recursive doubling): even rank 2i sends its input to 2i + 1 and sits
//   out; odd rank 2i + 1 reduces it into out. The p2 remaining ranks get virtual ranks
//   0 .. p2-1; the buffer is cut into p2 blocks (segmentBegin/segmentCount).
// - Reduce-scatter, distance d = p2/2, p2/4, .. 1: a rank holds blocks [lo, hi) and partner
//   vrank ^ d the same range. The rank whose bit d is clear keeps the lower half and sends the
//   upper; its partner the opposite. Each reduces the received half into out (out = src (op)
//   received, src being `in` before the first write and out after). After the last step
//   vrank v holds block v fully reduced (avg divides it once, here).
// - All-gather, d = 1, 2, .. p2/2: partners exchange the ranges they hold, straight into out,
//   doubling them, until every rank holds all blocks. The odd ranks of the fold send the
//   result to the even ranks that sat out.
// - Pipelining: each exchange is cut into op.chunkBytes() messages, all posted at once, and a
//   received chunk is reduced while later ones arrive. A step's sends finish before the next
//   step begins (nothing it sends is written afterwards anyway: a rank only writes the range
//   it keeps, and in the all-gather only ranges its partner sent).
// - Every block is reduced by one rank and then copied, so all ranks end with the same bits.
// Tags: step 0 for the fold, 1 .. L for the halving steps, L + 1 .. 2L for the doubling steps,
// 63 for the final send-back; chunks of one step share the tag (in-order matching).
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"

namespace loom::comm {

void allreduceHalvingDoubling(Op& op, const void* in, void* out, size_t count, DType dtype,
                              ReduceOp rop) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t esize = dtypeSize(dtype);
  const size_t bytes = count * esize;
  const ReduceFn reduce = reduceFunction(dtype, rop);
  int p2 = 1;
  while (p2 * 2 <= size) p2 *= 2;
  const int rem = size - p2;
  auto realRank = [&](int v) { return unfoldedRank(v, rem); };
  const size_t chunkElems = std::max<size_t>(1, op.chunkBytes() / esize);

  const int vrank = foldIn(op, in, out, count, dtype, reduce, rem);
  if (vrank < 0) return;
  // Where this rank's current values are read from: out once the fold or a step wrote them.
  const void* src = rank < 2 * rem ? out : in;

  // The first element of block b (block p2: count).
  auto elemBegin = [&](int block) { return segmentBegin(count, p2, block); };
  std::vector<RequestPtr> recvs, sends;
  // Sends elements [b, e) of `from` to `peer` in chunks, tagged `step`.
  auto sendRange = [&](int peer, const void* from, size_t b, size_t e, uint32_t step) {
    for (size_t c = b; c < e; c += chunkElems) {
      const size_t n = std::min(chunkElems, e - c);
      sends.push_back(op.send(peer, at(from, c * esize), n * esize, step));
    }
  };

  // Reduce-scatter by recursive halving; received halves land in scratch (at most half of
  // the buffer), chunk by chunk, and are reduced into out as they arrive.
  int lo = 0, hi = p2;
  uint32_t step = 1;
  uint8_t* window = nullptr;
  if (p2 > 1) {
    const size_t half = segmentBegin(count, p2, p2 / 2);  // the largest half (lower blocks)
    window = static_cast<uint8_t*>(op.context().scratch(std::max<size_t>(half, 1) * esize, 1));
  }
  for (int d = p2 / 2; d >= 1; d /= 2, ++step) {
    const int partner = realRank(vrank ^ d);
    const int mid = lo + (hi - lo) / 2;
    const bool lower = (vrank & d) == 0;
    const int keepLo = lower ? lo : mid, keepHi = lower ? mid : hi;
    const int sendLo = lower ? mid : lo, sendHi = lower ? hi : mid;
    const size_t kb = elemBegin(keepLo), ke = elemBegin(keepHi);
    recvs.clear();
    for (size_t c = kb; c < ke; c += chunkElems) {
      const size_t n = std::min(chunkElems, ke - c);
      recvs.push_back(op.recv(partner, window + (c - kb) * esize, n * esize, step));
    }
    sendRange(partner, src, elemBegin(sendLo), elemBegin(sendHi), step);
    size_t i = 0;
    for (size_t c = kb; c < ke; c += chunkElems, ++i) {
      const size_t n = std::min(chunkElems, ke - c);
      op.wait(recvs[i]);
      // The lower virtual rank's values first, as in recursive doubling.
      const uint8_t* got = window + (c - kb) * esize;
      if (lower) {
        reduce(at(out, c * esize), at(src, c * esize), got, n);
      } else {
        reduce(at(out, c * esize), got, at(src, c * esize), n);
      }
    }
    op.waitAll(sends);
    sends.clear();
    src = out;
    lo = keepLo;
    hi = keepHi;
  }
  if (rop == ReduceOp::kAvg) {
    const size_t b = elemBegin(lo);
    divideBy(at(out, b * esize), elemBegin(hi) - b, dtype, size);
  }

  // All-gather by recursive doubling, straight into out.
  for (int d = 1; d < p2; d *= 2, ++step) {
    const int partner = realRank(vrank ^ d);
    const bool lower = (vrank & d) == 0;
    const int width = hi - lo;
    const int theirLo = lower ? hi : lo - width, theirHi = lower ? hi + width : lo;
    const size_t tb = elemBegin(theirLo), te = elemBegin(theirHi);
    recvs.clear();
    for (size_t c = tb; c < te; c += chunkElems) {
      const size_t n = std::min(chunkElems, te - c);
      recvs.push_back(op.recv(partner, at(out, c * esize), n * esize, step));
    }
    sendRange(partner, out, elemBegin(lo), elemBegin(hi), step);
    op.waitAll(recvs);
    op.waitAll(sends);
    sends.clear();
    lo = std::min(lo, theirLo);
    hi = std::max(hi, theirHi);
  }
  foldOut(op, out, bytes, rem);
}

}  // namespace loom::comm
