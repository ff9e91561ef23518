// Matrix ops (Eigen over the tensors' own storage, no copies), losses and layer functions.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels.h"
#include "loom/autograd/engine.h"
#include "loom/autograd/ops.h"
#include "loom/autograd/parallel.h"

namespace loom::ag {

using detail::dispatchFloat;

namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;

// A row-major [rows, cols] Eigen view of a tensor's storage.
template <class T>
Eigen::Map<RowMat<T>> mat(Tensor& t, int64_t rows, int64_t cols) {
  return Eigen::Map<RowMat<T>>(t.data<T>(), rows, cols);
}
template <class T>
Eigen::Map<const RowMat<T>> mat(const Tensor& t, int64_t rows, int64_t cols) {
  return Eigen::Map<const RowMat<T>>(t.data<T>(), rows, cols);
}
template <class T>
Eigen::Map<const RowVec<T>> rowVec(const Tensor& t) {
  return Eigen::Map<const RowVec<T>>(t.data<T>(), t.numel());
}
template <class T>
Eigen::Map<RowVec<T>> rowVec(Tensor& t) {
  return Eigen::Map<RowVec<T>>(t.data<T>(), t.numel());
}

std::string shapes(const Tensor& a, const Tensor& b) {
  return shapeToString(a.shape()) + " and " + shapeToString(b.shape());
}

}  // namespace

// logits: [N, C], labels: [N] int64. With eps = labelSmoothing and V the rows whose label is
// not ignoreIndex:
//   loss = 1/|V| sum_{n in V} [(1 - eps) (-logp[n, y_n]) + eps/C sum_c (-logp[n, c])].
// Backward, rows in V: (softmax(logits) - (1 - eps) onehot(y) - eps/C) * g / |V|; others 0.
Tensor crossEntropy(const Tensor& logits, const Tensor& labels,
                    const CrossEntropyOptions& options) {
  if (detail::isLow(logits)) {
    return cast(crossEntropy(detail::upcastLow(logits), labels, options),
                detail::fp32OpResultDType({&logits}));
  }
  detail::checkDefined(logits, "crossEntropy", "logits");
  detail::checkDefined(labels, "crossEntropy", "labels");
  detail::checkDim(logits, 2, "crossEntropy", "logits");
  if (labels.dtype() != DType::kInt64) {
    throw std::invalid_argument(std::string("crossEntropy: labels must be int64, got ") +
                                dtypeName(labels.dtype()));
  }
  const double eps = options.labelSmoothing;
  if (!(eps >= 0.0 && eps <= 1.0)) {
    throw std::invalid_argument("crossEntropy: labelSmoothing must be in [0, 1], got " +
                                std::to_string(eps));
  }
  const int64_t n = logits.size(0), c = logits.size(1);
  if (labels.shape() != Shape{n}) {
    throw std::invalid_argument("crossEntropy: labels must have shape [" + std::to_string(n) +
                                "] to match logits " + shapeToString(logits.shape()) + ", got " +
                                shapeToString(labels.shape()));
  }
  if (n == 0) throw std::invalid_argument("crossEntropy: empty batch");
  const int64_t ignore = options.ignoreIndex;
  const int64_t* py = labels.data<int64_t>();
  int64_t valid = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (py[i] == ignore) continue;
    ++valid;
    if (py[i] < 0 || py[i] >= c) {
      throw std::invalid_argument("crossEntropy: labels[" + std::to_string(i) + "] = " +
                                  std::to_string(py[i]) + " is outside [0, " + std::to_string(c) +
                                  ") and is not ignoreIndex (" + std::to_string(ignore) + ")");
    }
  }
  Tensor probs = empty({n, c}, logits.dtype());
  Tensor out = empty({}, logits.dtype());
  const double invValid = 1.0 / static_cast<double>(valid);  // inf when none: NaN loss
  dispatchFloat(logits.dtype(), "crossEntropy", [&]<class T>() {
    const T* px = logits.data<T>();
    T* pp = probs.data<T>();
    double loss = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T* row = px + i * c;
      T* prow = pp + i * c;
      T mx = row[0];
      for (int64_t j = 1; j < c; ++j) mx = std::max(mx, row[j]);
      T total = 0;
      for (int64_t j = 0; j < c; ++j) {
        prow[j] = std::exp(row[j] - mx);
        total += prow[j];
      }
      const T inv = T(1) / total;
      for (int64_t j = 0; j < c; ++j) prow[j] *= inv;
      if (py[i] == ignore) continue;
      const double logTotal = static_cast<double>(mx) + std::log(static_cast<double>(total));
      double rowLoss = (1.0 - eps) * (logTotal - static_cast<double>(row[py[i]]));
      if (eps > 0) {
        double sumNegLogp = 0;
        for (int64_t j = 0; j < c; ++j) sumNegLogp += logTotal - static_cast<double>(row[j]);
        rowLoss += eps / static_cast<double>(c) * sumNegLogp;
      }
      loss += rowLoss;
    }
    *out.data<T>() = static_cast<T>(valid == 0 ? std::nan("") : loss * invValid);
  });
  recordOp(out, "crossEntropy", {&logits, nullptr},
           [probs, labels = labels.detach(), n, c, ignore, eps, invValid](const Tensor& g) {
             Tensor gx = probs;  // owned by this node; reused as the gradient buffer
             dispatchFloat(g.dtype(), "crossEntropy backward", [&]<class T>() {
               T* p = gx.data<T>();
               const int64_t* py = labels.data<int64_t>();
               const T scale = static_cast<T>(g.item() * invValid);
               const T smooth = static_cast<T>(eps / static_cast<double>(c));
               for (int64_t i = 0; i < n; ++i) {
                 T* row = p + i * c;
                 if (py[i] == ignore) {
                   std::fill_n(row, c, T(0));
                   continue;
                 }
                 row[py[i]] -= static_cast<T>(1.0 - eps);
                 for (int64_t j = 0; j < c; ++j) row[j] = (row[j] - smooth) * scale;
               }
             });
             return std::vector<Tensor>{gx, Tensor()};
           });
  return out;
}

