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
  char reason[512];
  alignas(64) std::atomic<uint32_t> sleepers;
};

struct Arena::Control {
  // posted / reduced / consumed: (last step done) + 1, written only by the owning rank.
  alignas(64) std::atomic<uint64_t> counters[3];
  // Bumped on every publish; sleepers FUTEX_WAIT on it.
  std::atomic<uint32_t> wake;
  std::atomic<int32_t> pid;
  std::atomic<int32_t> cpu;  // where the rank last published (sched_getcpu)
  std::atomic<uint32_t> closed;
  uint64_t signature[kSlots];
  // What the rank posted in each slot, for mismatch messages.
  uint64_t postedSeq[kSlots];
  uint64_t postedBytes[kSlots];
  uint32_t postedKind[kSlots];
  // The user buffers (in, out) of the single-copy step in each slot, as addresses in the
  // owner's process.
  uint64_t buffers[kSlots][2];
  // The access mode posted for each slot (PeerAccess), checked like the signature.
  uint32_t postedAccess[kSlots];
  // On the window path: the Windows holding those buffers (window.h), in the owner's process.
  uint64_t windowId[kSlots][2];
  int32_t windowFd[kSlots][2];
  uint64_t windowBase[kSlots][2];
  uint64_t windowBytes[kSlots][2];
};

}  // namespace loom::comm::shm
