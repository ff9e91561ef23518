// The steps the shared-memory collectives are made of (shm_collectives.cc, shm_rows.cc): how a
// collective starts on the arena, meets for a count of 0, sizes its chunks and stages its input.
// Internal to comm/src/shm.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/comm/collectives.h"
#include "loom/comm/types.h"
#include "shm/arena.h"

namespace loom::comm::shm {

// Starts a collective of `kind` on the arena: fails at once when the group already failed. Its
// signature (signature.h) is what must agree between ranks: kind, count, dtype, op (-1: none),
// root (-1: none), and whether the reduction is exact (the reproducible mode's n-ary forms,
// shm_rows.cc), so that a rank running the ordinary collective against them fails at its first
// step with both signatures instead of mixing two reductions.
Arena::Call makeCall(Arena& arena, OpType kind, const CollectiveOptions& opts, size_t count,
                     DType dtype, int op = -1, int root = -1, bool exact = false);

// Who posts and who waits in a collective's first step (see zeroCountStep).
enum class Meet : uint8_t {
  kAll,         // every rank posts and waits for every post
  kRootPosts,   // the root posts, the others wait for it (broadcast, scatter)
  kOthersPost,  // the others post, the root waits for them (gather)
};

// A collective of 0 elements moves nothing, but its ranks still meet in one step, posted and
// waited on as the collective's first step is, so that a rank that passed another count (or
// called another collective) finds the mismatch in the posted signature at once, on whichever
// side waits, instead of one rank returning while the others wait out their deadline. A rooted
// meet announces and checks the calls (Arena::announceCall) as the rooted collectives do.
void zeroCountStep(Arena& arena, const Arena::Call& call, Meet meet, int root = 0);

// Elements per chunk when a slot holds `pieces` pieces of the chunk. Collectives that move
// less than kWholeSlotBytes per rank use chunks of at most kCacheChunkBytes, so that a few
// chunks pipeline and the staging stays in L2; larger ones fill the whole slot, which cuts the
// number of steps (each a hand-over between ranks, and a context switch on a loaded machine).
size_t chunkElements(const Arena& arena, size_t elementSize, int pieces, size_t totalBytes);

// Stages chunk `c` elements of `in` (at element `offset`) into this rank's slot for the split
// reduction, except the sub-slice this rank reduces itself: it reads that part straight from
// its input, which saves 1/N of the copy in.
void stageChunk(Arena& arena, const void* in, size_t offset, size_t c, size_t es);

// Stages elements [offset, offset + c) of each of the `size` slices of `in` (slice j starts
// at element j * count) back to back into `slot`; slice `skip` is left out (-1: none).
void stageSlices(uint8_t* slot, const void* in, size_t count, size_t offset, size_t c, size_t es,
                 int size, int skip = -1);

// After the split reduction of chunk `c` at element `offset`: waits for every rank's reduced
// sub-slice (this rank's first, it is ready) and copies it into `out` (non-temporal stores
// with `stream`: then fenceStreams() after the last chunk).
void copyOutReduced(Arena& arena, const Arena::Call& call, void* out, size_t offset, size_t c,
                    size_t es, bool stream);

}  // namespace loom::comm::shm