// mean((input - target)^2). Backward: 2 (input - target) g / n to input, its negation to target.
Tensor mseLoss(const Tensor& input, const Tensor& target) {
  if (detail::anyLowPrecision({&input, &target})) {
    return cast(mseLoss(detail::upcastLow(input), detail::upcastLow(target)),
                detail::fp32OpResultDType({&input, &target}));
  }
  detail::checkDefined(input, "mseLoss", "input");
  detail::checkDefined(target, "mseLoss", "target");
  detail::checkSameDType(input, target, "mseLoss");
  if (input.shape() != target.shape()) {
    throw std::invalid_argument("mseLoss: input and target shapes differ: " +
                                shapes(input, target));
  }
  const int64_t n = input.numel();
  Tensor diff = empty(input.shape(), input.dtype());
  Tensor out = empty({}, input.dtype());
  dispatchFloat(input.dtype(), "mseLoss", [&]<class T>() {
    const T* a = input.data<T>();
    const T* b = target.data<T>();
    T* d = diff.data<T>();
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      d[i] = a[i] - b[i];
      acc += static_cast<double>(d[i]) * d[i];
    }
    *out.data<T>() = static_cast<T>(n ? acc / static_cast<double>(n) : 0.0);
  });
  recordOp(out, "mseLoss", {&input, &target}, [diff, n](const Tensor& g) {
    Tensor ga = diff * (2.0 * g.item() / static_cast<double>(n));
    return std::vector<Tensor>{ga, neg(ga)};
  });
  return out;
}

// Backward: g times the same mask (0 or 1/(1-p)).
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  if (detail::isLow(x)) return cast(dropout(detail::upcastLow(x), p, training, gen), x.dtype());
  detail::checkDefined(x, "dropout", "x");
  if (!(p >= 0.0 && p <= 1.0)) {
    throw std::invalid_argument("dropout: p must be in [0, 1], got " + std::to_string(p));
  }
  if (!training || p == 0.0) return x;
  Tensor mask = empty(x.shape(), x.dtype());
  Tensor out = empty(x.shape(), x.dtype());
  dispatchFloat(x.dtype(), "dropout", [&]<class T>() {
    const T keepScale = p == 1.0 ? T(0) : static_cast<T>(1.0 / (1.0 - p));
    T* pm = mask.data<T>();
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      pm[i] = gen.uniform() < p ? T(0) : keepScale;
      po[i] = px[i] * pm[i];
    }
  });
  recordOp(out, "dropout", {&x},
           [mask](const Tensor& g) { return std::vector<Tensor>{mul(g, mask)}; });
  return out;
}

