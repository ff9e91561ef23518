// The collective algorithms, written once over the Transport interface (docs/architecture.md).
//
// Contract
// - Every function is blocking and runs on the caller's thread; the ProcessGroup layer runs
//   them on its own worker thread to make them asynchronous.
// - All ranks of the Context call the same collectives in the same order with matching
//   arguments (count, dtype, op, root). `opts.seq` is the collective's sequence number (the
//   caller increments it per collective, below 2^40); it travels in every message header so
//   that a mismatch (ranks running different collectives under one seq, or a rank that
//   skipped a collective the others ran: a message of another seq where one of this
//   collective is awaited) is detected and named at once. seq 0 turns that check off
//   (messages are still matched in order).
// - In-place when the output pointer equals the input pointer (or the documented slot of it:
//   all-gather and gather in == out + rank * count, reduce-scatter and scatter out == in +
//   rank * count; the v forms at the rank's offset). Buffers that overlap in any other way are
//   refused with InvalidArgumentError before any message (peers read some buffers in place).
// - Errors: InvalidArgumentError for bad arguments (root out of range, bitwise op on floats);
//   TimeoutError when `opts.timeout` passes, naming the operation, seq, the peer waited on and
//   the bytes outstanding; IoError when a peer dies (naming its rank). After an IoError the
//   Context is unusable.
// - `opts.algorithm` (or ContextOptions::algorithm, which LOOM_ALGO fills) forces an
//   algorithm; kAuto picks by size and world size using measured
//   crossovers (all-reduce: recursive doubling for small buffers, halving-doubling for mid
//   sizes on power-of-two worlds from 4 ranks, the ring otherwise; comm/src/algorithms/select.cc).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "loom/comm/types.h"

