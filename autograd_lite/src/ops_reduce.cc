// Reductions (sum, mean), softmax and log-softmax, and the broadcast-gradient reduction sumTo.
//
// Axis ops view x as [outer, size, inner] around the reduced dimension `dim`: element
// (o, s, i) sits at (o * size + s) * inner + i.
#include <Eigen/Core>
#include <cmath>
#include <stdexcept>

#include "kernels.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/parallel.h"

namespace loom::ag {

using detail::dispatchFloat;

namespace detail {

int64_t wrapDim(int64_t dim, int64_t rank, const char* op) {
  const int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank) {
    throw std::invalid_argument(std::string(op) + ": dim " + std::to_string(dim) +
                                " is out of range for a " + std::to_string(rank) + "-d tensor");
  }
  return d;
}

AxisSplit splitAxis(const Shape& shape, int64_t dim) {
  AxisSplit s;
  for (int64_t k = 0; k < dim; ++k) s.outer *= shape[k];
  s.size = shape[dim];
  for (size_t k = dim + 1; k < shape.size(); ++k) s.inner *= shape[k];
  return s;
}

Tensor sumTo(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor out = zeros(shape, g.dtype());
  dispatchFloat(g.dtype(), "sumTo", [&]<class T>() {
    const T* pg = g.data<T>();
    T* po = out.data<T>();
    const int64_t n = g.numel();
    const int64_t m = out.numel();
    const Shape& sg = g.shape();
    const bool suffix = shape.size() <= sg.size() &&
                        std::equal(shape.begin(), shape.end(),
                                   sg.end() - static_cast<std::ptrdiff_t>(shape.size()));
    if (m == 1) {
      double acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += pg[i];
      po[0] = static_cast<T>(acc);
    } else if (suffix) {
      for (int64_t r = 0; r < n / m; ++r) {
        const T* row = pg + r * m;
        for (int64_t j = 0; j < m; ++j) po[j] += row[j];
      }
    } else {
      // Walk g's index; out's offset uses stride 0 on the dimensions that were broadcast.
      const size_t rank = sg.size();
      std::vector<int64_t> stride(rank, 0), index(rank, 0);
      int64_t st = 1;
      for (size_t k = 0; k < shape.size(); ++k) {
        const size_t d = shape.size() - 1 - k;
        stride[rank - 1 - k] = shape[d] == 1 ? 0 : st;
        st *= shape[d];
      }
      int64_t off = 0;
      for (int64_t i = 0; i < n; ++i) {
        po[off] += pg[i];
        for (size_t d = rank; d-- > 0;) {
          ++index[d];
          off += stride[d];
          if (index[d] < sg[d]) break;
          off -= stride[d] * sg[d];
          index[d] = 0;
        }
      }
    }
  });
  return out;
}

}  // namespace detail

namespace {

// gx[o, s, i] = g[o, i] * scale.
Tensor expandAlongAxis(const Tensor& g, const Shape& inShape, int64_t dim, double scale) {
  Tensor gx = empty(inShape, g.dtype());
  const detail::AxisSplit s = detail::splitAxis(inShape, dim);
  dispatchFloat(g.dtype(), "sum backward", [&]<class T>() {
    const T* pg = g.data<T>();
    T* px = gx.data<T>();
    const T sc = static_cast<T>(scale);
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t k = 0; k < s.size; ++k) {
        T* dst = px + (o * s.size + k) * s.inner;
        const T* src = pg + o * s.inner;
        for (int64_t i = 0; i < s.inner; ++i) dst[i] = src[i] * sc;
      }
    }
  });
  return gx;
}

Tensor sumAll(const Tensor& x, const char* op, double scale) {
  detail::checkDefined(x, op, "x");
  Tensor out = empty({}, x.dtype());
  dispatchFloat(x.dtype(), op, [&]<class T>() {
    const T* p = x.data<T>();
    double acc = 0;
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) acc += p[i];
    *out.data<T>() = static_cast<T>(acc * scale);
  });
  recordOp(out, op, {&x}, [shape = x.shape(), scale](const Tensor& g) {
    return std::vector<Tensor>{full(shape, g.item() * scale, g.dtype())};
  });
  return out;
}

Tensor sumAxis(const Tensor& x, int64_t dim, bool keepdim, const char* op, bool isMean) {
  detail::checkDefined(x, op, "x");
  const int64_t d = detail::wrapDim(dim, x.dim(), op);
  const detail::AxisSplit s = detail::splitAxis(x.shape(), d);
  const double scale = isMean ? 1.0 / static_cast<double>(s.size) : 1.0;
  Shape outShape = x.shape();
  if (keepdim) {
    outShape[d] = 1;
  } else {
    outShape.erase(outShape.begin() + d);
  }
  Tensor out = zeros(outShape, x.dtype());
  dispatchFloat(x.dtype(), op, [&]<class T>() {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t o = 0; o < s.outer; ++o) {
      T* dst = po + o * s.inner;
      for (int64_t k = 0; k < s.size; ++k) {
        const T* src = px + (o * s.size + k) * s.inner;
        for (int64_t i = 0; i < s.inner; ++i) dst[i] += src[i];
      }
      if (isMean) {
        for (int64_t i = 0; i < s.inner; ++i) dst[i] = static_cast<T>(dst[i] * scale);
      }
    }
  });
  recordOp(out, op, {&x}, [inShape = x.shape(), d, scale](const Tensor& g) {
    return std::vector<Tensor>{expandAlongAxis(g, inShape, d, scale)};
  });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) {
  if (detail::isLow(x)) return cast(sum(detail::upcastLow(x)), detail::fp32OpResultDType({&x}));
  return sumAll(x, "sum", 1.0);
}
Tensor mean(const Tensor& x) {
  if (detail::isLow(x)) return cast(mean(detail::upcastLow(x)), detail::fp32OpResultDType({&x}));
  return sumAll(x, "mean", 1.0 / static_cast<double>(std::max<int64_t>(x.numel(), 1)));
}
Tensor sum(const Tensor& x, int64_t dim, bool keepdim) {
  if (detail::isLow(x))
    return cast(sum(detail::upcastLow(x), dim, keepdim), detail::fp32OpResultDType({&x}));
  return sumAxis(x, dim, keepdim, "sum", false);
}
Tensor mean(const Tensor& x, int64_t dim, bool keepdim) {
  if (detail::isLow(x))
    return cast(mean(detail::upcastLow(x), dim, keepdim), detail::fp32OpResultDType({&x}));
  return sumAxis(x, dim, keepdim, "mean", true);
}

