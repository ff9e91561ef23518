// GradScaler (grad_scaler.h): PyTorch's amp loss-scaling state machine.
#include "loom/autograd/grad_scaler.h"

#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

#include "loom/autograd/ops.h"

namespace loom::ag::optim {

namespace {

// g *= invScale in place; returns whether any element of g is inf or NaN (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_: multiplies every gradient, checks them all).
template <class T>
bool unscaleInPlace(Tensor& g, float invScale) {
  T* p = g.data<T>();
  const int64_t n = g.numel();
  bool nonFinite = false;
  for (int64_t i = 0; i < n; ++i) {
    nonFinite |= !std::isfinite(p[i]);
    p[i] = static_cast<T>(p[i] * static_cast<T>(invScale));
  }
  return nonFinite;
}

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(static_cast<float>(options.initScale)) {
  if (!(options.initScale > 0) || !std::isfinite(scale_)) {
    throw std::invalid_argument(
        "GradScaler: initScale must be positive and finite in float32, got " +
        std::to_string(options.initScale));
  }
  if (!(options.growthFactor > 1.0)) {
    throw std::invalid_argument("GradScaler: the growth factor must be > 1, got " +
                                std::to_string(options.growthFactor));
  }
  if (!(options.backoffFactor < 1.0 && options.backoffFactor > 0.0)) {
    throw std::invalid_argument("GradScaler: the backoff factor must be in (0, 1), got " +
                                std::to_string(options.backoffFactor));
  }
  if (options.growthInterval < 1) {
    throw std::invalid_argument("GradScaler: growthInterval must be >= 1, got " +
                                std::to_string(options.growthInterval));
  }
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!loss.defined()) throw std::invalid_argument("GradScaler::scale: loss is undefined");
  if (!options_.enabled) return loss;
  return loss * static_cast<double>(scale_);
}

void GradScaler::unscale(Optimizer& optimizer) {
  if (!options_.enabled) return;
  PerOptimizer& st = perOptimizer_[&optimizer];
  if (st.stage == Stage::kUnscaled) {
    throw std::logic_error(
        "GradScaler::unscale: unscale() has already been called on this optimizer since the "
        "last update()");
  }
  if (st.stage == Stage::kStepped) {
    throw std::logic_error("GradScaler::unscale: unscale() is being called after step()");
  }
  const float invScale = static_cast<float>(1.0 / static_cast<double>(scale_));
  bool foundInf = false;
  const std::vector<Tensor>& params = optimizer.params();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    switch (g.dtype()) {
      case DType::kFloat32:
        foundInf |= unscaleInPlace<float>(g, invScale);
        break;
      case DType::kFloat64:
        foundInf |= unscaleInPlace<double>(g, invScale);
        break;
      case DType::kInt64:
      case DType::kBFloat16:
      case DType::kFloat16:
        throw std::invalid_argument(
            "GradScaler::unscale: parameter " + std::to_string(i) + " has a " +
            dtypeName(g.dtype()) +
            " gradient; unscaling needs float32 or float64 (master) parameters");
    }
  }
  st.foundInf = foundInf;
  st.stage = Stage::kUnscaled;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  PerOptimizer& st = perOptimizer_[&optimizer];
  if (st.stage == Stage::kStepped) {
    throw std::logic_error(
        "GradScaler::step: step() has already been called since the last update()");
  }
  if (st.stage == Stage::kReady) unscale(optimizer);
  const bool stepped = !*st.foundInf;
  if (stepped) optimizer.step();
  st.stage = Stage::kStepped;
  return stepped;
}

