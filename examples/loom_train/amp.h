// loom-train --amp: mixed precision. bf16 runs the training forward pass and loss under
// autocast to bfloat16 (the evaluation stays float32); fp16 under autocast to float16, with a
// GradScaler (dynamic loss scaling) stepping the optimizer. Both keep float32 master weights,
// gradients and optimizer state (loom/autograd/autocast.h, grad_scaler.h).
#pragma once

#include <optional>
#include <string>

#include "loom/autograd/grad_scaler.h"
#include "loom/autograd/optim.h"
#include "loom/autograd/tensor.h"

namespace loom::train {

// The autocast dtype of an --amp value: nullopt for "none", bfloat16, float16.
std::optional<ag::DType> ampDType(const std::string& amp);

// The optimizer as checkpoints and shrink snapshots see it under --amp fp16: the optimizer's
// state dict followed by the scaler's, under "grad_scaler." + PyTorch's key (scale,
// growth_factor, backoff_factor, growth_interval, _growth_tracker), so that one file (one
// atomic write) holds both and --resume continues the loss scale where the run left it.
// loadStateDict checks both parts before changing either; a state without the scaler's entries
// (a checkpoint of a run without --amp fp16) is refused, naming them. step() is not for use:
// the scaler steps the optimizer (GradScaler::step).
class ScaledOptimizerState : public ag::optim::Optimizer {
 public:
  ScaledOptimizerState(ag::optim::Optimizer& optimizer, ag::optim::GradScaler& scaler);
  void step() override;
  ag::nn::NamedTensors stateDict() const override;
  void loadStateDict(const ag::nn::NamedTensors& state) override;

  static constexpr const char* kPrefix = "grad_scaler.";

 private:
  ag::optim::Optimizer& optimizer_;
  ag::optim::GradScaler& scaler_;
};

}  // namespace loom::train