namespace {

// y = softmax(x) (or log-softmax) along dim, computed stably by subtracting the max.
Tensor softmaxImpl(const Tensor& x, int64_t dim, bool logOutput) {
  const char* op = logOutput ? "logSoftmax" : "softmax";
  detail::checkDefined(x, op, "x");
  const int64_t d = detail::wrapDim(dim, x.dim(), op);
  const detail::AxisSplit s = detail::splitAxis(x.shape(), d);
  Tensor out = empty(x.shape(), x.dtype());
  // Rows along the last dimension (inner == 1, attention's and the classifier's case): Eigen's
  // vectorized exp over each contiguous row, rows split over the thread pool.
  const int64_t rowGrain = std::max<int64_t>(1, 16384 / std::max<int64_t>(s.size, 1));
  if (s.inner == 1) {
    dispatchFloat(x.dtype(), op, [&]<class T>() {
      using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
      const T* px = x.data<T>();
      T* py = out.data<T>();
      parallelFor(s.outer, rowGrain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          Eigen::Map<const Arr> xr(px + r * s.size, s.size);
          Eigen::Map<Arr> yr(py + r * s.size, s.size);
          const T mx = xr.maxCoeff();
          yr = (xr - mx).exp();
          const T total = yr.sum();
          if (logOutput) {
            yr = xr - (mx + std::log(total));
          } else {
            yr *= T(1) / total;
          }
        }
      });
    });
  } else {
    dispatchFloat(x.dtype(), op, [&]<class T>() {
      const T* px = x.data<T>();
      T* py = out.data<T>();
      for (int64_t o = 0; o < s.outer; ++o) {
        for (int64_t i = 0; i < s.inner; ++i) {
          const int64_t base = o * s.size * s.inner + i;
          T mx = px[base];
          for (int64_t k = 1; k < s.size; ++k) mx = std::max(mx, px[base + k * s.inner]);
          T total = 0;
          for (int64_t k = 0; k < s.size; ++k) {
            const T e = std::exp(px[base + k * s.inner] - mx);
            total += e;
            if (!logOutput) py[base + k * s.inner] = e;
          }
          if (logOutput) {
            const T shift = mx + std::log(total);
            for (int64_t k = 0; k < s.size; ++k)
              py[base + k * s.inner] = px[base + k * s.inner] - shift;
          } else {
            const T inv = T(1) / total;
            for (int64_t k = 0; k < s.size; ++k) py[base + k * s.inner] *= inv;
          }
        }
      }
    });
  }
  if (anyRequiresGrad({&x})) {
    // softmax: gx = y * (g - sum(g * y)); log-softmax: gx = g - exp(y) * sum(g).
    recordOp(out, op, {&x}, [y = out.detach(), s, logOutput, op, rowGrain](const Tensor& g) {
      Tensor gx = empty(g.shape(), g.dtype());
      if (s.inner == 1) {
        dispatchFloat(g.dtype(), op, [&]<class T>() {
          using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
          const T* py = y.data<T>();
          const T* pg = g.data<T>();
          T* pgx = gx.data<T>();
          parallelFor(s.outer, rowGrain, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
              Eigen::Map<const Arr> yr(py + r * s.size, s.size), gr(pg + r * s.size, s.size);
              Eigen::Map<Arr> out(pgx + r * s.size, s.size);
              if (logOutput) {
                out = gr - yr.exp() * gr.sum();
              } else {
                out = yr * (gr - (gr * yr).sum());
              }
            }
          });
        });
        return std::vector<Tensor>{gx};
      }
      dispatchFloat(g.dtype(), op, [&]<class T>() {
        const T* py = y.data<T>();
        const T* pg = g.data<T>();
        T* pgx = gx.data<T>();
        for (int64_t o = 0; o < s.outer; ++o) {
          for (int64_t i = 0; i < s.inner; ++i) {
            const int64_t base = o * s.size * s.inner + i;
            T dot = 0;
            for (int64_t k = 0; k < s.size; ++k) {
              const int64_t j = base + k * s.inner;
              dot += logOutput ? pg[j] : pg[j] * py[j];
            }
            for (int64_t k = 0; k < s.size; ++k) {
              const int64_t j = base + k * s.inner;
              pgx[j] = logOutput ? pg[j] - std::exp(py[j]) * dot : py[j] * (pg[j] - dot);
            }
          }
        }
      });
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  if (detail::isLow(x))
    return cast(softmax(detail::upcastLow(x), dim), detail::fp32OpResultDType({&x}));
  return softmaxImpl(x, dim, false);
}
Tensor logSoftmax(const Tensor& x, int64_t dim) {
  if (detail::isLow(x))
    return cast(logSoftmax(detail::upcastLow(x), dim), detail::fp32OpResultDType({&x}));
  return softmaxImpl(x, dim, true);
}

}  // namespace loom::ag
