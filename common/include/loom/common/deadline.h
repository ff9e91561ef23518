// Deadline: a point on the steady clock that every blocking step in Loom waits against.
//
// Timeouts are std::chrono::milliseconds; a zero or negative timeout means "already due"
// (useful to poll), and kNoTimeout is never used by library code: every wait has an end.
#pragma once

#include <algorithm>
#include <chrono>

namespace loom {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class Deadline {
 public:
  explicit Deadline(milliseconds timeout) : start_(Clock::now()), end_(start_ + timeout) {}

  bool expired() const { return Clock::now() >= end_; }
  // Time left, never negative.
  milliseconds remaining() const {
    const auto left = std::chrono::duration_cast<milliseconds>(end_ - Clock::now());
    return std::max(left, milliseconds(0));
  }
  // Time since construction, for messages ("waited 30012 ms").
  milliseconds elapsed() const {
    return std::chrono::duration_cast<milliseconds>(Clock::now() - start_);
  }
  // Milliseconds left as an int for poll/epoll_wait, capped to `cap`.
  int pollTimeoutMs(milliseconds cap = milliseconds(1000)) const {
    return static_cast<int>(std::min(remaining(), cap).count());
  }
  Clock::time_point end() const { return end_; }

 private:
  Clock::time_point start_;
  Clock::time_point end_;
};

}  // namespace loom
