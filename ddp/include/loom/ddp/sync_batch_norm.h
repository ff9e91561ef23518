// SyncBatchNorm: BatchNorm1d whose batch statistics span every rank of a process group.
//
// How it works (x: [N, C] on each rank, M = the sum of N over ranks)
// - Forward in training: each rank sums x and x^2 per channel; one all-reduce (float64) gives
//   the global mean and biased variance, with which every rank normalizes its own rows:
//   xhat = (x - mean) / sqrt(var + eps), y = weight * xhat + bias. The running statistics are
//   updated as BatchNorm1d does, with the global mean and the unbiased global variance
//   (var * M / (M - 1)).
// - Backward: each rank sums dy and dy * xhat per channel; one all-reduce gives the global sums,
//   and dx = weight / sqrt(var + eps) * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M), the
//   gradient of the normalization over the concatenated batch. dweight and dbias stay local
//   sums, which DDP then averages, as in PyTorch.
// - Eval (or trackRunningStats off in eval): plain batch norm with the running statistics,
//   no communication.
// Collective: every rank runs forward and backward of its SyncBatchNorm layers in the same
// order. Parameter and buffer names are BatchNorm1d's, so state dicts interchange.
#pragma once

#include <memory>

#include "loom/autograd/nn.h"
#include "loom/process_group/process_group.h"

namespace loom::ddp {

class SyncBatchNorm : public ag::nn::Module {
 public:
  SyncBatchNorm(int64_t numFeatures, std::shared_ptr<ProcessGroup> pg,
                const ag::nn::BatchNorm1dOptions& options = {});
  ag::Tensor forward(const ag::Tensor& input) override;
  std::string describe() const override;
  int64_t numFeatures() const { return numFeatures_; }
  ag::Tensor& weight() { return weight_; }
  ag::Tensor& bias() { return bias_; }
  ag::Tensor& runningMean() { return runningMean_; }
  ag::Tensor& runningVar() { return runningVar_; }
  ag::Tensor& numBatchesTracked() { return numBatchesTracked_; }

 private:
  int64_t numFeatures_;
  std::shared_ptr<ProcessGroup> pg_;
  ag::nn::BatchNorm1dOptions options_;
  ag::Tensor weight_, bias_, runningMean_, runningVar_, numBatchesTracked_;
};

// Replaces every BatchNorm1d in the tree (the root included) with a SyncBatchNorm over pg,
// copying its parameters and buffers; returns the (possibly new) root. Call before wrapping
// the model in DistributedDataParallel and before creating the optimizer.
std::shared_ptr<ag::nn::Module> convertSyncBatchNorm(std::shared_ptr<ag::nn::Module> module,
                                                     std::shared_ptr<ProcessGroup> pg);

}  // namespace loom::ddp
