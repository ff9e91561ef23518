// Collectives designed for shared memory, run when every rank of a Context is on this host
// (collectives.cc picks them; arena.h explains the segment, its steps and its waits).
//
// How they work: a large buffer is cut into chunks that fit a staging slot (256 KiB by
// default, so the working set stays in cache); each chunk is one arena step.
// - allreduce: every rank copies its chunk into its slot and posts; rank r then reduces
//   sub-slice r of the chunk from every rank's slot into its own slot (reading its peers'
//   memory directly, no messages; in rank order x_0 op x_1 op ..., reads rotated: fold.h),
//   marks it reduced, and every rank copies the N reduced sub-slices out. Memory traffic per rank
//   and byte: one copy in, one pass of reduction over 1/N, one copy out. Chunks up to kSmallBytes
//   skip the split: every rank reduces the whole chunk from all slots straight into its output (one
//   synchronisation instead of two).
// - reduce: the allreduce split, but only the root copies the reduced sub-slices out.
// - reduceScatter: every rank stages the chunk of all N slices (its own too); rank r folds
//   piece r of every slot (fold.h) straight into its output.
// - broadcast / scatter: the root stages, the others copy out. allgather / gather /
//   alltoall: every rank stages its part, every (or the root) rank copies what it needs.
// - barrier: a step without data (post, wait for every post).
// Large allreduce, reduceScatter, broadcast and allgather take the single-copy path instead
// when the arena's probe allowed it (shm_single_copy.h).
// All functions assume validated arguments and size > 1 (as algorithms.h). Count 0 moves nothing
// but still meets the other ranks in one step, so that a rank that passed another count finds
// the mismatch in the signatures at once (the generic engine's zeroCountExchange, over the
// arena).
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"

namespace loom::comm::shm {

class Arena;

// Chunks at or below this many bytes per rank are reduced whole by every rank.
constexpr size_t kSmallBytes = 16 << 10;
// Collectives moving fewer bytes per rank than kWholeSlotBytes step in chunks of at most
// kCacheChunkBytes; larger ones use the whole slot (ArenaOptions::slotBytes) per step.
constexpr size_t kCacheChunkBytes = 256 << 10;
constexpr size_t kWholeSlotBytes = 8 << 20;

void allreduce(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
               DType dtype, ReduceOp op);
void reduce(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
            DType dtype, ReduceOp op, int root);
void reduceScatter(Arena& arena, const CollectiveOptions& opts, const void* in, void* out,
                   size_t count, DType dtype, ReduceOp op);
void broadcast(Arena& arena, const CollectiveOptions& opts, void* buf, size_t count, DType dtype,
               int root);
void allgather(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
               DType dtype);
void gather(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
            DType dtype, int root);
void scatter(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
             DType dtype, int root);
void alltoall(Arena& arena, const CollectiveOptions& opts, const void* in, void* out, size_t count,
              DType dtype);
void barrier(Arena& arena, const CollectiveOptions& opts);

// The n-ary reductions (shm_rows.cc), for a reduction that needs every rank's operand of an
// element at once and does not depend on their order (the reproducible mode's exact sums).
// `reduce(rows, n, out)` gets the operands of n elements, rows[q] rank q's, and writes their
// reduction to `out`, which overlaps none of them; it is called once per chunk and rank with
// the rank's sub-slice (reduceScatterRows: its slice). The data moves as in allreduce's, reduce's
// and reduceScatter's staged paths (one copy in, the reduction's reads, one copy out); `op`
// only goes into the signature, with the exact flag (signature.h), so that ranks running the
// ordinary collective against these fail at the first step. No single-copy path, no helpers.
using RowsReducer = std::function<void(std::span<const void* const> rows, size_t n, void* out)>;
void allreduceRows(Arena& arena, const CollectiveOptions& opts, const void* in, void* out,
                   size_t count, DType dtype, ReduceOp op, const RowsReducer& reduce);
void reduceRows(Arena& arena, const CollectiveOptions& opts, const void* in, void* out,
                size_t count, DType dtype, ReduceOp op, int root, const RowsReducer& reduce);
// `count` elements per rank, as reduceScatter.
void reduceScatterRows(Arena& arena, const CollectiveOptions& opts, const void* in, void* out,
                       size_t count, DType dtype, ReduceOp op, const RowsReducer& reduce);

}  // namespace loom::comm::shm
