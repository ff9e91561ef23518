// Schedule noise, for finding races between threads and ranks in tests (LOOM_SCHEDULE_NOISE_US;
// docs/architecture.md "Schedule noise"). LOOM_NOISE() marks a point where what a thread
// concludes depends on how far another thread or rank got since its last look: after a readiness
// check and before a health check, before a rank publishes that it started, posted or closed,
// before a thread claims an operation another thread may claim too. With the setting at N > 0,
// each point sleeps a random 0..N microseconds one time in four and yields one time in four, so
// that a peer can run a whole step inside a window that is a few instructions wide on an idle
// machine. At 0 (the default) a point costs one relaxed load and a branch; the points are once
// per step or on slow paths, never in a copy or a spin.
#pragma once

#include <atomic>
#include <cstdint>

namespace loom {

// Process-wide; comm::Context setup sets it from LOOM_SCHEDULE_NOISE_US
// (comm/src/context_settings.cc).
inline std::atomic<int64_t> scheduleNoiseUs{0};
// One point's draw: a sleep of up to maxUs microseconds, a yield, or nothing.
void scheduleNoise(int64_t maxUs);

}  // namespace loom

#define LOOM_NOISE()                                                                          \
  do {                                                                                        \
    if (const int64_t loomNoiseUs_ = ::loom::scheduleNoiseUs.load(std::memory_order_relaxed); \
        loomNoiseUs_ > 0) [[unlikely]] {                                                      \
      ::loom::scheduleNoise(loomNoiseUs_);                                                    \
    }                                                                                         \
  } while (0)
