#include "loom/autograd/nn.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"

namespace loom::ag::nn {

// ---- Module ----

void Module::checkNewName(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos) {
    throw std::invalid_argument("Module: invalid name '" + name + "' (non-empty, no '.')");
  }
  auto taken = [&](const auto& list) {
    for (const auto& [n, _] : list) {
      if (n == name) return true;
    }
    return false;
  };
  if (taken(params_) || taken(buffers_) || taken(children_)) {
    throw std::invalid_argument("Module: name '" + name + "' is already registered");
  }
}

Tensor Module::registerParameter(const std::string& name, Tensor value) {
  checkNewName(name);
  if (!value.defined())
    throw std::invalid_argument("registerParameter: '" + name + "' is undefined");
  value.setRequiresGrad(true);
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::registerBuffer(const std::string& name, Tensor value) {
  checkNewName(name);
  if (!value.defined()) throw std::invalid_argument("registerBuffer: '" + name + "' is undefined");
  buffers_.emplace_back(name, value);
  return value;
}

std::shared_ptr<Module> Module::registerModule(const std::string& name,
                                               std::shared_ptr<Module> module) {
  checkNewName(name);
  if (!module) throw std::invalid_argument("registerModule: '" + name + "' is null");
  children_.emplace_back(name, module);
  return module;
}

void Module::collect(const std::string& prefix, bool params, bool buffers, bool recurse,
                     NamedTensors& out) const {
  if (params) {
    for (const auto& [n, t] : params_) out.emplace_back(prefix + n, t);
  }
  if (buffers) {
    for (const auto& [n, t] : buffers_) out.emplace_back(prefix + n, t);
  }
  if (recurse) {
    for (const auto& [n, m] : children_) m->collect(prefix + n + ".", params, buffers, true, out);
  }
}

namespace {
// A tensor reachable under two names (a module shared by two parents) is listed once, under
// its first name, as PyTorch's named_parameters() does.
NamedTensors withoutDuplicates(NamedTensors all) {
  std::set<const TensorImpl*> seen;
  NamedTensors out;
  for (auto& [n, t] : all) {
    if (seen.insert(t.impl().get()).second) out.emplace_back(std::move(n), std::move(t));
  }
  return out;
}
}  // namespace

NamedTensors Module::namedParameters() const {
  NamedTensors out;
  collect("", true, false, true, out);
  return withoutDuplicates(std::move(out));
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : namedParameters()) out.push_back(t);
  return out;
}

NamedTensors Module::namedBuffers() const {
  NamedTensors out;
  collect("", false, true, true, out);
  return withoutDuplicates(std::move(out));
}

NamedTensors Module::stateDict() const {
  NamedTensors out;
  collect("", true, true, true, out);
  return out;
}

void Module::loadStateDict(const NamedTensors& state, bool strict) {
  std::unordered_map<std::string, const Tensor*> given;
  for (const auto& [n, t] : state) {
    if (!given.emplace(n, &t).second) {
      throw std::invalid_argument("loadStateDict: '" + n + "' appears twice in the state dict");
    }
  }
  NamedTensors mine = stateDict();
  std::set<std::string> known;
  // Check everything before copying anything, so a failed load leaves the module unchanged.
  for (const auto& [n, t] : mine) {
    known.insert(n);
    auto it = given.find(n);
    if (it == given.end()) {
      if (strict) throw std::invalid_argument("loadStateDict: missing '" + n + "'");
      continue;
    }
    const Tensor& src = *it->second;
    if (src.shape() != t.shape()) {
      throw std::invalid_argument("loadStateDict: '" + n + "' has shape " +
                                  shapeToString(src.shape()) + ", expected " +
                                  shapeToString(t.shape()));
    }
    if (src.dtype() != t.dtype()) {
      throw std::invalid_argument("loadStateDict: '" + n + "' has dtype " + dtypeName(src.dtype()) +
                                  ", expected " + dtypeName(t.dtype()));
    }
  }
  if (strict) {
    for (const auto& [n, t] : state) {
      if (!known.count(n)) {
        throw std::invalid_argument("loadStateDict: unexpected '" + n +
                                    "' (the module has no such "
                                    "parameter or buffer)");
      }
    }
  }
  for (auto& [n, t] : mine) {
    auto it = given.find(n);
    if (it != given.end()) t.copyFrom(*it->second);
  }
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::namedModules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  // The module itself has no owning shared_ptr here; report it with a non-owning alias.
  out.emplace_back("", std::shared_ptr<Module>(std::shared_ptr<Module>(), this));
  std::function<void(const std::string&, Module&)> walk = [&](const std::string& prefix,
                                                              Module& m) {
    for (const auto& [n, c] : m.children_) {
      const std::string path = prefix.empty() ? n : prefix + "." + n;
      out.emplace_back(path, c);
      walk(path, *c);
    }
  };
  walk("", *this);
  return out;
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  for (const auto& [n, m] : children_) {
    if (n == name) return m;
  }
  throw std::invalid_argument("Module: no child named '" + name + "'");
}

