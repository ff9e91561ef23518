#include "loom/autograd/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <stdexcept>

#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"

namespace loom::ag {

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt64:
      return "int64";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "?";
}

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
  }
  return 0;
}

bool isLowPrecision(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

bool isFloatingPoint(DType dtype) {
  return dtype != DType::kInt64;
}

std::string shapeToString(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    os << (i ? ", " : "") << shape[i];
  }
  os << ']';
  return os.str();
}

int64_t shapeNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      throw std::invalid_argument("negative dimension in shape " + shapeToString(shape));
    }
    n *= d;
  }
  return n;
}

// ---- Generator ----

namespace {
uint64_t splitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}
}  // namespace

Generator::Generator(uint64_t seed) {
  this->seed(seed);
}

void Generator::seed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitMix64(x);
  hasSpare_ = false;
}

uint64_t Generator::nextU64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Generator::uniform() {
  return static_cast<double>(nextU64() >> 11) * 0x1.0p-53;
}

double Generator::normal() {
  if (hasSpare_) {
    hasSpare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * M_PI * u2;
  spare_ = r * std::sin(theta);
  hasSpare_ = true;
  return r * std::cos(theta);
}

// ---- Storage ----

Storage::Storage(size_t nbytes) : nbytes_(nbytes) {
  const size_t rounded = (nbytes + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (data_ == nullptr) throw std::bad_alloc();
}

Storage::Storage(void* external, size_t nbytes, std::shared_ptr<void> owner)
    : data_(external), nbytes_(nbytes), owner_(std::move(owner)) {
  if (external == nullptr && nbytes > 0) {
    throw std::invalid_argument("Storage: external memory of " + std::to_string(nbytes) +
                                " bytes at nullptr");
  }
  if (owner_ == nullptr) {
    throw std::invalid_argument("Storage: external memory needs an owner that keeps it alive");
  }
}

Storage::~Storage() {
  if (!owner_) std::free(data_);
}

// ---- Tensor ----

void Tensor::checkDefined(const char* what) const {
  if (!impl_) throw std::invalid_argument(std::string(what) + ": tensor is undefined");
}

const Shape& Tensor::shape() const {
  checkDefined("shape");
  return impl_->shape;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  const int64_t i = d < 0 ? d + n : d;
  if (i < 0 || i >= n) {
    throw std::invalid_argument("size(" + std::to_string(d) +
                                "): dimension out of range for shape " + shapeToString(shape()));
  }
  return impl_->shape[i];
}

int64_t Tensor::numel() const {
  checkDefined("numel");
  return impl_->numel;
}

DType Tensor::dtype() const {
  checkDefined("dtype");
  return impl_->dtype;
}

namespace {
template <class T>
constexpr DType dtypeOf();
template <>
constexpr DType dtypeOf<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtypeOf<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtypeOf<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtypeOf<BFloat16>() {
  return DType::kBFloat16;
}
template <>
constexpr DType dtypeOf<Float16>() {
  return DType::kFloat16;
}

}  // namespace

template <class T>
T* Tensor::data() {
  checkDefined("data");
  if (impl_->dtype != dtypeOf<T>()) {
    throw std::invalid_argument(std::string("data<") + dtypeName(dtypeOf<T>()) +
                                ">() on a tensor of dtype " + dtypeName(impl_->dtype));
  }
  return static_cast<T*>(impl_->storage->data());
}

template <class T>
const T* Tensor::data() const {
  return const_cast<Tensor*>(this)->data<T>();
}

template float* Tensor::data<float>();
template double* Tensor::data<double>();
template int64_t* Tensor::data<int64_t>();
template BFloat16* Tensor::data<BFloat16>();
template Float16* Tensor::data<Float16>();
template const BFloat16* Tensor::data<BFloat16>() const;
template const Float16* Tensor::data<Float16>() const;
template const float* Tensor::data<float>() const;
template const double* Tensor::data<double>() const;
template const int64_t* Tensor::data<int64_t>() const;

void* Tensor::rawData() {
  checkDefined("rawData");
  return impl_->storage->data();
}

const void* Tensor::rawData() const {
  checkDefined("rawData");
  return impl_->storage->data();
}

double Tensor::item() const {
  if (numel() != 1) {
    throw std::invalid_argument("item(): tensor has " + std::to_string(numel()) +
                                " elements (shape " + shapeToString(shape()) + "), expected 1");
  }
  switch (dtype()) {
    case DType::kFloat32:
      return *data<float>();
    case DType::kFloat64:
      return *data<double>();
    case DType::kInt64:
      return static_cast<double>(*data<int64_t>());
    case DType::kBFloat16:
      return toFloat(*data<BFloat16>());
    case DType::kFloat16:
      return toFloat(*data<Float16>());
  }
  return 0;
}

template <class T>
std::vector<T> Tensor::toVector() const {
  const T* p = data<T>();
  return std::vector<T>(p, p + numel());
}

template std::vector<float> Tensor::toVector<float>() const;
template std::vector<double> Tensor::toVector<double>() const;
template std::vector<int64_t> Tensor::toVector<int64_t>() const;
template std::vector<BFloat16> Tensor::toVector<BFloat16>() const;
template std::vector<Float16> Tensor::toVector<Float16>() const;

bool Tensor::requiresGrad() const {
  return impl_ && impl_->requiresGrad;
}

Tensor& Tensor::setRequiresGrad(bool requiresGrad) {
  checkDefined("setRequiresGrad");
  if (impl_->gradFn) {
    throw std::invalid_argument(
        "setRequiresGrad: only leaf tensors can change requiresGrad (this one was made by " +
        std::string(impl_->gradFn->name()) + "); use detach() first");
  }
  if (requiresGrad && impl_->dtype == DType::kInt64) {
    throw std::invalid_argument("setRequiresGrad: int64 tensors cannot require grad");
  }
  impl_->requiresGrad = requiresGrad;
  return *this;
}

bool Tensor::isLeaf() const {
  return impl_ && !impl_->gradFn;
}

const std::shared_ptr<Node>& Tensor::gradFn() const {
  checkDefined("gradFn");
  return impl_->gradFn;
}

Tensor Tensor::grad() const {
  checkDefined("grad");
  return Tensor(impl_->grad);
}

Tensor Tensor::mutableGrad() {
  checkDefined("mutableGrad");
  if (!impl_->grad) impl_->grad = zeros(impl_->shape, impl_->dtype).impl();
  return Tensor(impl_->grad);
}

void Tensor::setGrad(const Tensor& grad) {
  checkDefined("setGrad");
  if (grad.defined() && (grad.shape() != shape() || grad.dtype() != dtype())) {
    throw std::invalid_argument("setGrad: gradient has shape " + shapeToString(grad.shape()) +
                                " and dtype " + dtypeName(grad.dtype()) + ", expected " +
                                shapeToString(shape()) + " and " + dtypeName(dtype()));
  }
  impl_->grad = grad.impl();
}

void Tensor::zeroGrad(bool setToNone) {
  checkDefined("zeroGrad");
  if (!impl_->grad) return;
  if (setToNone) {
    impl_->grad.reset();
  } else {
    std::memset(impl_->grad->storage->data(), 0,
                static_cast<size_t>(impl_->grad->numel) * dtypeSize(impl_->grad->dtype));
  }
}

void Tensor::backward(const Tensor& gradient) const {
  ::loom::ag::backward(*this, gradient);
}

HookHandle Tensor::registerGradReadyHook(GradReadyHook hook) {
  checkDefined("registerGradReadyHook");
  if (!isLeaf() || !requiresGrad()) {
    throw std::invalid_argument(
        "registerGradReadyHook: only leaf tensors that require grad (parameters) have hooks");
  }
  static std::atomic<uint64_t> nextHandle{1};
  const HookHandle h = nextHandle.fetch_add(1);
  impl_->gradReadyHooks.emplace_back(h, std::move(hook));
  return h;
}

bool Tensor::removeGradReadyHook(HookHandle handle) {
  checkDefined("removeGradReadyHook");
  auto& hooks = impl_->gradReadyHooks;
  for (auto it = hooks.begin(); it != hooks.end(); ++it) {
    if (it->first == handle) {
      hooks.erase(it);
      return true;
    }
  }
  return false;
}

Tensor Tensor::detach() const {
  checkDefined("detach");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = impl_->shape;
  impl->numel = impl_->numel;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::clone() const {
  checkDefined("clone");
  Tensor out = empty(shape(), dtype());
  std::memcpy(out.rawData(), rawData(), nbytes());
  recordOp(out, "clone", {this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor Tensor::reshape(const Shape& newShape) const {
  checkDefined("reshape");
  Shape s = newShape;
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (inferred >= 0) {
        throw std::invalid_argument("reshape: more than one -1 in " + shapeToString(newShape));
      }
      inferred = static_cast<int>(i);
    } else if (s[i] < 0) {
      throw std::invalid_argument("reshape: negative dimension in " + shapeToString(newShape));
    } else {
      known *= s[i];
    }
  }
  if (inferred >= 0 && known > 0 && numel() % known == 0) s[inferred] = numel() / known;
  if (inferred >= 0 && s[inferred] == -1) {
    throw std::invalid_argument("reshape: cannot infer -1 in " + shapeToString(newShape) + " for " +
                                std::to_string(numel()) + " elements");
  }
  if (shapeNumel(s) != numel()) {
    throw std::invalid_argument("reshape: cannot view shape " + shapeToString(shape()) + " (" +
                                std::to_string(numel()) + " elements) as " +
                                shapeToString(newShape));
  }
  Tensor out = detach();
  out.impl()->shape = s;
  const Shape inShape = shape();
  recordOp(out, "reshape", {this},
           [inShape](const Tensor& g) { return std::vector<Tensor>{g.reshape(inShape)}; });
  return out;
}

void Tensor::copyFrom(const Tensor& src) {
  checkDefined("copyFrom");
  if (!src.defined()) throw std::invalid_argument("copyFrom: source tensor is undefined");
  if (src.shape() != shape() || src.dtype() != dtype()) {
    throw std::invalid_argument("copyFrom: source has shape " + shapeToString(src.shape()) +
                                " and dtype " + dtypeName(src.dtype()) + ", expected " +
                                shapeToString(shape()) + " and " + dtypeName(dtype()));
  }
  if (src.rawData() != rawData()) std::memcpy(rawData(), src.rawData(), nbytes());
}

void Tensor::fill(double value) {
  checkDefined("fill");
  const int64_t n = numel();
  switch (dtype()) {
    case DType::kFloat32: {
      float* p = data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value);
      break;
    }
    case DType::kFloat64: {
      double* p = data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    case DType::kInt64: {
      int64_t* p = data<int64_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int64_t>(value);
      break;
    }
    case DType::kBFloat16: {
      const BFloat16 v = toBFloat16(static_cast<float>(value));
      std::fill_n(data<BFloat16>(), n, v);
      break;
    }
    case DType::kFloat16: {
      const Float16 v = toFloat16(static_cast<float>(value));
      std::fill_n(data<Float16>(), n, v);
      break;
    }
  }
}

// ---- factories ----

Tensor empty(const Shape& shape, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->numel = shapeNumel(shape);
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(impl->numel) * dtypeSize(dtype));
  return Tensor(std::move(impl));
}

Tensor zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.rawData(), 0, t.nbytes());
  return t;
}

Tensor ones(const Shape& shape, DType dtype) {
  return full(shape, 1.0, dtype);
}

Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor scalarTensor(double value, DType dtype) {
  return full({}, value, dtype);
}
Tensor zerosLike(const Tensor& t) {
  return zeros(t.shape(), t.dtype());
}
Tensor onesLike(const Tensor& t) {
  return ones(t.shape(), t.dtype());
}

namespace {
void checkFloatDType(DType dtype, const char* op) {
  if (dtype == DType::kInt64) {
    throw std::invalid_argument(std::string(op) +
                                ": dtype must be float32, float64, bfloat16 or float16, got int64");
  }
}
template <class F>
Tensor fillWith(const Shape& shape, DType dtype, F next) {
  if (isLowPrecision(dtype)) return fillWith(shape, DType::kFloat32, next).to(dtype);
  Tensor t = empty(shape, dtype);
  const int64_t n = t.numel();
  if (dtype == DType::kFloat32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(next());
  } else {
    double* p = t.data<double>();
    for (int64_t i = 0; i < n; ++i) p[i] = next();
  }
  return t;
}
template <class T>
Tensor fromVectorImpl(const std::vector<T>& values, const Shape& shape, DType dtype) {
  const Shape s = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
  if (shapeNumel(s) != static_cast<int64_t>(values.size())) {
    throw std::invalid_argument("fromVector: " + std::to_string(values.size()) +
                                " values do not fill shape " + shapeToString(s));
  }
  Tensor t = empty(s, dtype);
  if (!values.empty()) std::memcpy(t.rawData(), values.data(), values.size() * sizeof(T));
  return t;
}
}  // namespace

Tensor randn(const Shape& shape, Generator& gen, DType dtype) {
  checkFloatDType(dtype, "randn");
  return fillWith(shape, dtype, [&] { return gen.normal(); });
}

Tensor uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype) {
  checkFloatDType(dtype, "uniform");
  if (!(low <= high)) {
    throw std::invalid_argument("uniform: low (" + std::to_string(low) + ") > high (" +
                                std::to_string(high) + ")");
  }
  return fillWith(shape, dtype, [&] { return low + (high - low) * gen.uniform(); });
}

Tensor fromVector(const std::vector<float>& values, const Shape& shape) {
  return fromVectorImpl(values, shape, DType::kFloat32);
}
Tensor fromVector(const std::vector<double>& values, const Shape& shape) {
  return fromVectorImpl(values, shape, DType::kFloat64);
}
Tensor fromVector(const std::vector<int64_t>& values, const Shape& shape) {
  return fromVectorImpl(values, shape, DType::kInt64);
}

}  // namespace loom::ag
