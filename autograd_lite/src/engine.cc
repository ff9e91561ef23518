#include "loom/autograd/engine.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <queue>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "loom/autograd/ops.h"

namespace loom::ag {

namespace {
thread_local bool tlsGradEnabled = true;
std::atomic<uint64_t> nextSequence{0};
}  // namespace

bool gradEnabled() {
  return tlsGradEnabled;
}
void setGradEnabled(bool enabled) {
  tlsGradEnabled = enabled;
}

Node::Node(const char* name, std::vector<std::shared_ptr<TensorImpl>> inputs, BackwardFn fn)
    : name_(name),
      sequence_(nextSequence.fetch_add(1, std::memory_order_relaxed)),
      inputs_(std::move(inputs)),
      fn_(std::move(fn)) {}

Node::Node(const char* name, std::vector<std::shared_ptr<TensorImpl>> inputs,
           AccumulatingBackwardFn fn)
    : name_(name),
      sequence_(nextSequence.fetch_add(1, std::memory_order_relaxed)),
      inputs_(std::move(inputs)),
      accumulatingFn_(std::move(fn)) {}

std::vector<Tensor> Node::apply(const Tensor& gradOut, const std::vector<Tensor>& sinks) {
  return accumulatingFn_ ? accumulatingFn_(gradOut, sinks) : fn_(gradOut);
}

void Node::release() {
  released_ = true;
  fn_ = nullptr;
  accumulatingFn_ = nullptr;
  inputs_.clear();
  inputs_.shrink_to_fit();
}

bool anyRequiresGrad(std::initializer_list<const Tensor*> inputs) {
  if (!tlsGradEnabled) return false;
  for (const Tensor* t : inputs) {
    if (t != nullptr && t->requiresGrad()) return true;
  }
  return false;
}

namespace {

template <class Fn>
void recordOpImpl(Tensor& out, const char* name, const std::vector<const Tensor*>& inputs, Fn fn) {
  if (!tlsGradEnabled) return;
  bool any = false;
  std::vector<std::shared_ptr<TensorImpl>> edges;
  edges.reserve(inputs.size());
  for (const Tensor* t : inputs) {
    if (t != nullptr && t->requiresGrad()) {
      edges.push_back(t->impl());
      any = true;
    } else {
      edges.push_back(nullptr);
    }
  }
  if (!any) return;
  out.impl()->gradFn = std::make_shared<Node>(name, std::move(edges), std::move(fn));
  out.impl()->requiresGrad = true;
}

}  // namespace

void recordOp(Tensor& out, const char* name, const std::vector<const Tensor*>& inputs,
              BackwardFn fn) {
  recordOpImpl(out, name, inputs, std::move(fn));
}

void recordOp(Tensor& out, const char* name, const std::vector<const Tensor*>& inputs,
              AccumulatingBackwardFn fn) {
  recordOpImpl(out, name, inputs, std::move(fn));
}

namespace {

// Adds g into acc (same shape and dtype).
void addInto(Tensor& acc, const Tensor& g) {
  const int64_t n = acc.numel();
  if (acc.dtype() == DType::kFloat32) {
    float* a = acc.data<float>();
    const float* b = g.data<float>();
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  } else if (acc.dtype() == DType::kFloat64) {
    double* a = acc.data<double>();
    const double* b = g.data<double>();
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  } else if (acc.dtype() == DType::kBFloat16) {  // summed in float32, rounded once
    BFloat16* a = acc.data<BFloat16>();
    const BFloat16* b = g.data<BFloat16>();
    for (int64_t i = 0; i < n; ++i) a[i] = toBFloat16(toFloat(a[i]) + toFloat(b[i]));
  } else {
    Float16* a = acc.data<Float16>();
    const Float16* b = g.data<Float16>();
    for (int64_t i = 0; i < n; ++i) a[i] = toFloat16(toFloat(a[i]) + toFloat(b[i]));
  }
}

// A gradient we may write into: one no other tensor shares. Otherwise a copy.
Tensor owned(const Tensor& g) {
  if (g.impl().use_count() == 1 && g.impl()->storage.use_count() == 1) return g;
  Tensor c = empty(g.shape(), g.dtype());
  std::memcpy(c.rawData(), g.rawData(), g.nbytes());
  return c;
}

using ImplPtr = std::shared_ptr<TensorImpl>;

struct ByHighestSequence {
  bool operator()(const ImplPtr& a, const ImplPtr& b) const {
    return a->gradFn->sequence() < b->gradFn->sequence();
  }
};

class GradModeScope {
 public:
  explicit GradModeScope(bool enabled) : previous_(gradEnabled()) { setGradEnabled(enabled); }
  ~GradModeScope() { setGradEnabled(previous_); }

