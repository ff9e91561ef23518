// The algorithm implementations behind collectives.h; collectives.cc validates arguments,
// picks one (select.cc) and calls it. Every function runs on the calling rank, talks only
// through `op`, and may assume validated arguments, count > 0 and size > 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "algorithms/op.h"
#include "loom/comm/reduce.h"
#include "loom/comm/types.h"

namespace loom::comm {

// Contiguous segment s of `count` elements split over `parts` parts, the first count % parts
// parts one element longer.
inline size_t segmentBegin(size_t count, int parts, int s) {
  const size_t base = count / parts, extra = count % parts;
  return base * s + std::min<size_t>(s, extra);
}
inline size_t segmentCount(size_t count, int parts, int s) {
  return count / parts + (static_cast<size_t>(s) < count % parts ? 1 : 0);
}

inline uint8_t* at(void* p, size_t byteOffset) {
  return static_cast<uint8_t*>(p) + byteOffset;
}
inline const uint8_t* at(const void* p, size_t byteOffset) {
  return static_cast<const uint8_t*>(p) + byteOffset;
}

// The fold of recursive doubling and halving-doubling onto p2 = the largest power of two <= size
// ranks, rem = size - p2: the 2*rem lowest ranks pair up; even rank 2i sends its input to 2i + 1
// and waits there for the final result (foldIn returns -1: `out` holds it), odd rank 2i + 1
// reduces it into out (the lower rank's value first) and goes on as virtual rank i; the other
// ranks go on as rank - rem, their values still in `in`. foldOut sends the result back to the
// ranks that sat out (tag step 63). Tag step 0 is the fold's.
int foldIn(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceFn reduce, int rem);
void foldOut(Op& op, const void* out, size_t bytes, int rem);
// The rank behind virtual rank v of the fold.
inline int unfoldedRank(int vrank, int rem) {
  return vrank < rem ? vrank * 2 + 1 : vrank + rem;
}

void allreduceRing(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop);
void allreduceRecursiveDoubling(Op& op, const void* in, void* out, size_t count, DType dtype,
                                ReduceOp rop);
void allreduceHalvingDoubling(Op& op, const void* in, void* out, size_t count, DType dtype,
                              ReduceOp rop);
void allreduceDirect(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop);

void reduceScatterRing(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop);
void reduceScatterDirect(Op& op, const void* in, void* out, size_t count, DType dtype,
                         ReduceOp rop);

void allgatherRing(Op& op, const void* in, void* out, size_t count, DType dtype);
void allgatherDirect(Op& op, const void* in, void* out, size_t count, DType dtype);

void broadcastChain(Op& op, void* buf, size_t count, DType dtype, int root);
void broadcastTree(Op& op, void* buf, size_t count, DType dtype, int root);
void broadcastDirect(Op& op, void* buf, size_t count, DType dtype, int root);

void reduceTree(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop,
                int root);
void reduceDirect(Op& op, const void* in, void* out, size_t count, DType dtype, ReduceOp rop,
                  int root);

void gatherDirect(Op& op, const void* in, void* out, size_t count, DType dtype, int root);
void scatterDirect(Op& op, const void* in, void* out, size_t count, DType dtype, int root);
void alltoallDirect(Op& op, const void* in, void* out, size_t count, DType dtype);
void barrierDissemination(Op& op);
// An even collective of 0 elements (barrier.cc): one empty message to and from every other rank,
// each carrying the collective's signature, so that a rank that passed another count finds the
// mismatch at once, whichever messages its algorithm sends and receives (tag_matcher.h compares
// the signatures of any two messages of one collective).
void zeroCountExchange(Op& op);

// The direct reductions' last step: out = the `size` inputs reduced in rank order (so every
// rank computes the same bits), this rank's at `mine`, peer p's at slices + p * (its bytes)
// once recvs[p] completed (recvs[rank] is empty); then divided for avg. size >= 2.
void reduceInRankOrder(Op& op, void* out, const void* mine, const uint8_t* slices,
                       std::vector<RequestPtr>& recvs, size_t count, DType dtype, ReduceOp rop);

// The uneven collectives (uneven.cc); counts per rank as in collectives.h. They also take
// world size 1 and blocks of 0 elements.
// offsets[j] = sum of counts[0 .. j-1]; offsets[size] is the total.
std::vector<size_t> blockOffsets(std::span<const size_t> counts);
void alltoallvDirect(Op& op, const void* in, std::span<const size_t> inCounts, void* out,
                     std::span<const size_t> outCounts, DType dtype);
void allgathervDirect(Op& op, const void* in, void* out, std::span<const size_t> counts,
                      DType dtype);
void gathervDirect(Op& op, const void* in, void* out, std::span<const size_t> counts, DType dtype,
                   int root);
void reduceScattervDirect(Op& op, const void* in, void* out, std::span<const size_t> counts,
                          DType dtype, ReduceOp rop);

}  // namespace loom::comm
