// The collectives with uneven counts (alltoallv, allgatherv, gatherv, reduceScatterv): direct
// exchanges, one round, like their even counterparts in gather_scatter.cc and the direct
// reduce-scatter.
//
// How it works: `counts` holds one element count per rank and the blocks are packed in rank
// order, so block j starts at `offsets[j]` = the sum of the counts before j (blockOffsets).
// Every rank posts all its receives first (each lands in its own block of out, or of a
// `slices` scratch buffer for the reduce-scatter), then its sends, then copies its own block
// locally, then waits for everything. A block of 0 elements still travels, as an empty message:
// every message carries the collective's signature with the count of its own block and the
// digest of the counts (signature.h, sendBlock / recvBlock), so ranks whose split sizes differ
// anywhere fail at their first message with both signatures, instead of one rank skipping a
// block the other waits for until its deadline.
//
// In place: allgatherv's in is its own block of out (the copy is skipped); alltoallv's in ==
// out is copied to scratch first, since blocks are overwritten while others are still being
// sent; reduceScatterv's out inside in (block rank) has its own block saved to scratch before
// the first reduce overwrites it.
#include <cstring>
#include <numeric>
#include <vector>

#include "algorithms/algorithms.h"
#include "signature.h"

namespace loom::comm {

namespace {

// A message of `count` elements whose signature names that count (the block's, as this rank's
// counts give it: the sender's for what it sends, the receiver's for what it expects).
RequestPtr sendBlock(Op& op, int peer, const void* data, size_t count, size_t esize) {
  const SignatureScope block(withBlock(SignatureScope::current(), count));
  return op.send(peer, data, count * esize, 0);
}

RequestPtr recvBlock(Op& op, int peer, void* data, size_t count, size_t esize) {
  const SignatureScope block(withBlock(SignatureScope::current(), count));
  return op.recv(peer, data, count * esize, 0);
}

}  // namespace

std::vector<size_t> blockOffsets(std::span<const size_t> counts) {
  std::vector<size_t> offsets(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  return offsets;
}

void alltoallvDirect(Op& op, const void* in, std::span<const size_t> inCounts, void* out,
                     std::span<const size_t> outCounts, DType dtype) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t esize = dtypeSize(dtype);
  const std::vector<size_t> inOffsets = blockOffsets(inCounts);
  const std::vector<size_t> outOffsets = blockOffsets(outCounts);
  if (in == out && inOffsets[size] > 0) {
    void* copy = op.context().scratch(inOffsets[size] * esize, 0);
    std::memcpy(copy, in, inOffsets[size] * esize);
    in = copy;
  }
  std::vector<RequestPtr> reqs;
  for (int i = 1; i < size; ++i) {
    const int peer = (rank - i + size) % size;
    reqs.push_back(recvBlock(op, peer, at(out, outOffsets[peer] * esize), outCounts[peer], esize));
  }
  for (int i = 1; i < size; ++i) {
    const int peer = (rank + i) % size;
    reqs.push_back(sendBlock(op, peer, at(in, inOffsets[peer] * esize), inCounts[peer], esize));
  }
  if (inCounts[rank] > 0) {
    std::memcpy(at(out, outOffsets[rank] * esize), at(in, inOffsets[rank] * esize),
                inCounts[rank] * esize);
  }
  op.waitAll(reqs);
}

void allgathervDirect(Op& op, const void* in, void* out, std::span<const size_t> counts,
                      DType dtype) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t esize = dtypeSize(dtype);
  const std::vector<size_t> offsets = blockOffsets(counts);
  std::vector<RequestPtr> reqs;
  for (int i = 1; i < size; ++i) {
    const int peer = (rank - i + size) % size;
    reqs.push_back(recvBlock(op, peer, at(out, offsets[peer] * esize), counts[peer], esize));
  }
  for (int i = 1; i < size; ++i) {
    reqs.push_back(sendBlock(op, (rank + i) % size, in, counts[rank], esize));
  }
  void* mine = at(out, offsets[rank] * esize);
  if (counts[rank] > 0 && mine != in) std::memmove(mine, in, counts[rank] * esize);
  op.waitAll(reqs);
}

void gathervDirect(Op& op, const void* in, void* out, std::span<const size_t> counts, DType dtype,
                   int root) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t esize = dtypeSize(dtype);
  std::vector<RequestPtr> reqs;
  if (rank != root) {
    reqs.push_back(sendBlock(op, root, in, counts[rank], esize));
  } else {
    const std::vector<size_t> offsets = blockOffsets(counts);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      reqs.push_back(recvBlock(op, peer, at(out, offsets[peer] * esize), counts[peer], esize));
    }
    void* mine = at(out, offsets[rank] * esize);
    if (counts[rank] > 0 && mine != in) std::memmove(mine, in, counts[rank] * esize);
  }
  op.waitAll(reqs);
}

void reduceScattervDirect(Op& op, const void* in, void* out, std::span<const size_t> counts,
                          DType dtype, ReduceOp rop) {
  const int size = op.size();
  const int rank = op.rank();
  const size_t esize = dtypeSize(dtype);
  const std::vector<size_t> offsets = blockOffsets(counts);
  const size_t count = counts[rank];
  const size_t bytes = count * esize;
  std::vector<RequestPtr> sends;
  for (int i = 1; i < size; ++i) {
    const int peer = (rank + i) % size;
    sends.push_back(sendBlock(op, peer, at(in, offsets[peer] * esize), counts[peer], esize));
  }
  if (count == 0) {
    // Nothing to reduce, but every peer's (empty) block of ours still comes, with its signature.
    std::vector<RequestPtr> recvs;
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) recvs.push_back(recvBlock(op, peer, nullptr, 0, esize));
    }
    op.waitAll(recvs);
    op.waitAll(sends);
    return;
  }
  auto* slices = static_cast<uint8_t*>(op.context().scratch(bytes * size, 0));
  // In place (out == block rank of in) our own block is overwritten by the first reduce.
  const void* mine = at(in, offsets[rank] * esize);
  if (out == mine) {
    std::memcpy(slices + rank * bytes, mine, bytes);
    mine = slices + rank * bytes;
  }
  std::vector<RequestPtr> recvs(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) recvs[peer] = recvBlock(op, peer, slices + peer * bytes, count, esize);
  }
  if (size == 1) {
    if (out != mine) std::memcpy(out, mine, bytes);
  } else {
    reduceInRankOrder(op, out, mine, slices, recvs, count, dtype, rop);
  }
  op.waitAll(sends);
}

void reduceInRankOrder(Op& op, void* out, const void* mine, const uint8_t* slices,
                       std::vector<RequestPtr>& recvs, size_t count, DType dtype, ReduceOp rop) {
  const int size = op.size();
  const size_t bytes = count * dtypeSize(dtype);
  const ReduceFn reduce = reduceFunction(dtype, rop);
  auto value = [&](int peer) -> const void* {
    return peer == op.rank() ? mine : slices + peer * bytes;
  };
  if (recvs[0]) op.wait(recvs[0]);
  if (recvs[1]) op.wait(recvs[1]);
  reduce(out, value(0), value(1), count);
  for (int peer = 2; peer < size; ++peer) {
    if (recvs[peer]) op.wait(recvs[peer]);
    reduce(out, out, value(peer), count);
  }
  if (rop == ReduceOp::kAvg) divideBy(out, count, dtype, size);
}

}  // namespace loom::comm