// x: [N, C]. xhat = (x - mean) * invstd; y = xhat * weight + bias.
// Backward (training, batch statistics):
//   gxhat = g * weight; gx = invstd / N * (N gxhat - sum_n gxhat - xhat sum_n(gxhat xhat));
// (eval, running statistics): gx = g * weight * invstd. gweight = sum_n g xhat; gbias = sum_n g.
Tensor batchNorm(const Tensor& x, const Tensor& runningMean, const Tensor& runningVar,
                 const Tensor& weight, const Tensor& bias, bool training, double momentum,
                 double eps) {
  if (detail::anyLowPrecision({&x, &weight, &bias})) {
    return cast(batchNorm(detail::upcastLow(x), runningMean, runningVar, detail::upcastLow(weight),
                          detail::upcastLow(bias), training, momentum, eps),
                detail::fp32OpResultDType({&x, &weight, &bias}));
  }
  detail::checkDefined(x, "batchNorm", "input");
  if (x.dim() != 2) {
    throw std::invalid_argument("batchNorm: expected input [N, C], got " +
                                shapeToString(x.shape()));
  }
  const int64_t n = x.size(0), c = x.size(1);
  auto checkVec = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return;
    if (t.shape() != Shape{c} || t.dtype() != x.dtype()) {
      throw std::invalid_argument(std::string("batchNorm: ") + what + " must be [" +
                                  std::to_string(c) + "] " + dtypeName(x.dtype()) + ", got " +
                                  shapeToString(t.shape()) + " " + dtypeName(t.dtype()));
    }
  };
  checkVec(runningMean, "running_mean");
  checkVec(runningVar, "running_var");
  checkVec(weight, "weight");
  checkVec(bias, "bias");
  if (!training && (!runningMean.defined() || !runningVar.defined())) {
    throw std::invalid_argument("batchNorm: eval mode needs running_mean and running_var");
  }
  if (training && n <= 1) {
    throw std::invalid_argument(
        "batchNorm: training needs more than 1 value per channel, got input " +
        shapeToString(x.shape()));
  }
  Tensor xhat = empty({n, c}, x.dtype());
  Tensor invstd = empty({c}, x.dtype());
  Tensor y = empty({n, c}, x.dtype());
  dispatchFloat(x.dtype(), "batchNorm", [&]<class T>() {
    auto xm = mat<T>(x, n, c);
    auto xh = mat<T>(xhat, n, c);
    auto is = rowVec<T>(invstd);
    RowVec<T> mu;
    if (training) {
      mu = xm.colwise().sum() / static_cast<T>(n);
      xh = xm.rowwise() - mu;
      RowVec<T> var = xh.array().square().colwise().sum() / static_cast<T>(n);
      is = (var.array() + static_cast<T>(eps)).rsqrt();
      if (runningMean.defined()) {
        Tensor rm = runningMean, rv = runningVar;
        const T mom = static_cast<T>(momentum);
        rowVec<T>(rm) = (T(1) - mom) * rowVec<T>(rm) + mom * mu;
        rowVec<T>(rv) =
            (T(1) - mom) * rowVec<T>(rv) + mom * var * (static_cast<T>(n) / static_cast<T>(n - 1));
      }
    } else {
      mu = rowVec<T>(runningMean);
      xh = xm.rowwise() - mu;
      is = (rowVec<T>(runningVar).array() + static_cast<T>(eps)).rsqrt();
    }
    xh = xh.array().rowwise() * is.array();
    auto ym = mat<T>(y, n, c);
    if (weight.defined()) {
      ym = xh.array().rowwise() * rowVec<T>(weight).array();
    } else {
      ym = xh;
    }
    if (bias.defined()) ym.rowwise() += rowVec<T>(bias);
  });
  recordOp(y, "batchNorm", {&x, &weight, &bias},
           [xhat, invstd, w = weight.defined() ? weight.detach() : Tensor(), training, n, c,
            needW = weight.requiresGrad(), needB = bias.requiresGrad()](const Tensor& g) {
             Tensor gx = empty({n, c}, g.dtype()), gw, gb;
             dispatchFloat(g.dtype(), "batchNorm backward", [&]<class T>() {
               auto gm = mat<T>(g, n, c);
               auto xh = mat<T>(xhat, n, c);
               RowVec<T> sumG = gm.colwise().sum();
               RowVec<T> sumGXhat = (gm.array() * xh.array()).colwise().sum();
               if (needW) {
                 gw = empty({c}, g.dtype());
                 rowVec<T>(gw) = sumGXhat;
               }
               if (needB) {
                 gb = empty({c}, g.dtype());
                 rowVec<T>(gb) = sumG;
               }
               RowVec<T> scale = rowVec<T>(invstd);
               if (w.defined()) scale = scale.array() * rowVec<T>(w).array();
               auto gxm = mat<T>(gx, n, c);
               if (training) {
                 // gxhat = g * w; sums over n of gxhat are w * sumG and w * sumGXhat.
                 const T invN = T(1) / static_cast<T>(n);
                 gxm = (gm.array().rowwise() - sumG.array() * invN) -
                       (xh.array().rowwise() * (sumGXhat.array() * invN));
                 gxm = gxm.array().rowwise() * scale.array();
               } else {
                 gxm = gm.array().rowwise() * scale.array();
               }
             });
             return std::vector<Tensor>{gx, gw, gb};
           });
  return y;
}