 private:
  bool previous_;
};

thread_local std::vector<std::function<void()>>* tlsCallbacks = nullptr;

class CallbackScope {
 public:
  explicit CallbackScope(std::vector<std::function<void()>>* callbacks) : previous_(tlsCallbacks) {
    tlsCallbacks = callbacks;
  }
  ~CallbackScope() { tlsCallbacks = previous_; }

 private:
  std::vector<std::function<void()>>* previous_;
};

void runGraph(const Tensor& root, const Tensor& seed);

void fireHooks(TensorImpl* leaf) {
  if (leaf->gradReadyHooks.empty()) return;
  Tensor g(leaf->grad);
  // Copy: a hook may (un)register hooks.
  auto hooks = leaf->gradReadyHooks;
  for (auto& [handle, hook] : hooks) hook(g);
}

void finishLeaf(TensorImpl* leaf, Tensor grad) {
  if (!leaf->grad) {
    leaf->grad = owned(grad).impl();
  } else {
    Tensor acc(leaf->grad);
    addInto(acc, grad);
  }
  fireHooks(leaf);
}

}  // namespace

void backward(const Tensor& root, const Tensor& gradient) {
  if (!root.defined()) throw std::invalid_argument("backward: tensor is undefined");
  if (!root.requiresGrad()) {
    throw std::invalid_argument(
        "backward: tensor does not require grad (no input requires grad, or it was computed "
        "under NoGradGuard)");
  }
  Tensor seed;
  if (gradient.defined()) {
    if (gradient.shape() != root.shape() || gradient.dtype() != root.dtype()) {
      throw std::invalid_argument("backward: gradient has shape " +
                                  shapeToString(gradient.shape()) + " and dtype " +
                                  dtypeName(gradient.dtype()) + ", expected " +
                                  shapeToString(root.shape()) + " and " + dtypeName(root.dtype()));
    }
    seed = gradient;
  } else {
    if (root.numel() != 1) {
      throw std::invalid_argument(
          "backward: gradient can be implied only for a one-element "
          "tensor, this one has shape " +
          shapeToString(root.shape()));
    }
    seed = onesLike(root);
  }

  GradModeScope noGrad(false);
  std::vector<std::function<void()>> callbacks;
  CallbackScope callbackScope(&callbacks);
  runGraph(root, seed);
  // Callbacks may queue further callbacks; run until none is left.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto cb = std::move(callbacks[i]);
    cb();
  }
}

