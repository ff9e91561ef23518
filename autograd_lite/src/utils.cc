#include "loom/autograd/utils.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"

namespace loom::ag {

namespace {

template <class T>
void normPart(const Tensor& g, double p, double& acc) {
  const T* d = g.data<T>();
  const int64_t n = g.numel();
  if (std::isinf(p)) {
    for (int64_t i = 0; i < n; ++i) acc = std::max(acc, std::abs(static_cast<double>(d[i])));
  } else if (p == 2.0) {
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(d[i]) * d[i];
  } else {
    for (int64_t i = 0; i < n; ++i) acc += std::pow(std::abs(static_cast<double>(d[i])), p);
  }
}

template <class T>
void scaleInPlace(Tensor g, double factor) {
  T* d = g.data<T>();
  const T f = static_cast<T>(factor);
  for (int64_t i = 0; i < g.numel(); ++i) d[i] *= f;
}

}  // namespace

double clipGradNorm(const std::vector<Tensor>& params, double maxNorm, double normType,
                    bool errorIfNonfinite) {
  if (!(normType > 0)) {
    throw std::invalid_argument("clipGradNorm: normType must be > 0 (or infinity), got " +
                                std::to_string(normType));
  }
  if (!(maxNorm >= 0)) {
    throw std::invalid_argument("clipGradNorm: maxNorm must be >= 0, got " +
                                std::to_string(maxNorm));
  }
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined()) {
      throw std::invalid_argument("clipGradNorm: parameter " + std::to_string(i) + " is undefined");
    }
    Tensor g = params[i].grad();
    if (g.defined()) grads.push_back(g);
  }
  if (grads.empty()) return 0.0;
  double acc = 0;
  for (const Tensor& g : grads) {
    if (g.dtype() == DType::kFloat32) {
      normPart<float>(g, normType, acc);
    } else if (g.dtype() == DType::kFloat64) {
      normPart<double>(g, normType, acc);
    } else {
      throw std::invalid_argument(std::string("clipGradNorm: gradients must be float32 or ") +
                                  "float64, got " + dtypeName(g.dtype()));
    }
  }
  const double total = std::isinf(normType) ? acc
                       : normType == 2.0    ? std::sqrt(acc)
                                            : std::pow(acc, 1.0 / normType);
  if (errorIfNonfinite && !std::isfinite(total)) {
    throw std::runtime_error("clipGradNorm: the total norm of order " + std::to_string(normType) +
                             " of the gradients is non-finite (" + std::to_string(total) +
                             "), so it cannot be clipped");
  }
  const double coef = maxNorm / (total + 1e-6);
  if (coef < 1.0 || std::isnan(coef)) {
    for (Tensor& g : grads) {
      if (g.dtype() == DType::kFloat32) {
        scaleInPlace<float>(g, coef);
      } else {
        scaleInPlace<double>(g, coef);
      }
    }
  }
  return total;
}

GradAccumulation::GradAccumulation(int64_t steps) : steps_(steps) {
  if (steps < 1) {
    throw std::invalid_argument("GradAccumulation: steps must be >= 1, got " +
                                std::to_string(steps));
  }
}

Tensor GradAccumulation::scale(const Tensor& loss) const {
  if (!loss.defined()) throw std::invalid_argument("GradAccumulation::scale: loss is undefined");
  return steps_ == 1 ? loss : loss * (1.0 / static_cast<double>(steps_));
}

bool GradAccumulation::next() {
  if (++count_ < steps_) return false;
  count_ = 0;
  return true;
}

}  // namespace loom::ag
