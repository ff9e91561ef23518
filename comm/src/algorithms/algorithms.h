// The algorithm implementations behind collectives.h; collectives.cc validates arguments,
// picks one (select.cc) and calls it. Every function runs on the calling rank, talks only
// through `op`, and may assume validated arguments, count > 0 and size > 1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/op.h"
#include "loom/comm/reduce.h"
#include "loom/comm/types.h"

namespace loom::comm {

// Pipelining granularity of the ring and chain algorithms (LOOM_CHUNK_BYTES overrides).
size_t chunkBytes();

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

}  // namespace loom::comm
