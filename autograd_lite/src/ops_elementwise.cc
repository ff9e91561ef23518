// Elementwise ops: binary arithmetic with broadcasting, and unary activations. Unary loops
// split over the thread pool in runs of kGrain elements; GELU uses Eigen's vectorized erf/exp.
#include <Eigen/Core>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <unsupported/Eigen/SpecialFunctions>

#include "kernels.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/parallel.h"

namespace loom::ag {

using detail::dispatchFloat;

Shape broadcastShapes(const Shape& a, const Shape& b, const char* op) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    const int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (da != db && da != 1 && db != 1) {
      throw std::invalid_argument(std::string(op) + ": shapes " + shapeToString(a) + " and " +
                                  shapeToString(b) + " cannot be broadcast together");
    }
    out[rank - 1 - k] = da == 1 ? db : da;
  }
  return out;
}

namespace {

template <class F>
Tensor binaryForward(const Tensor& a, const Tensor& b, const char* op, F f) {
  detail::checkDefined(a, op, "a");
  detail::checkDefined(b, op, "b");
  detail::checkSameDType(a, b, op);
  Tensor out = empty(broadcastShapes(a.shape(), b.shape(), op), a.dtype());
  dispatchFloat(a.dtype(), op, [&]<class T>() { detail::broadcastBinary<T>(a, b, out, f); });
  return out;
}

// Binary ops with a bfloat16/float16 operand: computed in float32 (float64 when the result is
// float64) on cast operands, the result cast to the promoted dtype (autocast.h).
template <class Op>
std::optional<Tensor> lowBinary(const Tensor& a, const Tensor& b, const char* op, Op f) {
  detail::checkDefined(a, op, "a");
  detail::checkDefined(b, op, "b");
  if (!detail::anyLowPrecision({&a, &b})) return std::nullopt;
  const DType result = detail::promoteBinary(a, b, op);
  const DType compute = result == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  return cast(f(cast(a, compute), cast(b, compute)), result);
}

// A scalar operand: float32 next to a low-precision tensor (the 0-d promotion rule keeps the
// tensor's dtype), else the tensor's dtype.
Tensor scalarFor(double v, const Tensor& t) {
  return scalarTensor(v, isLowPrecision(t.dtype()) ? DType::kFloat32 : t.dtype());
}

}  // namespace

// out = a + b. Backward: each input gets g summed over the dimensions it was broadcast along.
Tensor add(const Tensor& a, const Tensor& b) {
  if (auto low = lowBinary(a, b, "add", [](const Tensor& x, const Tensor& y) { return add(x, y); }))
    return *low;
  Tensor out = binaryForward(a, b, "add", [](auto x, auto y) { return x + y; });
  recordOp(out, "add", {&a, &b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{detail::sumTo(g, sa), detail::sumTo(g, sb)};
  });
  return out;
}

// out = a - b. Backward: g to a, -g to b (each summed to its shape).
Tensor sub(const Tensor& a, const Tensor& b) {
  if (auto low = lowBinary(a, b, "sub", [](const Tensor& x, const Tensor& y) { return sub(x, y); }))
    return *low;
  Tensor out = binaryForward(a, b, "sub", [](auto x, auto y) { return x - y; });
  recordOp(out, "sub", {&a, &b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) {
    return std::vector<Tensor>{detail::sumTo(g, sa), detail::sumTo(neg(g), sb)};
  });
  return out;
}

// out = a * b. Backward: g * b to a, g * a to b.
Tensor mul(const Tensor& a, const Tensor& b) {
  if (auto low = lowBinary(a, b, "mul", [](const Tensor& x, const Tensor& y) { return mul(x, y); }))
    return *low;
  Tensor out = binaryForward(a, b, "mul", [](auto x, auto y) { return x * y; });
  if (out.dtype() != DType::kInt64 && anyRequiresGrad({&a, &b})) {
    const bool needA = a.requiresGrad(), needB = b.requiresGrad();
    Tensor sa = needB ? a.detach() : Tensor();
    Tensor sb = needA ? b.detach() : Tensor();
    recordOp(
        out, "mul", {&a, &b}, [sa, sb, shapeA = a.shape(), shapeB = b.shape()](const Tensor& g) {
          return std::vector<Tensor>{sb.defined() ? detail::sumTo(mul(g, sb), shapeA) : Tensor(),
                                     sa.defined() ? detail::sumTo(mul(g, sa), shapeB) : Tensor()};
        });
  }
  return out;
}

