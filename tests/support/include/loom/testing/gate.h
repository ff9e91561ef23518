// Gate: holds threads at a point of a test until the test opens it, so that an interleaving the
// scheduler would leave to chance (a thread inside an operation while another starts one) is
// certain. Every wait is bounded: a broken test fails, it does not hang.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace loom::testing {

class Gate {
 public:
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = false;
    }
    cv_.notify_all();
  }
  // Called by the thread to hold: counts it as arrived, then waits while the gate is closed, at
  // most `bound` (after that it goes on, and the test fails on what it then sees). Returns
  // whether the gate was open by then.
  bool pass(std::chrono::milliseconds bound = std::chrono::seconds(60)) {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrivals_;
    ++held_;
    cv_.notify_all();
    const bool opened = cv_.wait_for(lock, bound, [&] { return !closed_; });
    --held_;
    return opened;
  }
  // Until `n` threads in all have arrived at pass() since the last resetArrivals(), or until
  // `n` threads wait at it now; false when `timeout` passed first.
  bool awaitArrivals(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return arrivals_ >= n; });
  }
  bool awaitHeld(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return held_ >= n; });
  }
  void resetArrivals() {
    std::lock_guard<std::mutex> lock(mu_);
    arrivals_ = 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int arrivals_ = 0;
  int held_ = 0;
};

}  // namespace loom::testing
