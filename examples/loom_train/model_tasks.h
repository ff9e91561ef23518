// Private to loom-train's models: the per-model factories and the shared evaluation loop.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "models.h"

namespace loom::train {

std::unique_ptr<Task> makeGptTask(const ModelArgs& args, uint64_t seed);
std::unique_ptr<Task> makeCnnTask(const ModelArgs& args, uint64_t seed);

// Splits `items` validation rows over pg's ranks (SequentialDistributedSampler), calls
// score(rows, out) on this rank's rows in chunks of `batch`, where score writes (loss, correct)
// for each row into out[2 * i], out[2 * i + 1]; gathers every rank's scores in order and returns
// the means (accuracy: the mean of `correct`). Collective.
EvalResult evaluateSplit(ProcessGroup& pg, int64_t items, int64_t batch,
                         const std::function<void(const std::vector<int64_t>&, double*)>& score);

// Per row of logits [rows, classes] (float32) and targets [rows] (int64): -log softmax[target],
// and 1 if the target is the argmax.
void scoreRows(const float* logits, const int64_t* targets, int64_t rows, int64_t classes,
               double* loss, double* correct);

}  // namespace loom::train
