// Small OS helpers shared by the shared-memory arena and the point-to-point transport:
// futex waits on words in shared mappings, liveness of a peer process, the monotonic clock.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::comm::shm {

inline size_t roundUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

// CLOCK_MONOTONIC in nanoseconds.
int64_t nowNs();

// Sleeps while *word == expected, at most `timeoutNs` (any length). `shared`: the word may be
// in a mapping shared with other processes (FUTEX_WAIT), else a process-private futex.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, long timeoutNs, bool shared = true);
// Wakes every waiter on `word`.
void futexWakeAll(std::atomic<uint32_t>* word, bool shared = true);

// False once `pid` is gone or a zombie (killed but not yet reaped by its parent).
bool processAlive(pid_t pid);

// CPUs this process may run on (its affinity mask), at least 1.
int usableCpus();

// How long a shm waiter spins, then yields, before it sleeps on a futex (the policy is in
// arena.h). Spinning only pays while every rank has a core of its own: then spin up to 1 ms;
// when `localRanks` outnumber the usable CPUs, no timed spin (0) and yield longer (2 ms
// instead of 1 ms). `spinUs` / `yieldUs` >= 0 (ContextOptions::shmSpinUs / shmYieldUs,
// validated at Context setup) replace either budget.
struct WaitBudget {
  int64_t spinNs;
  int64_t yieldNs;
};
WaitBudget waitBudget(int localRanks, int spinUs = -1, int yieldUs = -1);

// The first line of a file, empty when it cannot be read.
std::string readFirstLine(const char* path);

}  // namespace loom::comm::shm
