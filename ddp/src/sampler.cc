#include "loom/ddp/sampler.h"

#include <numeric>

#include "loom/autograd/tensor.h"
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
  std::vector<int64_t> all(size_);
  std::iota(all.begin(), all.end(), 0);
  if (shuffle_) {
    ag::Generator gen(seed_ + static_cast<uint64_t>(epoch_));
    for (int64_t i = size_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(gen.nextU64() % static_cast<uint64_t>(i + 1));
      std::swap(all[i], all[j]);
    }
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
