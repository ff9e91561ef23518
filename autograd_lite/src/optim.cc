#include "loom/autograd/optim.h"

#include <cmath>
#include <map>
#include <set>
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
      throw std::invalid_argument(std::string("optimizer: parameters must be float32 or float64, "
                                              "got ") +
                                  dtypeName(p.dtype()) +
                                  " (mixed precision keeps float32 master parameters: see "
                                  "autocast.h)");
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

void checkLr(double lr) {
  if (!(lr >= 0.0))
    throw std::invalid_argument("optimizer: lr must be >= 0, got " + std::to_string(lr));
}

void checkSgdOptions(const SGDOptions& options) {
  if (!(options.momentum >= 0.0) || !(options.weightDecay >= 0.0)) {
    throw std::invalid_argument("SGD: momentum and weightDecay must be >= 0, got " +
                                std::to_string(options.momentum) + ", " +
                                std::to_string(options.weightDecay));
  }
  if (options.nesterov && (options.momentum <= 0.0 || options.dampening != 0.0)) {
    throw std::invalid_argument("SGD: nesterov needs momentum > 0 and dampening = 0");
  }
}

void checkAdamOptions(const AdamOptions& options) {
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

std::string shapeAndDtype(const Tensor& t) {
  return std::string(dtypeName(t.dtype())) + " " + shapeToString(t.shape());
}

// The entries of a state dict being loaded: lookups record what was used, so that whatever is
// left at the end is reported as unexpected. Every error names the entry.
class StateReader {
 public:
  StateReader(std::string who, const nn::NamedTensors& state, size_t numParams)
      : who_(std::move(who)), numParams_(numParams) {
    for (const auto& [name, t] : state) {
      if (!t.defined()) fail("entry '" + name + "' is an undefined tensor");
      if (!entries_.emplace(name, t).second) fail("entry '" + name + "' appears twice");
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(who_ + ".loadStateDict: " + what);
  }

  bool has(const std::string& name) const { return entries_.count(name) != 0; }

  const Tensor& get(const std::string& name) {
    auto it = entries_.find(name);
    if (it == entries_.end()) fail("missing entry '" + name + "'");
    used_.insert(name);
    return it->second;
  }

  double scalarDouble(const std::string& name) {
    const Tensor& t = get(name);
    if (t.dtype() != DType::kFloat64 || t.dim() != 0) {
      fail("entry '" + name + "' is " + shapeAndDtype(t) +
           ", expected a float64 scalar (shape [])");
    }
    return t.item();
  }

  int64_t scalarInt(const std::string& name) {
    const Tensor& t = get(name);
    if (t.dtype() != DType::kInt64 || t.dim() != 0) {
      fail("entry '" + name + "' is " + shapeAndDtype(t) + ", expected an int64 scalar (shape [])");
    }
    return t.data<int64_t>()[0];
  }

  bool scalarBool(const std::string& name) {
    const int64_t v = scalarInt(name);
    if (v != 0 && v != 1)
      fail("entry '" + name + "' is " + std::to_string(v) + ", expected 0 or 1");
    return v == 1;
  }

  // A copy of the entry, checked to have p's shape and dtype.
  Tensor likeParam(const std::string& name, const Tensor& p) {
    const Tensor& t = get(name);
    if (t.shape() != p.shape() || t.dtype() != p.dtype()) {
      fail("entry '" + name + "' is " + shapeAndDtype(t) + ", expected " + shapeAndDtype(p) +
           " (the parameter's)");
    }
    Tensor copy = zerosLike(p);
    copy.copyFrom(t);
    return copy;
  }

  // Checks that the state dict is for as many parameters as this optimizer has.
  void checkNumParams() {
    const int64_t n = scalarInt("param_groups.0.num_params");
    if (n != static_cast<int64_t>(numParams_)) {
      fail("the state dict is for " + std::to_string(n) +
           " parameters ('param_groups.0.num_params'), " + "this optimizer has " +
           std::to_string(numParams_));
    }
  }

  // Every entry was used; otherwise names the ones that were not.
  void checkAllUsed() const {
    std::string extra;
    for (const auto& [name, t] : entries_) {
      if (used_.count(name)) continue;
      extra += (extra.empty() ? "'" : ", '") + name + "'";
    }
    if (!extra.empty()) {
      fail("unexpected entries " + extra + " (this optimizer has " + std::to_string(numParams_) +
           " parameters, state names 'state.<index>.<name>' with index in [0, " +
           std::to_string(numParams_) + "))");
    }
  }

 private:
  std::string who_;
  size_t numParams_;
  std::map<std::string, Tensor> entries_;
  std::set<std::string> used_;
};

std::string stateName(size_t i, const char* what) {
  return "state." + std::to_string(i) + "." + what;
}

Tensor doubleScalar(double v) {
  return scalarTensor(v, DType::kFloat64);
}
Tensor intScalar(int64_t v) {
  Tensor t = zeros({}, DType::kInt64);
  t.data<int64_t>()[0] = v;
  return t;
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  checkLr(lr);
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
  checkSgdOptions(options);
}

nn::NamedTensors SGD::stateDict() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (momentumBuffers_[i].defined()) {
      out.emplace_back(stateName(i, "momentum_buffer"), momentumBuffers_[i].clone());
    }
  }
  out.emplace_back("param_groups.0.num_params", intScalar(static_cast<int64_t>(params_.size())));
  out.emplace_back("param_groups.0.lr", doubleScalar(lr_));
  out.emplace_back("param_groups.0.momentum", doubleScalar(options_.momentum));
  out.emplace_back("param_groups.0.dampening", doubleScalar(options_.dampening));
  out.emplace_back("param_groups.0.weight_decay", doubleScalar(options_.weightDecay));
  out.emplace_back("param_groups.0.nesterov", intScalar(options_.nesterov ? 1 : 0));
  return out;
}

