// Private helpers shared by the op implementations: dtype dispatch, argument checks,
// broadcasting iteration and reduction of a broadcast gradient back to an input's shape.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/autograd/ops.h"
#include "loom/autograd/parallel.h"
#include "loom/autograd/tensor.h"

namespace loom::ag::detail {

// Calls f.template operator()<T>() with T = float or double according to dtype. Kernels
// compute in these two only: the public ops turn bfloat16/float16 inputs into float32 before
// they get here (see autocast.h), so a low-precision dtype here is a library bug, reported.
template <class F>
decltype(auto) dispatchFloat(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f.template operator()<float>();
    case DType::kFloat64:
      return f.template operator()<double>();
    case DType::kInt64:
    case DType::kBFloat16:
    case DType::kFloat16:
      break;
  }
  throw std::invalid_argument(
      std::string(op) + ": this kernel computes in float32 or float64 only, got " +
      dtypeName(dtype) + (isLowPrecision(dtype) ? " (cast it with cast(x, DType::kFloat32))" : ""));
}

// Like dispatchFloat, also with T = int64_t, BFloat16 and Float16 (for ops that only move
// data).
template <class F>
decltype(auto) dispatchAny(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f.template operator()<float>();
    case DType::kFloat64:
      return f.template operator()<double>();
    case DType::kBFloat16:
      return f.template operator()<BFloat16>();
    case DType::kFloat16:
      return f.template operator()<Float16>();
    case DType::kInt64:
      break;
  }
  return f.template operator()<int64_t>();
}

// ---- low precision (the rules are in autocast.h) ----

// x as float32 when it is bfloat16/float16 (a differentiable cast), else x itself.
Tensor upcastLow(const Tensor& x);
// The dtype a float32 result goes back to: `like` when every defined input is that one
// low-precision dtype and no autocast is active, else float32 (PyTorch's fp32 op list: under
// autocast these ops return float32; outside it they return their inputs' dtype).
DType fp32OpResultDType(std::initializer_list<const Tensor*> inputs);
// y cast to dtype (no-op when equal).
Tensor castTo(const Tensor& y, DType dtype);
inline bool isLow(const Tensor& x) {
  return x.defined() && isLowPrecision(x.dtype());
}
// True when any defined input is bfloat16/float16.
bool anyLowPrecision(std::initializer_list<const Tensor*> inputs);
// Under autocast: x cast to the autocast dtype when it is float32 or the other low dtype
// (float64 and int64 are left alone). Outside autocast, or x undefined: x.
Tensor autocastLow(const Tensor& x);
// The dtype of a binary elementwise result (PyTorch's promotion restricted to our dtypes): equal
// dtypes give themselves; a 0-d operand takes the other's dtype when that one is dimensioned;
// a low-precision dtype with float32/float64 gives the wider one; bfloat16 with float16 gives
// float32. Other mixes (float32 with float64) throw, naming op.
DType promoteBinary(const Tensor& a, const Tensor& b, const char* op);

inline void checkDefined(const Tensor& t, const char* op, const char* arg) {
  if (!t.defined()) {
    throw std::invalid_argument(std::string(op) + ": " + arg + " is undefined");
  }
}

inline void checkSameDType(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype()) {
    throw std::invalid_argument(std::string(op) + ": dtypes differ (" + dtypeName(a.dtype()) +
                                " vs " + dtypeName(b.dtype()) + ")");
  }
}

inline void checkDim(const Tensor& t, int64_t dim, const char* op, const char* arg) {
  if (t.dim() != dim) {
    throw std::invalid_argument(std::string(op) + ": " + arg + " must be " + std::to_string(dim) +
                                "-d, got shape " + shapeToString(t.shape()));
  }
}

// Normalizes a possibly negative dim for a tensor of rank `rank`.
int64_t wrapDim(int64_t dim, int64_t rank, const char* op);

// Sums g (of a broadcast shape) down to `shape` (what the input had before broadcasting).
// Returns g itself when the shapes already match.
Tensor sumTo(const Tensor& g, const Shape& shape);

// out = f(a, b) elementwise with broadcasting; out has the broadcast shape. No autograd.
template <class T, class F>
void broadcastBinary(const Tensor& a, const Tensor& b, Tensor& out, F f);

// Splits shape around dim into outer * size * inner (row-major).
struct AxisSplit {
  int64_t outer = 1;
  int64_t size = 1;
  int64_t inner = 1;
};
AxisSplit splitAxis(const Shape& shape, int64_t dim);

// Elementwise loops split over the thread pool in runs of at least this many elements.
constexpr int64_t kElementwiseGrain = 1 << 15;

// ---- template definitions ----

template <class T, class F>
void broadcastBinary(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const int64_t n = out.numel();
  const int64_t na = a.numel();
  const int64_t nb = b.numel();
  // The common layouts split over the thread pool in runs of kElementwiseGrain elements.
  if (na == n && nb == n) {
    parallelFor(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = f(pa[i], pb[i]);
    });
    return;
  }
  if (na == n && nb == 1) {
    const T vb = pb[0];
    parallelFor(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = f(pa[i], vb);
    });
    return;
  }
  if (nb == n && na == 1) {
    const T va = pa[0];
    parallelFor(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = f(va, pb[i]);
    });
    return;
  }
  // A trailing block repeated: b's shape is a suffix of out's (a row vector over rows).
  const Shape& so = out.shape();
  auto isSuffix = [&](const Shape& s) {
    if (s.size() > so.size()) return false;
    return std::equal(s.begin(), s.end(), so.end() - static_cast<std::ptrdiff_t>(s.size()));
  };
  if (na == n && nb > 0 && isSuffix(b.shape())) {
    parallelFor(n / nb, std::max<int64_t>(1, kElementwiseGrain / nb), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* ra = pa + r * nb;
        T* ro = po + r * nb;
        for (int64_t j = 0; j < nb; ++j) ro[j] = f(ra[j], pb[j]);
      }
    });
    return;
  }
  if (nb == n && na > 0 && isSuffix(a.shape())) {
    parallelFor(n / na, std::max<int64_t>(1, kElementwiseGrain / na), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* rb = pb + r * na;
        T* ro = po + r * na;
        for (int64_t j = 0; j < na; ++j) ro[j] = f(pa[j], rb[j]);
      }
    });
    return;
  }
  // General case: walk out's index with per-operand strides (0 on broadcast dimensions).
  const size_t rank = so.size();
  std::vector<int64_t> strideA(rank, 0), strideB(rank, 0), index(rank, 0);
  auto fillStrides = [&](const Shape& s, std::vector<int64_t>& stride) {
    int64_t st = 1;
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t d = s.size() - 1 - k;
      const size_t od = rank - 1 - k;
      stride[od] = s[d] == 1 ? 0 : st;
      st *= s[d];
    }
  };
  fillStrides(a.shape(), strideA);
  fillStrides(b.shape(), strideB);
  int64_t offA = 0, offB = 0;
  for (int64_t i = 0; i < n; ++i) {
    po[i] = f(pa[offA], pb[offB]);
    for (size_t d = rank; d-- > 0;) {
      ++index[d];
      offA += strideA[d];
      offB += strideB[d];
      if (index[d] < so[d]) break;
      offA -= strideA[d] * so[d];
      offB -= strideB[d] * so[d];
      index[d] = 0;
    }
  }
}

}  // namespace loom::ag::detail
