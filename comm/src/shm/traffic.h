// What one rank moves through memory, and how often it synchronises, in one chunk (one arena
// step) of each shared-memory algorithm: the model that docs/shm.md tabulates as functions of
// n and the bound it implies. Built from the same split the collectives use (segmentBegin /
// segmentCount of algorithms.h, fold.h's one operand read per rank per element), so that
// tests/shm/shm_plan_test.cc can check per-rank counts without running ranks.
//
// Counted: bytes read and written by this rank's copies and reductions (a reduction of k
// operands reads k ranges and writes one; the accumulators the fold re-reads between stages
// stay in L1/L2 and are not counted), and synchronisations: posts and marks this rank
// publishes plus the distinct waits it makes (a wait on every peer counts n-1).
#pragma once

#include <cstddef>

#include "algorithms/algorithms.h"

namespace loom::comm::shm {

struct StepTraffic {
  size_t read = 0;
  size_t written = 0;
  int publishes = 0;  // post, markReduced, finishStep's consumed counter (when announced)
  int waits = 0;      // peers waited for (per counter)
};

// One chunk of `c` elements of `es` bytes (the per-rank buffer, S = c * es), rank `r` of `n`.
// The staged split all-reduce (chunks > kSmallBytes): copy in all but the own sub-slice, fold
// the own sub-slice from the own input and n-1 slots into the own slot, copy all n reduced
// sub-slices out.
inline StepTraffic stagedAllreduceTraffic(size_t c, size_t es, int n, int r) {
  const size_t own = segmentCount(c, n, r) * es, all = c * es;
  StepTraffic t;
  t.read = (all - own) + own * n + all;
  t.written = (all - own) + own + all;
  t.publishes = 2;        // post, markReduced (consumed not announced)
  t.waits = 2 * (n - 1);  // every post, every peer's reduced mark
  return t;
}
// The staged reduce (the split path, rooted): as the all-reduce's copy in and fold; only the
// root copies the n reduced sub-slices out. Rooted steps announce their consumed counter, and
// every rank's acquireSlot waits on the peers' (counted here per step).
inline StepTraffic stagedReduceTraffic(size_t c, size_t es, int n, int r, int root) {
  const size_t own = segmentCount(c, n, r) * es, all = c * es;
  const bool isRoot = r == root;
  StepTraffic t;
  t.read = (all - own) + own * n + (isRoot ? all : 0);
  t.written = (all - own) + own + (isRoot ? all : 0);
  t.publishes = 3;                       // post, markReduced, consumed
  t.waits = (isRoot ? 3 : 2) * (n - 1);  // slot, posts; the root also every reduced mark
  return t;
}
// The staged reduce-scatter: `c` elements per rank's output; the rank stages all n slices of
// its input (n * c), then folds its slice of every slot (n reads of c) into its output.
inline StepTraffic stagedReduceScatterTraffic(size_t c, size_t es, int n, int /*r*/) {
  const size_t slice = c * es, all = slice * n;
  StepTraffic t;
  t.read = all + slice * n;
  t.written = all + slice;
  t.publishes = 1;
  t.waits = n - 1;
  return t;
}
// The staged broadcast: the root copies the chunk in, every other rank copies it out.
inline StepTraffic stagedBroadcastTraffic(size_t c, size_t es, int n, int r, int root) {
  StepTraffic t;
  t.read = c * es;
  t.written = c * es;
  t.publishes = r == root ? 2 : 1;  // the root posts; everyone announces consumed
  t.waits = r == root ? n - 1 : 1;  // the root's acquireSlot: every consumed counter; the others:
                                    // the root's post
  return t;
}
// The staged all-gather: `c` elements per rank; each copies its own in and all n out.
inline StepTraffic stagedAllgatherTraffic(size_t c, size_t es, int n, int /*r*/) {
  const size_t mine = c * es;
  StepTraffic t;
  t.read = mine + mine * n;
  t.written = mine + mine * n;
  t.publishes = 1;
  t.waits = n - 1;
  return t;
}
// The window all-reduce (one step for the whole buffer of `c` elements): rank r folds its
// segment from n inputs in place and writes it to its own output and n-1 peers' outputs.
inline StepTraffic windowAllreduceTraffic(size_t c, size_t es, int n, int r) {
  const size_t own = segmentCount(c, n, r) * es;
  StepTraffic t;
  t.read = own * n + own * (n - 1);  // the fold; the copies to the peers read the result
  t.written = own + own * (n - 1);
  t.publishes = 3;  // post, markReduced, finishStep
  t.waits = 2 * (n - 1);
  return t;
}
// The cross-memory all-reduce: as the window one's fold (the peers' operands through the
// bounce buffer: each read once by the kernel and once by the fold), then the n-1 other
// reduced segments read out of their owners' outputs.
inline StepTraffic crossMemoryAllreduceTraffic(size_t c, size_t es, int n, int r) {
  const size_t own = segmentCount(c, n, r) * es, all = c * es;
  StepTraffic t;
  t.read = own * (n - 1) + own * n + (all - own);
  t.written = own * (n - 1) + own + (all - own);
  t.publishes = 3;        // post, markReduced, finishStep
  t.waits = 3 * (n - 1);  // posts, reduced marks, finished
  return t;
}

// The window reduce-scatter (`c` elements per rank's output, one step): rank r folds slice r
// of every rank's input (its own in place) into its output.
inline StepTraffic windowReduceScatterTraffic(size_t c, size_t es, int n, int /*r*/) {
  StepTraffic t;
  t.read = c * es * n;
  t.written = c * es;
  t.publishes = 2;        // post, finishStep
  t.waits = 2 * (n - 1);  // every post, every peer finished reading this rank's input
  return t;
}
// The window reduce of `c` elements (one step). With the root's output in a window, rank r
// folds its segment from n inputs in place (into the bounce buffer unless it is the root) and
// writes it into the root's output: the non-roots also read the bounce buffer's block once.
// Otherwise the root folds all c elements alone and the others only post and wait.
inline StepTraffic windowReduceTraffic(size_t c, size_t es, int n, int r, int root,
                                       bool rootOutputInWindow) {
  StepTraffic t;
  t.publishes = 3;        // post, markReduced, finishStep
  t.waits = 2 * (n - 1);  // every post, every peer's reduced mark
  if (!rootOutputInWindow) {
    t.read = r == root ? c * es * n : 0;
    t.written = r == root ? c * es : 0;
    return t;
  }
  const size_t own = segmentCount(c, n, r) * es;
  t.read = own * n + (r == root ? 0 : own);
  t.written = own;
  return t;
}
// The window all-gather (`c` elements per rank, one step): each rank copies the n-1 peers'
// inputs into its output, and its own input unless in place.
inline StepTraffic windowAllgatherTraffic(size_t c, size_t es, int n, bool inPlace) {
  const size_t copied = c * es * static_cast<size_t>(inPlace ? n - 1 : n);
  StepTraffic t;
  t.read = copied;
  t.written = copied;
  t.publishes = 2;
  t.waits = 2 * (n - 1);
  return t;
}
// The window broadcast of `c` elements (one step). Unassisted: each receiver copies the whole
// buffer from the root's window. Assisted (broadcastRootAssists): the root writes segment i
// of the receiver i places after it, and each receiver copies the n-1 other segments.
inline StepTraffic windowBroadcastTraffic(size_t c, size_t es, int n, int r, int root,
                                          bool assisted) {
  StepTraffic t;
  const int place = (r - root + n) % n;
  if (!assisted) {
    t.read = t.written = r == root ? 0 : c * es;
    t.publishes = 2;                  // post, finishStep
    t.waits = r == root ? n - 1 : 1;  // root: every receiver finished; receiver: the post
    return t;
  }
  const size_t bytes =
      r == root ? (c - segmentCount(c, n, 0)) * es : (c - segmentCount(c, n, place)) * es;
  t.read = t.written = bytes;
  t.publishes = r == root ? 3 : 2;        // the root marks its writes done
  t.waits = r == root ? 2 * (n - 1) : 2;  // root: posts, finished; receiver: post, mark
  return t;
}

}  // namespace loom::comm::shm
