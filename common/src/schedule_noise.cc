#include "loom/common/schedule_noise.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

namespace loom {

void scheduleNoise(int64_t maxUs) {
  // xorshift64*, per thread, seeded from the thread and the clock: ranks that are threads of one
  // process draw different delays.
  thread_local uint64_t state =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (static_cast<uint64_t>(::syscall(SYS_gettid)) << 32) ^ 0x9e3779b97f4a7c15ull;
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  const uint64_t draw = state * 0x2545f4914f6cdd1dull;
  switch (draw & 3) {
    case 0:
      ::usleep(static_cast<useconds_t>((draw >> 8) % static_cast<uint64_t>(maxUs)));
      break;
    case 1:
      ::sched_yield();
      break;
    default:
      break;
  }
}

}  // namespace loom
