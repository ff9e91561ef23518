// DistributedDataParallel: data-parallel training of an autograd_lite module over a
// ProcessGroup, as PyTorch users know it.
//
// Contract
// - Construction is collective: every rank checks that all ranks have the same parameter and
//   buffer names, shapes and dtypes (the error names the first difference and the rank that has
//   it), then parameters and buffers are broadcast from rank 0.
// - forward(x) runs the wrapped module (children are named "module.", as in PyTorch). In
//   training with grad mode on and sync enabled, it arms the reducer (reducer.h) for the
//   following backward: gradients are averaged over ranks by buckets while backward runs, and
//   when backward returns every parameter's grad() holds the average, bitwise equal on every
//   rank (the reduction is finalized by a callback at the end of the backward pass;
//   finalize() after backward is then a no-op, kept for symmetry with older code paths).
// - broadcastBuffers (default on): buffers are broadcast from rank 0 before each training
//   forward, so every rank normalizes with rank 0's running statistics.
// - noSync(): while the guard lives, backward only accumulates local gradients; the next synced
//   backward reduces the accumulated sum.
// - staticGraph: the graph (which parameters take part in the loss) is the same every
//   iteration; see reducer.h. Unused parameters are allowed (found in the first iteration).
// - Join (join.h): uneven inputs. While a Join is active, every training forward first agrees
//   with the other ranks on which still have data; ranks out of data shadow the collectives.
// - One DDP per group at a time; one training thread. The module and group must outlive it.
#pragma once

#include <memory>
#include <string>

#include "loom/autograd/nn.h"
#include "loom/ddp/comm_hook.h"
#include "loom/ddp/reducer.h"
#include "loom/process_group/process_group.h"

namespace loom::ddp {

struct DdpOptions {
  double bucketCapMb = 25.0;
  double firstBucketCapMb = 1.0;
  bool findUnusedParameters = false;
  bool broadcastBuffers = true;
  bool staticGraph = false;
  bool gradientAsBucketView = true;    // grad() lives in the bucket (see reducer.h)
  bool windowBuckets = true;           // buckets in Loom windows (see reducer.h)
  std::shared_ptr<CommHook> commHook;  // null: average with all-reduce
};

struct JoinOptions {
  // As PyTorch's divide_by_initial_world_size: true divides the summed gradients by the world
  // size even when some ranks are out of data (they contribute zeros); false averages over the
  // ranks that still had data in that iteration.
  bool divideByInitialWorldSize = true;
};

class DistributedDataParallel : public ag::nn::Module {
 public:
  DistributedDataParallel(std::shared_ptr<ag::nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                          const DdpOptions& options = {});
  ~DistributedDataParallel() override;

  ag::Tensor forward(const ag::Tensor& input) override;
  std::string describe() const override;

  // Waits for the gradient reduction of the last backward (no-op when it already finished).
  void finalize() { reducer_->finalize(); }
  void registerCommHook(std::shared_ptr<CommHook> hook) { reducer_->setCommHook(std::move(hook)); }

  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_) {
      ddp_.sync_ = false;
    }
    ~NoSyncGuard() { ddp_.sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard noSync() { return NoSyncGuard(*this); }

  // Join protocol (use the Join guard in join.h rather than these).
  void joinBegin(const JoinOptions& options);
  // This rank is out of data: shadow the others' iterations until every rank is out, then take
  // the final parameters and buffers from the highest rank among the last to run out.
  void joinShadowUntilAllJoined();
  void joinEnd() noexcept { joining_ = false; }
  bool joining() const { return joining_; }
  // Ranks that had data in the last joined iteration (world size outside Join).
  int activeRanks() const { return activeRanks_; }

  const std::shared_ptr<ag::nn::Module>& module() const { return module_; }
  ProcessGroup& processGroup() const { return *pg_; }
  const Reducer& reducer() const { return *reducer_; }
  const DdpOptions& options() const { return options_; }

 private:
  void checkSameParametersEverywhere();
  void broadcastState(bool buffersOnly, int root = 0);
  // One round of the join agreement: every rank's flag (0 out of data, 1 training without
  // sync, 2 training with sync), all-reduced; returns them.
  std::vector<int32_t> joinAgree(int32_t mine);

  std::shared_ptr<ag::nn::Module> module_;
  std::shared_ptr<ProcessGroup> pg_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
  bool joining_ = false;
  JoinOptions joinOptions_;
  int activeRanks_ = 0;
  int lastAuthoritative_ = -1;  // highest rank that had data in the last round where any had
};

// Broadcasts `tensors` (any dtype) from `root`, in order, waiting for each.
void broadcastTensors(ProcessGroup& pg, ag::nn::NamedTensors& tensors, int root = 0);

}  // namespace loom::ddp
