// Tensor: a cheap, reference-counted handle to a contiguous row-major n-d array.
//
// Contract
// - Copying a Tensor copies the handle, not the data: both handles see the same TensorImpl
//   (shape, dtype, storage, autograd metadata). `clone()` copies data; `detach()` makes a new
//   handle on the same storage with no autograd history.
// - Storage is always contiguous and row-major, with no offset. `reshape` of a tensor is a view
//   (same storage); nothing else aliases storage.
// - dtypes: float32 (models), float64 (gradient checks), int64 (class labels, indices,
//   BatchNorm's num_batches_tracked), bfloat16 and float16 (mixed precision: storage only,
//   elements are BFloat16 / Float16 from half.h). Ops compute in float32 or float64 and never
//   mix the two; a bfloat16/float16 input is computed in float32 and rounded back (see
//   autocast.h for the mixed-precision rules).
// - Autograd: a tensor that `requiresGrad()` and was made by an op holds the op's backward
//   node (`gradFn`); a leaf (made by the user, e.g. a parameter) accumulates its gradient in
//   `grad()` when `backward()` runs. See engine.h for the exact order and when the
//   gradient-ready hooks fire.
// - Thread-safety: none per tensor; use one graph per thread. Grad mode is thread-local.
//
// Errors: caller mistakes (bad shape, wrong dtype, undefined tensor) throw
// std::invalid_argument naming the operation and the expected vs. actual value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "loom/autograd/half.h"

namespace loom::ag {

enum class DType { kFloat32, kFloat64, kInt64, kBFloat16, kFloat16 };

// "float32", "float64", "int64", "bfloat16", "float16".
const char* dtypeName(DType dtype);
size_t dtypeSize(DType dtype);
// bfloat16 or float16.
bool isLowPrecision(DType dtype);
// float32, float64, bfloat16 or float16.
bool isFloatingPoint(DType dtype);

using Shape = std::vector<int64_t>;

// "[64, 784]".
std::string shapeToString(const Shape& shape);
int64_t shapeNumel(const Shape& shape);

// A seeded, deterministic random source (SplitMix64-seeded xoshiro256**). The same seed gives
// the same numbers on every platform: uniform() uses the top 53 bits, normal() Box-Muller.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0);
  uint64_t nextU64();
  double uniform();  // [0, 1)
  double normal();   // N(0, 1)
  void seed(uint64_t seed);

 private:
  uint64_t s_[4];
  bool hasSpare_ = false;
  double spare_ = 0.0;
};

class Node;
class Tensor;

// Raw bytes shared by a tensor and its views. 64-byte aligned.
class Storage {
 public:
  explicit Storage(size_t nbytes);
  // Storage over memory that `owner` keeps alive (e.g. a slice of DDP's gradient bucket, so
  // that a parameter's gradient accumulates straight into the bucket): not freed here, and
  // aligned as the caller's memory is. Holds `owner` for as long as this storage lives.
  Storage(void* external, size_t nbytes, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  std::shared_ptr<void> owner_;  // set for external storage (which is then not freed)
};

// Called with the parameter's (now complete) gradient; see engine.h.
using GradReadyHook = std::function<void(Tensor& grad)>;
using HookHandle = uint64_t;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  bool requiresGrad = false;
  std::shared_ptr<Node> gradFn;  // null for leaves
  std::shared_ptr<TensorImpl> grad;
  std::vector<std::pair<HookHandle, GradReadyHook>> gradReadyHooks;
};

class Tensor {
 public:
  Tensor() = default;  // undefined
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  // Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const;
  DType dtype() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype()); }

  // Typed access to the contiguous data; throws if T does not match dtype().
  template <class T>
  T* data();
  template <class T>
  const T* data() const;
  void* rawData();
  const void* rawData() const;

  // The value of a one-element tensor, as double.
  double item() const;
  // A copy of the data as std::vector<T> (T must match dtype()).
  template <class T>
  std::vector<T> toVector() const;

  // ---- autograd ----
  bool requiresGrad() const;
  // Only leaves (tensors not produced by a recorded op) may change this.
  Tensor& setRequiresGrad(bool requiresGrad = true);
  bool isLeaf() const;
  const std::shared_ptr<Node>& gradFn() const;
  // The accumulated gradient (undefined until the first backward reaches this leaf, or after
  // zeroGrad(true)). Same shape and dtype as this tensor.
  Tensor grad() const;
  // The gradient buffer, allocated as zeros if undefined: DDP reads and writes it as
  // `mutableGrad().data<float>()` with `numel()` elements.
  Tensor mutableGrad();
  void setGrad(const Tensor& grad);
  // setToNone=false fills the existing buffer with zeros (it keeps its address, which DDP's
  // buckets rely on); true drops it.
  void zeroGrad(bool setToNone = false);
  // Runs reverse-mode autograd from this tensor (see engine.h). gradient defaults to 1 for a
  // one-element tensor.
  void backward(const Tensor& gradient = Tensor()) const;
  // Registers a hook that fires once per backward pass, right after this leaf's gradient for
  // that pass is complete (see engine.h). Only for leaves that require grad.
  HookHandle registerGradReadyHook(GradReadyHook hook);
  // Returns false if no hook with this handle is registered.
  bool removeGradReadyHook(HookHandle handle);

  // ---- views and copies ----
  // Same storage, no autograd history, requiresGrad false.
  Tensor detach() const;
  // New storage with the same values; records a graph edge (gradient passes through).
  Tensor clone() const;
  // A view with a new shape (one dimension may be -1). Differentiable.
  Tensor reshape(const Shape& shape) const;
  // A new tensor with values converted; no graph (use for gradient-check setups; cast() in
  // ops.h is the differentiable form). To bfloat16/float16: round to nearest even (from
  // float64 through float32, as PyTorch does); float to int64 truncates.
  Tensor to(DType dtype) const;
  // In-place copy of src's values (same shape and dtype), outside autograd. Used to load
  // weights and write optimizer updates without replacing storage.
  void copyFrom(const Tensor& src);
  // In-place fill, outside autograd.
  void fill(double value);

  // True when both handles are the same tensor.
  bool is(const Tensor& other) const { return impl_ == other.impl_; }
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

 private:
  void checkDefined(const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

// ---- factories ----
Tensor empty(const Shape& shape, DType dtype = DType::kFloat32);
Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32);
Tensor ones(const Shape& shape, DType dtype = DType::kFloat32);
Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32);
// A 0-d tensor.
Tensor scalarTensor(double value, DType dtype = DType::kFloat32);
Tensor zerosLike(const Tensor& t);
Tensor onesLike(const Tensor& t);
// Standard normal / uniform [low, high) values from gen, drawn in row-major order.
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::kFloat32);
Tensor uniform(const Shape& shape, double low, double high, Generator& gen,
               DType dtype = DType::kFloat32);
// Copies values; an empty shape means 1-d {values.size()} (use scalarTensor for 0-d).
Tensor fromVector(const std::vector<float>& values, const Shape& shape = {});
Tensor fromVector(const std::vector<double>& values, const Shape& shape = {});
Tensor fromVector(const std::vector<int64_t>& values, const Shape& shape = {});

}  // namespace loom::ag
