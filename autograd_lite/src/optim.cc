#include "loom/autograd/optim.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace loom::ag::optim {

namespace {

template <class F>
void forFloat(Tensor& p, F&& f) {
  switch (p.dtype()) {
    case DType::kFloat32:
      f.template operator()<float>();
      break;
    case DType::kFloat64:
      f.template operator()<double>();
      break;
    default:
      throw std::invalid_argument("optimizer: parameters must be float32 or float64");
  }
}

// p -= lr * (buf, or g + momentum * buf for nesterov), buf = keep * buf + take * g (with
// g = grad + wd * p), in one pass: the step is memory-bound.
template <class T>
void sgdMomentumKernel(T* __restrict w, const T* __restrict g, T* __restrict b, int64_t n, T lr,
                       T wd, T mom, T keep, T take, bool nesterov) {
  if (nesterov) {
    for (int64_t k = 0; k < n; ++k) {
      const T d = g[k] + wd * w[k];
      const T bk = b[k] * keep + take * d;
      b[k] = bk;
      w[k] -= lr * (d + mom * bk);
    }
  } else {
    for (int64_t k = 0; k < n; ++k) {
      const T d = g[k] + wd * w[k];
      const T bk = b[k] * keep + take * d;
      b[k] = bk;
      w[k] -= lr * bk;
    }
  }
}

template <class T>
void adamKernel(T* __restrict w, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t n,
                T b1, T b2, T eps, T decay, T wd, T stepSize, T bc2) {
  for (int64_t k = 0; k < n; ++k) {
    const T d = g[k] + wd * w[k];
    const T mk = m[k] * b1 + (T(1) - b1) * d;
    const T vk = v[k] * b2 + (T(1) - b2) * d * d;
    m[k] = mk;
    v[k] = vk;
    w[k] = w[k] * decay - stepSize * mk / (std::sqrt(vk) / bc2 + eps);
  }
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  if (!(lr >= 0.0))
    throw std::invalid_argument("optimizer: lr must be >= 0, got " + std::to_string(lr));
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].defined() || !params_[i].isLeaf() || !params_[i].requiresGrad() ||
        params_[i].dtype() == DType::kInt64) {
      throw std::invalid_argument("optimizer: parameter " + std::to_string(i) +
                                  " must be a defined float leaf tensor that requires grad");
    }
  }
}

void Optimizer::zeroGrad(bool setToNone) {
  for (auto& p : params_) p.zeroGrad(setToNone);
}

SGD::SGD(std::vector<Tensor> params, double lr, const SGDOptions& options)
    : Optimizer(std::move(params), lr), options_(options), momentumBuffers_(params_.size()) {
  if (options.momentum < 0.0 || options.weightDecay < 0.0) {
    throw std::invalid_argument("SGD: momentum and weightDecay must be >= 0");
  }
  if (options.nesterov && (options.momentum <= 0.0 || options.dampening != 0.0)) {
    throw std::invalid_argument("SGD: nesterov needs momentum > 0 and dampening = 0");
  }
}

void SGD::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const bool first = !momentumBuffers_[i].defined();
    if (options_.momentum != 0.0 && first) momentumBuffers_[i] = zerosLike(p);
    Tensor buf = momentumBuffers_[i];
    forFloat(p, [&]<class T>() {
      T* w = p.data<T>();
      const T* g = grad.data<T>();
      const T lr = static_cast<T>(lr_), wd = static_cast<T>(options_.weightDecay);
      const T mom = static_cast<T>(options_.momentum);
      const T damp = static_cast<T>(1.0 - options_.dampening);
      const int64_t n = p.numel();
      if (!buf.defined()) {
        for (int64_t k = 0; k < n; ++k) w[k] -= lr * (g[k] + wd * w[k]);
        return;
      }
      const T keep = first ? T(0) : mom;
      const T take = first ? T(1) : damp;
      sgdMomentumKernel<T>(w, g, buf.data<T>(), n, lr, wd, mom, keep, take, options_.nesterov);
    });
  }
}

Adam::Adam(std::vector<Tensor> params, double lr, const AdamOptions& options, bool decoupled)
    : Optimizer(std::move(params), lr),
      options_(options),
      decoupled_(decoupled),
      m_(params_.size()),
      v_(params_.size()),
      steps_(params_.size(), 0) {
  if (!(options.beta1 >= 0.0 && options.beta1 < 1.0 && options.beta2 >= 0.0 &&
        options.beta2 < 1.0)) {
    throw std::invalid_argument("Adam: betas must be in [0, 1), got " +
                                std::to_string(options.beta1) + ", " +
                                std::to_string(options.beta2));
  }
  if (!(options.eps >= 0.0) || !(options.weightDecay >= 0.0)) {
    throw std::invalid_argument("Adam: eps and weightDecay must be >= 0");
  }
}

void Adam::step() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (!m_[i].defined()) {
      m_[i] = zerosLike(p);
      v_[i] = zerosLike(p);
    }
    const int64_t t = ++steps_[i];
    const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(t));
    const double bc2Sqrt = std::sqrt(1.0 - std::pow(options_.beta2, static_cast<double>(t)));
    Tensor m = m_[i], v = v_[i];
    forFloat(p, [&]<class T>() {
      T* w = p.data<T>();
      const T* g = grad.data<T>();
      T* pm = m.data<T>();
      T* pv = v.data<T>();
      const T b1 = static_cast<T>(options_.beta1), b2 = static_cast<T>(options_.beta2);
      const T eps = static_cast<T>(options_.eps);
      // Decoupled (AdamW) decays the weight; coupled (Adam) adds wd * w to the gradient.
      const T decay = static_cast<T>(decoupled_ ? 1.0 - lr_ * options_.weightDecay : 1.0);
      const T wd = static_cast<T>(decoupled_ ? 0.0 : options_.weightDecay);
      const T stepSize = static_cast<T>(lr_ / bc1);
      const T bc2 = static_cast<T>(bc2Sqrt);
      const int64_t n = p.numel();
      adamKernel<T>(w, g, pm, pv, n, b1, b2, eps, decay, wd, stepSize, bc2);
    });
  }
}

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer), baseLr_(optimizer.lr()) {}

void LRScheduler::step() {
  ++epoch_;
  optimizer_.setLr(lrAt(epoch_));
}

StepLR::StepLR(Optimizer& optimizer, int64_t stepSize, double gamma)
    : LRScheduler(optimizer), stepSize_(stepSize), gamma_(gamma) {
  if (stepSize <= 0) {
    throw std::invalid_argument("StepLR: stepSize must be positive, got " +
                                std::to_string(stepSize));
  }
}

double StepLR::lrAt(int64_t epoch) const {
  return baseLr_ * std::pow(gamma_, static_cast<double>(epoch / stepSize_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t tMax, double etaMin)
    : LRScheduler(optimizer), tMax_(tMax), etaMin_(etaMin) {
  if (tMax <= 0) {
    throw std::invalid_argument("CosineAnnealingLR: tMax must be positive, got " +
                                std::to_string(tMax));
  }
}

double CosineAnnealingLR::lrAt(int64_t epoch) const {
  return etaMin_ +
         (baseLr_ - etaMin_) *
             (1.0 + std::cos(M_PI * static_cast<double>(epoch) / static_cast<double>(tMax_))) / 2.0;
}

}  // namespace loom::ag::optim
