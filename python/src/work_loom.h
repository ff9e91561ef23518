// WorkLoom: the c10d::Work torch sees for one Loom operation (or a few issued together).
//
// Contract
// - Holds the Loom Works of the operation, the tensors it produces (result(), the future's
//   value) and an optional `finish` step run once after they all succeed (copying staged
//   results back into the caller's tensors, dividing, ...). The tensors and staging buffers
//   stay alive until the WorkLoom is destroyed, so Loom never writes freed memory.
// - wait() waits for every Loom Work in order, runs `finish` once, and returns true; a failed
//   operation rethrows Loom's exception (its message names the rank, op#seq and peer).
//   wait(timeout) with a positive timeout bounds the whole wait; when it passes, Loom aborts the
//   group and throws TimeoutError (loom/process_group/work.h).
// - getFuture() returns a c10::ivalue::Future holding the output tensors (a TensorList, what
//   DDP's reducer and comm hooks read), or the operation's error. Loom's Work has no completion
//   callback, so the group's FutureCompleter thread waits for the operation and completes the
//   future (running its then() callbacks there, as gloo's thread does); the caller goes on at
//   once, so DDP's backward overlaps the all-reduces. Without a completer, getFuture waits.
// - isCompleted() never blocks; when every Loom Work is done it runs `finish` (so polling users
//   see their tensors). Thread-safe.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/process_group/work.h"

namespace loom::torch_backend {

// One thread per group that runs tasks in order (the futures of its operations, which complete
// in issue order anyway). The destructor runs what is queued, then joins. A task can hold the
// last reference to the completer (a WorkLoom holds it): then the destructor runs on the
// completer's own thread, which cannot join itself; it detaches, and the thread, which owns the
// queue's state, finishes the queue and ends.
class FutureCompleter {
 public:
  FutureCompleter();
  ~FutureCompleter();
  FutureCompleter(const FutureCompleter&) = delete;
  FutureCompleter& operator=(const FutureCompleter&) = delete;

  // `task` must not throw.
  void enqueue(std::function<void()> task);
  // Keeps the Works of a WorkLoom dropped before they completed (and the tensors they write)
  // until they complete, on this thread: dropping a Work (del work, the interpreter's exit)
  // must not block the caller, who may hold the GIL, for up to the operation's timeout.
  // `finish` (the copy back of staged results) runs once they all succeeded, as wait() would.
  void adopt(std::vector<std::shared_ptr<loom::Work>> works, std::vector<at::Tensor> tensors,
             std::function<void()> finish);
  // Dropped operations still running (adopt): what destroying the group must abort.
  int orphans() const;

 private:
  struct State {
    std::mutex mu;  // guards tasks and stop
    std::condition_variable wake;
    std::deque<std::function<void()>> tasks;
    bool stop = false;
    std::atomic<int> orphans{0};
  };
  static void run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

class WorkLoom : public c10d::Work {
 public:
  WorkLoom(int rank, c10d::OpType type, std::vector<std::shared_ptr<loom::Work>> works,
           std::vector<at::Tensor> outputs, std::function<void()> finish = {}, int sourceRank = -1,
           std::shared_ptr<FutureCompleter> completer = nullptr);
  ~WorkLoom() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // The peer of a recv; for a recv from any source, the sender once it completed.
  int sourceRank() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  const std::vector<std::shared_ptr<loom::Work>>& loomWorks() const { return works_; }

 private:
  // Runs finish_ once, after every Loom Work succeeded; rethrows its failure to every caller.
  void runFinish();
  // Waits, then completes future_ with the outputs or the error.
  void completeFuture();

  const std::vector<std::shared_ptr<loom::Work>> works_;
  const std::vector<at::Tensor> outputs_;
  const int sourceRank_;
  const std::shared_ptr<FutureCompleter> completer_;

  mutable std::mutex finishMu_;  // guards the members below
  std::function<void()> finish_;
  bool finished_ = false;
  std::exception_ptr finishError_;

  std::mutex futureMu_;  // guards future_; never held with finishMu_
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace loom::torch_backend
