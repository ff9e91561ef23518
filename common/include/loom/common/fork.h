// Whether this process is a fork() child of the one that made an object.
//
// A group's threads, connections and locks stay in the process that created it: a child made
// by fork() has only copies of their memory (a lock a parent thread held at the fork stays
// held for good). Objects record forkGeneration() when made and compare it before use; the
// comparison is one relaxed atomic load, so it costs nothing per operation.
#pragma once

#include <atomic>
#include <cstdint>

namespace loom {

// How many fork()s separate this process from the first that asked: 0 there, 1 in its child,
// and so on. The first call registers the pthread_atfork handler that counts.
uint64_t forkGeneration();

namespace detail {
extern std::atomic<uint64_t> gForkGeneration;
}  // namespace detail

// forkGeneration() without the registration: for hot paths of objects whose constructor
// called forkGeneration() (so the handler counts). One relaxed load.
inline uint64_t forkGenerationNow() {
  return detail::gForkGeneration.load(std::memory_order_relaxed);
}

}  // namespace loom
