// Distributed evaluation helpers. Collective: every rank calls them in the same order.
#pragma once

#include <cstdint>

#include "loom/autograd/tensor.h"
#include "loom/process_group/process_group.h"

namespace loom::ddp {

// The mean of `value` over the ranks of pg (the same double on every rank).
double reduceMean(ProcessGroup& pg, double value);
// Element-wise mean over ranks of a float32, float64, bfloat16 or float16 tensor, in place.
// An integer tensor is an InvalidArgumentError.
void reduceMeanInPlace(ProcessGroup& pg, ag::Tensor& tensor);

// local: this rank's results for the indices of a SequentialDistributedSampler(datasetSize,
// pg.size(), pg.rank()), shape [numSamples, ...] (float32, float64 or int64, the same shape
// on every rank). Returns every rank's results in dataset order, [datasetSize, ...], the
// padding removed, on every rank.
ag::Tensor gatherInOrder(ProcessGroup& pg, const ag::Tensor& local, int64_t datasetSize);

}  // namespace loom::ddp
