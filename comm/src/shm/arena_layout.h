// The arena's shared layout (arena.h): the header and the per-rank control block, shared by
// the arena's steps (arena.cc) and its access to peers' user buffers (arena_peers.cc).
// Internal to comm/src/shm.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "shm/arena.h"

namespace loom::comm::shm {

constexpr size_t kPage = 4096;

// A 64-bit mix (splitmix64's finalizer): probe words that no stale memory holds by chance.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Arena::Header {
  uint64_t magic;
  uint32_t version;
  int32_t size;
  uint64_t slotBytes;
  uint64_t perRankBytes;
  // 0 = healthy, 1 = an abort is being written, 2 = aborted (reason valid).
  alignas(64) std::atomic<uint32_t> aborted;
  int32_t blamedRank;
  int32_t abortingRank;
  uint32_t abortInvalid;  // 1: the ranks' calls disagree (InvalidArgumentError on every rank)
  char reason[512];
  alignas(64) std::atomic<uint32_t> sleepers;
};

// One slot's announcement, in one cache line: the stamp that says the slot is posted, what a
// peer checks before it reads (signature, access mode) and, for steps of at most kBoxBytes
// per rank, the data itself. A waiter that sees the stamp has everything in the same line
// (one cache-line transfer, as Open MPI's fast box), instead of the counter's line, then the
// signature's, then the slot's.
struct Arena::Box {
  // (the last step posted in this slot) + 1, written only by the owning rank, last.
  std::atomic<uint64_t> posted;
  uint64_t signature;       // Signature::word
  uint32_t signatureExtra;  // Signature::extra: the count's high 32 bits (collectives here are
                            // even, see signature.h)
  uint16_t access;          // PeerAccess
  uint16_t variant;         // Call::variant: how the poster runs this step
  uint8_t data[kBoxBytes];
};
static_assert(sizeof(Arena::Box) == 64, "a box is one cache line");

// What a rank says when it starts a rooted collective (Arena::announceCall), before it posts or
// waits for anything in that step: the call's signature and access mode, so that ranks that do
// not otherwise read each other's posts in that step (a broadcast's or scatter's roots and
// receivers, a gather's senders) can compare their calls. Kept per step in a ring of
// kAnnouncements; arena_calls.cc says why an entry is never overwritten while a peer may still
// read it.
struct Arena::Announcement {
  // (the step announced) + 1, written only by the owning rank, last.
  std::atomic<uint64_t> stamp;
  uint64_t signature;       // Signature::word
  uint64_t seq;             // Call::seq, for mismatch messages
  uint32_t signatureExtra;  // Signature::extra (its low 32 bits, as in the box)
  uint16_t access;          // PeerAccess
  uint8_t kind;             // OpType, for mismatch messages
};
static_assert(sizeof(Arena::Announcement) == 32, "two announcements per cache line");

struct Arena::Control {
  // reduced / consumed: (last step done) + 1, written only by the owning rank. Posting is
  // the box's stamp (Box::posted).
  alignas(64) std::atomic<uint64_t> counters[2];
  // Bumped on every publish; sleepers FUTEX_WAIT on it.
  std::atomic<uint32_t> wake;
  // Read by every waiter that does not find its peer ready, written rarely: a line of their
  // own, so that those reads do not pull the line that every publish writes away from its
  // owner (a cache-line ping-pong per operation: ~20% of an 8-byte all-reduce).
  alignas(64) std::atomic<int32_t> cpu;  // where the rank last published (sched_getcpu)
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> closed;
  // What the rank posted in each slot, for mismatch messages only (the check reads the box).
  alignas(64) uint64_t postedSeq[kSlots];
  uint64_t postedBytes[kSlots];
  uint32_t postedKind[kSlots];
  // The user buffers (in, out) of the single-copy step in each slot, as addresses in the
  // owner's process.
  uint64_t buffers[kSlots][2];
  // On the window path: the Windows holding those buffers (window.h), in the owner's process.
  uint64_t windowId[kSlots][2];
  int32_t windowFd[kSlots][2];
  uint64_t windowBase[kSlots][2];
  uint64_t windowBytes[kSlots][2];
  // Each slot's announcement (its own cache lines: they are what peers poll).
  alignas(64) Box box[kSlots];
  // The rooted collectives' announcements, by step % kAnnouncements (polled as the boxes are).
  alignas(64) Announcement announced[kAnnouncements];
};

}  // namespace loom::comm::shm
