// optim: SGD and Adam/AdamW with PyTorch's update rules, and learning-rate schedules.
//
// An optimizer holds handles to the parameters it was given and updates their storage in
// place in step(), outside autograd. Parameters whose grad() is undefined are skipped (as in
// PyTorch). State (momentum buffers, Adam moments, step counts) is per parameter, created
// lazily at the first step that parameter has a gradient. float32 and float64 parameters.
//
// State dicts (stateDict / loadStateDict), named after PyTorch's optimizer state_dict with
// parameters by index in the order the optimizer was given them (one parameter group, "0"):
//   state.<i>.momentum_buffer                           SGD with momentum, same shape/dtype as p_i
//   state.<i>.exp_avg, state.<i>.exp_avg_sq             Adam/AdamW, same shape/dtype as p_i
//   state.<i>.step                                      Adam/AdamW, int64 scalar (0-d)
//   param_groups.0.num_params                           int64 scalar
//   param_groups.0.lr, .momentum, .dampening, .weight_decay        float64 scalars (SGD)
//   param_groups.0.nesterov                             int64 scalar 0/1 (SGD)
//   param_groups.0.lr, .beta1, .beta2, .eps, .weight_decay          float64 scalars (Adam)
//   param_groups.0.decoupled_weight_decay               int64 scalar 0/1 (Adam: 0, AdamW: 1)
// State that was not created yet (no step with a gradient for that parameter) has no entries;
// loading such a dict leaves that parameter's state uncreated, so it is created at its next
// step exactly as in an uninterrupted run. stateDict returns copies. loadStateDict overwrites
// the state and the hyper-parameters (as PyTorch does), after checking every entry: a missing,
// unexpected, duplicated, wrong-shaped or wrong-dtype entry, or a bad value, throws
// std::invalid_argument naming the entry and what was expected, and leaves the optimizer as it
// was.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/autograd/nn.h"
#include "loom/autograd/tensor.h"

namespace loom::ag::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zeroGrad(bool setToNone = false);
  double lr() const { return lr_; }
  void setLr(double lr) { lr_ = lr; }
  const std::vector<Tensor>& params() const { return params_; }
  // See the top of this file for the names.
  virtual nn::NamedTensors stateDict() const = 0;
  virtual void loadStateDict(const nn::NamedTensors& state) = 0;

 protected:
  std::vector<Tensor> params_;
  double lr_;
};

struct SGDOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  double weightDecay = 0.0;
  bool nesterov = false;
};

// g = grad + weightDecay * p; with momentum: buf = g at the first step, then
// buf = momentum * buf + (1 - dampening) * g, and g = nesterov ? g + momentum * buf : buf;
// p -= lr * g.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double lr, const SGDOptions& options = {});
  void step() override;
  nn::NamedTensors stateDict() const override;
  void loadStateDict(const nn::NamedTensors& state) override;
  const SGDOptions& options() const { return options_; }

 private:
  SGDOptions options_;
  std::vector<Tensor> momentumBuffers_;
};

struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.0;
};

// Adam (weight decay added to the gradient) or, with decoupled = true, AdamW (p *= 1 - lr *
// weightDecay first). t = step count; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, double lr = 1e-3, const AdamOptions& options = {},
       bool decoupled = false);
  void step() override;
  nn::NamedTensors stateDict() const override;
  void loadStateDict(const nn::NamedTensors& state) override;
  const AdamOptions& options() const { return options_; }
  bool decoupled() const { return decoupled_; }

 private:
  AdamOptions options_;
  bool decoupled_;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> steps_;
};

// AdamW: PyTorch's defaults (weight decay 0.01).
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, double lr = 1e-3,
        const AdamOptions& options = {0.9, 0.999, 1e-8, 0.01})
      : Adam(std::move(params), lr, options, true) {}
};

// Schedulers set the optimizer's lr from the epoch count; call step() once per epoch (or
// per iteration, as you define it), after optimizer.step().
class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  void step();
  int64_t epoch() const { return epoch_; }
  double baseLr() const { return baseLr_; }
  // The lr for a given epoch.
  virtual double lrAt(int64_t epoch) const = 0;

 protected:
  Optimizer& optimizer_;
  double baseLr_;
  int64_t epoch_ = 0;
};

// lr = base * gamma^(epoch / stepSize) (integer division), as torch.optim.lr_scheduler.StepLR.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t stepSize, double gamma = 0.1);
  double lrAt(int64_t epoch) const override;

 private:
  int64_t stepSize_;
  double gamma_;
};

// lr = etaMin + (base - etaMin) (1 + cos(pi epoch / tMax)) / 2, the closed form of
// torch.optim.lr_scheduler.CosineAnnealingLR (for epoch <= tMax; beyond it the cosine
// continues, as PyTorch's closed form does).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t tMax, double etaMin = 0.0);
  double lrAt(int64_t epoch) const override;

 private:
  int64_t tMax_;
  double etaMin_;
};

}  // namespace loom::ag::optim
