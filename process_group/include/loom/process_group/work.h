// Work: the handle of one asynchronous ProcessGroup operation (c10d's Work).
//
// Contract
// - A Work is created by a ProcessGroup when an operation is issued and completes exactly
//   once, either successfully or with an exception (markCompleted / markFailed, called by the
//   backend). Completion is final.
// - isCompleted(), isSuccess() and exception() never block (for pushed completion they are
//   one atomic load). exception() is null unless the operation failed.
// - wait() blocks until the operation completes. It returns true on success and rethrows the
//   stored exception on failure. It has no deadline of its own: every operation runs against
//   the group's (or its own) timeout, and after a failure the group fails every queued
//   operation at once, so wait() always ends. A backend may run the operation on the thread
//   that calls wait() instead of handing it to its own thread (the comm backend does when the
//   operation is next in issue order), so the waiting thread may spend the operation's time
//   inside wait().
// - wait(timeout) sets the caller's own deadline on top. When it passes before the operation
//   completes, wait throws TimeoutError naming the operation and its sequence number, and the
//   group is aborted first (like NCCL's watchdog): a TimeoutError is an IoError and always
//   means the group is unusable. Use isCompleted() to poll without that consequence. A
//   bounded wait never runs the operation itself, so its deadline holds. A timeout of zero or
//   less is c10d's kNoTimeout: wait(0ms) is wait(), not an instant deadline that would abort
//   the group.
// - The buffers an operation reads and writes must stay valid until its Work completes.
// - Thread-safe: any thread may wait on or query a Work. Completion wakes sleeping waiters
//   only: completing a Work nobody sleeps on makes no system call.
//
// Backends: wait, wait(timeout) and isCompleted are virtual (as in c10d) so that a backend's
// Work can do its part of the waiting (run the operation inline, poll a CUDA event) and then
// use the base class's blocking wait, finished() and timedOut().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

namespace loom {

class Work {
 public:
  // `opName` names the operation ("allreduce"), `seq` its sequence number in the group,
  // `rank` the issuing rank; together they appear in every message ("rank 2: allreduce#17").
  Work(std::string opName, uint64_t seq, int rank);
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  virtual bool isCompleted();
  bool isSuccess() const;
  std::exception_ptr exception() const;

  virtual bool wait();
  virtual bool wait(std::chrono::milliseconds timeout);

  const std::string& opName() const { return opName_; }
  uint64_t seq() const { return seq_; }
  int rank() const { return rank_; }
  // "allreduce#17"
  std::string describe() const;
  // The rank a receive got its data from (c10d's sourceRank): set when a receive completes,
  // which matters for one from any source; -1 before that and for other operations.
  int sourceRank() const { return sourceRank_.load(std::memory_order_acquire); }
  // Backend side, before markCompleted.
  void setSourceRank(int rank) { sourceRank_.store(rank, std::memory_order_release); }

  // Backend side. The first call wins; later calls are ignored.
  void markCompleted();
  void markFailed(std::exception_ptr error);
  // Backend side: sleeps until the Work completed or `deadline` passed, whichever comes
  // first, and returns isCompleted(). Raises nothing and does nothing on the deadline (for a
  // backend thread that waits for an operation another thread runs).
  bool awaitCompletion(std::chrono::steady_clock::time_point deadline);

 protected:
  // Called (once, with no lock held) when wait(timeout) expires, before it throws: the
  // backend aborts its group here. The default does nothing.
  virtual void onWaitTimeout(const std::string& reason);
  // For a backend's wait: the result of a completed Work (true, or its error rethrown).
  bool finished() const;
  // For a backend's bounded wait whose deadline passed (the wait began at `start`): calls
  // onWaitTimeout and throws the TimeoutError.
  [[noreturn]] void timedOut(std::chrono::steady_clock::time_point start);

 private:
  bool waitUntil(std::chrono::steady_clock::time_point deadline, bool bounded);
  // Sleeps on state_ until kDone (or the deadline, when bounded).
  void sleepUntilDone(std::chrono::steady_clock::time_point deadline, bool bounded);

  const std::string opName_;
  const uint64_t seq_;
  const int rank_;
  std::atomic<int> sourceRank_{-1};

  // Completion: the first mark* call wins: markCompleted moves state_ from kPending to kDone
  // in one compare-and-swap; markFailed moves it to kSetting, stores error_, then publishes
  // kDone (release). error_ is never written again, so a
  // reader that saw kDone (acquire) reads it without a lock. A waiter that sleeps counts
  // itself in sleepers_ first, then reads state_ and sleeps on it with FUTEX_WAIT (which
  // returns at once if state_ changed since); the completer stores kDone, then looks at
  // sleepers_ (both sequentially consistent) and wakes the word only when someone sleeps:
  // either the waiter sees kDone or the completer sees the sleeper. No mutex and no condition
  // variable: a Work is created and destroyed per operation, and completing one that nobody
  // sleeps on costs one compare-and-swap.
  enum : uint32_t { kPending, kSetting, kDone };
  bool done() const { return state_.load(std::memory_order_acquire) == kDone; }
  bool complete(std::exception_ptr error);

  std::atomic<uint32_t> state_{kPending};  // the futex word
  std::atomic<int> sleepers_{0};
  std::exception_ptr error_;
};

}  // namespace loom
