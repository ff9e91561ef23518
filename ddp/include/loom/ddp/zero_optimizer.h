// ZeroRedundancyOptimizer: ZeRO stage 1, the optimizer state sharded over the ranks of a group.
//
// How it works (N: the model's parameter count; shard = ceil(N / world) floats)
// - The parameters (float32, the same names and shapes on every rank; construction checks the
//   count and broadcasts them from rank 0) are seen as one flat vector of N floats, padded
//   with zeros to world * shard. Rank r owns the slice [r * shard, (r + 1) * shard): a flat
//   float32 tensor that is the only parameter of its local optimizer (made by the factory:
//   SGD, Adam, ...), so momentum buffers or Adam moments exist for that slice only.
// - step() (collective, after a backward that left this rank's local gradients in grad(),
//   e.g. under ddp.noSync() or without DDP): the gradients are packed into the flat vector
//   (an undefined grad() counts as zeros), reduce-scattered with ReduceOp::kAvg so that rank r
//   gets the average of its slice, the local optimizer steps the slice, and the slices are
//   all-gathered and unpacked into every parameter. Elementwise optimizers (SGD, Adam, AdamW)
//   then end every step with the parameters plain DDP would have.
// - The flat vector lives in a Loom Window (ZeroOptions::windowBuffer, default on), as DDP's
//   buckets do, so that over shared memory the reduce-scatter reads every rank's gradients in
//   place and the all-gather (in place: this rank's slice is written into the flat vector
//   first) reads every rank's slice in place, with no staging copies. Where no window can be
//   made, ordinary memory and one warning.
// - stateBytes(): the bytes of this rank's optimizer state (its state dict's tensors).
// - Checkpoints (checkpoint.h overloads): consolidatedStateDict() gathers the slices to rank 0
//   (entries of the local optimizer's state dict named as they are, sharded ones as full
//   [N] float32 tensors, replicated ones such as step counts and hyper-parameters from rank 0);
//   loadConsolidatedStateDict() takes this rank's slice, so a checkpoint saved at one world size
//   loads at another.
// Thread-safety: one training thread; every rank calls step() and the collective methods in
// the same order. The parameters' storage must outlive the optimizer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/autograd/nn.h"
#include "loom/autograd/optim.h"
#include "loom/process_group/process_group.h"

namespace loom::ddp {

struct ZeroOptions {
  // The flat gradient and parameter vector in a Loom Window (zero-copy over shared memory);
  // false: an ordinary array.
  bool windowBuffer = true;
};

class ZeroRedundancyOptimizer {
 public:
  using OptimizerFactory =
      std::function<std::unique_ptr<ag::optim::Optimizer>(std::vector<ag::Tensor>)>;
  ZeroRedundancyOptimizer(ag::nn::NamedTensors parameters, std::shared_ptr<ProcessGroup> pg,
                          OptimizerFactory factory, ZeroOptions options = {});

  void step();
  void zeroGrad();

  int64_t numel() const { return numel_; }      // N
  int64_t shardSize() const { return shard_; }  // floats this rank owns (padding included)
  size_t stateBytes() const;
  ag::optim::Optimizer& localOptimizer() { return *local_; }

  // Collective. Every rank gets the whole dict (rank 0's is what a checkpoint writes).
  ag::nn::NamedTensors consolidatedStateDict();
  // Not collective: every rank passes the same consolidated dict.
  void loadConsolidatedStateDict(const ag::nn::NamedTensors& state);

 private:
  void packSlice();
  bool isSharded(const ag::Tensor& t) const;

  ag::nn::NamedTensors params_;
  std::shared_ptr<ProcessGroup> pg_;
  int64_t numel_ = 0, shard_ = 0;
  // The flat vector: world * shard floats (gradients, then gathered parameters).
  float* flat() const { return flat_.get(); }
  size_t flatCount() const { return flatCount_; }

  std::shared_ptr<float> flat_;  // a Window's memory or an array (ZeroOptions::windowBuffer)
  size_t flatCount_ = 0;
  ag::Tensor slice_;  // [shard] this rank's parameters, the local optimizer's one param
  std::unique_ptr<ag::optim::Optimizer> local_;
};

}  // namespace loom::ddp
