// GradScaler: dynamic loss scaling for float16 mixed precision, with the semantics of
// torch.cuda.amp.GradScaler (PyTorch 1.13).
//
// How it works
// - scale(loss) returns loss * scale (differentiable), so float16 activations' gradients stay
//   above float16's underflow; the float32 master gradients then hold scale * the true ones.
// - unscale(optimizer) multiplies every gradient of that optimizer's parameters by 1 / scale
//   (the reciprocal taken in float64 and rounded to float32, as PyTorch does) and records
//   whether any gradient held an inf or NaN. At most once per optimizer between update()s; call
//   it yourself before clipGradNorm, otherwise step() calls it.
// - step(optimizer) unscales if needed, then runs optimizer.step() only when that optimizer's
//   gradients were all finite; returns whether it stepped. At most once per optimizer between
//   update()s.
// - update() (once per iteration, after the steps) adjusts the scale from the inf checks of all
//   optimizers stepped since the last update: any inf/NaN: scale *= backoffFactor and the
//   growth tracker resets; otherwise the tracker counts one more clean step, and when it
//   reaches growthInterval, scale *= growthFactor (kept only if finite) and the tracker resets.
//   The scale is a float32 value (products taken in float64, then rounded), as PyTorch keeps
//   it. update(newScale) sets the scale directly instead. Either way the per-optimizer records
//   are cleared.
// - Disabled (enabled = false): scale() returns the loss, step() just steps, unscale/update do
//   nothing.
// - stateDict(): "scale", "growth_factor", "backoff_factor" (float64 0-d), "growth_interval",
//   "_growth_tracker" (int64 0-d): PyTorch's keys. loadStateDict checks every entry (missing,
//   unexpected, wrong dtype/shape or value) before changing anything.
// Misuse (unscale twice, unscale after step, step twice, update with no inf check recorded, a
// non-float32/64 gradient) throws std::logic_error / std::invalid_argument with PyTorch's
// wording. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "loom/autograd/nn.h"
#include "loom/autograd/optim.h"
#include "loom/autograd/tensor.h"

namespace loom::ag::optim {

struct GradScalerOptions {
  double initScale = 65536.0;  // 2^16
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  Tensor scale(const Tensor& loss) const;
  void unscale(Optimizer& optimizer);
  bool step(Optimizer& optimizer);
  void update(std::optional<double> newScale = std::nullopt);

  // The current scale (1.0 when disabled, as PyTorch's get_scale).
  double scaleValue() const;
  int64_t growthTracker() const { return growthTracker_; }
  bool isEnabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  nn::NamedTensors stateDict() const;
  void loadStateDict(const nn::NamedTensors& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    std::optional<bool> foundInf;  // set by unscale
  };

  GradScalerOptions options_;
  float scale_;
  int64_t growthTracker_ = 0;
  std::map<const Optimizer*, PerOptimizer> perOptimizer_;
};

}  // namespace loom::ag::optim
