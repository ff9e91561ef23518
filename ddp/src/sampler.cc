#include "loom/ddp/sampler.h"

#include <numeric>
#include <random>
#include <utility>

#include "loom/common/error.h"

namespace loom::ddp {

namespace {

void checkSplit(int64_t size, int numReplicas, int rank, const char* what) {
  LOOM_CHECK(size >= 0, what, ": dataset size must be >= 0, got ", size);
  LOOM_CHECK(numReplicas >= 1, what, ": numReplicas must be >= 1, got ", numReplicas);
  LOOM_CHECK(rank >= 0 && rank < numReplicas, what, ": rank must be in [0, ", numReplicas,
             "), got ", rank);
}

}  // namespace

// std::mt19937 is specified bit for bit by the C++ standard and is the engine behind torch's
// CPUGeneratorImpl (whose seeding keeps the low 32 bits; random() is one 32-bit output).
std::vector<int64_t> torchRandperm(int64_t n, uint64_t seed) {
  LOOM_CHECK(n >= 0, "torchRandperm: n must be >= 0, got ", n);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 engine(static_cast<uint32_t>(seed & 0xffffffffu));
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int64_t z = static_cast<int64_t>(engine()) % (n - i);
    std::swap(perm[i], perm[i + z]);
  }
  return perm;
}

DistributedSampler::DistributedSampler(int64_t size, int numReplicas, int rank, bool shuffle,
                                       uint64_t seed, bool dropLast)
    : size_(size),
      numReplicas_(numReplicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      dropLast_(dropLast) {
  checkSplit(size, numReplicas, rank, "DistributedSampler");
  if (dropLast_ && size_ % numReplicas_ != 0) {
    numSamples_ = (size_ - numReplicas_ + numReplicas_ - 1) / numReplicas_;  // ceil
    if (numSamples_ < 0) numSamples_ = 0;
  } else {
    numSamples_ = (size_ + numReplicas_ - 1) / numReplicas_;
  }
  totalSize_ = numSamples_ * numReplicas_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (shuffle_) {
    all = torchRandperm(size_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    all.resize(static_cast<size_t>(size_));
    std::iota(all.begin(), all.end(), 0);
  }
  if (!dropLast_) {
    // Wrap around (repeatedly, when the padding is longer than the list).
    const int64_t original = static_cast<int64_t>(all.size());
    for (int64_t i = 0; static_cast<int64_t>(all.size()) < totalSize_ && original > 0; ++i) {
      all.push_back(all[i % original]);
    }
  } else {
    all.resize(totalSize_);
  }
  std::vector<int64_t> mine;
  mine.reserve(numSamples_);
  for (int64_t i = rank_; i < totalSize_; i += numReplicas_) mine.push_back(all[i]);
  return mine;
}

SequentialDistributedSampler::SequentialDistributedSampler(int64_t size, int numReplicas, int rank)
    : size_(size), numReplicas_(numReplicas), rank_(rank) {
  checkSplit(size, numReplicas, rank, "SequentialDistributedSampler");
  numSamples_ = (size_ + numReplicas_ - 1) / numReplicas_;
}

std::vector<int64_t> SequentialDistributedSampler::indices() const {
  std::vector<int64_t> mine;
  if (size_ == 0) return mine;
  for (int64_t i = 0; i < numSamples_; ++i) {
    mine.push_back(std::min(rank_ * numSamples_ + i, size_ - 1));
  }
  return mine;
}

}  // namespace loom::ddp
