#include "work_loom.h"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <thread>
#include <utility>

#include "loom/common/error.h"
#include "loom/common/schedule_noise.h"

namespace loom::torch_backend {

FutureCompleter::FutureCompleter()
    : state_(std::make_shared<State>()), thread_([state = state_] { run(state); }) {}

FutureCompleter::~FutureCompleter() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->wake.notify_one();
  if (std::this_thread::get_id() == thread_.get_id()) {
    thread_.detach();  // the last reference dropped by one of our own tasks: see the header
  } else {
    thread_.join();
  }
}

void FutureCompleter::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->tasks.push_back(std::move(task));
  }
  state_->wake.notify_one();
}

void FutureCompleter::adopt(std::vector<std::shared_ptr<loom::Work>> works,
                            std::vector<at::Tensor> tensors, std::function<void()> finish) {
  state_->orphans.fetch_add(1);
  enqueue([state = state_, works = std::move(works), tensors = std::move(tensors),
           finish = std::move(finish)]() mutable {
    bool ok = true;
    for (const auto& work : works) {
      try {
        work->wait();
      } catch (...) {  // nobody waits for a dropped Work: its error is the group's to report
        ok = false;
      }
    }
    try {
      if (ok && finish) finish();
    } catch (...) {  // NOLINT(bugprone-empty-catch): as above
    }
    finish = nullptr;
    works.clear();
    tensors.clear();
    state->orphans.fetch_sub(1);
  });
}

int FutureCompleter::orphans() const {
  return state_->orphans.load();
}

void FutureCompleter::run(const std::shared_ptr<State>& state) {
  std::unique_lock<std::mutex> lock(state->mu);
  for (;;) {
    state->wake.wait(lock, [&] { return state->stop || !state->tasks.empty(); });
    if (state->tasks.empty()) return;  // stop, and nothing left to run
    auto task = std::move(state->tasks.front());
    state->tasks.pop_front();
    lock.unlock();
    LOOM_NOISE();  // the Work's owner may drop it, or wait on it, meanwhile
    task();
    task = nullptr;  // drop what it holds (the Work and its tensors) outside the lock
    lock.lock();
  }
}

WorkLoom::WorkLoom(int rank, c10d::OpType type, std::vector<std::shared_ptr<loom::Work>> works,
                   std::vector<at::Tensor> outputs, std::function<void()> finish, int sourceRank,
                   std::shared_ptr<FutureCompleter> completer)
    : c10d::Work(rank, type),
      works_(std::move(works)),
      outputs_(std::move(outputs)),
      sourceRank_(sourceRank),
      completer_(std::move(completer)),
      finish_(std::move(finish)) {}

WorkLoom::~WorkLoom() {
  // Loom may still write into our tensors: never free them under a running operation. Dropped
  // before it completed (del work, or the interpreter's exit), the Work's operations and
  // tensors go to the group's completer thread, which keeps them until they complete, so the
  // caller (who may hold the GIL) does not wait up to the operation's timeout; destroying the
  // group aborts what is still running then (ProcessGroupLoom::endOrphans).
  // Completed but never waited for: the staged result's copy back (finish) still runs, so the
  // caller's tensor gets the result, as with gloo.
  bool running = false, failed = false;
  for (const auto& work : works_) {
    running = running || !work->isCompleted();
    failed = failed || (work->isCompleted() && !work->isSuccess());
  }
  LOOM_NOISE();  // a Work seen running may complete meanwhile (its result must still land)
  if (!running) {
    if (!failed) {
      try {
        runFinish();
      } catch (...) {  // NOLINT(bugprone-empty-catch): nobody waits for a dropped Work
      }
    }
    return;
  }
  if (completer_) {
    std::function<void()> finish;
    {
      std::lock_guard<std::mutex> lock(finishMu_);
      if (!finished_) finish = std::move(finish_);
    }
    completer_->adopt(works_, outputs_, std::move(finish));
    return;
  }
  for (const auto& work : works_) {
    try {
      work->wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the error belongs to whoever waited
    }
  }
}

int WorkLoom::sourceRank() const {
  if (sourceRank_ >= 0 || works_.empty()) return sourceRank_;
  return works_.front()->sourceRank();
}

bool WorkLoom::isCompleted() {
  for (const auto& work : works_) {
    if (!work->isCompleted()) return false;
  }
  if (isSuccess()) {
    try {
      runFinish();
    } catch (...) {  // NOLINT(bugprone-empty-catch): exception() reports it
    }
  }
  return true;
}

bool WorkLoom::isSuccess() const {
  for (const auto& work : works_) {
    if (!work->isCompleted() || !work->isSuccess()) return false;
  }
  std::lock_guard<std::mutex> lock(finishMu_);
  return finishError_ == nullptr;
}

std::exception_ptr WorkLoom::exception() const {
  for (const auto& work : works_) {
    if (auto error = work->exception()) return error;
  }
  std::lock_guard<std::mutex> lock(finishMu_);
  return finishError_;
}

bool WorkLoom::wait(std::chrono::milliseconds timeout) {
  if (timeout <= kNoTimeout) {
    for (const auto& work : works_) work->wait();
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const auto& work : works_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      work->wait(std::max(left, std::chrono::milliseconds(1)));
    }
  }
  runFinish();
  return true;
}

void WorkLoom::runFinish() {
  std::lock_guard<std::mutex> lock(finishMu_);
  if (!finished_) {
    finished_ = true;
    if (finish_) {
      try {
        finish_();
      } catch (...) {
        finishError_ = std::current_exception();
      }
      finish_ = nullptr;
    }
  }
  if (finishError_) std::rethrow_exception(finishError_);
}

c10::intrusive_ptr<c10::ivalue::Future> WorkLoom::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(futureMu_);
    if (future_) return future_;
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{});
    future = future_;
  }
  bool done = true;
  for (const auto& work : works_) done = done && work->isCompleted();
  LOOM_NOISE();  // an operation seen running may complete meanwhile
  if (done || !completer_) {
    completeFuture();
  } else {
    // The task owns a reference: the Work (and the tensors Loom writes) outlive the wait.
    auto self = c10::intrusive_ptr<WorkLoom>::unsafe_reclaim_from_nonowning(this);
    completer_->enqueue([self] { self->completeFuture(); });
  }
  return future;
}

void WorkLoom::completeFuture() {
  // future_ was set (under futureMu_) before this runs, and never changes after.
  try {
    wait();
  } catch (...) {
    future_->setError(std::current_exception());
    return;
  }
  future_->markCompleted(c10::IValue(outputs_));
}

}  // namespace loom::torch_backend
