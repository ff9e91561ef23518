// nn: modules with named parameters and buffers, as PyTorch names them.
//
// Contract
// - A Module owns its parameters (leaf tensors with requiresGrad) and buffers (tensors
//   without grad, e.g. BatchNorm's running statistics) by name, and its children by name.
//   Registration order is kept, and the recursive names are PyTorch's: for
//   Sequential(Linear, BatchNorm1d) they are `0.weight`, `0.bias`, `1.weight`, `1.bias`,
//   `1.running_mean`, `1.running_var`, `1.num_batches_tracked`.
// - namedParameters() lists a module's own parameters, then its children's, recursively (the
//   order PyTorch's named_parameters() gives and the order DDP buckets in reverse); a tensor
//   reachable under two names (a shared module) is listed once, under its first name.
//   stateDict() lists, per module, parameters then buffers, then children (PyTorch's order),
//   shared tensors under every name (as PyTorch's state_dict()).
// - Parameters and buffers are updated in place (optimizers, BatchNorm's running statistics,
//   loadStateDict): the Tensor handles returned here stay valid and keep their storage for the
//   module's lifetime, unless replaceChild swaps the module that owns them.
// - Modules are used through std::shared_ptr; a module may be shared between parents.
// - Not thread-safe; train()/eval() switch the whole subtree.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/autograd/ops.h"
#include "loom/autograd/tensor.h"

namespace loom::ag::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& input) = 0;
  Tensor operator()(const Tensor& input) { return forward(input); }
  // A short description, e.g. "Linear(in_features=784, out_features=1024, bias=true)".
  virtual std::string describe() const = 0;

  // Recursive, registration order, dotted names (see the file comment).
  NamedTensors namedParameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors namedBuffers() const;
  // Parameters and buffers by name, PyTorch's state_dict order.
  NamedTensors stateDict() const;
  // Copies values in place. Checks that every name matches and every shape and dtype agrees;
  // throws std::invalid_argument naming the first tensor that is missing, unexpected
  // (strict only) or has the wrong shape or dtype.
  void loadStateDict(const NamedTensors& state, bool strict = true);

  // Direct children in registration order, and every descendant with its dotted path
  // (the module itself first, with an empty name).
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& namedChildren() const {
    return children_;
  }
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> namedModules();
  // The child registered as `name`; throws std::invalid_argument if there is none.
  std::shared_ptr<Module> child(const std::string& name) const;
  // Replaces the child registered as `name` (e.g. BatchNorm1d by a SyncBatchNorm), keeping its
  // position; returns the old one.
  std::shared_ptr<Module> replaceChild(const std::string& name, std::shared_ptr<Module> module);

  void train(bool on = true);
  void eval() { train(false); }
  bool isTraining() const { return training_; }
  // Resets every parameter's gradient: zeros in place, or drops it with setToNone.
  void zeroGrad(bool setToNone = false);

 protected:
  // Registers (and returns) a parameter; it is made a leaf that requires grad.
  Tensor registerParameter(const std::string& name, Tensor value);
  Tensor registerBuffer(const std::string& name, Tensor value);
  std::shared_ptr<Module> registerModule(const std::string& name, std::shared_ptr<Module> module);
  // Hook for modules with mode-dependent state; the default does nothing.
  virtual void onTrainChanged() {}

 private:
  void collect(const std::string& prefix, bool params, bool buffers, bool recurse,
               NamedTensors& out) const;
  void checkNewName(const std::string& name) const;

  bool training_ = true;
  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

struct LinearOptions {
  bool bias = true;
  // Seed of PyTorch-style default init: weight and bias uniform in +-1/sqrt(in_features)
  // (kaiming_uniform with a = sqrt(5) gives exactly that bound).
  uint64_t seed = 0;
};

// y = x weight^T + bias; weight: [out, in], bias: [out].
class Linear : public Module {
 public:
  Linear(int64_t inFeatures, int64_t outFeatures, const LinearOptions& options = {});
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string describe() const override { return "ReLU()"; }
};

class GELU : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string describe() const override { return "GELU()"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string describe() const override { return "Tanh()"; }
};

// Zeroes elements with probability p in training (masks drawn from its own generator, seeded).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, uint64_t seed = 0);
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;
  Generator& generator() { return gen_; }

 private:
  double p_;
  Generator gen_;
};

struct BatchNorm1dOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;
  bool trackRunningStats = true;
};

// x: [N, C]. Parameters weight (ones) and bias (zeros); buffers running_mean (zeros),
// running_var (ones) and num_batches_tracked (int64 0-d, counts training forwards).
class BatchNorm1d : public Module {
 public:
  explicit BatchNorm1d(int64_t numFeatures, const BatchNorm1dOptions& options = {});
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;
  int64_t numFeatures() const { return numFeatures_; }
  const BatchNorm1dOptions& options() const { return options_; }
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }
  Tensor& runningMean() { return runningMean_; }
  Tensor& runningVar() { return runningVar_; }
  Tensor& numBatchesTracked() { return numBatchesTracked_; }

 private:
  int64_t numFeatures_;
  BatchNorm1dOptions options_;
  Tensor weight_, bias_, runningMean_, runningVar_, numBatchesTracked_;
};