namespace loom::comm {

class Context;

enum class Algorithm : uint8_t {
  kAuto,
  kRing,               // bandwidth-optimal ring (reduce-scatter + all-gather)
  kRecursiveDoubling,  // latency-optimal for small messages
  kDirect,             // every rank exchanges with every rank (small worlds / all-to-all)
  kTree,               // binomial tree (broadcast / reduce)
  kChain,              // pipelined chain (broadcast)
  kHalvingDoubling,    // Rabenseifner: recursive-halving reduce-scatter + doubling all-gather
};
const char* algorithmName(Algorithm algorithm);
Algorithm parseAlgorithm(std::string_view name);  // "auto", "ring", "rd", "hd", "direct", ...

struct CollectiveOptions {
  // The call's deadline; zero (the default) takes the Context's (ContextOptions::timeout,
  // LOOM_TIMEOUT). A negative one is an InvalidArgumentError.
  std::chrono::milliseconds timeout{0};
  uint64_t seq = 0;
  Algorithm algorithm = Algorithm::kAuto;
  // Reproducible mode for this call (loom/comm/reproducible.h): SUM and AVG over floating dtypes
  // give the correctly rounded result whatever the algorithm; PROD over floats is refused.
  // ContextOptions::reproducible (LOOM_REPRODUCIBLE) turns it on for every call.
  bool reproducible = false;
};

// out[i] = reduce over ranks of in[i]; count elements on every rank.
void allreduce(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
               const CollectiveOptions& opts = {});
// buf on root is sent to every rank's buf.
void broadcast(Context& ctx, void* buf, size_t count, DType dtype, int root,
               const CollectiveOptions& opts = {});
// out on root = reduce of every rank's in; out is ignored on other ranks (may be null).
void reduce(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
            int root, const CollectiveOptions& opts = {});
// out (size * count) = concatenation of every rank's in (count), in rank order.
// In-place when in == out + rank * count.
void allgather(Context& ctx, const void* in, void* out, size_t count, DType dtype,
               const CollectiveOptions& opts = {});
// out (count) on rank r = reduction of slice r of every rank's in (size * count).
// In-place when out == in + rank * count.
void reduceScatter(Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                   const CollectiveOptions& opts = {});
// out (size * count) on root = every rank's in (count) in rank order; ignored elsewhere.
void gather(Context& ctx, const void* in, void* out, size_t count, DType dtype, int root,
            const CollectiveOptions& opts = {});
// out (count) on rank r = slice r of root's in (size * count).
void scatter(Context& ctx, const void* in, void* out, size_t count, DType dtype, int root,
             const CollectiveOptions& opts = {});
// out slice j (count) on rank r = slice r of rank j's in; both size * count.
void alltoall(Context& ctx, const void* in, void* out, size_t count, DType dtype,
              const CollectiveOptions& opts = {});

// Uneven counts (c10d's split sizes and list forms). Counts are in elements, one per rank
// (a span of exactly size() entries, InvalidArgumentError otherwise), blocks packed in rank
// order: block j starts at the sum of the counts before j. Every rank passes the same counts
// where the counts describe every rank (allgatherv, gatherv, reduceScatterv); for alltoallv
// inCounts[j] on rank r must equal outCounts[r] on rank j. A block of 0 elements sends no
// message. A count that differs from what the peer sends fails the receive with an IoError
// (as for the even collectives: the transport is aborted, the Context unusable) whose message
// names this rank, the operation and its seq, the peer and both sizes ("rank 1 sent 16 bytes
// for alltoallv#5 step 0 but rank 0 receives 8 bytes"); a receive of a block the peer thinks
// empty times out naming that peer.
//
// out block j (outCounts[j]) on rank r = block r (inCounts[r] on rank j) of rank j's in.
// In place when in == out (then sum(inCounts) == sum(outCounts) is required).
void alltoallv(Context& ctx, const void* in, std::span<const size_t> inCounts, void* out,
               std::span<const size_t> outCounts, DType dtype, const CollectiveOptions& opts = {});
// out (sum(counts)) = every rank's in (counts[rank]) in rank order.
// In place when in == out + the offset of block rank.
void allgatherv(Context& ctx, const void* in, void* out, std::span<const size_t> counts,
                DType dtype, const CollectiveOptions& opts = {});
// out (sum(counts)) on root = every rank's in (counts[rank]) in rank order; ignored elsewhere.
void gatherv(Context& ctx, const void* in, void* out, std::span<const size_t> counts, DType dtype,
             int root, const CollectiveOptions& opts = {});
// out (counts[rank]) on rank r = reduction of block r of every rank's in (sum(counts)).
// In place when out == in + the offset of block rank.
void reduceScatterv(Context& ctx, const void* in, void* out, std::span<const size_t> counts,
                    DType dtype, ReduceOp op, const CollectiveOptions& opts = {});

// Returns once every rank has entered.
void barrier(Context& ctx, const CollectiveOptions& opts = {});
// Point-to-point; `tag` distinguishes concurrent messages between the same pair. User tags go
// up to kMaxPointToPointTag; pointToPointTag(tag) is the transport tag send/recv put on the
// wire, for layers that post point-to-point messages on the Transport directly.
constexpr uint64_t kMaxPointToPointTag = (uint64_t{1} << 56) - 1;
uint64_t pointToPointTag(uint64_t tag);
void send(Context& ctx, const void* buf, size_t count, DType dtype, int peer, uint64_t tag,
          const CollectiveOptions& opts = {});
void recv(Context& ctx, void* buf, size_t count, DType dtype, int peer, uint64_t tag,
          const CollectiveOptions& opts = {});
// Receive from any source (c10d's recv_anysource): takes the first message with `tag` that
// any other rank sent and no receive took yet, and returns its sender. It polls the
// transport (Transport::probe, backing off to 1 ms naps), so a receive posted meanwhile for
// the same peer and tag may take that message first. A TimeoutError names the tag and the
// ranks it listened to.
int recvAny(Context& ctx, void* buf, size_t count, DType dtype, uint64_t tag,
            const CollectiveOptions& opts = {});

}  // namespace loom::comm
