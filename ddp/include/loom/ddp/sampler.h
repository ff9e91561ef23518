// Samplers: which dataset indices each rank trains or evaluates on.
//
// DistributedSampler(size, numReplicas, rank, shuffle, seed, dropLast) splits indices as
// torch.utils.data.DistributedSampler does. Without shuffle the split is exactly PyTorch's:
// with dropLast the tail that does not divide evenly is dropped, otherwise the index list is
// padded by wrapping around to its start until it divides; rank r then takes every
// numReplicas-th index starting at r. With shuffle, the index list is first permuted exactly as
// PyTorch's sampler permutes it (torch.randperm(size) with a CPU generator seeded seed + epoch,
// see torchRandperm), so a job moved between PyTorch and Loom sees the same data order: the
// same on every rank for a given seed and epoch, different per epoch (call setEpoch).
//
// SequentialDistributedSampler gives each rank a contiguous block (the last rank's block is
// padded by repeating the final index) for evaluation; gatherInOrder (eval.h) puts the
// results back in dataset order without the padding.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::ddp {

// torch.randperm(n, generator=g) on the CPU after g.manual_seed(seed), bit for bit as torch 1.13
// computes it: a mt19937 seeded with the low 32 bits of seed, then for i in [0, n-1) swap
// element i with element i + (next 32-bit output % (n - i)). (Torch 2.x switched to another
// algorithm for n >= 2^32 / 20; below that size both agree with this one.) n must be >= 0.
std::vector<int64_t> torchRandperm(int64_t n, uint64_t seed);

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
