// Helper threads for the staged all-reduce's large copies (issue 41; docs/shm.md "Helper
// threads"). One rank's staged all-reduce copies in, folds its own sub-slice and copies out on
// one thread, so its busbw is bounded by one core's memcpy rate (4(n-1)B/(5n-1), docs/shm.md);
// where ranks are fewer than cores, each of those three contiguous ranges can be shared by the
// rank's thread and T helper threads of its own.
//
// What it is: a pool of T threads owned by one Arena (Arena::parallel), created on the first
// step that uses it and joined by the Arena's destructor. A task is a function of (part,
// parts); the caller runs part 0 and the helpers parts 1..parts-1, and the caller returns
// only once every part returned, so no helper ever touches a buffer after the collective
// that handed it over returned (or threw).
//
// What the helpers never do: wait for a peer. They copy and fold local memory that the caller
// made ready (the caller does every cross-rank wait itself, before it hands a range over), so
// a dead or stopped peer cannot hold them. A part checks stopRequested() between runs of at
// most kPartRunBytes and returns false when it stopped early: the group failed (the arena's
// shared abort flag, set by any rank's failure or by Context::abort) or the caller gave up
// waiting (cancel(): its deadline). Idle helpers spin, yield, then sleep on a private futex
// with a 50 ms timeout, so they never hold up the destructor for long.
//
// Thread-safety: start / waitFinished / cancel from the owning (caller) thread only, one task
// at a time; stopRequested from any part.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace loom::comm::shm {

class CopyHelpers {
 public:
  // A part of a task: returns false when it stopped early (stopRequested()).
  using Part = bool (*)(void* context, int part, int parts);
  // The most helper threads per rank (ContextOptions::shmCopyThreads' range).
  static constexpr int kMaxThreads = 64;

  // Starts up to `threads` helpers (fewer when the system refuses more threads: a warning).
  // `aborted`: the group's abort flag (nonzero once failed). Idle helpers spin for `spinNs`,
  // then yield for `yieldNs`, then sleep.
  CopyHelpers(int threads, const std::atomic<uint32_t>* aborted, int64_t spinNs, int64_t yieldNs);
  // Stops and joins every helper (they are idle: every task was waited for).
  ~CopyHelpers();
  CopyHelpers(const CopyHelpers&) = delete;
  CopyHelpers& operator=(const CopyHelpers&) = delete;

  // The helpers running (0 when none could be started, or in a child forked after they were).
  int threads() const;

  // Hands parts 1..parts-1 of `part(context, i, parts)` to helpers 0..parts-2 (parts - 1 <=
  // threads()). The caller then runs part 0 itself and calls waitFinished until it is true.
  void start(int parts, Part part, void* context);
  // Waits at most `timeoutNs` for every started part to return; true when they all did.
  bool waitFinished(int64_t timeoutNs);
  // Asks the running parts to stop at their next check (the caller's deadline passed).
  void cancel() { cancel_.store(true, std::memory_order_relaxed); }
  // Whether a part should stop: the group failed or the caller cancelled the task.
  bool stopRequested() const {
    return cancel_.load(std::memory_order_relaxed) ||
           aborted_->load(std::memory_order_relaxed) != 0;
  }
  // After waitFinished returned true: whether every helper part of the task ran to its end.
  bool complete() const { return !incomplete_.load(std::memory_order_relaxed); }

 private:
  void loop(int index);

  const std::atomic<uint32_t>* const aborted_;
  const int64_t spinNs_;
  const int64_t yieldNs_;
  const int owner_;  // the pid that started the threads
  std::vector<std::thread> threads_;
  // (generation << 8) | parts of the current task: the helpers' futex word.
  std::atomic<uint32_t> task_{0};
  std::atomic<uint32_t> idleSleepers_{0};
  // Helper parts of the current task that returned: the caller's futex word.
  std::atomic<uint32_t> finished_{0};
  std::atomic<uint32_t> callerSleeps_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> cancel_{false};
  std::atomic<bool> incomplete_{false};
  // Written by the caller before it publishes task_, read by the participating helpers after
  // they saw it (the caller waits for all of them before it writes the next task's).
  Part part_ = nullptr;
  void* context_ = nullptr;
  uint32_t waited_ = 0;  // helper parts the caller waits for (caller only)
};

}  // namespace loom::comm::shm
