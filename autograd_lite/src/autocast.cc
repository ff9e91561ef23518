// The autocast scope, the differentiable cast, and the low-precision helpers the ops use
// (autocast.h states the rules).
#include "loom/autograd/autocast.h"

#include <stdexcept>
#include <string>

#include "kernels.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"

namespace loom::ag {

namespace {
thread_local std::optional<DType> tAutocast;
}  // namespace

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : previous_(tAutocast) {
  if (!isLowPrecision(dtype)) {
    throw std::invalid_argument(
        std::string("AutocastGuard: dtype must be bfloat16 or float16, got ") + dtypeName(dtype));
  }
  tAutocast = enabled ? std::optional<DType>(dtype) : std::nullopt;
}

AutocastGuard::~AutocastGuard() {
  tAutocast = previous_;
}

std::optional<DType> autocastDType() {
  return tAutocast;
}

// Backward: g cast back to x's dtype (a float source only; int64 gets no gradient).
Tensor cast(const Tensor& x, DType dtype) {
  detail::checkDefined(x, "cast", "x");
  if (x.dtype() == dtype) return x;
  Tensor out = x.to(dtype);
  if (isFloatingPoint(dtype) && anyRequiresGrad({&x})) {
    recordOp(out, "cast", {&x},
             [from = x.dtype()](const Tensor& g) { return std::vector<Tensor>{cast(g, from)}; });
  }
  return out;
}

namespace detail {

Tensor upcastLow(const Tensor& x) {
  return x.defined() && isLowPrecision(x.dtype()) ? cast(x, DType::kFloat32) : x;
}

bool anyLowPrecision(std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* t : inputs) {
    if (t->defined() && isLowPrecision(t->dtype())) return true;
  }
  return false;
}

DType fp32OpResultDType(std::initializer_list<const Tensor*> inputs) {
  if (tAutocast) return DType::kFloat32;
  std::optional<DType> common;
  for (const Tensor* t : inputs) {
    if (!t->defined() || !isFloatingPoint(t->dtype())) continue;
    if (!isLowPrecision(t->dtype()) || (common && *common != t->dtype())) return DType::kFloat32;
    common = t->dtype();
  }
  return common.value_or(DType::kFloat32);
}

Tensor castTo(const Tensor& y, DType dtype) {
  return cast(y, dtype);
}

Tensor autocastLow(const Tensor& x) {
  if (!tAutocast || !x.defined()) return x;
  const DType d = x.dtype();
  if (d == DType::kFloat32 || (isLowPrecision(d) && d != *tAutocast)) return cast(x, *tAutocast);
  return x;
}

DType promoteBinary(const Tensor& a, const Tensor& b, const char* op) {
  const DType da = a.dtype(), db = b.dtype();
  if (da == db) return da;
  if (isFloatingPoint(da) && isFloatingPoint(db)) {
    if (a.dim() == 0 && b.dim() > 0) return db;
    if (b.dim() == 0 && a.dim() > 0) return da;
    if (isLowPrecision(da) && isLowPrecision(db)) return DType::kFloat32;
    if (isLowPrecision(da)) return db;
    if (isLowPrecision(db)) return da;
  }
  throw std::invalid_argument(std::string(op) + ": dtypes differ (" + dtypeName(da) + " vs " +
                              dtypeName(db) +
                              "); only bfloat16/float16 mix with other float dtypes");
}

}  // namespace detail

}  // namespace loom::ag