void GradScaler::update(std::optional<double> newScale) {
  if (!options_.enabled) return;
  if (newScale) {
    if (!(*newScale > 0) || !std::isfinite(static_cast<float>(*newScale))) {
      throw std::invalid_argument("GradScaler::update: newScale must be positive and finite, got " +
                                  std::to_string(*newScale));
    }
    scale_ = static_cast<float>(*newScale);
  } else {
    bool anyRecorded = false, foundInf = false;
    for (const auto& [opt, st] : perOptimizer_) {
      if (st.foundInf) {
        anyRecorded = true;
        foundInf |= *st.foundInf;
      }
    }
    if (!anyRecorded) {
      throw std::logic_error("GradScaler::update: no inf checks were recorded prior to update()");
    }
    // PyTorch's _amp_update_scale_.
    if (foundInf) {
      scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoffFactor);
      growthTracker_ = 0;
    } else {
      const int64_t successful = growthTracker_ + 1;
      if (successful == options_.growthInterval) {
        const float grown = static_cast<float>(static_cast<double>(scale_) * options_.growthFactor);
        if (std::isfinite(grown)) scale_ = grown;
        growthTracker_ = 0;
      } else {
        growthTracker_ = successful;
      }
    }
  }
  perOptimizer_.clear();
}

double GradScaler::scaleValue() const {
  return options_.enabled ? static_cast<double>(scale_) : 1.0;
}

nn::NamedTensors GradScaler::stateDict() const {
  nn::NamedTensors out;
  if (!options_.enabled) return out;  // PyTorch: an empty dict when disabled
  out.emplace_back("scale", scalarTensor(static_cast<double>(scale_), DType::kFloat64));
  out.emplace_back("growth_factor", scalarTensor(options_.growthFactor, DType::kFloat64));
  out.emplace_back("backoff_factor", scalarTensor(options_.backoffFactor, DType::kFloat64));
  out.emplace_back("growth_interval",
                   scalarTensor(static_cast<double>(options_.growthInterval), DType::kInt64));
  out.emplace_back("_growth_tracker",
                   scalarTensor(static_cast<double>(growthTracker_), DType::kInt64));
  return out;
}

void GradScaler::loadStateDict(const nn::NamedTensors& state) {
  if (!options_.enabled) {
    throw std::logic_error(
        "GradScaler::loadStateDict: this instance is disabled; it has no state to load into");
  }
  if (state.empty()) {
    throw std::invalid_argument(
        "GradScaler::loadStateDict: the source state dict is empty, possibly because it was "
        "saved from a disabled GradScaler");
  }
  std::map<std::string, Tensor> byName;
  for (const auto& [name, t] : state) {
    if (!byName.emplace(name, t).second) {
      throw std::invalid_argument("GradScaler::loadStateDict: duplicated entry '" + name + "'");
    }
  }
  auto get = [&](const std::string& name, DType dtype) {
    auto it = byName.find(name);
    if (it == byName.end()) {
      throw std::invalid_argument("GradScaler::loadStateDict: missing entry '" + name + "'");
    }
    const Tensor& t = it->second;
    if (!t.defined() || t.dtype() != dtype || t.dim() != 0) {
      throw std::invalid_argument("GradScaler::loadStateDict: entry '" + name + "' must be a 0-d " +
                                  dtypeName(dtype) + " tensor");
    }
    const double value = t.item();  // before the erase: t refers into the map's node
    byName.erase(it);
    return value;
  };
  GradScalerOptions o = options_;
  const double scale = get("scale", DType::kFloat64);
  o.growthFactor = get("growth_factor", DType::kFloat64);
  o.backoffFactor = get("backoff_factor", DType::kFloat64);
  o.growthInterval = static_cast<int64_t>(get("growth_interval", DType::kInt64));
  const auto tracker = static_cast<int64_t>(get("_growth_tracker", DType::kInt64));
  if (!byName.empty()) {
    throw std::invalid_argument("GradScaler::loadStateDict: unexpected entry '" +
                                byName.begin()->first + "'");
  }
  o.initScale = scale;
  if (tracker < 0) {
    throw std::invalid_argument("GradScaler::loadStateDict: _growth_tracker must be >= 0, got " +
                                std::to_string(tracker));
  }
  GradScaler checked(o);  // validates the values as the constructor does
  options_ = o;
  scale_ = checked.scale_;
  growthTracker_ = tracker;
}

}  // namespace loom::ag::optim