void SGD::loadStateDict(const nn::NamedTensors& state) {
  StateReader in("SGD", state, params_.size());
  in.checkNumParams();
  const double lr = in.scalarDouble("param_groups.0.lr");
  SGDOptions options;
  options.momentum = in.scalarDouble("param_groups.0.momentum");
  options.dampening = in.scalarDouble("param_groups.0.dampening");
  options.weightDecay = in.scalarDouble("param_groups.0.weight_decay");
  options.nesterov = in.scalarBool("param_groups.0.nesterov");
  try {
    checkLr(lr);
    checkSgdOptions(options);
  } catch (const std::invalid_argument& e) {
    in.fail(std::string("bad hyper-parameters: ") + e.what());
  }
  std::vector<Tensor> buffers(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string name = stateName(i, "momentum_buffer");
    if (!in.has(name)) continue;
    if (options.momentum == 0.0) {
      in.fail("entry '" + name + "' is present but 'param_groups.0.momentum' is 0");
    }
    buffers[i] = in.likeParam(name, params_[i]);
  }
  in.checkAllUsed();
  lr_ = lr;
  options_ = options;
  momentumBuffers_ = std::move(buffers);
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
  checkAdamOptions(options);
}

nn::NamedTensors Adam::stateDict() const {
  nn::NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!m_[i].defined()) continue;
    out.emplace_back(stateName(i, "step"), intScalar(steps_[i]));
    out.emplace_back(stateName(i, "exp_avg"), m_[i].clone());
    out.emplace_back(stateName(i, "exp_avg_sq"), v_[i].clone());
  }
  out.emplace_back("param_groups.0.num_params", intScalar(static_cast<int64_t>(params_.size())));
  out.emplace_back("param_groups.0.lr", doubleScalar(lr_));
  out.emplace_back("param_groups.0.beta1", doubleScalar(options_.beta1));
  out.emplace_back("param_groups.0.beta2", doubleScalar(options_.beta2));
  out.emplace_back("param_groups.0.eps", doubleScalar(options_.eps));
  out.emplace_back("param_groups.0.weight_decay", doubleScalar(options_.weightDecay));
  out.emplace_back("param_groups.0.decoupled_weight_decay", intScalar(decoupled_ ? 1 : 0));
  return out;
}

void Adam::loadStateDict(const nn::NamedTensors& state) {
  StateReader in(decoupled_ ? "AdamW" : "Adam", state, params_.size());
  in.checkNumParams();
  const double lr = in.scalarDouble("param_groups.0.lr");
  AdamOptions options;
  options.beta1 = in.scalarDouble("param_groups.0.beta1");
  options.beta2 = in.scalarDouble("param_groups.0.beta2");
  options.eps = in.scalarDouble("param_groups.0.eps");
  options.weightDecay = in.scalarDouble("param_groups.0.weight_decay");
  const bool decoupled = in.scalarBool("param_groups.0.decoupled_weight_decay");
  try {
    checkLr(lr);
    checkAdamOptions(options);
  } catch (const std::invalid_argument& e) {
    in.fail(std::string("bad hyper-parameters: ") + e.what());
  }
  std::vector<Tensor> m(params_.size()), v(params_.size());
  std::vector<int64_t> steps(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string names[3] = {stateName(i, "step"), stateName(i, "exp_avg"),
                                  stateName(i, "exp_avg_sq")};
    int present = 0;
    for (const auto& n : names) present += in.has(n) ? 1 : 0;
    if (present == 0) continue;  // not created yet
    for (const auto& n : names) {
      if (!in.has(n)) {
        in.fail("missing entry '" + n + "' (parameter " + std::to_string(i) +
                " has some Adam state: step, exp_avg and exp_avg_sq go together)");
      }
    }
    steps[i] = in.scalarInt(names[0]);
    if (steps[i] < 1) {
      in.fail("entry '" + names[0] + "' is " + std::to_string(steps[i]) + ", expected >= 1");
    }
    m[i] = in.likeParam(names[1], params_[i]);
    v[i] = in.likeParam(names[2], params_[i]);
  }
  in.checkAllUsed();
  lr_ = lr;
  options_ = options;
  decoupled_ = decoupled;
  m_ = std::move(m);
  v_ = std::move(v);
  steps_ = std::move(steps);
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
