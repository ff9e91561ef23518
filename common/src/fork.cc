#include "loom/common/fork.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace loom {

namespace detail {
std::atomic<uint64_t> gForkGeneration{0};
}  // namespace detail

namespace {

void countFork() {
  detail::gForkGeneration.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

uint64_t forkGeneration() {
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(nullptr, nullptr, countFork); });
  return forkGenerationNow();
}

}  // namespace loom