// x: [R..., D...] seen as [R, D] rows (D = prod(normalizedShape)). Per row:
//   xhat = (x - mean) * invstd, invstd = 1 / sqrt(mean((x - mean)^2) + eps); y = xhat w + b.
// Backward, per row: gxhat = g w; gx = invstd (gxhat - mean(gxhat) - xhat mean(gxhat xhat));
// gw = sum over rows of g xhat; gb = sum over rows of g.
Tensor layerNorm(const Tensor& x, const Shape& normalizedShape, const Tensor& weight,
                 const Tensor& bias, double eps) {
  if (detail::anyLowPrecision({&x, &weight, &bias})) {
    return cast(layerNorm(detail::upcastLow(x), normalizedShape, detail::upcastLow(weight),
                          detail::upcastLow(bias), eps),
                detail::fp32OpResultDType({&x, &weight, &bias}));
  }
  detail::checkDefined(x, "layerNorm", "input");
  const size_t k = normalizedShape.size();
  if (k == 0 || k > x.shape().size() ||
      !std::equal(normalizedShape.begin(), normalizedShape.end(), x.shape().end() - k)) {
    throw std::invalid_argument("layerNorm: input shape " + shapeToString(x.shape()) +
                                " does not end with normalizedShape " +
                                shapeToString(normalizedShape));
  }
  for (const Tensor* t : {&weight, &bias}) {
    if (t->defined() && (t->shape() != normalizedShape || t->dtype() != x.dtype())) {
      throw std::invalid_argument(std::string("layerNorm: ") + (t == &weight ? "weight" : "bias") +
                                  " must be " + shapeToString(normalizedShape) + " " +
                                  dtypeName(x.dtype()) + ", got " + shapeToString(t->shape()) +
                                  " " + dtypeName(t->dtype()));
    }
  }
  const int64_t d = shapeNumel(normalizedShape);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1));
  Tensor xhat = empty(x.shape(), x.dtype());
  Tensor invstd = empty({rows}, x.dtype());
  Tensor y = empty(x.shape(), x.dtype());
  dispatchFloat(x.dtype(), "layerNorm", [&]<class T>() {
    const T* px = x.data<T>();
    T* ph = xhat.data<T>();
    T* pi = invstd.data<T>();
    T* py = y.data<T>();
    const T* pw = weight.defined() ? weight.data<T>() : nullptr;
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;
    parallelFor(rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = px + r * d;
        T* hr = ph + r * d;
        T* yr = py + r * d;
        double mean = 0;
        for (int64_t j = 0; j < d; ++j) mean += xr[j];
        mean /= static_cast<double>(d);
        double var = 0;
        for (int64_t j = 0; j < d; ++j) {
          const double c = xr[j] - mean;
          var += c * c;
        }
        var /= static_cast<double>(d);
        const T is = static_cast<T>(1.0 / std::sqrt(var + eps));
        const T mu = static_cast<T>(mean);
        pi[r] = is;
        for (int64_t j = 0; j < d; ++j) {
          hr[j] = (xr[j] - mu) * is;
          yr[j] = (pw ? hr[j] * pw[j] : hr[j]) + (pb ? pb[j] : T(0));
        }
      }
    });
  });
  recordOp(y, "layerNorm", {&x, &weight, &bias},
           [xhat, invstd, w = weight.defined() ? weight.detach() : Tensor(), rows, d, grain,
            normalizedShape, needX = x.requiresGrad(), needW = weight.requiresGrad(),
            needB = bias.requiresGrad()](const Tensor& g) {
             Tensor gx, gw, gb;
             dispatchFloat(g.dtype(), "layerNorm backward", [&]<class T>() {
               const T* pg = g.data<T>();
               const T* ph = xhat.data<T>();
               const T* pw = w.defined() ? w.data<T>() : nullptr;
               if (needX) {
                 gx = empty(g.shape(), g.dtype());
                 T* px = gx.data<T>();
                 const T* pi = invstd.data<T>();
                 parallelFor(rows, grain, [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) {
                     const T* gr = pg + r * d;
                     const T* hr = ph + r * d;
                     T* xr = px + r * d;
                     double sumG = 0, sumGH = 0;
                     for (int64_t j = 0; j < d; ++j) {
                       const double gh = pw ? gr[j] * pw[j] : gr[j];
                       sumG += gh;
                       sumGH += gh * hr[j];
                     }
                     const T meanG = static_cast<T>(sumG / static_cast<double>(d));
                     const T meanGH = static_cast<T>(sumGH / static_cast<double>(d));
                     for (int64_t j = 0; j < d; ++j) {
                       const T gh = pw ? gr[j] * pw[j] : gr[j];
                       xr[j] = pi[r] * (gh - meanG - hr[j] * meanGH);
                     }
                   }
                 });
               }
               if (needW || needB) {
                 // Column sums, split over columns so each thread owns its outputs.
                 if (needW) gw = zeros(normalizedShape, g.dtype());
                 if (needB) gb = zeros(normalizedShape, g.dtype());
                 T* pgw = needW ? gw.data<T>() : nullptr;
                 T* pgb = needB ? gb.data<T>() : nullptr;
                 const int64_t colGrain = std::max<int64_t>(16, 16384 / std::max<int64_t>(rows, 1));
                 parallelFor(d, colGrain, [&](int64_t c0, int64_t c1) {
                   for (int64_t r = 0; r < rows; ++r) {
                     const T* gr = pg + r * d;
                     const T* hr = ph + r * d;
                     for (int64_t j = c0; j < c1; ++j) {
                       if (pgw) pgw[j] += gr[j] * hr[j];
                       if (pgb) pgb[j] += gr[j];
                     }
                   }
                 });
               }
             });
             return std::vector<Tensor>{gx, gw, gb};
           });
  return y;
}