namespace {

void runGraph(const Tensor& root, const Tensor& seed) {
  TensorImpl* rootImpl = root.impl().get();
  if (!rootImpl->gradFn) {
    finishLeaf(rootImpl, seed);
    return;
  }

  // Pass 1: count the edges into every tensor reachable from root.
  std::unordered_map<TensorImpl*, int> pendingEdges;
  std::vector<TensorImpl*> stack{rootImpl};
  std::vector<std::shared_ptr<Node>> nodes;  // to release them all if a backward throws
  pendingEdges[rootImpl] = 0;
  while (!stack.empty()) {
    TensorImpl* t = stack.back();
    stack.pop_back();
    const std::shared_ptr<Node>& node = t->gradFn;
    if (!node) continue;
    if (node->released()) {
      throw std::invalid_argument(
          std::string("backward: trying to backward through the graph a second time (node '") +
          node->name() + "' was freed by an earlier backward)");
    }
    nodes.push_back(node);
    for (const auto& in : node->inputs()) {
      if (!in) continue;
      auto [it, inserted] = pendingEdges.try_emplace(in.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(in.get());
    }
  }

  // Pass 2: run ready nodes, highest sequence first.
  std::unordered_map<TensorImpl*, Tensor> grads;
  std::priority_queue<ImplPtr, std::vector<ImplPtr>, ByHighestSequence> ready;
  grads[rootImpl] = seed;
  ready.push(root.impl());
  try {
    while (!ready.empty()) {
      ImplPtr tOwner = ready.top();
      ready.pop();
      TensorImpl* t = tOwner.get();
      Tensor gradOut = std::move(grads[t]);
      grads.erase(t);
      std::shared_ptr<Node> node = t->gradFn;  // keeps inputs alive while we use them
      const auto inputs = node->inputs();
      std::vector<Tensor> sinks;
      if (node->acceptsSinks()) {
        sinks.resize(inputs.size());
        for (size_t i = 0; i < inputs.size(); ++i) {
          TensorImpl* in = inputs[i].get();
          if (in != nullptr && !in->gradFn && in->grad && pendingEdges[in] == 1 &&
              grads.find(in) == grads.end()) {
            sinks[i] = Tensor(in->grad);
          }
        }
      }
      std::vector<Tensor> inGrads = node->apply(gradOut, sinks);
      gradOut = Tensor();
      node->release();
      if (inGrads.size() != inputs.size()) {
        throw std::logic_error(std::string("backward of '") + node->name() + "' returned " +
                               std::to_string(inGrads.size()) + " gradients for " +
                               std::to_string(inputs.size()) + " inputs");
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        TensorImpl* in = inputs[i].get();
        if (in == nullptr) continue;
        Tensor& g = inGrads[i];
        const bool sunk = i < sinks.size() && sinks[i].defined();
        if (sunk && g.defined()) {
          throw std::logic_error(std::string("backward of '") + node->name() +
                                 "' both accumulated into and returned a gradient for input " +
                                 std::to_string(i));
        }
        if (g.defined() && (g.shape() != in->shape || g.dtype() != in->dtype)) {
          throw std::logic_error(std::string("backward of '") + node->name() +
                                 "' returned a gradient of shape " + shapeToString(g.shape()) +
                                 " for input " + std::to_string(i) + " of shape " +
                                 shapeToString(in->shape));
        }
        if (g.defined()) {
          auto it = grads.find(in);
          if (it == grads.end()) {
            grads.emplace(in, std::move(g));
          } else {
            if (it->second.impl().use_count() > 1 || it->second.impl()->storage.use_count() > 1) {
              it->second = owned(it->second);
            }
            addInto(it->second, g);
          }
        }
        if (--pendingEdges[in] == 0) {
          if (sunk) {  // the node already added its gradient into in->grad
            fireHooks(in);
            continue;
          }
          auto it = grads.find(in);
          if (in->gradFn) {
            if (it == grads.end()) {
              // No gradient flowed here (all consumers returned undefined); its own inputs
              // still need their edge counts settled, so feed zeros.
              grads.emplace(in, zeros(in->shape, in->dtype));
            }
            ready.push(inputs[i]);
          } else if (it != grads.end()) {
            Tensor leafGrad = std::move(it->second);
            grads.erase(it);
            finishLeaf(in, std::move(leafGrad));
          }
        }
      }
    }
  } catch (...) {
    for (auto& n : nodes) n->release();
    throw;
  }
}

}  // namespace

void queueCallback(std::function<void()> callback) {
  if (tlsCallbacks == nullptr) {
    throw std::invalid_argument("queueCallback: no backward pass is running on this thread");
  }
  tlsCallbacks->push_back(std::move(callback));
}

bool inBackward() {
  return tlsCallbacks != nullptr;
}

}  // namespace loom::ag
