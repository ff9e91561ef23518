// Whether this process is a fork() child of the one that made an object.
//
// A group's threads, connections and locks stay in the process that created it: a child made
// by fork() has only copies of their memory (a lock a parent thread held at the fork stays
// held for good). Objects record forkGeneration() when made and compare it before use; the
// comparison is one relaxed atomic load, so it costs nothing per operation.
#pragma once

#include <cstdint>

namespace loom {

// How many fork()s separate this process from the first that asked: 0 there, 1 in its child,
// and so on. The first call registers the pthread_atfork handler that counts.
uint64_t forkGeneration();

}  // namespace loom
