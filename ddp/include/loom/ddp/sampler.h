// Samplers: which dataset indices each rank trains or evaluates on.
//
// DistributedSampler(size, numReplicas, rank, shuffle, seed, dropLast) splits indices as
// torch.utils.data.DistributedSampler does. Without shuffle the split is exactly PyTorch's:
// with dropLast the tail that does not divide evenly is dropped, otherwise the index list is
// padded by wrapping around to its start until it divides; rank r then takes every
// numReplicas-th index starting at r. With shuffle, the permutation is Loom's own (a
// Fisher-Yates shuffle driven by ag::Generator seeded with seed + epoch): the same on every
// rank for a given seed and epoch, different per epoch (call setEpoch), but not the
// permutation torch.randperm would give.
//
// SequentialDistributedSampler gives each rank a contiguous block (the last rank's block is
// padded by repeating the final index) for evaluation; gatherInOrder (eval.h) puts the
// results back in dataset order without the padding.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::ddp {

class DistributedSampler {
 public:
  DistributedSampler(int64_t size, int numReplicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool dropLast = false);
  void setEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch.
  std::vector<int64_t> indices() const;
  int64_t numSamples() const { return numSamples_; }  // per rank
  int64_t totalSize() const { return totalSize_; }

 private:
  int64_t size_;
  int numReplicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool dropLast_;
  int64_t epoch_ = 0;
  int64_t numSamples_ = 0, totalSize_ = 0;
};

class SequentialDistributedSampler {
 public:
  SequentialDistributedSampler(int64_t size, int numReplicas, int rank);
  std::vector<int64_t> indices() const;
  int64_t numSamples() const { return numSamples_; }

 private:
  int64_t size_;
  int numReplicas_, rank_;
  int64_t numSamples_;
};

}  // namespace loom::ddp
