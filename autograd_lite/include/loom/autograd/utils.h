// Training utilities: gradient-norm clipping and gradient accumulation over micro-batches.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "loom/autograd/tensor.h"

namespace loom::ag {

// torch.nn.utils.clip_grad_norm_: the norm of all the gradients together (as if concatenated
// into one vector; normType 2 = Euclidean, infinity = max |g|, any p > 0), computed in double;
// when it exceeds maxNorm every gradient is scaled in place by maxNorm / (norm + 1e-6).
// Parameters without a gradient are skipped. Returns the total norm before clipping (0 when
// no parameter has a gradient). A non-finite total norm throws std::runtime_error when
// errorIfNonfinite, else the gradients are scaled by a NaN factor as PyTorch 1.13 does.
double clipGradNorm(const std::vector<Tensor>& params, double maxNorm, double normType = 2.0,
                    bool errorIfNonfinite = false);

// Gradient accumulation: `steps` micro-batches per optimizer step, each loss scaled by
// 1 / steps so the accumulated gradient is the mean over the micro-batches (the gradient of
// the loss on their union when they have equal size).
//
//   GradAccumulation acc(4);
//   for (batch : data) {
//     acc.scale(loss(batch)).backward();
//     if (acc.next()) { opt.step(); opt.zeroGrad(); }
//   }
//
// Under DDP, `acc.syncNext()` tells whether the coming backward completes a group (run the
// others under no_sync).
class GradAccumulation {
 public:
  explicit GradAccumulation(int64_t steps);
  int64_t steps() const { return steps_; }
  // loss / steps (recorded, so backward flows through it).
  Tensor scale(const Tensor& loss) const;
  // Counts one micro-batch; true when it completed a group (time for the optimizer step).
  bool next();
  // Whether the micro-batch about to run is the last of its group.
  bool syncNext() const { return count_ + 1 == steps_; }
  // Micro-batches counted in the current group.
  int64_t pending() const { return count_; }

 private:
  int64_t steps_;
  int64_t count_ = 0;
};

}  // namespace loom::ag
