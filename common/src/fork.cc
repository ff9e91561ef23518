#include "loom/common/fork.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace loom {

namespace {

std::atomic<uint64_t> gGeneration{0};

void countFork() {
  gGeneration.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

uint64_t forkGeneration() {
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(nullptr, nullptr, countFork); });
  return gGeneration.load(std::memory_order_relaxed);
}

}  // namespace loom
