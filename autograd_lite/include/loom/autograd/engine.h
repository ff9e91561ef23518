// The autograd engine: backward nodes, grad mode, and the order in which backward runs.
//
// How backward works
// - Every op that has an input requiring grad (while grad mode is on) gives its output a
//   `gradFn` node that holds the inputs that require grad, whatever the backward needs
//   (saved tensors, captured by value), and a sequence number that grows with creation order.
// - `backward(root, gradient)` first walks the graph from root and counts, for each tensor,
//   how many recorded edges point at it. It then runs nodes from a ready queue, always the
//   ready node with the highest sequence number first (the reverse of forward order where the
//   graph allows it). A node becomes ready when every consumer of its output has handed it a
//   gradient; partial gradients are summed.
// - A leaf that requires grad gets the sum of its partial gradients added to `grad()` (or
//   stored there if grad() was undefined) when the last edge pointing at it has delivered.
// - Nodes are run with grad mode off, and each node's saved tensors and input references are
//   released right after it runs: the graph is freed by backward. Calling backward through
//   the same graph again throws std::invalid_argument.
//
// When the gradient-ready hooks fire (the seam DDP uses to start communication early)
// - Exactly once per backward() call for each leaf that the graph from root reaches and that
//   requires grad, right after that leaf's grad() has received its last contribution of this
//   pass (so grad() holds the previously accumulated value plus the whole of this pass).
// - On the thread that called backward(), in the order leaves complete, which for a
//   feed-forward model is the reverse of the order their layers ran in forward.
// - Leaves the graph does not reach (unused parameters) do not fire; DDP handles those (e.g.
//   in a queueCallback callback, which runs when the whole pass is done).
// - A hook may read and overwrite grad() in place (it is the parameter's grad buffer), but must
//   not run backward or change the graph. Hooks run in registration order. An exception from
//   a hook propagates out of backward() (the rest of the graph is then released unrun).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "loom/autograd/tensor.h"

namespace loom::ag {

// A backward function for one op output. gradOut has the output's shape; the result has one
// entry per input (undefined where the input does not need a gradient).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& gradOut)>;
// A backward that may add its gradient for input i straight into that leaf's grad buffer
// (saving a temporary and a pass over memory for large weights). The engine passes
// sinks[i] = the leaf's grad() only when input i is a leaf whose grad buffer exists and this
// node's edge is the last one still to deliver into it; the function must then add its
// gradient into sinks[i] and return an undefined tensor for i. Other sinks are undefined.
using AccumulatingBackwardFn =
    std::function<std::vector<Tensor>(const Tensor& gradOut, const std::vector<Tensor>& sinks)>;

class Node {
 public:
  Node(const char* name, std::vector<std::shared_ptr<TensorImpl>> inputs, BackwardFn fn);
  Node(const char* name, std::vector<std::shared_ptr<TensorImpl>> inputs,
       AccumulatingBackwardFn fn);
  const char* name() const { return name_; }
  uint64_t sequence() const { return sequence_; }
  // inputs()[i] is null when input i did not require grad.
  const std::vector<std::shared_ptr<TensorImpl>>& inputs() const { return inputs_; }
  bool needsInputGrad(size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  bool released() const { return released_; }

  bool acceptsSinks() const { return static_cast<bool>(accumulatingFn_); }
  std::vector<Tensor> apply(const Tensor& gradOut, const std::vector<Tensor>& sinks);
  // Drops saved tensors and input references.
  void release();

 private:
  const char* name_;
  uint64_t sequence_;
  std::vector<std::shared_ptr<TensorImpl>> inputs_;
  BackwardFn fn_;
  AccumulatingBackwardFn accumulatingFn_;
  bool released_ = false;
};

// Grad mode (thread-local, on by default): when off, ops record nothing.
bool gradEnabled();
void setGradEnabled(bool enabled);

// RAII: turns grad mode off for a scope, restoring the previous mode on exit.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(gradEnabled()) { setGradEnabled(false); }
  ~NoGradGuard() { setGradEnabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// See the file comment. gradient defaults to ones for a one-element root.
void backward(const Tensor& root, const Tensor& gradient = Tensor());

// Queues `callback` to run once, on this thread, after the backward pass now running has
// finished all its nodes and hooks (what PyTorch's queue_callback gives DDP: wait for the
// last bucket's all-reduce and write the averaged gradients back before backward returns).
// Callbacks run in queue order, with grad mode off, and may queue more callbacks. Call it from
// a gradient-ready hook; outside a backward pass it throws std::invalid_argument. If the pass
// throws, queued callbacks are dropped unrun.
void queueCallback(std::function<void()> callback);
// Whether a backward pass is running on this thread.
bool inBackward();

// For op implementations: when grad mode is on and any input requires grad, gives `out` a
// node named `name` over `inputs` with backward `fn` and marks it as requiring grad.
// Returns whether it did (so callers can skip saving tensors when it did not).
bool anyRequiresGrad(std::initializer_list<const Tensor*> inputs);
void recordOp(Tensor& out, const char* name, const std::vector<const Tensor*>& inputs,
              BackwardFn fn);
void recordOp(Tensor& out, const char* name, const std::vector<const Tensor*>& inputs,
              AccumulatingBackwardFn fn);

}  // namespace loom::ag