std::shared_ptr<Module> Module::replaceChild(const std::string& name,
                                             std::shared_ptr<Module> module) {
  if (!module) throw std::invalid_argument("replaceChild: new module for '" + name + "' is null");
  for (auto& [n, m] : children_) {
    if (n == name) {
      auto old = m;
      m = std::move(module);
      return old;
    }
  }
  throw std::invalid_argument("replaceChild: no child named '" + name + "'");
}

void Module::train(bool on) {
  training_ = on;
  onTrainChanged();
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zeroGrad(bool setToNone) {
  for (auto& [n, t] : namedParameters()) t.zeroGrad(setToNone);
}

// ---- layers ----

Linear::Linear(int64_t inFeatures, int64_t outFeatures, const LinearOptions& options)
    : in_(inFeatures), out_(outFeatures) {
  if (inFeatures <= 0 || outFeatures <= 0) {
    throw std::invalid_argument("Linear: features must be positive, got in=" +
                                std::to_string(inFeatures) + " out=" + std::to_string(outFeatures));
  }
  Generator gen(options.seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(inFeatures));
  weight_ = registerParameter("weight", uniform({outFeatures, inFeatures}, -bound, bound, gen));
  if (options.bias) bias_ = registerParameter("bias", uniform({outFeatures}, -bound, bound, gen));
}

Tensor Linear::forward(const Tensor& input) {
  return linear(input, weight_, bias_);
}

std::string Linear::describe() const {
  return "Linear(in_features=" + std::to_string(in_) + ", out_features=" + std::to_string(out_) +
         ", bias=" + (bias_.defined() ? "true" : "false") + ")";
}

Tensor ReLU::forward(const Tensor& input) {
  return relu(input);
}
Tensor GELU::forward(const Tensor& input) {
  return gelu(input);
}
Tensor Tanh::forward(const Tensor& input) {
  return ::loom::ag::tanh(input);
}

Dropout::Dropout(double p, uint64_t seed) : p_(p), gen_(seed) {
  if (!(p >= 0.0 && p <= 1.0)) {
    throw std::invalid_argument("Dropout: p must be in [0, 1], got " + std::to_string(p));
  }
}

Tensor Dropout::forward(const Tensor& input) {
  return dropout(input, p_, isTraining(), gen_);
}

std::string Dropout::describe() const {
  return "Dropout(p=" + std::to_string(p_) + ")";
}

BatchNorm1d::BatchNorm1d(int64_t numFeatures, const BatchNorm1dOptions& options)
    : numFeatures_(numFeatures), options_(options) {
  if (numFeatures <= 0) {
    throw std::invalid_argument("BatchNorm1d: numFeatures must be positive, got " +
                                std::to_string(numFeatures));
  }
  if (options.affine) {
    weight_ = registerParameter("weight", ones({numFeatures}));
    bias_ = registerParameter("bias", zeros({numFeatures}));
  }
  if (options.trackRunningStats) {
    runningMean_ = registerBuffer("running_mean", zeros({numFeatures}));
    runningVar_ = registerBuffer("running_var", ones({numFeatures}));
    numBatchesTracked_ = registerBuffer("num_batches_tracked", zeros({}, DType::kInt64));
  }
}

Tensor BatchNorm1d::forward(const Tensor& input) {
  const bool useBatchStats = isTraining() || !options_.trackRunningStats;
  Tensor rm = runningMean_, rv = runningVar_;
  if (input.defined() && rm.defined() && input.dtype() != rm.dtype()) {
    throw std::invalid_argument(std::string("BatchNorm1d: input is ") + dtypeName(input.dtype()) +
                                " but the module's running statistics are " +
                                dtypeName(rm.dtype()));
  }
  // Eval without running statistics normalizes with the batch's own (PyTorch's rule).
  const bool passStats = !(useBatchStats && !isTraining());
  Tensor out = batchNorm(input, passStats ? rm : Tensor(), passStats ? rv : Tensor(), weight_,
                         bias_, useBatchStats, options_.momentum, options_.eps);
  if (isTraining() && options_.trackRunningStats) ++*numBatchesTracked_.data<int64_t>();
  return out;
}

std::string BatchNorm1d::describe() const {
  return "BatchNorm1d(" + std::to_string(numFeatures_) + ", eps=" + std::to_string(options_.eps) +
         ", momentum=" + std::to_string(options_.momentum) + ")";
}

Embedding::Embedding(int64_t numEmbeddings, int64_t embeddingDim, uint64_t seed)
    : Embedding(numEmbeddings, embeddingDim,
                EmbeddingOptions{.paddingIdx = std::nullopt, .seed = seed}) {}

Embedding::Embedding(int64_t numEmbeddings, int64_t embeddingDim, const EmbeddingOptions& options)
    : num_(numEmbeddings), dim_(embeddingDim) {
  if (numEmbeddings <= 0 || embeddingDim <= 0) {
    throw std::invalid_argument("Embedding: sizes must be positive, got " +
                                std::to_string(numEmbeddings) + " x " +
                                std::to_string(embeddingDim));
  }
  if (options.paddingIdx) {
    const int64_t p = *options.paddingIdx;
    if (p < -numEmbeddings || p >= numEmbeddings) {
      throw std::invalid_argument("Embedding: paddingIdx " + std::to_string(p) + " is outside [-" +
                                  std::to_string(numEmbeddings) + ", " +
                                  std::to_string(numEmbeddings) + ")");
    }
    paddingIdx_ = p < 0 ? p + numEmbeddings : p;
  }
  Generator gen(options.seed);
  Tensor w = randn({numEmbeddings, embeddingDim}, gen);
  if (paddingIdx_) std::fill_n(w.data<float>() + *paddingIdx_ * embeddingDim, embeddingDim, 0.0f);
  weight_ = registerParameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) {
  return embedding(weight_, indices, paddingIdx_);
}

std::string Embedding::describe() const {
  return "Embedding(" + std::to_string(num_) + ", " + std::to_string(dim_) +
         (paddingIdx_ ? ", padding_idx=" + std::to_string(*paddingIdx_) : "") + ")";
}

LayerNorm::LayerNorm(Shape normalizedShape, const LayerNormOptions& options)
    : shape_(std::move(normalizedShape)), options_(options) {
  if (shape_.empty() || shapeNumel(shape_) <= 0) {
    throw std::invalid_argument(
        "LayerNorm: normalizedShape must be non-empty with positive "
        "sizes, got " +
        shapeToString(shape_));
  }
  if (options.elementwiseAffine) {
    weight_ = registerParameter("weight", ones(shape_));
    bias_ = registerParameter("bias", zeros(shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  return layerNorm(input, shape_, weight_, bias_, options_.eps);
}

std::string LayerNorm::describe() const {
  return "LayerNorm(" + shapeToString(shape_) + ", eps=" + std::to_string(options_.eps) +
         ", elementwise_affine=" + (options_.elementwiseAffine ? "true" : "false") + ")";
}

CausalSelfAttention::CausalSelfAttention(int64_t embedDim, int64_t numHeads,
                                         const CausalSelfAttentionOptions& options)
    : embedDim_(embedDim), numHeads_(numHeads), options_(options), gen_(options.seed + 1) {
  if (embedDim <= 0 || numHeads <= 0 || embedDim % numHeads != 0) {
    throw std::invalid_argument("CausalSelfAttention: embedDim (" + std::to_string(embedDim) +
                                ") must be a positive multiple of numHeads (" +
                                std::to_string(numHeads) + ")");
  }
  if (!(options.attnDropout >= 0.0 && options.attnDropout <= 1.0)) {
    throw std::invalid_argument("CausalSelfAttention: attnDropout must be in [0, 1], got " +
                                std::to_string(options.attnDropout));
  }
  qkv_ = std::make_shared<Linear>(embedDim, 3 * embedDim,
                                  LinearOptions{.bias = options.bias, .seed = options.seed});
  proj_ = std::make_shared<Linear>(
      embedDim, embedDim, LinearOptions{.bias = options.bias, .seed = options.seed + 1000});
  registerModule("qkv", qkv_);
  registerModule("proj", proj_);
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  if (!x.defined() || x.dim() != 3 || x.size(2) != embedDim_) {
    throw std::invalid_argument("CausalSelfAttention: expected input [B, T, " +
                                std::to_string(embedDim_) + "], got " +
                                (x.defined() ? shapeToString(x.shape()) : "undefined"));
  }
  const int64_t b = x.size(0), t = x.size(1), h = numHeads_, d = embedDim_ / numHeads_;
  std::vector<Tensor> qkv = split((*qkv_)(x), embedDim_, -1);  // 3 x [B, T, C]
  auto heads = [&](const Tensor& z) {                          // [B, T, C] -> [B, H, T, D]
    return permute(z.reshape({b, t, h, d}), {0, 2, 1, 3});
  };
  Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  Tensor att = matmul(q, transpose(k, -2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
  att = softmax(causalMask(att), -1);  // [B, H, T, T]
  att = dropout(att, options_.attnDropout, isTraining(), gen_);
  Tensor y = permute(matmul(att, v), {0, 2, 1, 3}).reshape({b, t, embedDim_});
  return (*proj_)(y);
}

std::string CausalSelfAttention::describe() const {
  return "CausalSelfAttention(embed_dim=" + std::to_string(embedDim_) +
         ", num_heads=" + std::to_string(numHeads_) + ")";
}

Conv2d::Conv2d(int64_t inChannels, int64_t outChannels, int64_t kernelSize,
               const Conv2dOptions& options)
    : in_(inChannels), out_(outChannels), kernel_(kernelSize), options_(options) {
  if (inChannels <= 0 || outChannels <= 0 || kernelSize <= 0 || options.stride <= 0 ||
      options.padding < 0) {
    throw std::invalid_argument("Conv2d: channels (" + std::to_string(inChannels) + ", " +
                                std::to_string(outChannels) + "), kernel size (" +
                                std::to_string(kernelSize) + ") and stride (" +
                                std::to_string(options.stride) + ") must be positive, padding (" +
                                std::to_string(options.padding) + ") >= 0");
  }
  Generator gen(options.seed);
  const double bound = 1.0 / std::sqrt(static_cast<double>(inChannels * kernelSize * kernelSize));
  weight_ = registerParameter(
      "weight", uniform({outChannels, inChannels, kernelSize, kernelSize}, -bound, bound, gen));
  if (options.bias) bias_ = registerParameter("bias", uniform({outChannels}, -bound, bound, gen));
}

Tensor Conv2d::forward(const Tensor& input) {
  return conv2d(input, weight_, bias_,
                {.strideH = options_.stride,
                 .strideW = options_.stride,
                 .padH = options_.padding,
                 .padW = options_.padding});
}

std::string Conv2d::describe() const {
  return "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) +
         ", kernel_size=" + std::to_string(kernel_) +
         ", stride=" + std::to_string(options_.stride) +
         ", padding=" + std::to_string(options_.padding) + ")";
}

namespace {
Pool2dParams poolParams(const char* what, int64_t kernel, std::optional<int64_t> stride,
                        int64_t padding) {
  const int64_t s = stride.value_or(kernel);
  if (kernel <= 0 || s <= 0 || padding < 0 || 2 * padding > kernel) {
    throw std::invalid_argument(std::string(what) + ": kernel size (" + std::to_string(kernel) +
                                ") and stride (" + std::to_string(s) +
                                ") must be positive and padding (" + std::to_string(padding) +
                                ") in [0, kernel / 2]");
  }
  return {kernel, kernel, s, s, padding, padding};
}
std::string poolDescription(const char* what, const Pool2dParams& p) {
  return std::string(what) + "(kernel_size=" + std::to_string(p.kernelH) +
         ", stride=" + std::to_string(p.strideH) + ", padding=" + std::to_string(p.padH) + ")";
}
}  // namespace

MaxPool2d::MaxPool2d(int64_t kernelSize, std::optional<int64_t> stride, int64_t padding)
    : params_(poolParams("MaxPool2d", kernelSize, stride, padding)) {}
Tensor MaxPool2d::forward(const Tensor& input) {
  return maxPool2d(input, params_);
}
std::string MaxPool2d::describe() const {
  return poolDescription("MaxPool2d", params_);
}

AvgPool2d::AvgPool2d(int64_t kernelSize, std::optional<int64_t> stride, int64_t padding)
    : params_(poolParams("AvgPool2d", kernelSize, stride, padding)) {}
Tensor AvgPool2d::forward(const Tensor& input) {
  return avgPool2d(input, params_);
}
std::string AvgPool2d::describe() const {
  return poolDescription("AvgPool2d", params_);
}

Tensor Flatten::forward(const Tensor& input) {
  return flatten(input, startDim_, endDim_);
}
std::string Flatten::describe() const {
  return "Flatten(start_dim=" + std::to_string(startDim_) + ", end_dim=" + std::to_string(endDim_) +
         ")";
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) append(std::move(m));
}

void Sequential::append(std::shared_ptr<Module> module) {
  registerModule(std::to_string(size()), std::move(module));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [n, m] : namedChildren()) x = m->forward(x);
  return x;
}

std::string Sequential::describe() const {
  std::string s = "Sequential(\n";
  for (const auto& [n, m] : namedChildren()) s += "  (" + n + "): " + m->describe() + "\n";
  return s + ")";
}

std::shared_ptr<Module> Sequential::at(size_t index) const {
  if (index >= size()) {
    throw std::invalid_argument("Sequential: index " + std::to_string(index) +
                                " out of range (size " + std::to_string(size()) + ")");
  }
  return namedChildren()[index].second;
}

std::shared_ptr<Module> Sequential::replace(size_t index, std::shared_ptr<Module> module) {
  at(index);
  return replaceChild(std::to_string(index), std::move(module));
}

}  // namespace loom::ag::nn
