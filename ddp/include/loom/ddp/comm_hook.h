// Communication hooks: how DDP reduces one gradient bucket (c10d's register_comm_hook).
//
// Contract
// - DDP calls hook.start(pg, bucket) on the backward thread as soon as every gradient of the
//   bucket is in bucket.data (float32, the sum of this rank's local gradients). Buckets are
//   started in bucket-index order, the same on every rank, so hooks that issue collectives
//   issue them in the same order everywhere.
// - start() returns a HookFuture; DDP calls its wait() (on the thread that finishes backward)
//   before it writes gradients back. When wait() returns, bucket.data must hold the value every
//   rank agrees on (for the built-in hooks: the average over ranks, bitwise the same on every
//   rank). bucket.data stays valid and untouched by DDP until wait() returns.
// - Exceptions from start() or wait() propagate out of backward / finalize.
// - Built-in hooks: allreduceHook (float32 all-reduce with ReduceOp::kAvg),
//   fp16CompressHook and bf16CompressHook (divide, round to half precision, sum in half
//   precision on the wire, widen back to float32). Users subclass CommHook for their own.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/process_group/process_group.h"

namespace loom::ddp {

struct GradBucket {
  int index = 0;                             // position in the bucket order (0 is started first)
  bool isLast = false;                       // the last bucket started in an iteration
  float* data = nullptr;                     // flat gradients of the bucket's parameters
  size_t count = 0;                          // floats in data
  std::vector<std::string> parameterNames;   // in the order they are laid out in data
  std::vector<size_t> offsets;               // where each parameter starts in data
  std::vector<std::vector<int64_t>> shapes;  // each parameter's shape
};

class HookFuture {
 public:
  virtual ~HookFuture() = default;
  virtual void wait() = 0;
  // True once the communication has completed (wait() may still have work to do, such as
  // widening compressed values). Never blocks. Only the timeline (LOOM_TRACE) asks; a hook that
  // cannot tell keeps the default, and DDP then learns of completion in wait().
  virtual bool isCompleted() { return false; }
};

// A future made of a Work and what to do once it completed (runs on the waiting thread).
class WorkFuture : public HookFuture {
 public:
  WorkFuture(std::shared_ptr<Work> work, std::function<void()> then = {})
      : work_(std::move(work)), then_(std::move(then)) {}
  void wait() override;
  bool isCompleted() override { return done_ || work_->isCompleted(); }

 private:
  std::shared_ptr<Work> work_;
  std::function<void()> then_;
  bool done_ = false;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual std::unique_ptr<HookFuture> start(ProcessGroup& pg, GradBucket& bucket) = 0;
};

std::shared_ptr<CommHook> allreduceHook();
std::shared_ptr<CommHook> fp16CompressHook();
std::shared_ptr<CommHook> bf16CompressHook();
// "none" (or "allreduce"), "fp16", "bf16"; anything else is an InvalidArgumentError.
std::shared_ptr<CommHook> commHookByName(const std::string& name);

}  // namespace loom::ddp
