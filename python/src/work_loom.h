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
//   DDP's reducer and comm hooks read). It waits for the operation first, so the future it
//   returns is already completed (or holds the error); Loom's Work has no completion callback
//   to complete it later.
// - isCompleted() never blocks; when every Loom Work is done it runs `finish` (so polling users
//   see their tensors). Thread-safe.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "loom/process_group/work.h"

namespace loom::torch_backend {

class WorkLoom : public c10d::Work {
 public:
  WorkLoom(int rank, c10d::OpType type, std::vector<std::shared_ptr<loom::Work>> works,
           std::vector<at::Tensor> outputs, std::function<void()> finish = {}, int sourceRank = -1);
  ~WorkLoom() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override { return sourceRank_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  // Runs finish_ once, after every Loom Work succeeded; rethrows its failure to every caller.
  void runFinish();

  const std::vector<std::shared_ptr<loom::Work>> works_;
  const std::vector<at::Tensor> outputs_;
  const int sourceRank_;

  mutable std::mutex finishMu_;  // guards the members below
  std::function<void()> finish_;
  bool finished_ = false;
  std::exception_ptr finishError_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace loom::torch_backend