// out[idx..., :] = weight[indices[idx...], :]. Backward: rows of g scatter-added into gweight,
// except at paddingIdx.
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> paddingIdx) {
  if (detail::isLow(weight)) {
    return cast(embedding(detail::upcastLow(weight), indices, paddingIdx), weight.dtype());
  }
  detail::checkDefined(weight, "embedding", "weight");
  detail::checkDefined(indices, "embedding", "indices");
  detail::checkDim(weight, 2, "embedding", "weight");
  if (indices.dtype() != DType::kInt64) {
    throw std::invalid_argument(std::string("embedding: indices must be int64, got ") +
                                dtypeName(indices.dtype()));
  }
  const int64_t v = weight.size(0), d = weight.size(1), count = indices.numel();
  if (paddingIdx && (*paddingIdx < 0 || *paddingIdx >= v)) {
    throw std::invalid_argument("embedding: paddingIdx " + std::to_string(*paddingIdx) +
                                " is outside [0, " + std::to_string(v) + ")");
  }
  const int64_t pad = paddingIdx.value_or(-1);
  const int64_t* idx = indices.data<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    if (idx[i] < 0 || idx[i] >= v) {
      throw std::invalid_argument("embedding: indices[" + std::to_string(i) +
                                  "] = " + std::to_string(idx[i]) + " is outside [0, " +
                                  std::to_string(v) + ")");
    }
  }
  Shape outShape = indices.shape();
  outShape.push_back(d);
  Tensor out = empty(outShape, weight.dtype());
  dispatchFloat(weight.dtype(), "embedding", [&]<class T>() {
    const T* pw = weight.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < count; ++i) std::copy_n(pw + idx[i] * d, d, po + i * d);
  });
  recordOp(out, "embedding", {&weight, nullptr},
           [ind = indices.detach(), v, d, count, pad](const Tensor& g) {
             Tensor gw = zeros({v, d}, g.dtype());
             dispatchFloat(g.dtype(), "embedding backward", [&]<class T>() {
               const T* pg = g.data<T>();
               T* pw = gw.data<T>();
               const int64_t* idx = ind.data<int64_t>();
               for (int64_t i = 0; i < count; ++i) {
                 if (idx[i] == pad) continue;
                 T* row = pw + idx[i] * d;
                 for (int64_t j = 0; j < d; ++j) row[j] += pg[i * d + j];
               }
             });
             return std::vector<Tensor>{gw, Tensor()};
           });
  return out;
}

}  // namespace loom::ag