struct EmbeddingOptions {
  // Row that gets no gradient and starts as zeros (PyTorch's padding_idx); negative counts from
  // the end.
  std::optional<int64_t> paddingIdx;
  uint64_t seed = 0;
};

// weight: [numEmbeddings, dim], init N(0, 1) from seed (the padding row zeroed).
// forward(indices int64) -> indices.shape + [dim].
class Embedding : public Module {
 public:
  Embedding(int64_t numEmbeddings, int64_t embeddingDim, uint64_t seed = 0);
  Embedding(int64_t numEmbeddings, int64_t embeddingDim, const EmbeddingOptions& options);
  Tensor forward(const Tensor& indices) override;
  std::string describe() const override;
  Tensor& weight() { return weight_; }
  std::optional<int64_t> paddingIdx() const { return paddingIdx_; }

 private:
  int64_t num_, dim_;
  std::optional<int64_t> paddingIdx_;
  Tensor weight_;
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwiseAffine = true;
};

// Normalizes over the last dims, normalizedShape. Parameters weight (ones) and bias (zeros),
// both normalizedShape.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalizedShape, const LayerNormOptions& options = {});
  explicit LayerNorm(int64_t dim, const LayerNormOptions& options = {})
      : LayerNorm(Shape{dim}, options) {}
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

 private:
  Shape shape_;
  LayerNormOptions options_;
  Tensor weight_, bias_;
};

struct CausalSelfAttentionOptions {
  bool bias = true;
  // Dropout on the attention probabilities in training (masks from a generator seeded with
  // seed + 1).
  double attnDropout = 0.0;
  // Seeds the two Linear layers' init (seed, seed + 1000).
  uint64_t seed = 0;
};

// Multi-head causal self-attention as in GPT-2. x: [B, T, C] -> [B, T, C]:
//   q, k, v = split(qkv(x), C): [B, T, C] each -> [B, H, T, D] (D = C / H);
//   att = softmax(causalMask(q k^T / sqrt(D))): [B, H, T, T], position t sees keys 0..t;
//   y = proj((att v) -> [B, T, C]).
// Children `qkv` (Linear C -> 3C, its output rows are q, then k, then v) and `proj`
// (Linear C -> C): parameters qkv.weight [3C, C], qkv.bias, proj.weight [C, C], proj.bias.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t embedDim, int64_t numHeads,
                      const CausalSelfAttentionOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  Linear& qkv() { return *qkv_; }
  Linear& proj() { return *proj_; }

 private:
  int64_t embedDim_, numHeads_;
  CausalSelfAttentionOptions options_;
  std::shared_ptr<Linear> qkv_, proj_;
  Generator gen_;
};

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  bool bias = true;
  // Seed of PyTorch-style init: weight and bias uniform in +-1/sqrt(C * KH * KW).
  uint64_t seed = 0;
};

// x: [N, C, H, W] -> [N, O, HO, WO]; weight [O, C, K, K], bias [O]. Square kernel, the same
// stride and padding on both axes (conv2d() itself takes them per axis).
class Conv2d : public Module {
 public:
  Conv2d(int64_t inChannels, int64_t outChannels, int64_t kernelSize,
         const Conv2dOptions& options = {});
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;
  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

 private:
  int64_t in_, out_, kernel_;
  Conv2dOptions options_;
  Tensor weight_, bias_;
};

// Square windows; stride defaults to the kernel size (PyTorch's default).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernelSize, std::optional<int64_t> stride = std::nullopt,
                     int64_t padding = 0);
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;

 private:
  Pool2dParams params_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernelSize, std::optional<int64_t> stride = std::nullopt,
                     int64_t padding = 0);
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;

 private:
  Pool2dParams params_;
};

// flatten(x, startDim, endDim); the default keeps the batch dimension: [N, C, H, W] -> [N, CHW].
class Flatten : public Module {
 public:
  explicit Flatten(int64_t startDim = 1, int64_t endDim = -1)
      : startDim_(startDim), endDim_(endDim) {}
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;

 private:
  int64_t startDim_, endDim_;
};

// Children named "0", "1", ...; forward runs them in order.
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  void append(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  std::string describe() const override;
  size_t size() const { return namedChildren().size(); }
  std::shared_ptr<Module> at(size_t index) const;
  // Replaces module `index` (same name), returns the old one.
  std::shared_ptr<Module> replace(size_t index, std::shared_ptr<Module> module);
};

}  // namespace loom::ag::nn
