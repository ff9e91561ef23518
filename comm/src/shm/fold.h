// The element-wise fold of the shared-memory reductions, shared by the staged path
// (shm_collectives.cc), the window path and the cross-memory path (shm_single_copy.cc).
//
// One summation order: every element's result is ((x_0 op x_1) op x_2) ... op x_{n-1}, the
// operands in rank order, whichever path and whichever rank computes it (AVG then divides that
// sum once). So the staged, window and cross-memory paths give the same bits, for every
// segment: before, the staged and cross-memory paths started with the owner's own operand
// ((x_r op x_0) op x_1 ...), which differs from rank order for owners r >= 2.
//
// Rotated reads in that order. A fold reads its operands one after the other; if every rank
// read x_0 first, then x_1, ..., all n-1 reducers would pull from one core's cache (or one
// rank's pages) at a time. Here the range is cut into blocks and each block's fold into n-1
// stages (stage 1: acc = x_0 op x_1; stage s >= 2: acc = acc op x_s), and the stages run as a
// wavefront (skewed): in round j the rank runs stage s of block j - (s - 1), for every s, so
// the n-1 blocks in flight are each at another stage, and it runs a round's stages starting at
// stage 1 + (rotation mod (n-1)). A block's stages still run in order 1, 2, ..., n-1 (each in
// a later round than the one before), so the order of the operations per element is exactly
// the fold above; only which peer is being read at a given moment rotates: with rotation = the
// rank, each rank's first read of every round is a different peer ((r + 1) mod n), and over a
// round every peer is read once. The accumulators of the n-1 blocks in flight stay in L1/L2
// (foldBlockElements).
//
// The schedule is a pure function (forEachFoldStep), so tests check the order and the
// rotation without running ranks (tests/shm/shm_plan_test.cc).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "loom/comm/reduce.h"

namespace loom::comm::shm {

// Bytes of accumulators in flight that the skewed fold allows (n-1 blocks): within L2.
inline constexpr size_t kFoldInFlightBytes = 128 << 10;
// The smallest block. Each stage of a block is one call of the reduction kernel, whose fixed
// cost (an indirect call, alias checks, loop prologue) is comparable to 2 KiB of work in cache:
// measured single-threaded with every operand in cache (2-vCPU VM, float sum), the skewed fold
// at 8-16 operands cost 10-40% more than the rank-order passes over the whole range with 2 KiB
// blocks and 5-20% with 4-8 KiB (docs/shm.md).
inline constexpr size_t kFoldMinBlockBytes = 4 << 10;
// The largest block: a finished block that is copied on (the window all-reduce writes it into
// every peer's output) is re-read from L1, as the window path's 32 KiB chunks were before.
inline constexpr size_t kFoldMaxBlockBytes = 32 << 10;

// Elements per block of a skewed fold of `count` elements of `elementSize` bytes over `size`
// operands: at least kFoldMinBlockBytes; at most kFoldMaxBlockBytes and what keeps the size-1
// blocks in flight within kFoldInFlightBytes, and small enough that the range has at least size-1
// blocks (so that the wavefront reaches its steady state, where every stage runs in every round)
// when the minimum allows; and such that the blocks in flight fit in `scratchBytes` (the bounce
// buffer, when the accumulators live there; 0: no limit).
inline size_t foldBlockElements(int size, size_t elementSize, size_t count,
                                size_t scratchBytes = 0) {
  const size_t stages = static_cast<size_t>(std::max(1, size - 1));
  size_t bytes = std::min(kFoldMaxBlockBytes,
                          std::bit_floor(std::max<size_t>(kFoldInFlightBytes / stages, 1)));
  const size_t perStage = std::bit_floor(std::max<size_t>(count * elementSize / stages, 1));
  bytes = std::max(kFoldMinBlockBytes, std::min(bytes, perStage));
  if (scratchBytes != 0 && bytes * stages > scratchBytes) bytes = scratchBytes / stages;
  return std::max<size_t>(1, bytes / elementSize);
}

// Calls visit(block, stage) for every block < `blocks` and stage 1..size-1, in the order a
// rank with `rotation` runs them: skewed and rotated as described above, or, with `skew`
// false, block after block with the stages in order (the cross-memory path, whose reads are
// kernel copies into a bounce buffer that is too small for n-1 blocks in flight).
template <class Visit>
void forEachFoldStep(int size, int rotation, size_t blocks, bool skew, Visit&& visit) {
  const int stages = size - 1;
  if (stages < 1 || blocks == 0) return;
  if (!skew || stages == 1) {
    for (size_t b = 0; b < blocks; ++b) {
      for (int s = 1; s <= stages; ++s) visit(b, s);
    }
    return;
  }
  const int first = ((rotation % stages) + stages) % stages;
  const size_t rounds = blocks + static_cast<size_t>(stages) - 1;
  for (size_t j = 0; j < rounds; ++j) {
    for (int i = 0; i < stages; ++i) {
      const int s = (first + i) % stages + 1;
      const size_t lag = static_cast<size_t>(s) - 1;
      if (j < lag || j - lag >= blocks) continue;
      visit(j - lag, s);
    }
  }
}

// Folds `count` elements of `size` operands: for every element, x_0 op x_1 op ... op x_{size-1}
// in that order, a block of `blockElements` at a time (forEachFoldStep).
// - operand(q, begin, m): where elements [begin, begin + m) of operand q are (a pointer that
//   stays valid until the next operand call for another q, except that stage 1 asks for
//   q = 0 and q = 1 before it reduces: both must stay valid then).
// - acc(block): the accumulator of a block (may be the destination itself; it may equal an
//   operand's range exactly only where that operand is read before the accumulator is
//   written: x_0 or x_1, as ReduceFn allows).
// - finished(block, acc, begin, m): after a block's last stage.
// Needs size >= 2.
template <class Operand, class Acc, class Finished>
void fold(ReduceFn fn, int size, int rotation, size_t count, size_t blockElements, bool skew,
          Operand&& operand, Acc&& acc, Finished&& finished) {
  const size_t blocks = (count + blockElements - 1) / blockElements;
  forEachFoldStep(size, rotation, blocks, skew, [&](size_t b, int s) {
    const size_t begin = b * blockElements;
    const size_t m = std::min(blockElements, count - begin);
    void* a = acc(b);
    if (s == 1) {
      const void* x0 = operand(0, begin, m);
      const void* x1 = operand(1, begin, m);
      fn(a, x0, x1, m);
    } else {
      fn(a, a, operand(s, begin, m), m);
    }
    if (s == size - 1) finished(b, a, begin, m);
  });
}

}  // namespace loom::comm::shm