// out = a / b. Backward: g / b to a, -g * a / b^2 = -g * out / b to b.
Tensor div(const Tensor& a, const Tensor& b) {
  if (auto low = lowBinary(a, b, "div", [](const Tensor& x, const Tensor& y) { return div(x, y); }))
    return *low;
  Tensor out = binaryForward(a, b, "div", [](auto x, auto y) { return x / y; });
  if (anyRequiresGrad({&a, &b})) {
    Tensor sb = b.detach();
    Tensor so = b.requiresGrad() ? out.detach() : Tensor();
    recordOp(out, "div", {&a, &b},
             [sb, so, shapeA = a.shape(), shapeB = b.shape()](const Tensor& g) {
               Tensor gOverB = div(g, sb);
               return std::vector<Tensor>{
                   detail::sumTo(gOverB, shapeA),
                   so.defined() ? detail::sumTo(neg(mul(gOverB, so)), shapeB) : Tensor()};
             });
  }
  return out;
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator-(const Tensor& a) {
  return neg(a);
}
Tensor operator+(const Tensor& a, double b) {
  return add(a, scalarFor(b, a));
}
Tensor operator-(const Tensor& a, double b) {
  return sub(a, scalarFor(b, a));
}
Tensor operator*(const Tensor& a, double b) {
  return mul(a, scalarFor(b, a));
}
Tensor operator/(const Tensor& a, double b) {
  return div(a, scalarFor(b, a));
}
Tensor operator+(double a, const Tensor& b) {
  return add(scalarFor(a, b), b);
}
Tensor operator-(double a, const Tensor& b) {
  return sub(scalarFor(a, b), b);
}
Tensor operator*(double a, const Tensor& b) {
  return mul(scalarFor(a, b), b);
}
Tensor operator/(double a, const Tensor& b) {
  return div(scalarFor(a, b), b);
}

// ---- unary ----

namespace {

constexpr int64_t kGrain = 1 << 15;

// Runs y = fwd(x) elementwise; if x requires grad, records a node whose backward computes
// gx = bwd(x, y, g) elementwise (x and y saved as needed).
template <class Fwd, class Bwd>
Tensor unaryOp(const Tensor& x, const char* op, bool saveX, bool saveY, Fwd fwd, Bwd bwd) {
  detail::checkDefined(x, op, "x");
  Tensor out = empty(x.shape(), x.dtype());
  dispatchFloat(x.dtype(), op, [&]<class T>() {
    const T* px = x.data<T>();
    T* py = out.data<T>();
    parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) py[i] = fwd(px[i]);
    });
  });
  if (anyRequiresGrad({&x})) {
    Tensor sx = saveX ? x.detach() : Tensor();
    Tensor sy = saveY ? out.detach() : Tensor();
    recordOp(out, op, {&x}, [sx, sy, op, bwd](const Tensor& g) {
      Tensor gx = empty(g.shape(), g.dtype());
      dispatchFloat(g.dtype(), op, [&]<class T>() {
        const T* px = sx.defined() ? sx.data<T>() : nullptr;
        const T* py = sy.defined() ? sy.data<T>() : nullptr;
        const T* pg = g.data<T>();
        T* pgx = gx.data<T>();
        parallelFor(g.numel(), kGrain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            pgx[i] = bwd(px ? px[i] : T(0), py ? py[i] : T(0), pg[i]);
          }
        });
      });
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

Tensor neg(const Tensor& a) {
  if (detail::isLow(a)) return cast(neg(detail::upcastLow(a)), a.dtype());
  return unaryOp(
      a, "neg", false, false, [](auto x) { return -x; }, [](auto, auto, auto g) { return -g; });
}

// y = max(x, 0); dy/dx = 1 where y > 0.
Tensor relu(const Tensor& x) {
  if (detail::isLow(x)) return cast(relu(detail::upcastLow(x)), x.dtype());
  return unaryOp(
      x, "relu", false, true, [](auto v) { return v > 0 ? v : decltype(v)(0); },
      [](auto, auto y, auto g) { return y > 0 ? g : decltype(g)(0); });
}

// y = x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2; dy/dx = Phi(x) + x * phi(x) with
// phi(x) = exp(-x^2 / 2) / sqrt(2 pi). Phi is kept from the forward for the backward.
Tensor gelu(const Tensor& x) {
  if (detail::isLow(x)) return cast(gelu(detail::upcastLow(x)), x.dtype());
  detail::checkDefined(x, "gelu", "x");
  Tensor out = empty(x.shape(), x.dtype());
  Tensor cdf = empty(x.shape(), x.dtype());
  dispatchFloat(x.dtype(), "gelu", [&]<class T>() {
    using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
    const T* px = x.data<T>();
    T* pc = cdf.data<T>();
    T* py = out.data<T>();
    parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      Eigen::Map<const Arr> xv(px + b, e - b);
      Eigen::Map<Arr> c(pc + b, e - b), y(py + b, e - b);
      c = T(0.5) * (T(1) + (xv * T(kInvSqrt2)).erf());
      y = xv * c;
    });
  });
  if (anyRequiresGrad({&x})) {
    recordOp(out, "gelu", {&x}, [sx = x.detach(), cdf](const Tensor& g) {
      Tensor gx = empty(g.shape(), g.dtype());
      dispatchFloat(g.dtype(), "gelu backward", [&]<class T>() {
        using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
        const T* px = sx.data<T>();
        const T* pc = cdf.data<T>();
        const T* pg = g.data<T>();
        T* pgx = gx.data<T>();
        parallelFor(g.numel(), kGrain, [&](int64_t b, int64_t e) {
          Eigen::Map<const Arr> xv(px + b, e - b), c(pc + b, e - b), gv(pg + b, e - b);
          Eigen::Map<Arr> out(pgx + b, e - b);
          out = gv * (c + xv * T(kInvSqrt2Pi) * (T(-0.5) * xv.square()).exp());
        });
      });
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

// dy/dx = 1 - y^2.
Tensor tanh(const Tensor& x) {
  if (detail::isLow(x)) return cast(tanh(detail::upcastLow(x)), x.dtype());
  return unaryOp(
      x, "tanh", false, true, [](auto v) { return std::tanh(v); },
      [](auto, auto y, auto g) { return g * (decltype(y)(1) - y * y); });
}

// y = 1 / (1 + e^-x); dy/dx = y (1 - y).
Tensor sigmoid(const Tensor& x) {
  if (detail::isLow(x)) return cast(sigmoid(detail::upcastLow(x)), x.dtype());
  return unaryOp(
      x, "sigmoid", false, true,
      [](auto v) {
        using T = decltype(v);
        return T(1) / (T(1) + std::exp(-v));
      },
      [](auto, auto y, auto g) { return g * y * (decltype(y)(1) - y); });
}

// dy/dx = y.
Tensor exp(const Tensor& x) {
  if (detail::isLow(x)) {
    return cast(exp(detail::upcastLow(x)), detail::fp32OpResultDType({&x}));
  }
  return unaryOp(
      x, "exp", false, true, [](auto v) { return std::exp(v); },
      [](auto, auto y, auto g) { return g * y; });
}

// dy/dx = 1 / x.
Tensor log(const Tensor& x) {
  if (detail::isLow(x)) {
    return cast(log(detail::upcastLow(x)), detail::fp32OpResultDType({&x}));
  }
  return unaryOp(
      x, "log", true, false, [](auto v) { return std::log(v); },
      [](auto v, auto, auto g) { return g / v; });
}

}  // namespace loom::ag
