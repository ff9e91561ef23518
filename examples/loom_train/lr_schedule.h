// loom-train's --lr-schedule: "none", "step:SIZE:GAMMA" (StepLR) or "cosine:TMAX[:ETA_MIN]"
// (CosineAnnealingLR), stepped once per optimizer step.
#pragma once

#include <memory>
#include <string>

#include "loom/autograd/optim.h"

namespace loom::train {

// The scheduler `spec` names over `optimizer`, or null for "none"; a malformed spec is an
// InvalidArgumentError quoting it and the accepted forms.
std::unique_ptr<ag::optim::LRScheduler> makeScheduler(const std::string& spec,
                                                      ag::optim::Optimizer& optimizer);

}  // namespace loom::train
